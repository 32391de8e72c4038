"""Task controls benchmark: what each ``@task`` option costs a no-op task, and whether the
limits hold across worker processes (issue 29's "Measure").

    python -m benchmarks.task_controls [--quick] [--repeats R]

1. **Enqueue**, side by side in this process (``measure_side_by_side``): ``delay()`` of a
   plain no-op task and of the same task with ``unique_for=60`` (new arguments each call,
   and the same arguments again: a duplicate, which queues nothing), beside a PING. Round
   trips counted by the client, commands by the server, per call.
2. **End to end, one worker process per option**: a no-op ``@task`` plain, then with
   ``unique_for=60``, ``timeout=10``, ``concurrency=1000`` (never full: the check's cost)
   and ``rate="1000000/m"`` (never over), each on a queue group of its own. Per round
   the parent enqueues N tasks (one ``delay()`` each), then opens the start gate of that
   option's worker process (imported and connected beforehand), which drains them
   (``Worker(burst=True)``, tasks inline). The options take turns round by round, so a
   busy neighbour's bursts fall on every row alike. Producer and worker round trips per
   task are counted by each process's client; commands per task by the server (those
   inside scripts included), split into the producer's and the worker's.
3. **Limits across 3 worker processes** (``run_email_worker --concurrency 4`` each, 12
   worker loops, running between rounds): 300 tasks of ``concurrency=2`` sleeping 20 ms
   (the ideal: 150 x 20 ms = 3.0 s; peak = the highest count of runs at once, read at
   every start by an INCR inside the task); 200 tasks of ``rate="20/s"`` (starts read
   with ``time.time()`` in the task, one machine: the most starts in any 1 s window, and
   the shortest span of 21 consecutive starts, which must be at least 1 s; the last start
   cannot come before (200 - 20) / 20 = 9 s after the first).
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from benchmarks.common import (
    Bench,
    Gate,
    Measurement,
    RoundTrips,
    ScenarioResult,
    Table,
    measure_side_by_side,
    ping_operation,
    read_result,
    report,
    spawn_workers,
    stop_workers,
)
from benchmarks.runner import run_benchmark

NAME = "task_controls"

#: option -> (row name, @task keyword arguments). Each on a queue group of its own.
OPTIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "plain": ("no-op @task (no option)", {}),
    "unique": ("unique_for=60", {"unique_for": 60}),
    "timeout": ("timeout=10 (tasks inline, SIGALRM timer)", {"timeout": 10}),
    "concurrency": ("concurrency=1000 (never full)", {"concurrency": 1000}),
    "rate": ('rate="1000000/m" (never over)', {"rate": "1000000/m"}),
}

#: The limits' measurements (part 3).
CONCURRENCY, CONCURRENCY_SECONDS = 2, 0.02
RATE, RATE_PER_SECOND = "20/s", 20
LIMIT_PROCESSES, LIMIT_LOOPS = 3, 4
LIMITS_QUEUE = "controls-limits/bench"
RUNNING = "bench:controls:running"
PEAKS = "bench:controls:peaks"
STARTS = "bench:controls:starts"
FINISHED = "bench:controls:finished"

#: When this process last ran a no-op task (a drain ends at the last one).
last_done = 0.0


def queue_of(option: str) -> str:
    return f"controls-{option}/bench"


def noop(number: int) -> None:
    global last_done  # noqa: PLW0603  (read by the drain in the worker process)
    last_done = time.time()


def limited_run(seconds: float) -> None:
    """A run of ``concurrency=2``: how many run with it, read as it starts."""
    from django_rcoord.connection import get_client

    client = get_client()
    client.rpush(PEAKS, client.incr(RUNNING))
    time.sleep(seconds)
    client.decr(RUNNING)
    client.rpush(FINISHED, repr(time.time()))


def rated_start(number: int) -> None:
    """A run of ``rate="20/s"``: when it started."""
    from django_rcoord.connection import get_client

    now = repr(time.time())
    client = get_client()
    client.rpush(STARTS, now)
    client.rpush(FINISHED, repr(time.time()))


def register() -> dict[str, Any]:
    """The benchmark's tasks, registered in this process: option -> its no-op task, and
    "limited" / "rated" for part 3."""
    from django_rcoord.queues import task

    tasks = {
        option: task(name=f"bench.controls.{option}", queue=queue_of(option), **options)(noop)
        for option, (_, options) in OPTIONS.items()
    }
    tasks["limited"] = task(
        name="bench.controls.limited",
        queue=LIMITS_QUEUE,
        concurrency=CONCURRENCY,
        max_retries=0,
    )(limited_run)
    tasks["rated"] = task(
        name="bench.controls.rated", queue=LIMITS_QUEUE, rate=RATE, max_retries=0
    )(rated_start)
    return tasks


# -- 1. enqueue, side by side ------------------------------------------------------------------


def enqueue_table(bench: Bench, tasks: dict[str, Any]) -> Table:
    client = bench.client
    count = bench.pick(quick=300, full=3000)
    repeats = bench.repeats_or(bench.pick(quick=3, full=5))
    numbers = iter(range(10**12))
    unique = tasks["unique"]
    unique.delay(-1)  # the one every duplicate call finds queued
    operations: list[tuple[str, str, Callable[[], object]]] = [
        ping_operation(client, 1),
        ("plain delay()", "", lambda: tasks["plain"].delay(next(numbers))),
        ("unique_for=60 delay(), new arguments", "", lambda: unique.delay(next(numbers))),
        ("unique_for=60 delay(), a duplicate (queues nothing)", "", lambda: unique.delay(-1)),
    ]
    costs = [per_call(client, operation) for _, _, operation in operations]
    operations = [
        (name, f"{trips:g}", operation)
        for (name, _, operation), (trips, _) in zip(operations, costs, strict=True)
    ]
    rows = measure_side_by_side(operations, count=count, repeats=repeats)
    plain = rows[1]
    for row, (_, commands) in zip(rows, costs, strict=True):
        row.extra["commands/call"] = commands
        if plain.median and row is not rows[0]:
            row.extra["vs plain"] = f"{row.median / plain.median:.2f}x"
    return Table(
        f"Enqueue, side by side in one process: {repeats} x {count:,} calls per row",
        "calls/s",
        rows,
        floor=rows[0].name,
        extra_columns=("vs plain", "commands/call"),
        note="round trips counted by the client, commands/call by the server (inside "
        "scripts included), each over 200 calls",
    )


def per_call(client: Any, operation: Callable[[], object], calls: int = 200) -> tuple[float, float]:
    """(round trips, server commands) per call of ``operation``, over ``calls`` calls (after
    a few, which load its script)."""
    for _ in range(3):
        operation()
    before = commands_processed(client)
    RoundTrips.reset()
    for _ in range(calls):
        operation()
    trips = RoundTrips.count
    commands = commands_processed(client) - before - 1  # less the first INFO
    return round(trips / calls, 2), round(commands / calls, 2)


def commands_processed(client: Any) -> int:
    return int(client.info("stats")["total_commands_processed"])


# -- 2. end to end, one worker process per option ---------------------------------------------


def drain_worker(option: str, url: str, rounds: str, gate_name: str) -> None:
    """The worker process of ``option``: ``rounds`` times, wait at the gate, run every task
    of its queue (burst), report when it started and ended and its round trips."""
    import redis

    from benchmarks.common import configure_django

    configure_django(url)
    register()
    from django_rcoord.queues.worker import Worker

    gate = Gate(redis.Redis.from_url(url), gate_name)
    for _ in range(int(rounds)):
        gate.pass_through()
        global last_done  # noqa: PLW0603  (the drain ends at the last task)
        last_done = 0.0
        RoundTrips.reset()
        started = time.time()
        Worker([queue_of(option)], burst=True).run()
        trips = RoundTrips.count
        report({"started": started, "finished": last_done or time.time(), "round_trips": trips})


def end_to_end_table(bench: Bench, tasks: dict[str, Any]) -> Table:
    client = bench.client
    count = bench.pick(quick=300, full=5000)
    repeats = bench.repeats_or(3)
    numbers = iter(range(10**12))
    children = {
        option: spawn_workers(
            "benchmarks.task_controls",
            ["drain", option, bench.url, str(repeats), f"controls:{option}"],
            1,
        )[0]
        for option in OPTIONS
    }
    gates = {option: Gate(client, f"controls:{option}") for option in OPTIONS}
    figures = ("total", "enqueue", "drain", "ptrips", "wtrips", "pcmd", "wcmd")
    seen: dict[str, dict[str, list[float]]] = {
        option: {name: [] for name in figures} for option in OPTIONS
    }
    try:
        for round_ in range(1, repeats + 1):
            for option in OPTIONS:  # the options take turns, round by round
                child, numbers_seen = children[option], seen[option]
                gates[option].wait_ready(1, [child], round_)
                job = tasks[option]
                before = commands_processed(client)
                RoundTrips.reset()
                started = time.perf_counter()
                for _ in range(count):
                    job.delay(next(numbers))
                enqueue_seconds = time.perf_counter() - started
                producer_trips = RoundTrips.count
                enqueued = commands_processed(client)
                gates[option].open(1)
                drained = read_result(child)
                after = commands_processed(client)
                drain_seconds = drained["finished"] - drained["started"]
                numbers_seen["total"].append(count / (enqueue_seconds + drain_seconds))
                numbers_seen["enqueue"].append(count / enqueue_seconds)
                numbers_seen["drain"].append(count / drain_seconds)
                numbers_seen["ptrips"].append(producer_trips / count)
                numbers_seen["wtrips"].append(drained["round_trips"] / count)
                # Less the INFO calls; the worker's share less the gate's RPUSH and BLPOP.
                numbers_seen["pcmd"].append((enqueued - before - 1) / count)
                numbers_seen["wcmd"].append((after - enqueued - 3) / count)
        for child in children.values():
            child.wait(60)
    finally:
        stop_workers(list(children.values()))
    rows = []
    for option, (name, _) in OPTIONS.items():
        values = seen[option]
        producer_per_task = statistics.median(values["ptrips"])
        worker_trips = statistics.median(values["wtrips"])
        row = Measurement(name, f"{producer_per_task:.2f} + {worker_trips:.3f}", values["total"])
        row.extra["enqueue/s"] = statistics.median(values["enqueue"])
        row.extra["drain/s"] = statistics.median(values["drain"])
        row.extra["producer round trips/task"] = round(producer_per_task, 2)
        row.extra["worker round trips/task"] = round(worker_trips, 3)
        row.extra["producer commands/task"] = round(statistics.median(values["pcmd"]), 2)
        row.extra["worker commands/task"] = round(statistics.median(values["wcmd"]), 2)
        rows.append(row)
    return Table(
        f"Each option on a no-op task: enqueue, drain (1 worker process), {repeats} x {count:,}",
        "tasks/s end to end",
        rows,
        floor=rows[0].name,
        extra_columns=(
            "enqueue/s",
            "drain/s",
            "producer round trips/task",
            "worker round trips/task",
            "producer commands/task",
            "worker commands/task",
        ),
        note="vs floor: against the plain task; round trips per task: producer + worker, "
        "counted by each process's client; commands: counted by the server (inside scripts "
        "included)",
    )


# -- 3. the limits across three worker processes ------------------------------------------------


def limits_worker(url: str) -> None:
    """A worker process of part 3: the worker command on the limits' queue until SIGTERM."""
    from benchmarks.common import configure_django

    configure_django(url)
    register()
    from django.core.management import call_command

    call_command(
        "run_email_worker", "--queues", LIMITS_QUEUE, "--concurrency", str(LIMIT_LOOPS), verbosity=0
    )


