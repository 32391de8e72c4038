"""Delayed-task benchmark: promotion throughput and lateness.

    python -m benchmarks.delayed [--quick] [--repeats R]

1. 20,000 tasks already due (1,000 with --quick): promoted per second by
   django-rcoord's poller (one script call per batch of 500) and by the book's
   poll_queue (one item per loop turn, under a lock), beside sequential PINGs.
2. Lateness (due -> promoted) of 1,000 tasks due over 2 s (500 over 0.5 s with
   --quick): django-rcoord's poller at its default 1 s interval (with its queue
   known, with the tasks in a second queue group, and started before the queue
   existed) and the book's poll_queue loop,
   each in a thread of this process.
"""

from __future__ import annotations

import statistics
import threading
import time

from benchmarks import book
from benchmarks.common import (
    Bench,
    Measurement,
    ScenarioResult,
    Table,
    measure_runs,
    percentile,
    pings,
)
from benchmarks.runner import run_benchmark

NAME = "delayed"


def run(bench: Bench) -> ScenarioResult:
    from django_rcoord.queues import execute_later
    from django_rcoord.queues.delayed import DueTaskPromoter
    from django_rcoord.queues.keys import QueueKeys

    client = bench.client
    count = bench.pick(quick=1000, full=20_000)
    repeats = bench.repeats_or(3)
    settle = bench.pick(quick=1.0, full=1.5)  # after the last due time
    # At most 1,000 tasks: the poller keeps the newest 1,000 lateness samples.
    spread, tasks = bench.pick(quick=(0.5, 500), full=(2.0, 1000))

    def rcoord_rate() -> float:
        client.flushdb()
        with client.pipeline(transaction=False) as pipe:
            for _ in range(count):
                execute_later("bench", "bench.noop", [], delay=0.001, client=pipe)
            pipe.execute()
        time.sleep(0.05)
        promoter = DueTaskPromoter(client=client)
        started = time.perf_counter()
        promoted = 0
        while promoted < count:
            promoted += promoter.run_once()[0]
        return count / (time.perf_counter() - started)

    def book_rate() -> float:
        client.flushdb()
        with client.pipeline(transaction=False) as pipe:
            for _ in range(count):
                book.execute_later(pipe, "bench", "noop", [], delay=0.001)
            pipe.execute()
        time.sleep(0.05)
        started = time.perf_counter()
        while book.poll_queue_once(client):
            pass
        elapsed = time.perf_counter() - started
        assert client.llen("queue:bench") == count
        return count / elapsed

    rows = [
        pings(client, 1, count=2000, repeats=repeats),
        measure_runs(
            "django-rcoord poll_delayed (batches of 500)",
            "1 per 500 tasks",
            rcoord_rate,
            repeats=repeats,
        ),
        measure_runs(
            "book: poll_queue (one item per turn, lock)",
            "7 per task",
            book_rate,
            repeats=repeats,
        ),
    ]
    promotion = Table(
        f"Promote {count:,} due tasks, {repeats} runs",
        "tasks/s",
        rows,
        floor=rows[0].name,
        note="the floor: one PING per task",
    )

    def lateness_run(queue_known: bool = True, queue: str = "bench") -> list[int]:
        """Milliseconds from due to promoted, one sample per task of ``queue``.

        ``queue_known``: the queues held a task before the poller started (the steady
        state): "bench" in the default group, and ``queue`` (in its own group when it
        names one). Without it the poller starts before any queue exists and learns of
        the group from the registry's wake-up.
        """
        client.flushdb()
        if queue_known:
            for name in {"bench", queue}:
                execute_later(name, "bench.noop", [], delay=0.001, client=client)
        promoter = DueTaskPromoter(client=client)
        thread = threading.Thread(target=promoter.run, daemon=True)
        thread.start()
        time.sleep(0.5)
        client.delete(QueueKeys.of(queue).lateness)  # the warm-up task's sample
        # Scheduled in one pipeline (quickly), so the poller's thread is not competing
        # with a scheduling loop for the interpreter while it works.
        with client.pipeline(transaction=False) as pipe:
            for index in range(tasks):
                delay = 0.2 + spread * index / tasks
                execute_later(queue, "bench.noop", [], delay=delay, client=pipe)
            pipe.execute()
        time.sleep(spread + settle)
        promoter.stop()
        thread.join(5)
        samples = [int(ms) for ms in client.lrange(QueueKeys.of(queue).lateness, 0, -1)]
        if len(samples) != tasks:
            raise RuntimeError(f"{len(samples)} lateness samples for {tasks} tasks")
        return samples

    def book_lateness_run() -> list[int]:
        client.flushdb()
        samples: list[int] = []
        stop = threading.Event()

        def moved(item: bytes, due: float) -> None:
            samples.append(int(1000 * (time.time() - due)))

        thread = threading.Thread(target=book.poll_queue, args=(client, stop, moved), daemon=True)
        thread.start()
        time.sleep(0.5)
        started = time.time()
        with client.pipeline(transaction=False) as pipe:
            for index in range(tasks):
                # the book's execute_later takes a delay from now; the pipeline is sent
                # below, well before the first item is due
                delay = 0.2 + spread * index / tasks - (time.time() - started)
                book.execute_later(pipe, "bench", "noop", [], delay=delay)
            pipe.execute()
        time.sleep(spread + settle)
        stop.set()
        thread.join(5)
        return samples

    lateness_rows = []
    for name, trips, run_once in (
        ("django-rcoord poll_delayed, interval 1 s", "1 per batch + BLPOP wait", lateness_run),
        (
            "django-rcoord, tasks in a second queue group",
            "1 per batch + BLPOP wait",
            lambda: lateness_run(queue="second/bench"),
        ),
        (
            "django-rcoord, poller started before the queue existed",
            "1 per batch + sleep",
            lambda: lateness_run(queue_known=False),
        ),
        ("book: poll_queue, 10 ms sleep when idle", "7 per task + sleep", book_lateness_run),
    ):
        runs = [run_once() for _ in range(repeats)]
        row = Measurement(
            name,
            trips,
            [statistics.median(samples) for samples in runs],
            note=f"{min(len(samples) for samples in runs):,} promotions per run",
        )
        row.extra["p90 ms"] = statistics.median(percentile(samples, 0.9) for samples in runs)
        row.extra["p99 ms"] = statistics.median(percentile(samples, 0.99) for samples in runs)
        row.extra["max ms"] = max(max(samples) for samples in runs)
        lateness_rows.append(row)
    lateness_table = Table(
        f"Lateness (due -> in its queue) of {tasks:,} tasks due over {spread:g} s, {repeats} runs",
        "ms",
        lateness_rows,
        lower_is_better=True,
        extra_columns=("p90 ms", "p99 ms", "max ms"),
        note="each poller in a thread of this process; django-rcoord records lateness with "
        "the server's clock, the book's is timed by this process's clock (the one it "
        "schedules with)",
    )
    return ScenarioResult(
        NAME,
        "Delayed tasks",
        [promotion, lateness_table],
        params={"count": count, "lateness_tasks": tasks, "lateness_spread_s": spread},
        repeats=repeats,
    )


if __name__ == "__main__":
    run_benchmark(NAME, __doc__.splitlines()[0])
