"""The fault matrix: each step of a lock, a semaphore or the worker that talks to Redis, with
its reply cut after the server ran the command (``tests.faultproxy``: a real TCP proxy), the client
resending the command (redis-py's retries) or not. Each cell asserts safety (one holder,
fencing tokens increasing, holders within the limit), liveness (a live waiter holds within
``LIVE_BOUND``) and no leak (nothing held once every caller is done; every task run once).

The steps and faults covered elsewhere: a waiter SIGKILLed with the hand-over in its socket
(``test_lock_liveness``), a holder SIGKILLed (``test_locks``:
``test_dead_holder_is_replaced_when_its_ttl_runs_out``), a raising caller inside the
middleware (``test_middleware``), a Redis restart and READONLY under workers
(``test_faults``), the worker's exchange retried (``test_worker_faults``).
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_rcoord.connection import get_client
from django_rcoord.exceptions import TaskTimeLimitExceeded
from django_rcoord.locks import Lock, LockLost
from django_rcoord.queues import (
    enqueue_many,
    execute_later,
    fan_in_status,
    group,
    queue_stats,
    recover_and_promote,
)
from django_rcoord.queues.keys import QueueKeys
from django_rcoord.queues.periodic import fire_due
from django_rcoord.queues.schedules import Schedule
from django_rcoord.queues.worker import Worker
from django_rcoord.scripts import get_script
from django_rcoord.semaphores import Semaphore
from tests import cluster, tasks
from tests.faultproxy import FaultProxy
from tests.procs import wait_until
from tests.test_lock_liveness import LIVE_BOUND
from tests.test_locks import blocked_count_is, has_compare_and_set, lock_key, patient_client
from tests.test_queues import ran, result_of
from tests.test_worker_faults import lost_deliveries

pytestmark = pytest.mark.skipif(cluster.ENABLED, reason="a proxy to one server")

TIMEOUT = 30
#: Whether the client resends a command whose reply it lost (redis-py's retries).
RESENT = pytest.mark.parametrize("resent", [True, False], ids=["resent", "not-resent"])
FAIR = pytest.mark.parametrize("fair", [True, False], ids=["fair", "non-fair"])


@pytest.fixture
def proxy(redis_client: Any) -> Iterator[FaultProxy]:
    kwargs = redis_client.connection_pool.connection_kwargs
    address = kwargs["path"] if "path" in kwargs else (kwargs["host"], kwargs["port"])
    fault_proxy = FaultProxy(address)
    yield fault_proxy
    fault_proxy.close()


def through(proxy: FaultProxy, *, resent: bool) -> redis.Redis:
    """A client through the proxy that resends a command whose reply it lost, or not. Its
    connections are named ``FIRST`` on the server (``CLIENT KILL`` finds them)."""
    retry = Retry(NoBackoff(), 3 if resent else 0)
    return redis.Redis.from_url(
        proxy.url,
        retry=retry,
        retry_on_error=[redis.exceptions.ConnectionError],
        client_name=FIRST,
        # The proxy's threads live in the test process: a process stalled on a busy machine
        # stalls them too, and a reply they relay late is not a fault under test (a cut
        # closes the connection at once, whatever the timeout).
        socket_timeout=30,
    )


FIRST = "rcoord-test-first-waiter"


def kill_blocked_first() -> None:
    """CLIENT KILL of the connection the first waiter blocks on: the server closes it."""
    client = get_client()
    wait_until(
        lambda: any(c["name"] == FIRST and c["cmd"] == "blpop" for c in client.client_list())
    )
    for connection in client.client_list():
        if connection["name"] == FIRST and connection["cmd"] == "blpop":
            client.client_kill_filter(_id=connection["id"])


def sha(script: str) -> str:
    """The SHA1 whose reply a test cuts; the script is loaded first, so the cut falls on
    its run and not on a NOSCRIPT answer (which it gets where no earlier test ran it)."""
    source = get_script(script)
    get_client().script_load(source.script)
    return source.sha


def holder_is(name: str, identifier: str | None) -> bool:
    held = get_client().get(lock_key(name, "owner"))
    return (held.decode() if held else None) == identifier


# -- acquire ---------------------------------------------------------------------------
@RESENT
@FAIR
def test_acquire_with_its_reply_cut(proxy: FaultProxy, resent: bool, fair: bool) -> None:
    """Resent: the caller gets the lock it was granted (once, its token). Not resent: the
    caller raises and gives the grant back, so the next caller takes the lock at once."""
    name = f"cut-acquire-{resent}-{fair}"
    lock = Lock(name, timeout=TIMEOUT, wait=5, fair=fair, client=through(proxy, resent=resent))
    proxy.cut_reply_to(sha("lock_acquire"))
    if resent:
        started = time.monotonic()
        assert lock.acquire()
        assert time.monotonic() - started < 5  # not a wait for itself until the TTL
        assert holder_is(name, lock.identifier)
        assert lock.token == int(get_client().get(lock_key(name, "fence")))
        lock.release()
    else:
        with pytest.raises(redis.exceptions.ConnectionError):
            lock.acquire()
    assert proxy.cut == 1
    assert Lock(name, wait=0).acquire() is True  # nothing left held


# -- a release with two waiters ----------------------------------------------------------
def release_to_two_waiters(
    proxy: FaultProxy, name: str, cut: bytes | str | None, *, resent: bool, fair: bool = True
) -> tuple[Any, float | None, float]:
    """A holder releases to two waiters, each in a thread: the first, blocked first, through
    the proxy, which cuts its reply to the command holding ``cut`` (None: its blocked
    connection is killed by the server, CLIENT KILL, before the release); the second behind
    it.
    Returns (the first's outcome: when it held the lock, or its error; when the second held
    it; when the holder released), once both are done (and have released)."""
    signal = lock_key(name, "signal")
    holder = Lock(name, timeout=TIMEOUT, wait=0, fair=fair)
    assert holder.acquire()
    waiters = [
        Lock(name, timeout=TIMEOUT, wait=TIMEOUT, fair=fair, client=through(proxy, resent=resent)),
        Lock(name, timeout=TIMEOUT, wait=TIMEOUT, fair=fair, client=patient_client()),
    ]
    outcomes: list[Any] = [None, None]

    def wait(index: int) -> None:
        try:
            assert waiters[index].acquire()
            outcomes[index] = time.monotonic()
            waiters[index].release()
        except redis.exceptions.ConnectionError as exc:
            outcomes[index] = exc

    threads = [threading.Thread(target=wait, args=(index,)) for index in range(2)]
    for blocked, thread in enumerate(threads, start=1):
        thread.start()
        wait_until(lambda: blocked_count_is(signal, blocked))  # noqa: B023
    if cut is None:
        kill_blocked_first()
    else:
        proxy.cut_reply_to(cut)
    released_at = time.monotonic()
    holder.release()
    for thread in threads:
        thread.join(TIMEOUT)
        assert not thread.is_alive(), "a waiter hung"  # fails here, not in a later test
    return outcomes[0], outcomes[1], released_at


@RESENT
def test_a_hand_over_whose_confirmation_reply_is_cut(proxy: FaultProxy, resent: bool) -> None:
    """The waiter handed the lock confirms it (the acquire script under the grant: the next
    one it sends after its BLPOP); that reply is cut. Resent: it holds the lock. Not resent:
    it raises and gives the grant back, and the waiter behind it holds the lock within the
    bound."""
    name = f"cut-confirm-{resent}"
    first, second, released_at = release_to_two_waiters(
        proxy, name, sha("lock_acquire"), resent=resent
    )
    assert proxy.cut == 1
    if resent:
        assert isinstance(first, float)
    else:
        assert isinstance(first, redis.exceptions.ConnectionError)
    assert isinstance(second, float)
    assert second - released_at < LIVE_BOUND
    assert Lock(name, wait=0).acquire() is True


@RESENT
@FAIR
def test_a_popped_hand_over_whose_reply_is_cut(proxy: FaultProxy, resent: bool, fair: bool) -> None:
    """Redis popped the hand-over (or wake-up) into a connection that was then cut: it is
    gone. A live waiter (the same one, resent, or the one behind) holds within the bound."""
    name = f"cut-blpop-{resent}-{fair}"
    first, second, released_at = release_to_two_waiters(
        proxy, name, b"BLPOP", resent=resent, fair=fair
    )
    assert proxy.cut >= 1
    held_at = [at for at in (first, second) if isinstance(at, float)]
    assert held_at, (first, second)
    assert min(held_at) - released_at < LIVE_BOUND
    assert Lock(name, wait=0).acquire() is True


@RESENT
@FAIR
def test_a_blocked_waiter_whose_connection_is_killed(
    proxy: FaultProxy, resent: bool, fair: bool
) -> None:
    """CLIENT KILL of the first waiter's blocked connection, then a release: resent, the
    waiter blocks again on a new connection; not resent, it raises and leaves its place. A
    live waiter holds the lock within the bound, and nothing stays held."""
    name = f"killed-waiter-{resent}-{fair}"
    first, second, released_at = release_to_two_waiters(proxy, name, None, resent=resent, fair=fair)
    if resent:
        assert isinstance(first, float)
    else:
        assert isinstance(first, redis.exceptions.ConnectionError)
    assert isinstance(second, float)
    held_at = [at for at in (first, second) if isinstance(at, float)]
    assert min(held_at) - released_at < LIVE_BOUND
    assert Lock(name, wait=0).acquire() is True


# -- release -----------------------------------------------------------------------------
@RESENT
def test_a_release_whose_reply_is_cut(proxy: FaultProxy, resent: bool) -> None:
    """The server released it; the caller lost the reply. Resent, the release finds the lock
    no longer the caller's and says so (LockLost: nothing was taken from anyone). Either
    way the lock is free."""
    name = f"cut-release-{resent}"
    lock = Lock(name, timeout=TIMEOUT, wait=0, client=through(proxy, resent=resent))
    assert lock.acquire()
    proxy.cut_reply_to(sha("lock_release"))
    with pytest.raises(LockLost if resent else redis.exceptions.ConnectionError):
        lock.release()
    assert proxy.cut == 1
    assert get_client().exists(lock_key(name, "owner")) == 0
    assert Lock(name, wait=0).acquire() is True


# -- extend ------------------------------------------------------------------------------
def extend_pattern() -> bytes | str:
    """What an extend sends: one SET ... IFEQ where the server compares, else the script."""
    return b"IFEQ" if has_compare_and_set(get_client()) else sha("lock_extend")


@RESENT
def test_an_extend_whose_reply_is_cut(proxy: FaultProxy, resent: bool) -> None:
    """The server extended the lock; the caller lost the reply. Resent, the extend runs again
    and holds (it is the caller's lock still). Not resent, it raises, and the lock is still
    the caller's, extended: its release frees it."""
    name = f"cut-extend-{resent}"
    lock = Lock(name, timeout=5, wait=0, client=through(proxy, resent=resent))
    assert lock.acquire()
    lock.extend()  # the server's answer to SET ... IFEQ learnt: the cut hits the extend
    proxy.cut_reply_to(extend_pattern())
    if resent:
        lock.extend(TIMEOUT)
    else:
        with pytest.raises(redis.exceptions.ConnectionError):
            lock.extend(TIMEOUT)
    assert proxy.cut == 1
    assert get_client().pttl(lock_key(name, "owner")) > 5000  # extended, either way
    assert holder_is(name, lock.identifier)
    lock.release()
    assert Lock(name, wait=0).acquire() is True


# -- async -------------------------------------------------------------------------------
def async_through(proxy: FaultProxy, *, resent: bool) -> redis.asyncio.Redis:
    return redis.asyncio.Redis.from_url(
        proxy.url,
        retry=redis.asyncio.retry.Retry(NoBackoff(), 3 if resent else 0),
        retry_on_error=[redis.exceptions.ConnectionError],
    )


@RESENT
async def test_async_release_and_extend_with_their_replies_cut(
    proxy: FaultProxy, resent: bool
) -> None:
    """``aextend`` and ``arelease`` as their sync twins: an extend cut is the caller's lock
    still, extended; a release cut frees the lock (resent, it says LockLost: nothing was
    taken from anyone)."""
    name = f"cut-arelease-{resent}"
    client = async_through(proxy, resent=resent)
    lock = Lock(name, timeout=5, wait=0, client=client)
    try:
        assert await lock.aacquire()
        await lock.aextend()
        proxy.cut_reply_to(extend_pattern())
        if resent:
            await lock.aextend(TIMEOUT)
        else:
            with pytest.raises(redis.exceptions.ConnectionError):
                await lock.aextend(TIMEOUT)
        assert get_client().pttl(lock_key(name, "owner")) > 5000
        proxy.cut_reply_to(sha("lock_release"))
        with pytest.raises(LockLost if resent else redis.exceptions.ConnectionError):
            await lock.arelease()
        assert proxy.cut == 2
        assert get_client().exists(lock_key(name, "owner")) == 0
        assert Lock(name, wait=0).acquire() is True
    finally:
        await client.aclose()


@RESENT
async def test_async_acquire_with_its_reply_cut(proxy: FaultProxy, resent: bool) -> None:
    name = f"cut-aacquire-{resent}"
    client = async_through(proxy, resent=resent)
    lock = Lock(name, timeout=TIMEOUT, wait=5, client=client)
    proxy.cut_reply_to(sha("lock_acquire"))
    try:
        if resent:
            assert await lock.aacquire()
            assert holder_is(name, lock.identifier)
            await lock.arelease()
        else:
            with pytest.raises(redis.exceptions.ConnectionError):
                await lock.aacquire()
            # The grant is given back in the background.
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if not get_client().exists(lock_key(name, "owner")):
                    break
                await asyncio.sleep(0.01)
        assert proxy.cut == 1
        assert Lock(name, wait=0).acquire() is True
    finally:
        await client.aclose()


# -- semaphores --------------------------------------------------------------------------
@RESENT
def test_a_semaphore_acquire_with_its_reply_cut(proxy: FaultProxy, resent: bool) -> None:
    """Resent: the caller gets the permit it was granted, not a second one nor a place
    behind itself. Not resent: it raises, and the permit goes back."""
    name = f"cut-semaphore-{resent}"
    semaphore = Semaphore(name, 1, timeout=TIMEOUT, client=through(proxy, resent=resent))
    proxy.cut_reply_to(sha("semaphore_acquire"))
    if resent:
        identifier = semaphore.acquire(wait=2)
        assert identifier is not None
        assert Semaphore(name, 1).holders() == 1
        assert semaphore.release(identifier)
    else:
        with pytest.raises(redis.exceptions.ConnectionError):
            semaphore.acquire(wait=2)
    assert proxy.cut == 1
    assert Semaphore(name, 1).holders() == 0


@RESENT
def test_a_semaphore_release_whose_reply_is_cut(proxy: FaultProxy, resent: bool) -> None:
    """The server released the permit; the caller lost the reply. Resent, the release finds
    the permit gone and answers False (nothing was taken from anyone); not resent, it
    raises. Either way the permit is back for the next caller."""
    name = f"cut-semaphore-release-{resent}"
    semaphore = Semaphore(name, 1, timeout=TIMEOUT, client=through(proxy, resent=resent))
    identifier = semaphore.acquire()
    assert identifier is not None
    proxy.cut_reply_to(sha("semaphore_release"))
    if resent:
        assert semaphore.release(identifier) is False
    else:
        with pytest.raises(redis.exceptions.ConnectionError):
            semaphore.release(identifier)
    assert proxy.cut == 1
    assert Semaphore(name, 1).holders() == 0
    assert Semaphore(name, 1).acquire() is not None


# -- the worker ------------------------------------------------------------------------
#: A worker closes the database connections a task may have left (as a request does):
#: its cells may touch the test database, as the worker's own tests do.
WORKER_DB = pytest.mark.django_db(transaction=True)


def taken_jobs(worker: Worker, count: int) -> list[Any]:
    """``count`` tasks queued and taken by ``worker`` (in flight, under its lease)."""
    enqueue_many([(tasks.record, (f"g{n}",), {}) for n in range(count)])
    jobs = worker.session.exchange([], count)
    assert len(jobs) == count
    assert queue_stats("default")["in_flight"] == count
    return jobs


@WORKER_DB
@RESENT
def test_a_give_back_with_its_reply_cut(proxy: FaultProxy, resent: bool) -> None:
    """The worker gives back tasks it took (it stops, or they waited behind a long task)
    and the reply is cut. Resent, the second call finds them given back already and gives
    back nothing twice; not resent, the call raises and asking again changes nothing. Each
    task is ready once, with no delivery counted, and runs once."""
    worker = Worker(["default"], burst=True, client=through(proxy, resent=resent))
    jobs = taken_jobs(worker, 3)
    proxy.cut_reply_to(sha("task_give_back"))
    if resent:
        worker.session.give_back(jobs)
    else:
        with pytest.raises(redis.exceptions.ConnectionError):
            worker.session.give_back(jobs)
        worker.session.give_back(jobs)  # the keeper's next turn: nothing left to give
    assert proxy.cut == 1
    assert queue_stats("default") == {"ready": 3, "in_flight": 0, "delayed": 0, "dead": 0}
    assert all(result_of(job.id).worker_ids == [] for job in jobs)
    assert Worker(["default"], burst=True).run() == 3
    assert sorted(ran()) == ["g0", "g1", "g2"]


@WORKER_DB
@RESENT
def test_a_finish_with_its_reply_cut(proxy: FaultProxy, resent: bool) -> None:
    """A worker finishes a task (and takes the next ones) and the reply is cut after the
    server ran it. Resent by the client, or retried by the worker after its backoff, the
    call is answered as it ran: every task runs once, none twice, nothing stays in flight."""
    worker = Worker(["default"], burst=True, client=through(proxy, resent=resent))
    enqueue_many([(tasks.record, (f"f{n}",), {}) for n in range(6)])
    proxy.cut_reply_to(sha("task_finish"))
    assert worker.run() == 6
    assert proxy.cut == 1
    assert sorted(ran()) == [f"f{n}" for n in range(6)]
    assert queue_stats("default") == {"ready": 0, "in_flight": 0, "delayed": 0, "dead": 0}
    assert lost_deliveries() == []


@WORKER_DB
@RESENT
def test_a_finish_that_counts_fan_in_children_with_its_reply_cut(
    proxy: FaultProxy, resent: bool
) -> None:
    """The call that records the ends of a fan-in's children also counts them (they are in
    their callback's queue group), and its reply is cut: answered as it ran, each child is
    counted once and the callback runs once, with every result."""
    job = group(*(tasks.square.s(n) for n in range(6))).then(tasks.collect.s("cut"))
    worker = Worker(["default"], burst=True, client=through(proxy, resent=resent))
    proxy.cut_reply_to(sha("task_finish"))
    assert worker.run() == 7  # the six children, then the callback
    assert proxy.cut == 1
    status = fan_in_status(job.id)
    assert status is not None
    assert (status.state, status.ended, status.failed) == ("fired", 6, 0)
    assert get_client().lrange(f"{tasks.FAN_IN}:cut", 0, -1) == [b"[0, 1, 4, 9, 16, 25]"]
    assert lost_deliveries() == []


# -- the poller ------------------------------------------------------------------------
@WORKER_DB
@RESENT
def test_a_promotion_with_its_reply_cut(proxy: FaultProxy, resent: bool) -> None:
    """The poller's promotion of due tasks (with the recovery of expired leases) has its
    reply cut: resent, or asked again on the poller's next pass, each due task is ready
    once."""
    client = through(proxy, resent=resent)
    for n in range(5):
        execute_later("default", "tests.tasks.record", [f"d{n}"], 0.01)
    time.sleep(0.05)  # due: the server's clock decides, 40 ms of margin past 10 ms
    proxy.cut_reply_to(sha("task_recover"))
    if resent:
        recover_and_promote(QueueKeys.of("default"), client=client)
    else:
        with pytest.raises(redis.exceptions.ConnectionError):
            recover_and_promote(QueueKeys.of("default"), client=client)
        recover_and_promote(QueueKeys.of("default"), client=client)
    assert proxy.cut == 1
    assert queue_stats("default") == {"ready": 5, "in_flight": 0, "delayed": 0, "dead": 0}
    assert Worker(["default"], burst=True).run() == 5
    assert sorted(ran()) == [f"d{n}" for n in range(5)]


@WORKER_DB
@RESENT
@pytest.mark.parametrize("step", ["periodic_claim", "periodic_queue"])
def test_a_periodic_tick_with_a_reply_cut(proxy: FaultProxy, resent: bool, step: str) -> None:
    """A poller firing a schedule's tick has the reply to its claim, or to the queueing of
    the claimed tick, cut: resent, or fired again on its next pass, the tick is queued
    once."""
    client = through(proxy, resent=resent)
    schedule = Schedule(f"cut-{step}", "tests.tasks.record", every=3600, args=["tick"])
    seconds, microseconds = get_client().time()
    now = seconds * 1000 + microseconds // 1000
    due = schedule.latest_tick(now) + 1  # just past a tick: it is due
    proxy.cut_reply_to(sha(step))
    if resent:
        # A resent queueing finds the tick queued (by its first send) and says so: it cannot
        # tell itself from another poller queueing the same claimed tick.
        assert fire_due(client, due, [schedule])[0] == (0 if step == "periodic_queue" else 1)
    else:
        with pytest.raises(redis.exceptions.ConnectionError):
            fire_due(client, due, [schedule])
        fire_due(client, due, [schedule])
    assert proxy.cut == 1
    assert fire_due(client, due, [schedule])[0] == 0  # not again
    assert queue_stats("default")["ready"] == 1
    assert Worker(["default"], burst=True).run() == 1
    assert ran() == ["tick"]


# -- an exception in the caller ----------------------------------------------------------
@pytest.mark.parametrize("raised", [KeyboardInterrupt, TaskTimeLimitExceeded])
@FAIR
def test_a_waiter_interrupted_while_it_waits(raised: type[BaseException], fair: bool) -> None:
    """Ctrl-C, or a task's time limit (an alarm), raises in a waiter blocked for the lock:
    the exception reaches the caller, the waiter holds nothing, and once the holder
    releases, the next caller holds the lock within the bound (a hand-over that went to the
    interrupted waiter lapses with its lease)."""
    name = f"interrupted-{raised.__name__}-{fair}"
    holder = Lock(name, timeout=TIMEOUT, wait=0, fair=fair)
    assert holder.acquire()
    waiter = Lock(name, timeout=TIMEOUT, wait=TIMEOUT, fair=fair)

    def interrupt(signum: int, frame: Any) -> None:
        raise raised("interrupted while waiting")

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(raised):
            waiter.acquire()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert waiter.identifier is None
    released_at = time.monotonic()
    holder.release()
    assert Lock(
        name, timeout=TIMEOUT, wait=LIVE_BOUND, fair=fair, client=patient_client()
    ).acquire()
    assert time.monotonic() - released_at < LIVE_BOUND
