"""Delayed-task benchmark: promotion throughput and lateness.

    python -m benchmarks.delayed [--count N] [--repeats R]

1. N tasks already due: promoted per second by django-rcoord's poller (one
   script call per batch of 500) and by the book's poll_queue (one item per
   loop turn, under a lock).
2. Lateness (due -> promoted) of 2,000 tasks due over 2 s, with the poller
   at its default 1 s interval.
"""

from __future__ import annotations

import statistics
import threading
import time

from benchmarks import book
from benchmarks.common import run_benchmark


def scenario(client, count: int, repeats: int) -> None:
    from django_rcoord.delayed import DueTaskPromoter
    from django_rcoord.queues import QueueKeys, execute_later

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

    print(f"\nPromote {count} due tasks, {repeats} runs")
    print(f"{'':<44} {'round trips':>18} {'promoted/s':>11} {'spread':>7}")
    for name, trips, measure in (
        ("django-rcoord poll_delayed (batches of 500)", "1 per 500 tasks", rcoord_rate),
        ("the book's poll_queue (one item, lock)", "7 per task", book_rate),
    ):
        rates = [measure() for _ in range(repeats)]
        median = statistics.median(rates)
        print(f"{name:<44} {trips:>18} {median:>11,.0f} {(max(rates) - min(rates)) / median:>6.0%}")

    # Lateness at the default interval.
    client.flushdb()
    promoter = DueTaskPromoter(client=client)
    thread = threading.Thread(target=promoter.run, daemon=True)
    thread.start()
    time.sleep(0.5)
    spread, tasks = 2.0, 2000
    # Scheduled in one pipeline (quickly), so the poller's thread is not competing with
    # a scheduling loop for the interpreter while it works.
    with client.pipeline(transaction=False) as pipe:
        for index in range(tasks):
            delay = 0.2 + spread * index / tasks
            execute_later("bench", "bench.noop", [], delay=delay, client=pipe)
        pipe.execute()
    time.sleep(spread + 1.5)
    promoter.stop()
    thread.join(5)
    samples = sorted(int(ms) for ms in client.lrange(QueueKeys.of("bench").lateness, 0, -1))

    def pct(p: float) -> int:
        return samples[min(len(samples) - 1, int(len(samples) * p))]

    print(
        f"\nLateness of {len(samples)} promotions (due -> in its queue), interval 1 s: "
        f"median {statistics.median(samples):.0f} ms, p90 {pct(0.9)} ms, p99 {pct(0.99)} ms, "
        f"max {samples[-1]} ms"
    )


if __name__ == "__main__":
    run_benchmark(__doc__.splitlines()[0], scenario)
