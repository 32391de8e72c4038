from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable

import pytest

from django_rcoord.connection import get_client
from django_rcoord.keys import KeySpace
from django_rcoord.semaphores import (
    Semaphore,
    SemaphoreTimeout,
    acquire_fair_semaphore,
    acquire_semaphore,
    acquire_semaphore_with_lock,
    refresh_fair_semaphore,
    release_fair_semaphore,
    release_semaphore,
)
from django_rcoord.semaphores import core as semaphore_core
from tests.procs import run_in_processes, server_now, start_process, wait_until

INSIDE = "test:inside"
VIOLATIONS = "test:violations"


def granted(identifier: str | None) -> str:
    """A permit the test expects to have been given."""
    assert identifier is not None
    return identifier


def in_line(name: str, count: int) -> bool:
    return waiters(name) == count


def holders_key(name: str) -> str:
    return KeySpace("semaphore", name).key("holders")


# -- code run in child processes -------------------------------------------------
def contend(name: str, limit: int, seconds: float, fair: bool, clock_shift: float) -> int:
    """Take permits in a loop for `seconds`; count holders from inside. Returns permits had."""
    if clock_shift:
        # This process's wall clock is hours off; the semaphore must not care.
        real_time = time.time
        time.time = lambda: real_time() + clock_shift
    client = get_client()
    semaphore = Semaphore(name, limit, timeout=5, fair=fair)
    had = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        identifier = semaphore.acquire(wait=2)
        if identifier is None:
            continue
        inside = client.incr(INSIDE)
        if inside > limit:
            client.rpush(VIOLATIONS, inside)
        time.sleep(0.003)
        client.decr(INSIDE)
        assert semaphore.release(identifier)
        had += 1
    return had


def probe(name: str, seconds: float) -> int:
    """A separate process sampling how many hold the semaphore; returns the maximum seen."""
    client = get_client()
    semaphore = Semaphore(name, 1)
    most = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        most = max(most, int(client.get(INSIDE) or 0), semaphore.holders())
    return most


def hold_and_die(name: str, limit: int, timeout: float = 1) -> None:
    """Take a permit and hold it until killed; ``test:holding`` is the server's time just
    before the take (its lease ends ``timeout`` after that at the earliest)."""
    before = server_now()
    Semaphore(name, limit, timeout=timeout).acquire()
    get_client().set("test:holding", before)
    time.sleep(3600)


def wait_in_line(name: str, label: str, waiter_lease: float | None = None) -> None:
    """Wait for a permit, note the order it came in, hold it briefly, release.
    ``waiter_lease``: how long a place in line lasts unless re-asked for (in this process;
    a long one keeps the line as it formed where a stalled waiter re-asks late)."""
    if waiter_lease is not None:
        semaphore_core.WAITER_LEASE = waiter_lease
    semaphore = Semaphore(name, 1, timeout=10)
    identifier = semaphore.acquire(wait=30)
    assert identifier is not None
    get_client().rpush("test:order", label)
    time.sleep(0.05)
    semaphore.release(identifier)


def waiters(name: str) -> int:
    return get_client().zcard(KeySpace("semaphore", name).key("waiters"))


# -- the limit holds under real contention ------------------------------------------
@pytest.mark.slow
# About 45 s for both, whose subject (the scripts' decisions under contention and skewed
# clocks) no version changes: README's command, the embedded session and the stress
# session run them; the other sessions test the same scripts by the tests below.
@pytest.mark.once
@pytest.mark.parametrize("fair", [True, False], ids=["fair", "counting"])
def test_sixteen_processes_never_exceed_the_limit_even_with_skewed_clocks(fair: bool) -> None:
    seconds = 10
    jobs = [("x", 3, seconds, fair, 0.0 if i % 2 else 3 * 3600.0) for i in range(16)]
    results = run_in_processes(
        run_role,
        [("contend", job) for job in jobs] + [("probe", ("x", seconds))],
    )
    permits, most_seen = results[:-1], results[-1]
    client = get_client()
    assert client.llen(VIOLATIONS) == 0
    assert most_seen <= 3
    assert all(had > 0 for had in permits), permits  # shifted clocks starve no one
    assert client.zcard(holders_key("x")) == 0
    print(
        f"\n{'fair' if fair else 'counting'}: {sum(permits)} permits in {seconds}s, "
        f"per process {min(permits)}..{max(permits)}, most holders seen {most_seen}"
    )


def run_role(role: str, args: tuple) -> int:
    roles: dict[str, Callable[..., int]] = {"contend": contend, "probe": probe}
    return roles[role](*args)


