"""The lock scripts' arguments and replies, as pure functions (no I/O).

``lock_acquire.lua`` answers a fencing token (> 0) or minus the holder's remaining
TTL in ms; a release hands the lock over to a waiter by pushing
``<token>:<ttl ms>:<identifier>`` on the lock's signal list (a fair lock), or frees it
and wakes one with ``1`` (a non-fair lock: the waiter asks again). See the scripts'
headers for their KEYS and ARGV.
"""

from __future__ import annotations

from typing import Any

from django_rcoord.exceptions import LockLost, LockNotReplicated, LockTimeout

#: The keys of one lock, in the order its scripts take them: "waiters" is the line of
#: waiters (the last one served takes the "waiting" flag down with it), "granted" names a
#: hand-over not confirmed yet (see the scripts' headers).
KEY_PARTS = ("owner", "fence", "signal", "waiting", "waiters", "granted")


def ttl_ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


#: How long a release's hand-over holds the lock for its waiter until the waiter confirms it
#: (extends it to its own TTL); ``lock_release.lua``'s GRANT_LEASE_MS. A waiter that took the
#: hand-over and then stalled, died or lost the reply keeps the lock from the others this
#: long, never for the lock's TTL.
GRANT_LEASE = 1.0

#: The longest a waiter blocks before it asks Redis again: a grant nobody confirmed ends
#: within ``GRANT_LEASE`` and the next waiter to ask takes the lock, so a live waiter holds
#: it within ``GRANT_LEASE + RECHECK`` of a holder's release or death, whatever the TTL.
RECHECK = 1.0


def block_ms(deadline: float, now: float) -> int:
    """The acquire script's ARGV[3]: how long the caller may block if refused, at most
    ``RECHECK`` (0: it will not wait, and raises no "someone waits" flag)."""
    remaining = min(deadline - now, RECHECK)
    return int(remaining * 1000) + 1 if remaining > 0 else 0


def acquire_args(
    identifier: str, lock_ttl_ms: int, block_ms: int, woken: bool
) -> tuple[str, int, int, int]:
    """The acquire script's ARGV. ``woken``: the caller asks because a plain wake-up woke
    it, so the release that sent it may wake a waiter again from now on."""
    return identifier, lock_ttl_ms, block_ms, 1 if woken else 0


def confirm_args(grant: str, lock_ttl_ms: int, waiter: str) -> tuple[str, int, int, int, str]:
    """The acquire script's ARGV that confirm a hand-over to ``grant``: it extends the grant
    to the waiter's own TTL and takes the waiter (``waiter``, its identifier in the line) out
    of the line, so the flag goes with the last waiter. Its reply is an attempt's: the
    token when the caller holds the lock under ``grant`` (confirmed; or, the grant lapsed,
    taken afresh), <= 0 when it lapsed and the lock is busy. It does not wait (the caller
    asks again as the waiter it is)."""
    return grant, lock_ttl_ms, 0, 0, waiter


def holder_ttl(result: int) -> float | None:
    """The holder's remaining TTL in seconds from a refused attempt's reply (None: none)."""
    return -result / 1000 if result < 0 else None


def wait_after_refusal(holder_ttl: float | None, deadline: float, now: float) -> float | None:
    """Seconds to block for a wake-up after a refused attempt, or None when out of time. A
    waiter never blocks past the holder's TTL (a holder that died is replaced on time) nor
    longer than ``RECHECK`` (a grant its waiter never confirmed is taken over on time)."""
    remaining = deadline - now
    if remaining <= 0:
        return None
    block = min(remaining, RECHECK)
    return block if holder_ttl is None else min(block, holder_ttl)


#: A non-fair waiter that was woken and still lost the race (a newcomer, often the releaser,
#: took the lock first) waits this long after its next wake-up before it asks again, and
#: twice as long after each further loss, up to ``RACE_BACKOFF_MAX``: while one process keeps
#: the lock busy, its waiters stay quiet instead of spending a round trip per release.
RACE_BACKOFF_MIN = 0.001
RACE_BACKOFF_MAX = 0.032


def race_backoff(previous: float) -> float:
    """The pause before asking again after a wake-up, once the last wake-up's try lost."""
    return min(RACE_BACKOFF_MAX, previous * 2 if previous else RACE_BACKOFF_MIN)


def handover(token: bytes) -> tuple[str, int, int] | None:
    """(identifier, fencing token, lease ms) of a lock handed over by a release, or None for
    a plain wake-up (``b"1"``). The waiter holds it once it has extended it to its own TTL
    (``confirm_args``): a grant is confirmed, or it lapses."""
    fields = token.split(b":", 2)
    if len(fields) != 3:
        return None
    return fields[2].decode(), int(fields[0]), int(fields[1])


def extend_command(owner_key: bytes, identifier: str, ttl_ms: int) -> tuple[Any, ...]:
    """``lock_extend.lua`` as one command, on servers that have compare-and-set (Redis 8.4+,
    Valkey 8.1+): the owner key keeps ``identifier`` and gets a TTL of ``ttl_ms`` if it holds
    ``identifier``; nil (nothing changed) otherwise."""
    return ("SET", owner_key, identifier, "IFEQ", identifier, "PX", ttl_ms)


def release_args(
    identifier: str, lock_ttl_ms: int, replicas: int, fair: bool = True
) -> tuple[str, int, int]:
    """The release script's ARGV. A fair lock's release hands the lock over to the waiter
    blocked longest; a non-fair one's frees it and wakes a waiter, who asks again and may
    lose to a newcomer (the releaser itself, often). With replicas to wait for, a grant must
    be acknowledged by them when it is made (acquire sends WAIT): a release then wakes a
    waiter rather than handing the lock over, fair or not."""
    return identifier, lock_ttl_ms, 1 if fair and not replicas else 0


def is_identifier(held: Any, identifier: str) -> bool:
    """Whether the owner key's value ``held`` is ``identifier``."""
    return held in (identifier, identifier.encode())


def lost(name: str) -> LockLost:
    return LockLost(f"Lock {name!r} expired or was taken by another holder.")


def timed_out(name: str, wait: float) -> LockTimeout:
    return LockTimeout(f"Could not acquire lock {name!r} within {wait}s.")


def not_replicated(
    name: str, acknowledged: int, replicas: int, timeout: float
) -> LockNotReplicated:
    return LockNotReplicated(
        f"Lock {name!r} was granted but only {acknowledged} of {replicas} replicas "
        f"acknowledged it within {timeout}s; it was given back."
    )