def limits_table(bench: Bench, tasks: dict[str, Any]) -> Table:
    from django_rcoord.queues import enqueue_many
    from django_rcoord.queues.keys import QueueKeys

    client: Any = bench.client  # redis-py's sync client (its stubs allow async replies)
    repeats = bench.repeats_or(3)
    limited_count = bench.pick(quick=100, full=300)
    rated_count = bench.pick(quick=60, full=200)
    children = spawn_workers("benchmarks.task_controls", ["limits", bench.url], LIMIT_PROCESSES)
    workers_key = QueueKeys.of(LIMITS_QUEUE).workers
    limited = Measurement(
        f"concurrency={CONCURRENCY}: {limited_count} tasks of {CONCURRENCY_SECONDS * 1000:.0f} "
        f"ms, {LIMIT_PROCESSES} workers x {LIMIT_LOOPS}",
        "",
        [],
    )
    rated = Measurement(
        f'rate="{RATE}": {rated_count} no-op tasks, {LIMIT_PROCESSES} workers x {LIMIT_LOOPS}',
        "",
        [],
    )
    peaks, ideal_limited = [], limited_count / CONCURRENCY * CONCURRENCY_SECONDS
    windows, spans, first_to_last = [], [], []
    task_windows: list[int] = []
    task_spans: list[float] = []
    ideal_rated = (rated_count - RATE_PER_SECOND) / RATE_PER_SECOND
    try:
        deadline = time.monotonic() + 120
        while int(client.scard(workers_key)) < LIMIT_PROCESSES * LIMIT_LOOPS:
            if any(child.poll() is not None for child in children):
                raise RuntimeError("a limits worker process exited early")
            if time.monotonic() > deadline:
                raise RuntimeError("the limits' worker processes were not up within 120 s")
            time.sleep(0.05)
        for _ in range(repeats):
            client.delete(RUNNING, PEAKS, FINISHED)
            started = time.time()
            enqueue_many(
                [(tasks["limited"], (CONCURRENCY_SECONDS,), {}) for _ in range(limited_count)]
            )
            wait_for(client, FINISHED, limited_count)
            finished = [float(value) for value in client.lrange(FINISHED, 0, -1)]
            limited.values.append(max(finished) - started)
            peaks.append(max(int(peak) for peak in client.lrange(PEAKS, 0, -1)))

            time.sleep(1.1)  # the last round's starts out of the rate's window
            client.delete(STARTS, FINISHED)
            log = RateLog(client, rate_log_key())
            started = time.time()
            with log:
                enqueue_many([(tasks["rated"], (number,), {}) for number in range(rated_count)])
                wait_for(client, FINISHED, rated_count)
            starts = sorted(float(value) for value in client.lrange(STARTS, 0, -1))
            finished = [float(value) for value in client.lrange(FINISHED, 0, -1)]
            decided = log.times()
            if len(decided) != rated_count:
                raise RuntimeError(f"the rate's log showed {len(decided)} of {rated_count} starts")
            rated.values.append(max(finished) - started)
            windows.append(most_in_a_window(decided, 1.0))
            task_windows.append(most_in_a_window(starts, 1.0))
            spans.append(shortest_span(decided, RATE_PER_SECOND + 1))
            task_spans.append(shortest_span(starts, RATE_PER_SECOND + 1))
            first_to_last.append(decided[-1] - decided[0])
    finally:
        stop_workers(children)
    limited.extra["ideal s"] = round(ideal_limited, 2)
    limited.extra["vs ideal"] = f"{statistics.median(limited.values) / ideal_limited:.2f}x"
    limited.extra["most at once"] = max(peaks)
    rated.extra["ideal s"] = f"{ideal_rated:.1f}-{rated_count / RATE_PER_SECOND:.1f}"
    rated.extra["vs ideal"] = (
        f"{statistics.median(rated.values) / (rated_count / RATE_PER_SECOND):.2f}x of "
        f"{rated_count / RATE_PER_SECOND:g} s"
    )
    rated.extra["most in 1 s"] = f"{max(windows)} (tasks' clock: {max(task_windows)})"
    rated.extra["shortest 21 starts s"] = f"{min(spans):.4f} (tasks' clock: {min(task_spans):.4f})"
    rated.extra["first to last start s"] = round(statistics.median(first_to_last), 2)
    return Table(
        f"Limits across {LIMIT_PROCESSES} worker processes (run_email_worker --concurrency "
        f"{LIMIT_LOOPS} each), {repeats} rounds",
        "seconds, enqueue to last finish",
        [limited, rated],
        lower_is_better=True,
        extra_columns=(
            "ideal s",
            "vs ideal",
            "most at once",
            "most in 1 s",
            "shortest 21 starts s",
            "first to last start s",
        ),
        note=f"concurrency ideal: {limited_count} / {CONCURRENCY} x {CONCURRENCY_SECONDS} s; "
        f"rate: the last start may not come before ({rated_count} - {RATE_PER_SECOND}) / "
        f"{RATE_PER_SECOND} s after the first; 'most at once' by an INCR at every start; "
        "rate: starts as the server decided them (the sliding window's log, on its clock, "
        "read every 50 ms), and as the tasks saw them (time.time() in the task, a moment "
        "later, one machine)",
    )


