"""Counting and fair semaphores: one script per operation, decided by the Redis server's clock.

Redis in Action 6.3 done right. Each holder has an identifier and a lease of
``timeout`` seconds. ``acquire``, ``release`` and ``refresh`` are each one
script (one round trip) that first drops holders whose lease has ended, using
``TIME`` on the server: clients' clocks never matter, and no lock or
ZINTERSTORE is needed for correctness.

Fair semaphores (the default) serve waiters first come, first served: a caller
that has to wait takes a ticket, and a permit goes to a waiter only when no
earlier ticket is still waiting. ``fair=False`` is the book's simpler
semaphore: whoever asks when a permit is free gets it.

Waiting does not poll: a release pushes wake-up tokens on a per-semaphore list
that waiters ``BLPOP``. A waiter keeps its place in line by asking again at
least every ``WAITER_LEASE / 2`` seconds; one that stops (its process died)
loses its place after ``WAITER_LEASE``.

``Semaphore`` is its sync face (``sync.SyncSemaphore``: acquire, release, refresh, keep,
holders, ``with``) and its async face (``aio.AsyncSemaphore``: the same with an ``a``,
``async with``, on redis.asyncio; async waiters of one event loop share one blocking
connection per semaphore) over one core with no I/O (``core``: settings, keys, the
scripts' arguments and the acquire as steps both faces run).
"""

from __future__ import annotations

from typing import Any

from django_rcoord.semaphores.aio import AsyncSemaphore
from django_rcoord.semaphores.sync import SyncSemaphore


class Semaphore(SyncSemaphore, AsyncSemaphore):
    """At most ``limit`` holders of ``name`` at once, each for ``timeout`` seconds unless refreshed.

    One ``Semaphore`` object can be shared by threads and tasks: permits are
    identified by the string ``acquire()`` returns. ``wait`` is how long
    ``with semaphore:`` waits for a permit.
    """


# -- the book's functions, without its `conn` argument --------------------------
def acquire_semaphore(
    semname: str, limit: int, timeout: float = 10, *, client: Any = None
) -> str | None:
    """6.3.1's counting semaphore: an identifier, or None."""
    return Semaphore(semname, limit, timeout=timeout, fair=False, client=client).acquire()


def release_semaphore(semname: str, identifier: str, *, client: Any = None) -> bool:
    """Release a permit of ``acquire_semaphore``: True when it was still held."""
    return Semaphore(semname, 1, fair=False, client=client).release(identifier)


def acquire_fair_semaphore(
    semname: str, limit: int, timeout: float = 10, *, client: Any = None
) -> str | None:
    """6.3.2's fair semaphore: an identifier, or None."""
    return Semaphore(semname, limit, timeout=timeout, client=client).acquire()


def release_fair_semaphore(semname: str, identifier: str, *, client: Any = None) -> bool:
    """Release a permit of ``acquire_fair_semaphore``: True when it was still held."""
    return Semaphore(semname, 1, client=client).release(identifier)


def refresh_fair_semaphore(
    semname: str, identifier: str, timeout: float = 10, *, client: Any = None
) -> bool:
    """6.3.3: restart a permit's lease; False when it had already lapsed."""
    return Semaphore(semname, 1, timeout=timeout, client=client).refresh(identifier)


def acquire_semaphore_with_lock(
    semname: str, limit: int, timeout: float = 10, *, client: Any = None
) -> str | None:
    """6.3.5's semaphore guarded by a lock. One script is already atomic, so no lock is taken."""
    return acquire_fair_semaphore(semname, limit, timeout, client=client)


def semaphore_status(name: str, *, limit: int = 50, client: Any = None) -> dict[str, Any]:
    """What operators see of a semaphore: its holders (lease left, seconds) and its waiters
    in line (count, and the first ``limit`` with their tickets). One round trip; identifiers
    are cut to 8 characters (a whole one could release the permit)."""
    semaphore = Semaphore(name, 1, client=client)
    client = semaphore.client
    seconds, micros = client.time()
    now_ms = seconds * 1000 + micros // 1000
    with client.pipeline(transaction=False) as pipe:
        pipe.zrangebyscore(
            semaphore._holders_key, now_ms, "+inf", start=0, num=limit, withscores=True
        )
        pipe.zcount(semaphore._holders_key, now_ms, "+inf")
        pipe.zrange(semaphore._waiters_key, 0, limit - 1, withscores=True)
        pipe.zcard(semaphore._waiters_key)
        holders, held, waiters, waiting = pipe.execute()
    return {
        "name": name,
        "held": int(held),
        "holders": [
            {"id": member.decode()[:8], "lease_left": (expiry - now_ms) / 1000}
            for member, expiry in holders
        ],
        "waiting": int(waiting),
        "waiters": [
            {"id": member.decode()[:8], "ticket": int(ticket)} for member, ticket in waiters
        ],
    }
