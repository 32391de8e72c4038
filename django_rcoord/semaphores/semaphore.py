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

Async twins (``aacquire``, ``arelease``, ``arefresh``, ``async with``) run on
``redis.asyncio``; async waiters of one event loop share one blocking
connection per semaphore (``django_rcoord.waiting.SignalHub``).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from types import TracebackType
from typing import Any

from django_rcoord import tracing
from django_rcoord.connection import aresolve_client, resolve_client
from django_rcoord.exceptions import SemaphoreTimeout
from django_rcoord.keys import encoded_instance_keys
from django_rcoord.locks import new_identifier
from django_rcoord.renewal import Renewal, akeep_alive, keep_alive
from django_rcoord.scripts import arun_script, run_script
from django_rcoord.validation import check_timeout_and_wait, is_positive_int
from django_rcoord.waiting import Waiting, spawn, wait_for_signal

logger = logging.getLogger(__name__)

#: Seconds a waiter keeps its place in line without asking again.
WAITER_LEASE = 2.0
_WAITER_LEASE_MS = int(WAITER_LEASE * 1000)

#: The keys of one semaphore: acquire takes all five, release all but the tickets.
KEY_PARTS = ("holders", "waiters", "waiter-leases", "tickets", "signal")

# Identifiers taken by ``with semaphore:`` in this thread / task, per semaphore.
_entered: contextvars.ContextVar[tuple[tuple[int, str], ...]] = contextvars.ContextVar(
    "rcoord_semaphore_entered", default=()
)