# -- leases, refresh, release ------------------------------------------------------------
def test_dead_holders_stop_counting_after_their_timeout() -> None:
    # A 3 s lease: it outlasts the handshake on a busy machine, and it ends well before the
    # 10 s wait, which a permit the dead holder kept for good would run out.
    holder = start_process(hold_and_die, "leased", 1, 3)
    try:
        wait_until(lambda: get_client().exists("test:holding"))
        holder.kill()  # SIGKILL
        semaphore = Semaphore("leased", 1)
        refused = semaphore.acquire()
        lease_ends_after = float(get_client().get("test:holding")) + 3
        # Asked while the dead holder's lease stood (the server's clock says so), refused.
        if server_now() < lease_ends_after:
            assert refused is None
        assert semaphore.acquire(wait=10) is not None
        assert server_now() >= lease_ends_after  # not before the lease ended
    finally:
        holder.kill()
        holder.join()


def test_refresh_of_an_expired_holder_returns_false_and_does_not_readd() -> None:
    semaphore = Semaphore("refresh", 1, timeout=3)  # a refresh 3 s on is late, a stall not
    identifier = granted(semaphore.acquire())
    assert semaphore.refresh(identifier) is True
    time.sleep(3.1)
    assert semaphore.refresh(identifier) is False
    assert get_client().zscore(holders_key("refresh"), identifier) is None
    assert semaphore.release(identifier) is False
    assert semaphore.acquire() is not None


def test_refresh_keeps_a_holder_past_its_timeout() -> None:
    # Refreshed every second, past its 3 s lease: two seconds to spare each time for a test
    # process stalled on a busy machine.
    semaphore = Semaphore("kept", 1, timeout=3)
    identifier = granted(semaphore.acquire())
    for _ in range(4):
        time.sleep(1.0)
        assert semaphore.refresh(identifier)
    assert semaphore.acquire() is None
    assert semaphore.release(identifier)


def test_limit_and_release() -> None:
    semaphore = Semaphore("three", 3)
    permits = [semaphore.acquire() for _ in range(3)]
    assert all(permits)
    assert len(set(permits)) == 3
    assert semaphore.acquire() is None
    assert semaphore.holders() == 3
    assert semaphore.release(granted(permits[0])) is True
    assert semaphore.release(granted(permits[0])) is False
    assert semaphore.acquire() is not None


# -- fairness and waiting ------------------------------------------------------------------
def test_waiters_are_served_first_come_first_served() -> None:
    # The holder's lease outlasts four process starts on a busy machine (a 10 s lease ran out
    # while they started under CI's load, and the line moved before it was complete).
    holder = Semaphore("line", 1, timeout=120)
    held = granted(holder.acquire())
    processes = []
    for index, label in enumerate(["first", "second", "third", "fourth"]):
        processes.append(start_process(wait_in_line, "line", label, 60))
        wait_until(functools.partial(in_line, "line", index + 1))
    assert holder.release(held)
    for process in processes:
        process.join(30)
    assert [label.decode() for label in get_client().lrange("test:order", 0, -1)] == [
        "first",
        "second",
        "third",
        "fourth",
    ]


def test_fair_semaphore_does_not_let_a_newcomer_jump_the_line() -> None:
    holder = Semaphore("no-jumping", 1, timeout=120)  # outlasts a process start under load
    held = granted(holder.acquire())
    waiter = start_process(wait_in_line, "no-jumping", "waiter", 60)
    try:
        wait_until(lambda: waiters("no-jumping") == 1)
        holder.release(held)
        # Whether or not the waiter has taken the freed permit yet, a newcomer gets
        # none: either it is taken, or the waiter is ahead in line.
        assert Semaphore("no-jumping", 1).acquire() is None
        waiter.join(30)
        assert get_client().lrange("test:order", 0, -1) == [b"waiter"]
    finally:
        waiter.kill()


@pytest.mark.parametrize("fair", [True, False], ids=["fair", "counting"])
def test_a_waiter_granted_a_permit_leaves_the_line_and_nobody_waiting_writes_no_line(
    fair: bool,
) -> None:
    client = get_client()
    line_keys = [KeySpace("semaphore", "granted").key(part) for part in ("waiters", "tickets")]
    line_keys.append(KeySpace("semaphore", "granted").key("waiter-leases"))
    semaphore = Semaphore("granted", 1, timeout=10, fair=fair)
    for _ in range(3):  # uncontended: the line's keys are never written
        assert semaphore.release(granted(semaphore.acquire()))
    assert client.exists(*line_keys) == 0
    held = granted(semaphore.acquire())
    given: list[str | None] = []
    thread = threading.Thread(target=lambda: given.append(semaphore.acquire(wait=10)))
    thread.start()
    wait_until(lambda: waiters("granted") == 1)
    assert semaphore.release(held)
    thread.join(10)
    assert given[0] is not None
    assert waiters("granted") == 0
    assert client.zcard(line_keys[2]) == 0  # its place's lease is gone too
    assert semaphore.release(given[0])
    assert semaphore.release(given[0]) is False


def test_semaphore_keys_follow_key_prefix_changes() -> None:
    from django.conf import settings
    from django.test import override_settings

    with override_settings(RCOORD={**settings.RCOORD, "KEY_PREFIX": "other"}):
        identifier = Semaphore("prefixed", 2).acquire()
        assert get_client().zscore("other:semaphore:{prefixed}:holders", identifier)
    assert Semaphore("prefixed", 2)._holders_key == "rcoord:semaphore:{prefixed}:holders"