def rate_log_key() -> str:
    """The exact sliding window's log of the rated task's starts (score: server time, us)."""
    from django_rcoord.keys import KeySpace

    return KeySpace("ratelimit", "task:bench.controls.rated").key("log")


class RateLog:
    """The starts a rate allowed, as the Redis server decided them: its sliding window's
    log (member: a start, score: the server's time in us), read every 50 ms while the
    block runs. A start stays in the log for at least the window (1 s), so none is
    missed."""

    def __init__(self, client: Any, key: str) -> None:
        self.client, self.key = client, key
        self.seen: dict[bytes, float] = {}
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._read, name="rate-log", daemon=True)

    def __enter__(self) -> RateLog:
        self._reader.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._reader.join(10)
        self._read_once()

    def _read(self) -> None:
        while not self._stop.wait(0.05):
            self._read_once()

    def _read_once(self) -> None:
        for member, score in self.client.zrange(self.key, 0, -1, withscores=True):
            self.seen[member] = score / 1e6

    def times(self) -> list[float]:
        return sorted(self.seen.values())


def shortest_span(times: list[float], count: int) -> float:
    """The shortest time from the first to the last of ``count`` consecutive sorted
    ``times``."""
    return min(b - a for a, b in zip(times, times[count - 1 :], strict=False))


