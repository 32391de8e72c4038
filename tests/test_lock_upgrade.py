"""This release's locks beside the previous release's, on one Redis (a rolling deploy): the
previous release's scripts (``tests/previous_release/lua``) and its waiter's steps, as its
Python took them, against this release's. Safe both ways, and live: a hand-over of either
is confirmed by a waiter of the other."""

from __future__ import annotations

import threading
import time

from django_rcoord.connection import get_client
from django_rcoord.locks import Lock, new_identifier, protocol
from django_rcoord.scripts import run_script
from tests.procs import wait_until, within_a_window
from tests.test_locks import blocked_count_is, lock_key

PREVIOUS = "tests.previous_release"
TIMEOUT = 30


def keys_of(name: str) -> list[str]:
    return [lock_key(name, part) for part in protocol.KEY_PARTS]


def previous_acquire(name: str, identifier: str, ttl_ms: int, block_ms: int) -> int:
    args = (identifier, ttl_ms, block_ms, 0)
    return int(run_script("lock_acquire", get_client(), keys_of(name), args, package=PREVIOUS))


def previous_release(name: str, identifier: str, ttl_ms: int) -> int:
    args = (identifier, ttl_ms, 1)  # a fair release
    return int(run_script("lock_release", get_client(), keys_of(name), args, package=PREVIOUS))


def previous_waiter_takes(name: str, ttl_ms: int) -> tuple[str, int] | None:
    """The previous release's waiter after its refused ask: BLPOP the wake-up list; a
    hand-over whose TTL is not its own is extended to its own (lock_extend.lua, unchanged)."""
    popped = get_client().blpop([lock_key(name, "signal")], timeout=TIMEOUT)
    assert popped is not None
    fields = popped[1].split(b":", 2)
    identifier, token, handed_ttl = fields[2].decode(), int(fields[0]), int(fields[1])
    if handed_ttl != ttl_ms:
        extended = run_script("lock_extend", get_client(), keys_of(name)[:1], (identifier, ttl_ms))
        if not extended:
            return None
    return identifier, token


def test_a_hand_over_of_this_release_is_confirmed_by_a_previous_releases_waiter() -> None:
    """This release hands over under a one-second grant lease, which the previous release's
    waiter takes for another TTL than its own and extends to its own: it holds the lock. (A
    try the test was stalled in past the lease is run again.)"""
    within_a_window(a_previous_waiter_confirms, "upgrade-new-to-old")


def a_previous_waiter_confirms(name: str) -> None:
    holder = Lock(name, timeout=TIMEOUT, wait=0)
    assert holder.acquire()
    first_token = holder.token
    assert first_token is not None
    assert previous_acquire(name, new_identifier(), TIMEOUT * 1000, 5000) < 0  # it waits
    holder.release()
    taken = previous_waiter_takes(name, TIMEOUT * 1000)
    assert taken is not None
    identifier, token = taken
    assert token == first_token + 1
    assert get_client().get(lock_key(name, "owner")).decode() == identifier
    assert get_client().pttl(lock_key(name, "owner")) > (TIMEOUT - 2) * 1000  # its own TTL
    assert Lock(name, wait=0).acquire() is False  # held: nobody barges in
    assert previous_release(name, identifier, TIMEOUT * 1000) == 1


def test_a_hand_over_of_the_previous_release_is_confirmed_by_this_releases_waiter() -> None:
    """The previous release hands over with its full TTL; this release's waiter confirms it
    all the same and holds it, with the next token, under its own TTL."""
    name = "upgrade-old-to-new"
    old_holder = new_identifier()
    first_token = previous_acquire(name, old_holder, TIMEOUT * 1000, 0)
    assert first_token > 0
    waiter = Lock(name, timeout=10, wait=TIMEOUT)
    got: list[int | None] = []

    def wait() -> None:
        assert waiter.acquire()
        got.append(waiter.token)
        time.sleep(0.2)
        waiter.release()

    thread = threading.Thread(target=wait)
    thread.start()
    wait_until(lambda: blocked_count_is(lock_key(name, "signal"), 1))
    assert previous_release(name, old_holder, TIMEOUT * 1000) == 1
    thread.join(TIMEOUT)
    assert got == [first_token + 1]


def test_the_previous_releases_acquire_keeps_counting_a_counter_with_a_ttl() -> None:
    """Fencing counters now expire once idle; the previous release's INCR keeps their TTL
    and counts on: tokens still increase, whichever release grants."""
    name = "upgrade-counter"
    lock = Lock(name, timeout=5, wait=0)
    assert lock.acquire()
    token = lock.token
    assert token is not None
    lock.release()
    previous = new_identifier()
    assert previous_acquire(name, previous, 5000, 0) == token + 1
    assert get_client().pttl(lock_key(name, "fence")) > 0
    assert previous_release(name, previous, 5000) == 1
    assert lock.acquire()
    assert lock.token == token + 2
    lock.release()
