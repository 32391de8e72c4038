"""Lock benchmark: uncontended cycles, contended critical sections, hand-off latency.

    python -m benchmarks.locks [--quick] [--repeats R]

1. Uncontended acquire+release cycles per second, one client.
2. Contended: 4 processes loop on one lock; each critical section is a
   non-atomic GET/SET increment of a counter, so the final counter equals the
   number of sections only if the lock excluded. Sections per second in total.
3. Hand-off: seconds from a holder's release to a blocked waiter's acquire.
4. Extend: a held lock's extend as shipped (one ``SET ... IFEQ`` on servers that compare
   and set) beside the script, on the same server.

Peers: redis-py's ``Lock``, python-redis-lock, pottery's ``Redlock`` on one
master, and the book's SETNX lock (benchmarks/book.py).
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from collections.abc import Callable

from benchmarks import book
from benchmarks.common import (
    Bench,
    Gate,
    Measurement,
    ScenarioResult,
    Table,
    measure_side_by_side,
    missing,
    ping_operation,
    pings,
    read_result,
    report,
    spawn_workers,
    stop_workers,
)
from benchmarks.runner import run_benchmark

NAME = "locks"
PROCESSES = 4

# name: (round trips of one uncontended acquire+release, how a blocked waiter waits)
PEERS = {
    "django-rcoord Lock": ("2 (2 scripts)", "BLPOP hand-over"),
    "django-rcoord Lock (fair=False)": ("2 (2 scripts)", "BLPOP wake-up, barging"),
    "redis-py Lock": ("2", "sleep 0.1 s poll"),
    "python-redis-lock": ("2", "BLPOP wake-up"),
    "pottery Redlock (1 master)": ("2 (+ thread pool)", "random sleep <= 0.2 s"),
    "book: SETNX+EXPIRE / WATCH..EXEC": ("2 + 3", "sleep 1 ms poll"),
}
# name: round trips from the start of release to the waiter holding the lock
HANDOFF_TRIPS = {
    "django-rcoord Lock": "1 (BLPOP returns it held)",
    "django-rcoord Lock (fair=False)": "2 (BLPOP wakes, acquire)",
    "redis-py Lock": "2 + sleep",
    "python-redis-lock": "2 (BLPOP returns)",
    "pottery Redlock (1 master)": "2 + sleep",
    "book: SETNX+EXPIRE / WATCH..EXEC": "3 + sleep + 2",
}


def lock_factory(peer: str, client, name: str) -> Callable[[], tuple[Callable, Callable]]:
    """A function returning (acquire, release) callables for a fresh holder of lock ``name``.

    acquire() blocks up to 30 s and returns a true value when the lock is held.
    """
    if peer.startswith("django-rcoord Lock"):
        from django_rcoord.locks import Lock

        fair = peer == "django-rcoord Lock"

        def rcoord_holder():
            lock = Lock(name, timeout=30, wait=30, fair=fair, client=client)
            return lock.acquire, lock.release

        return rcoord_holder
    if peer == "redis-py Lock":

        def redis_py_holder():
            # thread_local=False: its token is per thread by default, and the hand-off
            # waiter acquires in another thread than the one that releases.
            lock = client.lock(name, timeout=30, blocking_timeout=30, thread_local=False)
            return lock.acquire, lock.release

        return redis_py_holder
    if peer == "python-redis-lock":
        import redis_lock

        def prl_holder():
            lock = redis_lock.Lock(client, name, expire=30)
            return (lambda: lock.acquire(blocking=True, timeout=30)), lock.release

        return prl_holder
    if peer == "pottery Redlock (1 master)":
        from pottery import Redlock

        def pottery_holder():
            lock = Redlock(key=name, masters={client}, auto_release_time=30)
            return (lambda: lock.acquire(blocking=True, timeout=30)), lock.release

        return pottery_holder
    if peer == "book: SETNX+EXPIRE / WATCH..EXEC":

        def book_holder():
            identifier: list[str | None] = []

            def acquire() -> str | None:
                identifier[:] = [book.acquire_lock_with_timeout(client, name, 30, 30)]
                return identifier[0]

            def release() -> None:
                assert identifier[0] is not None  # released only after a grant
                book.release_lock(client, name, identifier[0])

            return acquire, release

        return book_holder
    raise ValueError(peer)


def unavailable(peer: str) -> str | None:
    """Why ``peer`` cannot run here, or None."""
    module = {"python-redis-lock": "redis_lock", "pottery Redlock (1 master)": "pottery"}.get(peer)
    if module:
        try:
            __import__(module)
        except ImportError:
            return f"{module} not installed (pip install -e '.[bench]')"
    return None


# -- 1. uncontended --------------------------------------------------------------------------


def uncontended(bench: Bench, count: int, repeats: int) -> Table:
    client = bench.client
    operations = [ping_operation(client, 2)]
    absent = {}
    for peer, (trips, _) in PEERS.items():
        reason = unavailable(peer)
        if reason:
            absent[peer] = missing(peer, trips, reason)
            continue
        make_holder = lock_factory(peer, client, f"bench-{peer}")

        def cycle(make_holder=make_holder) -> None:
            acquire, release = make_holder()
            if not acquire():
                raise RuntimeError("an uncontended lock was not acquired")
            release()

        operations.append((peer, trips, cycle))
    measured = {
        row.name: row for row in measure_side_by_side(operations, count=count, repeats=repeats)
    }
    rows = [measured[operations[0][0]]]
    rows += [measured.get(peer) or absent[peer] for peer in PEERS]
    return Table(
        f"Uncontended acquire+release, {repeats} x {count}",
        "cycles/s",
        rows,
        floor=rows[0].name,
    )


# -- 1b. extend -----------------------------------------------------------------------------


def extend(bench: Bench, count: int, repeats: int) -> Table:
    """A held lock's extend as shipped (one ``SET ... IFEQ`` where the server compares and
    sets, else the script) beside the script on the same server, and one PING."""
    from django_rcoord.connection.features import SET_IFEQ
    from django_rcoord.locks import Lock
    from django_rcoord.scripts import run_script

    client = bench.client
    lock = Lock("bench-extend", timeout=30, wait=0, client=client)
    if not lock.acquire():
        raise RuntimeError("an uncontended lock was not acquired")
    lock.extend()  # the server's answer to SET ... IFEQ learnt before the rows run
    owner = lock._keys[:1]
    identifier = lock.identifier
    shipped = "SET ... IFEQ" if SET_IFEQ.usable(client) else "the script"
    operations = [
        ping_operation(client, 1),
        (f"django-rcoord Lock.extend ({shipped})", "1", lock.extend),
        (
            "lock_extend.lua (the script path)",
            "1",
            lambda: run_script("lock_extend", client, keys=owner, args=(identifier, 30000)),
        ),
    ]
    try:
        rows = measure_side_by_side(operations, count=count, repeats=repeats)
    finally:
        lock.release()
    return Table(f"Extend a held lock, {repeats} x {count}", "extends/s", rows, floor=rows[0].name)


# -- 2. contended ----------------------------------------------------------------------------


def contended_worker(peer: str, url: str, seconds: str, rounds: str) -> None:
    """In each of the worker processes: critical sections for ``seconds``, ``rounds`` times."""
    import redis

    from benchmarks.common import configure_django

    configure_django(url)
    client = redis.Redis.from_url(url)
    gate = Gate(client, f"locks:{peer}")
    counter = f"bench:counter:{peer}"
    make_holder = lock_factory(peer, client, f"contended-{peer}")
    for _ in range(int(rounds)):
        gate.pass_through()
        started = time.time()
        end = time.monotonic() + float(seconds)
        sections = 0
        while time.monotonic() < end:
            acquire, release = make_holder()
            if not acquire():
                continue
            value = int(client.get(counter) or 0)  # deliberately not atomic
            client.set(counter, value + 1)
            release()
            sections += 1
        report({"sections": sections, "started": started, "finished": time.time()})


def contended(bench: Bench, seconds: float, repeats: int) -> Table:
    client = bench.client

    def serial_floor() -> float:
        """One process, the same four round trips per section, no lock to hand over."""
        done, end = 0, time.monotonic() + seconds
        started = time.perf_counter()
        while time.monotonic() < end:
            for _ in range(4):
                client.ping()
            done += 1
        return done / (time.perf_counter() - started)

    rows = [
        Measurement(
            "1 process, 4 x PING per section (the floor)",
            "4",
            [serial_floor() for _ in range(repeats)],
            note="no hand-over between processes",
        )
    ]
    for peer, (trips, waits) in PEERS.items():
        reason = unavailable(peer)
        if reason:
            rows.append(missing(peer, f"{trips} + GET/SET", reason))
            continue
        gate = Gate(client, f"locks:{peer}")
        counter = f"bench:counter:{peer}"
        children = spawn_workers(
            "benchmarks.locks", [peer, bench.url, str(seconds), str(repeats)], PROCESSES
        )
        rates, fairness, broken = [], [], 0
        try:
            for round_ in range(1, repeats + 1):
                client.set(counter, 0)
                gate.wait_ready(PROCESSES, children, round_)
                gate.open(PROCESSES)
                results = [read_result(child) for child in children]
                sections = [result["sections"] for result in results]
                elapsed = max(r["finished"] for r in results) - min(r["started"] for r in results)
                rates.append(sum(sections) / elapsed)
                fairness.append(min(sections) / max(sections) if max(sections) else 0.0)
                broken += sum(sections) - int(client.get(counter) or 0)
            for child in children:
                child.wait(30)
        finally:
            stop_workers(children)
        row = Measurement(peer, f"{trips} + GET/SET", rates, note=f"waiters: {waits}")
        row.extra["fairness"] = statistics.median(fairness)
        row.extra["exclusive"] = "yes" if broken == 0 else f"NO: {broken} increments lost"
        rows.append(row)
    return Table(
        f"Contended: {PROCESSES} processes on one lock, {seconds:g} s x {repeats}",
        "sections/s",
        rows,
        floor=rows[0].name,
        extra_columns=("fairness", "exclusive"),
        note="fairness = fewest / most sections of one process (1 = even); exclusive = the "
        "non-atomic counter equals the sections completed",
    )


# -- 3. hand-off -----------------------------------------------------------------------------


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
            wait: Callable[[], object] = wait,
            done: Callable[[], object] = done,
            acquired_at: list[float] = acquired_at,
        ) -> None:
            wait()
            acquired_at.append(time.perf_counter())
            done()  # by the thread that holds it: a lock may keep its holds per thread

        thread = threading.Thread(target=waiter)
        thread.start()
        time.sleep(0.05)  # the waiter is now blocked
        released_at = time.perf_counter()
        let_go()
        thread.join()
        latencies.append(acquired_at[0] - released_at)
    return latencies


def handoff(bench: Bench, rounds: int, repeats: int) -> Table:
    client = bench.client
    floor = pings(client, 2, count=300, repeats=repeats)
    rows = [
        Measurement(
            "2 x PING (the floor: release, then acquire)",
            "2",
            [1000 / rate for rate in floor.values],
        )
    ]
    for peer, (_, waits) in PEERS.items():
        trips = HANDOFF_TRIPS[peer]
        reason = unavailable(peer)
        if reason:
            rows.append(missing(peer, trips, reason))
            continue
        make_holder = lock_factory(peer, client, f"handoff-{peer}")
        per_repeat = [handoff_latencies(make_holder, rounds) for _ in range(repeats)]
        row = Measurement(
            peer,
            trips,
            [1000 * statistics.median(latencies) for latencies in per_repeat],
            note=f"waiter: {waits}",
        )
        row.extra["max ms"] = 1000 * max(max(latencies) for latencies in per_repeat)
        rows.append(row)
    return Table(
        f"Release -> blocked waiter's acquire, {repeats} x {rounds} rounds",
        "ms",
        rows,
        floor=rows[0].name,
        lower_is_better=True,
        extra_columns=("max ms",),
    )


def run(bench: Bench) -> ScenarioResult:
    count = bench.pick(quick=300, full=2000)
    seconds = bench.pick(quick=0.5, full=3.0)
    rounds = bench.pick(quick=5, full=10)
    repeats = bench.repeats_or(bench.pick(quick=3, full=5))
    tables = [
        uncontended(bench, count, repeats),
        extend(bench, count, repeats),
        contended(bench, seconds, bench.repeats_or(3)),
        handoff(bench, rounds, bench.repeats_or(3)),
    ]
    return ScenarioResult(
        NAME,
        "Locks",
        tables,
        params={
            "uncontended_count": count,
            "contended_processes": PROCESSES,
            "contended_seconds": seconds,
            "handoff_rounds": rounds,
        },
        repeats=repeats,
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        contended_worker(*sys.argv[2:])
    else:
        run_benchmark(NAME, __doc__.splitlines()[0])