def wait_for(client: Any, key: str, count: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while int(client.llen(key)) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {client.llen(key)} of {count} tasks ran within {timeout} s")
        time.sleep(0.01)


def most_in_a_window(times: list[float], seconds: float) -> int:
    """The most of the sorted ``times`` within any window [t, t + ``seconds``)."""
    most, first = 0, 0
    for last, at in enumerate(times):
        while at - times[first] >= seconds:
            first += 1
        most = max(most, last - first + 1)
    return most


def run(bench: Bench) -> ScenarioResult:
    from benchmarks.common import configure_django

    configure_django(bench.url)
    os.environ["BENCH_REDIS_URL"] = bench.url
    RoundTrips.install()
    tasks = register()
    tables = [enqueue_table(bench, tasks)]
    bench.client.flushdb()
    tables.append(end_to_end_table(bench, tasks))
    bench.client.flushdb()
    tables.append(limits_table(bench, tasks))
    return ScenarioResult(
        NAME,
        "Task controls: what each option costs, and the limits across workers",
        tables,
        params={
            "enqueue": bench.pick(quick=300, full=3000),
            "end_to_end": bench.pick(quick=300, full=5000),
            "concurrency_tasks": bench.pick(quick=100, full=300),
            "rate_tasks": bench.pick(quick=60, full=200),
        },
        repeats=bench.repeats_or(3),
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        RoundTrips.install()
        if sys.argv[2] == "drain":
            drain_worker(*sys.argv[3:])
        else:
            limits_worker(*sys.argv[3:])
    else:
        run_benchmark(NAME, __doc__.splitlines()[0])
