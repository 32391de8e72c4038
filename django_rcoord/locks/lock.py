"""Distributed locks with timeouts, fencing tokens, wake-on-release waiting and renewal.

Redis in Action 6.2 done right:

- acquiring is one script (``lock_acquire.lua``): ``SET NX PX`` and, in the same
  step, ``INCR`` of a per-name counter, returned as the fencing token;
- releasing and extending are compare-the-identifier-then-act scripts, so a
  holder whose TTL ran out can never delete or extend the next holder's lock;
- waiters do not poll: a refused caller that will wait joins the lock's line,
  raises a "someone waits" flag (which goes with the last waiter of the line
  served) and ``BLPOP``s a per-lock list; a release that sees the flag hands the
  lock over on that list (a new fencing token and identifier for whoever Redis
  gives it to: the waiter blocked longest), so the lock is never free for a
  newcomer to barge in while others wait, and the waiter holds it once it has
  confirmed the grant (which takes it out of the line). A release nobody waits
  for only deletes the owner key. A waiter never blocks longer than the holder's
  remaining TTL, so a holder that died is replaced as soon as its lock expires;
- ``fair=False`` trades that order for throughput: a release frees the lock and
  wakes one waiter with a plain wake-up, the waiter asks again, and whoever asks
  first wins (often the releaser coming straight back). Until the woken waiter has
  asked, later releases wake nobody else (it will ask; another would only find the
  lock taken again); a wake-up a grant drops, or one out for a second, no longer
  counts. A waiter that loses the race pauses after its next wake-ups before asking
  again (``protocol.race_backoff``), so a busy lock is not slowed by a failed try
  per release. Waiters still ask only when woken, and tokens and compare-and-act
  are the same.

``Lock`` is its sync face (``sync.SyncLock``: acquire, release, extend, owned,
``with``) and its async face (``aio.AsyncLock``: aacquire, arelease, aextend,
aowned, ``async with``, on redis.asyncio) over one core with no I/O (``core``:
settings, keys, and the acquire as steps both faces run; ``holds``: one hold per thread
or task; ``protocol``: the scripts' arguments and replies). Auto-renewal runs on the
process's renewer (``django_rcoord.renewal``).
"""

from __future__ import annotations

from typing import Any

from django_rcoord.connection.clients import resolve_client
from django_rcoord.locks.aio import AsyncLock
from django_rcoord.locks.sync import SyncLock
from django_rcoord.scripts import run_script


class Lock(SyncLock, AsyncLock):
    """A lock on ``name``, held for at most ``timeout`` seconds unless extended.

    One ``Lock`` object is a mutex for every thread and every asyncio task
    that enters it: each of them holds it under an identifier of its own (a
    module-level ``Lock`` shared by a whole process works). ``identifier``,
    ``token``, ``release()``, ``extend()`` and ``owned()`` are about the
    calling thread's or task's hold. It is not re-entrant: acquiring it again
    in the thread or task that holds it raises ``RcoordError`` at once (it
    would otherwise wait for itself). A task started inside ``async with
    lock:`` is another holder, not the holder. To release from elsewhere, use
    ``release_lock(name, identifier)``.

    ``wait`` is how long ``acquire()`` and ``with lock:`` wait by default.
    ``auto_renew=True`` keeps the TTL from running out while the lock is held
    (from the process's renewal thread, or its event loop for ``aacquire``);
    ``on_lost`` is called from there if a renewal finds the lock gone.

    ``fair=True`` (the default) hands a released lock to the waiter blocked
    longest, so nobody barges in while others wait. ``fair=False`` frees it and
    wakes a waiter, who competes with newcomers: more sections per second under
    contention, no order among them. Mixing the two on one name is safe; only the fair
    holders' releases hand over.
    """


# -- the book's functions ------------------------------------------------------
def acquire_lock(
    lockname: str, acquire_timeout: float = 10, lock_timeout: float = 10, *, client: Any = None
) -> str | None:
    """Redis in Action's ``acquire_lock_with_timeout``: the identifier, or None.

    There is no lock without a timeout here: a holder that dies would leave it
    held forever.
    """
    lock = Lock(lockname, timeout=lock_timeout, wait=acquire_timeout, client=client)
    return lock.identifier if lock.acquire() else None


def release_lock(lockname: str, identifier: str, *, client: Any = None) -> bool:
    """Redis in Action's ``release_lock``: True when released, False when no longer held."""
    return Lock(lockname, client=client)._release_identifier(resolve_client(client), identifier)


def lock_status(name: str, *, client: Any = None) -> dict[str, Any]:
    """What operators see of a lock, read in one step (``lock_status.lua``): its ``state``
    (``"free"``; ``"held"`` by a holder that took it or confirmed its hand-over;
    ``"granted"``: handed over by a release, not confirmed yet, which its waiter does
    within the grant lease or the grant lapses), ``held`` (not free: held or granted), the
    remaining TTL of the holder or grant (seconds; None without one), the last fencing
    token granted, and ``waiting``: how many waiters are in line (a waiter that gave up
    counts until its last block would have ended, and a second; 1 when only a waiter of an
    earlier release, which keeps no line, raised the "someone waits" flag). The holder's
    identifier (which can release it) is not shown."""
    lock = Lock(name, client=client)
    state, ttl_ms, token, waiters, flag = run_script("lock_status", lock.client, keys=lock._keys)
    state = state.decode() if isinstance(state, bytes) else state
    return {
        "name": name,
        "state": state,
        "held": state != "free",
        "ttl": ttl_ms / 1000 if ttl_ms >= 0 else None,
        "token": int(token) if token else None,
        "waiting": max(int(waiters), int(flag)),
    }
