"""Lock benchmark: uncontended acquire+release cycles per second, side by side.

python -m benchmarks.locks [--count N] [--repeats R]
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable

from benchmarks import book
from benchmarks.common import measure, print_table, run_benchmark, two_pings


def handoff_latencies(
    make_holder: Callable[[], tuple[Callable[[], object], Callable[[], object]]],
    rounds: int,
) -> list[float]:
    """Seconds from a holder's release to a blocked waiter's acquire, per round.

    ``make_holder()`` returns (acquire, release) callables for a fresh holder of
    one shared lock; the waiter blocks in acquire before the holder releases.
    """
    latencies = []
    for _ in range(rounds):
        hold, let_go = make_holder()
        wait, done = make_holder()
        hold()
        acquired_at: list[float] = []

        def waiter(
            wait: Callable[[], object] = wait, acquired_at: list[float] = acquired_at
        ) -> None:
            wait()
            acquired_at.append(time.perf_counter())

        thread = threading.Thread(target=waiter)
        thread.start()
        time.sleep(0.05)  # the waiter is now blocked
        released_at = time.perf_counter()
        let_go()
        thread.join()
        done()
        latencies.append(acquired_at[0] - released_at)
    return latencies


def scenario(client, count: int, repeats: int) -> None:
    from django_rcoord.locks import Lock

    def rcoord_cycle() -> None:
        lock = Lock("bench", timeout=10, wait=0, client=client)
        lock.acquire()
        lock.release()

    redis_py_lock = client.lock("redis-py-bench", timeout=10, blocking=False)

    def redis_py_cycle() -> None:
        redis_py_lock.acquire()
        redis_py_lock.release()

    def book_cycle() -> None:
        identifier = book.acquire_lock_with_timeout(client, "book-bench", 0.01, 10)
        book.release_lock(client, "book-bench", identifier)

    rows = [
        two_pings(client, count=count, repeats=repeats),
        measure("django-rcoord Lock", "2", rcoord_cycle, count=count, repeats=repeats),
        measure("redis-py Lock", "2", redis_py_cycle, count=count, repeats=repeats),
        measure(
            "book: SETNX+EXPIRE / WATCH..EXEC",
            "2 + 3",
            book_cycle,
            count=count,
            repeats=repeats,
        ),
    ]
    try:
        import redis_lock  # python-redis-lock, from the bench extra
    except ImportError:
        print("(python-redis-lock not installed: pip install 'django-rcoord[bench]')")
    else:
        peer = redis_lock.Lock(client, "prl-bench", expire=10)

        def prl_cycle() -> None:
            peer.acquire(blocking=False)
            peer.release()

        rows.append(measure("python-redis-lock", "2", prl_cycle, count=count, repeats=repeats))
    print_table(f"Uncontended acquire+release cycles, {repeats} x {count}", rows, baseline=rows[0])

    def rcoord_holder():
        lock = Lock("handoff", timeout=30, wait=30, client=client)
        return lock.acquire, lock.release

    def redis_py_holder():
        # thread_local=False: its token is per thread by default, and the
        # waiter acquires in another thread than the one that releases.
        lock = client.lock("redis-py-handoff", timeout=30, blocking_timeout=30, thread_local=False)
        return lock.acquire, lock.release

    def book_holder():
        identifier: list[str] = []

        def acquire() -> None:
            identifier.append(book.acquire_lock_with_timeout(client, "book-handoff", 30, 30))

        return acquire, lambda: book.release_lock(client, "book-handoff", identifier[0])

    holders = [
        ("django-rcoord Lock (BLPOP wake-up)", rcoord_holder),
        ("redis-py Lock (sleep 0.1 s poll)", redis_py_holder),
        ("book (sleep 1 ms poll)", book_holder),
    ]
    try:
        import redis_lock
    except ImportError:
        pass
    else:

        def prl_holder():
            lock = redis_lock.Lock(client, "prl-handoff", expire=30)
            return lock.acquire, lock.release

        holders.append(("python-redis-lock (BLPOP wake-up)", prl_holder))
    rounds = max(5, min(30, count // 100))
    print(f"\nRelease -> blocked waiter's acquire, {rounds} rounds")
    print(f"{'':<36} {'median ms':>10} {'max ms':>8}")
    for name, make_holder in holders:
        latencies = handoff_latencies(make_holder, rounds)
        print(
            f"{name:<36} {statistics.median(latencies) * 1000:>10.2f} {max(latencies) * 1000:>8.2f}"
        )


if __name__ == "__main__":
    run_benchmark(__doc__.splitlines()[0], scenario)
