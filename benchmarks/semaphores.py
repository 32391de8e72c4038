"""Semaphore benchmark: uncontended acquire+release cycles per second, side by side.

python -m benchmarks.semaphores [--count N] [--repeats R]
"""

from __future__ import annotations

from benchmarks import book
from benchmarks.common import measure, print_table, run_benchmark, two_pings


def scenario(client, count: int, repeats: int) -> None:
    from django_rcoord.semaphores import Semaphore

    fair = Semaphore("bench-fair", 5, client=client)
    counting = Semaphore("bench-counting", 5, fair=False, client=client)

    def fair_cycle() -> None:
        fair.release(fair.acquire())

    def counting_cycle() -> None:
        counting.release(counting.acquire())

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

    rows = [
        two_pings(client, count=count, repeats=repeats),
        measure("django-rcoord fair Semaphore", "2", fair_cycle, count=count, repeats=repeats),
        measure(
            "django-rcoord counting Semaphore",
            "2",
            counting_cycle,
            count=count,
            repeats=repeats,
        ),
        measure("book: fair semaphore", "3", book_fair_cycle, count=count, repeats=repeats),
        measure(
            "book: fair semaphore with lock",
            "1+2+1 + 3",
            book_with_lock_cycle,
            count=count,
            repeats=repeats,
        ),
        measure("book: counting semaphore", "2", book_counting_cycle, count=count, repeats=repeats),
    ]
    try:
        from dramatiq.rate_limits import ConcurrentRateLimiter
        from dramatiq.rate_limits.backends import RedisBackend
    except ImportError:
        print("(dramatiq not installed: pip install 'django-rcoord[bench]')")
    else:
        limiter = ConcurrentRateLimiter(RedisBackend(client=client), "bench", limit=5)

        def dramatiq_cycle() -> None:
            with limiter.acquire(raise_on_failure=False):
                pass

        rows.append(
            measure(
                "dramatiq ConcurrentRateLimiter",
                "6 (WATCH)",
                dramatiq_cycle,
                count=count,
                repeats=repeats,
            )
        )
    print_table(f"Uncontended acquire+release cycles, limit 5, {repeats} x {count}", rows, rows[0])


if __name__ == "__main__":
    run_benchmark(__doc__.splitlines()[0], scenario)