class Semaphore:
    """At most ``limit`` holders of ``name`` at once, each for ``timeout`` seconds unless refreshed.

    One ``Semaphore`` object can be shared by threads and tasks: permits are
    identified by the string ``acquire()`` returns. ``wait`` is how long
    ``with semaphore:`` waits for a permit.
    """

    def __init__(
        self,
        name: str,
        limit: int,
        *,
        timeout: float = 10,
        fair: bool = True,
        wait: float = 0,
        client: Any = None,
    ) -> None:
        if not is_positive_int(limit):
            raise ValueError("limit must be a positive integer")
        check_timeout_and_wait(timeout, wait)
        self.name = name
        self.limit = limit
        self.timeout = timeout
        self.fair = fair
        self.wait = wait
        self._client = client
        self._keys = encoded_instance_keys("semaphore", name, KEY_PARTS)
        self._release_keys = (*self._keys[:3], self._keys[4])

    # The keys as str, for the few commands outside the scripts.
    @property
    def _holders_key(self) -> str:
        return self._keys[0].decode()

    @property
    def _waiters_key(self) -> str:
        return self._keys[1].decode()

    @property
    def _signal_key(self) -> str:
        return self._keys[4].decode()

    @property
    def client(self) -> Any:
        return resolve_client(self._client)

    @property
    def _lease_ms(self) -> int:
        return max(1, int(self.timeout * 1000))

    # -- the three operations -------------------------------------------------
    def _acquire_args(
        self, identifier: str, queue: bool, woken: bool, in_line: bool
    ) -> tuple[Any, ...]:
        """ARGV of semaphore_acquire.lua. ``in_line``: an earlier attempt of this acquire was
        refused with ``queue`` (only then does the script look the caller up in line)."""
        return (
            identifier,
            self.limit,
            self._lease_ms,
            int(self.fair),
            int(queue),
            _WAITER_LEASE_MS,
            int(woken),
            int(in_line),
        )

    @staticmethod
    def _block_after(result: Any, remaining: float) -> float:
        """How long a refused caller waits for a wake-up before asking again: until its place
        in line would lapse, or a holder's lease ends, at most ``remaining``."""
        next_expiry = result[1] / 1000 if result[1] >= 0 else remaining
        return min(remaining, WAITER_LEASE / 2, max(next_expiry, 0))

    @tracing.traced_wait("semaphore", lambda _, permit: {"rcoord.semaphore.permit": permit})
    def acquire(self, wait: float | None = None) -> str | None:
        """A permit's identifier, or None when none was free within ``wait`` seconds (by
        default the instance's ``wait``, as for ``Lock.acquire``)."""
        wait = self.wait if wait is None else wait
        client = self.client
        identifier = new_identifier()
        try:
            return self._acquire_until(client, identifier, wait)
        except BaseException:
            # A reply cut after the server granted it, an alarm, a KeyboardInterrupt: the
            # permit (or place in line) goes back now, not at its lease's end.
            try:
                self._release(client, identifier)
            except Exception as exc:  # noqa: BLE001 (the caller's own error is raised)
                logger.warning("Could not give back a permit of %r: %s", self.name, exc)
            raise

    def _acquire_until(self, client: Any, identifier: str, wait: float) -> str | None:
        deadline = time.monotonic() + wait
        woken = in_line = False
        while True:
            remaining = deadline - time.monotonic()
            args = self._acquire_args(identifier, remaining > 0, woken, in_line)
            result = run_script("semaphore_acquire", client, keys=self._keys, args=args)
            if result == 1:
                return identifier
            in_line = in_line or remaining > 0
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if wait > 0:
                    self._leave_line(client, identifier)
                return None
            woken = wait_for_signal(client, self._signal_key, self._block_after(result, remaining))

    def release(self, identifier: str) -> bool:
        """Give back a permit; False when it was not held (its lease had ended)."""
        return self._release(self.client, identifier)

    def _release(self, client: Any, identifier: str) -> bool:
        args = (identifier, _WAITER_LEASE_MS)
        return bool(run_script("semaphore_release", client, keys=self._release_keys, args=args))

    # A waiter that gives up leaves the line the same way a holder leaves.
    _leave_line = _release

    def refresh(self, identifier: str) -> bool:
        """Restart a held permit's lease; False (and nothing re-added) when it had ended."""
        return bool(
            run_script(
                "semaphore_refresh",
                self.client,
                keys=self._keys[:1],
                args=(identifier, self._lease_ms),
            )
        )

    def keep(self, identifier: str, *, max_hold: float | None = None) -> Renewal:
        """Refresh a held permit every third of its lease, on the process's renewer, until
        the returned renewal is cancelled or the permit is found lapsed. For holders that
        may outlive a lease (the concurrency-limit middleware's requests). ``max_hold``:
        seconds after which it is no longer refreshed (the permit then ends within its
        lease), whatever its holder is doing."""
        until = None if max_hold is None else time.monotonic() + max_hold

        def refresh() -> bool:
            if until is not None and time.monotonic() >= until:
                return self._held_too_long(max_hold)
            if self.refresh(identifier):
                return True
            logger.warning("Permit of semaphore %r lapsed while held", self.name)
            return False

        return keep_alive(self.timeout / 3, refresh, f"refreshing a permit of {self.name!r}")

    def _held_too_long(self, max_hold: float | None) -> bool:
        logger.warning(
            "Permit of semaphore %r held past its max_hold of %ss: no longer refreshed",
            self.name,
            max_hold,
        )
        return False

    def holders(self) -> int:
        """How many permits are held now (expired leases not counted)."""
        client = self.client
        return int(client.zcount(self._holders_key, _after(client.time()), "+inf"))

    # -- context managers -------------------------------------------------------
    def __enter__(self) -> str:
        return self._enter(self.acquire(self.wait))

    def _enter(self, identifier: str | None) -> str:
        """Remember a permit taken by ``with`` in this thread / task, or raise the timeout."""
        if identifier is None:
            raise SemaphoreTimeout(
                f"No permit of semaphore {self.name!r} (limit {self.limit}) within {self.wait}s."
            )
        _entered.set((*_entered.get(), (id(self), identifier)))
        return identifier

    def _pop_entered(self) -> str:
        entered = _entered.get()
        for position in range(len(entered) - 1, -1, -1):
            if entered[position][0] == id(self):
                _entered.set(entered[:position] + entered[position + 1 :])
                return entered[position][1]
        raise RuntimeError("Semaphore exited without a matching enter")

    def _warn_expired(self) -> None:
        logger.warning("Permit of semaphore %r had expired before release", self.name)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if not self.release(self._pop_entered()) and exc_type is None:
            self._warn_expired()

    # -- async ----------------------------------------------------------------
    async def _aclient(self) -> Any:
        return await aresolve_client(self._client)

    @tracing.traced_wait("semaphore", lambda _, permit: {"rcoord.semaphore.permit": permit})
    async def aacquire(self, wait: float | None = None) -> str | None:
        """``acquire`` for async code, on redis.asyncio: a waiter costs no thread.

        The wait (by default the instance's) is counted from this call. A cancelled
        waiter leaves the line, and gives back a permit its last attempt got in flight.
        """
        wait = self.wait if wait is None else wait
        client = await self._aclient()
        identifier = new_identifier()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        woken = in_line = False
        waiting: Waiting | None = None
        try:
            while True:
                remaining = deadline - loop.time()
                args = self._acquire_args(identifier, remaining > 0, woken, in_line)
                attempt = asyncio.ensure_future(
                    arun_script("semaphore_acquire", client, keys=self._keys, args=args)
                )
                try:
                    result = await asyncio.shield(attempt)
                except asyncio.CancelledError:
                    # Granted or queued in flight: either way, give the identifier up after.
                    attempt.add_done_callback(lambda _: spawn(self._arelease(client, identifier)))
                    raise
                except Exception:
                    # The server may have granted it before the reply was lost.
                    spawn(self._arelease(client, identifier))
                    raise
                if result == 1:
                    return identifier
                in_line = in_line or remaining > 0
                remaining = deadline - loop.time()
                if remaining <= 0:
                    if wait > 0:
                        await self._arelease(client, identifier)  # leave the line
                    return None
                if waiting is None:
                    waiting = Waiting(client, self._signal_key)
                try:
                    # In this loop, the line for wake-ups follows the tickets.
                    woken = await waiting.wait(self._block_after(result, remaining), result[2])
                except BaseException:  # cancelled, or the wait failed (its BLPOP's error)
                    spawn(self._arelease(client, identifier))  # leave the line
                    raise
        finally:
            if waiting is not None:
                waiting.leave()

    async def arelease(self, identifier: str) -> bool:
        """``release`` for async code."""
        return await self._arelease(await self._aclient(), identifier)

    async def _arelease(self, client: Any, identifier: str) -> bool:
        args = (identifier, _WAITER_LEASE_MS)
        return bool(
            await arun_script("semaphore_release", client, keys=self._release_keys, args=args)
        )

    async def arefresh(self, identifier: str) -> bool:
        """``refresh`` for async code."""
        return bool(
            await arun_script(
                "semaphore_refresh",
                await self._aclient(),
                keys=self._keys[:1],
                args=(identifier, self._lease_ms),
            )
        )

    def akeep(self, identifier: str, *, max_hold: float | None = None) -> Renewal:
        """``keep`` for async code: refreshed on the running event loop."""
        until = None if max_hold is None else time.monotonic() + max_hold

        async def refresh() -> bool:
            if until is not None and time.monotonic() >= until:
                return self._held_too_long(max_hold)
            if await self.arefresh(identifier):
                return True
            logger.warning("Permit of semaphore %r lapsed while held", self.name)
            return False

        return akeep_alive(self.timeout / 3, refresh, f"refreshing a permit of {self.name!r}")

    async def aholders(self) -> int:
        """``holders`` for async code."""
        client = await self._aclient()
        return int(await client.zcount(self._holders_key, _after(await client.time()), "+inf"))

    async def __aenter__(self) -> str:
        return self._enter(await self.aacquire(self.wait))

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if not await self.arelease(self._pop_entered()) and exc_type is None:
            self._warn_expired()

    def __repr__(self) -> str:
        kind = "fair" if self.fair else "counting"
        return f"<Semaphore {self.name!r} ({kind}, limit {self.limit}, timeout {self.timeout}s)>"


def _after(server_time: tuple[int, int]) -> str:
    """The ZCOUNT lower bound for leases still running at ``server_time`` (TIME's reply)."""
    seconds, micros = server_time
    return f"({int(seconds) * 1000 + int(micros) // 1000}"


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