def test_acquire_waits_the_instances_wait_by_default_as_lock_acquire_does() -> None:
    holder = Semaphore("patient", 1, timeout=30)
    held = granted(holder.acquire())
    patient = Semaphore("patient", 1, timeout=30, wait=20)
    releaser = threading.Timer(0.3, holder.release, args=[held])
    releaser.start()
    try:
        assert patient.acquire() is not None  # waited for the release
    finally:
        releaser.cancel()
    assert Semaphore("patient", 1, wait=20).acquire(wait=0) is None  # an explicit wait wins


async def test_aacquire_waits_the_instances_wait_by_default() -> None:
    holder = Semaphore("patient-async", 1, timeout=30)
    held = granted(await holder.aacquire())
    patient = Semaphore("patient-async", 1, timeout=30, wait=20)
    waiting = asyncio.create_task(patient.aacquire())
    await asyncio.sleep(0.3)
    assert not waiting.done()
    await holder.arelease(held)
    assert await asyncio.wait_for(waiting, 10) is not None


def test_waiter_is_woken_by_release() -> None:
    semaphore = Semaphore("woken", 1, timeout=30)
    held = granted(semaphore.acquire())
    waiter = start_process(wait_in_line, "woken", "w", 60)
    wait_until(lambda: waiters("woken") == 1)
    released_at = time.monotonic()
    semaphore.release(held)
    wait_until(lambda: get_client().llen("test:order") == 1)
    # The holder's lease is 30 s and the waiter re-asks every 30 s (its place lasts 60 s
    # here); the release itself wakes it. (5 s: room for a stalled process.)
    assert time.monotonic() - released_at < 5
    waiter.join(10)


def test_a_waiter_that_died_loses_its_place() -> None:
    holder = Semaphore("dead-waiter", 1, timeout=120)  # outlasts a process start under load
    held = granted(holder.acquire())
    doomed = start_process(wait_in_line, "dead-waiter", "doomed")
    wait_until(lambda: waiters("dead-waiter") == 1)
    doomed.kill()  # SIGKILL
    doomed.join()
    holder.release(held)
    started = time.monotonic()
    assert Semaphore("dead-waiter", 1).acquire(wait=10) is not None
    # The dead waiter's place lapses (2 s); one that kept it would hold this past its wait.
    assert time.monotonic() - started < 9


def test_giving_up_leaves_the_line() -> None:
    holder = Semaphore("impatient", 1, timeout=10)
    held = granted(holder.acquire())
    assert Semaphore("impatient", 1).acquire(wait=0.2) is None
    assert waiters("impatient") == 0
    holder.release(held)


def test_context_manager() -> None:
    semaphore = Semaphore("with", 1, wait=0.1)
    with semaphore as identifier:
        assert get_client().zscore(holders_key("with"), identifier) is not None
        with pytest.raises(SemaphoreTimeout), semaphore:
            pass
    assert semaphore.holders() == 0
    with pytest.raises(ZeroDivisionError), semaphore:
        raise ZeroDivisionError
    assert semaphore.holders() == 0


async def test_async_context_manager_and_waiting() -> None:
    semaphore = Semaphore("async", 2, wait=5)
    held = granted(await semaphore.aacquire())

    async def use() -> str:
        async with semaphore as identifier:
            await asyncio.sleep(0.05)
            return identifier

    results = await asyncio.gather(use(), use(), use())
    assert len(set(results)) == 3
    assert await semaphore.arelease(held)
    assert semaphore.holders() == 0


# -- the book's functions ----------------------------------------------------------------------
def test_book_functions() -> None:
    counting = acquire_semaphore("book", 1, timeout=5)
    assert counting
    assert acquire_semaphore("book", 1) is None
    assert release_semaphore("book", counting)
    fair = acquire_fair_semaphore("book-fair", 1)
    assert fair
    assert acquire_semaphore_with_lock("book-fair", 1) is None
    assert refresh_fair_semaphore("book-fair", fair)
    assert release_fair_semaphore("book-fair", fair)
    assert not refresh_fair_semaphore("book-fair", fair)


def test_every_key_of_a_semaphore_expires_once_idle() -> None:
    """A name used once (a concurrency rule per user, a task's limit key) leaves no key
    without a TTL: holders, the line, its leases and ticket counter, the wake-up list."""
    client = get_client()
    holder = Semaphore("idle-sem", 1, timeout=5)
    permit = holder.acquire()
    assert permit is not None
    assert Semaphore("idle-sem", 1, timeout=5).acquire(wait=0.05) is None  # stood in line
    assert holder.refresh(permit)
    holder.release(permit)
    keys = list(client.scan_iter(match="*idle-sem*"))
    assert keys
    for key in keys:
        assert 0 < client.pttl(key) <= 65_000 + 5_000, key
