"""Semaphore benchmark: uncontended acquire+release cycles per second, side by side.

    python -m benchmarks.semaphores [--quick] [--repeats R]

Limit 5, one client, so every acquire succeeds: the cost of the algorithm's
round trips and server-side work. Peers: the book's counting, fair and
fair-with-lock semaphores (benchmarks/book.py) and dramatiq's
``ConcurrentRateLimiter``.
"""

from __future__ import annotations

from benchmarks import book
from benchmarks.common import (
    Bench,
    ScenarioResult,
    Table,
    measure_side_by_side,
    missing,
    ping_operation,
)
from benchmarks.runner import run_benchmark

NAME = "semaphores"


def run(bench: Bench) -> ScenarioResult:
    from django_rcoord.semaphores import Semaphore

    client = bench.client
    count = bench.pick(quick=300, full=2000)
    repeats = bench.repeats_or(bench.pick(quick=3, full=5))

    fair = Semaphore("bench-fair", 5, client=client)
    counting = Semaphore("bench-counting", 5, fair=False, client=client)

    def fair_cycle() -> None:
        identifier = fair.acquire()
        assert identifier is not None  # uncontended: always granted
        fair.release(identifier)

    def counting_cycle() -> None:
        identifier = counting.acquire()
        assert identifier is not None
        counting.release(identifier)

    def book_fair_cycle() -> None:
        book.release_fair_semaphore(
            client, "book-fair", book.acquire_fair_semaphore(client, "book-fair", 5)
        )

    def book_with_lock_cycle() -> None:
        book.release_fair_semaphore(
            client, "book-lock", book.acquire_semaphore_with_lock(client, "book-lock", 5)
        )

    def book_counting_cycle() -> None:
        book.release_semaphore(
            client, "book-counting", book.acquire_semaphore(client, "book-counting", 5)
        )

    operations = [
        ping_operation(client, 2),
        ("django-rcoord fair Semaphore", "1 + 1", fair_cycle),
        ("django-rcoord counting Semaphore", "1 + 1", counting_cycle),
        ("book: fair semaphore", "2 + 1", book_fair_cycle),
        ("book: fair semaphore with lock", "1+2+3 + 1", book_with_lock_cycle),
        ("book: counting semaphore", "1 + 1", book_counting_cycle),
    ]
    absent = []
    try:
        from dramatiq.rate_limits import ConcurrentRateLimiter
        from dramatiq.rate_limits.backends import RedisBackend
    except ImportError:
        absent.append(
            missing(
                "dramatiq ConcurrentRateLimiter",
                "3 + 3 (WATCH)",
                "dramatiq not installed (pip install -e '.[bench]')",
            )
        )
    else:
        limiter = ConcurrentRateLimiter(RedisBackend(client=client), "bench", limit=5)

        def dramatiq_cycle() -> None:
            with limiter.acquire(raise_on_failure=False):
                pass

        operations.append(("dramatiq ConcurrentRateLimiter", "3 + 3 (WATCH)", dramatiq_cycle))
    rows = measure_side_by_side(operations, count=count, repeats=repeats) + absent
    table = Table(
        f"Uncontended acquire+release, limit 5, {repeats} x {count}",
        "cycles/s",
        rows,
        floor=rows[0].name,
    )
    return ScenarioResult(NAME, "Semaphores", [table], params={"count": count}, repeats=repeats)


if __name__ == "__main__":
    run_benchmark(NAME, __doc__.splitlines()[0])
