"""Distributed locks with timeouts, fencing tokens, wake-on-release waiting and renewal.

Redis in Action 6.2 done right:

- acquiring is one script (``lock_acquire.lua``): ``SET NX PX`` and, in the same
  step, ``INCR`` of a per-name counter, returned as the fencing token;
- releasing and extending are compare-the-identifier-then-act scripts, so a
  holder whose TTL ran out can never delete or extend the next holder's lock;
- waiters do not poll: a release pushes one wake-up token onto a per-lock list
  that waiters ``BLPOP``; a waiter never blocks longer than the holder's
  remaining TTL, so a holder that died is replaced as soon as its lock expires.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from types import TracebackType
from typing import Any

from django_rcoord.conf import conf
from django_rcoord.connection import resolve_client, slot_pipeline
from django_rcoord.exceptions import LockLost, LockNotReplicated, LockTimeout, RcoordError
from django_rcoord.keys import KeySpace
from django_rcoord.scripts import run_script
from django_rcoord.validation import check_timeout_and_wait
from django_rcoord.waiting import Repeater, run_in_thread, wait_for_signal

__all__ = [
    "Lock",
    "LockLost",
    "LockNotReplicated",
    "LockTimeout",
    "acquire_lock",
    "release_lock",
]

logger = logging.getLogger(__name__)


class Lock:
    """A lock on ``name``, held for at most ``timeout`` seconds unless extended.

    One ``Lock`` object stands for one holder: its identifier lives on the
    object (not in a thread-local), so it can be acquired in one thread or task
    and released in another. It is not re-entrant.

    ``wait`` is how long ``acquire()`` and ``with lock:`` wait by default.
    ``auto_renew=True`` keeps the TTL from running out while the lock is held,
    from a background thread; ``on_lost`` is called (from that thread) if a
    renewal finds the lock gone.
    """

    def __init__(
        self,
        name: str,
        *,
        timeout: float = 10,
        wait: float = 10,
        auto_renew: bool = False,
        on_lost: Callable[[Lock], None] | None = None,
        client: Any = None,
    ) -> None:
        check_timeout_and_wait(timeout, wait)
        self.name = name
        self.timeout = timeout
        self.wait = wait
        self.auto_renew = auto_renew
        self.on_lost = on_lost
        self._client = client
        space = KeySpace("lock", name)
        self._owner_key = space.key("owner")
        self._fence_key = space.key("fence")
        self._signal_key = space.key("signal")
        self.identifier: str | None = None
        self.token: int | None = None
        #: After a failed ``acquire``: the holder's remaining TTL in seconds (None if unknown).
        self.holder_ttl: float | None = None
        self._lost = False
        self._renewer: Repeater | None = None

    @property
    def client(self) -> Any:
        return resolve_client(self._client)

    @property
    def _ttl_ms(self) -> int:
        return max(1, int(self.timeout * 1000))

    # -- acquiring -----------------------------------------------------------
    def _try_acquire(self, client: Any, identifier: str) -> int:
        """One attempt: the fencing token (> 0), or minus the holder's remaining TTL in ms."""
        keys, args = [self._owner_key, self._fence_key], [identifier, self._ttl_ms]
        replicas = conf.LOCK_REPLICAS
        if not replicas:
            return int(run_script("lock_acquire", client, keys=keys, args=args))
        # WAIT counts the writes of its own connection: send it in the same pipeline.
        with slot_pipeline(client, self._owner_key, transaction=False) as pipe:
            run_script("lock_acquire", pipe, keys=keys, args=args)
            pipe.wait(replicas, max(1, int(conf.LOCK_REPLICA_TIMEOUT * 1000)))
            result, acknowledged = pipe.execute()
        result = int(result)
        if result > 0 and acknowledged < replicas:
            self._release_identifier(client, identifier)
            raise LockNotReplicated(
                f"Lock {self.name!r} was granted but only {acknowledged} of {replicas} "
                f"replicas acknowledged it within {conf.LOCK_REPLICA_TIMEOUT}s; it was given back."
            )
        return result

    def acquire(self, wait: float | None = None) -> bool:
        """Take the lock, waiting up to ``wait`` seconds (default: the lock's ``wait``).

        Returns True when taken (``token`` then holds its fencing token), False
        when ``wait`` ran out.
        """
        if self.identifier is not None:
            raise RcoordError(f"Lock {self.name!r} is already held by this Lock object.")
        wait = self.wait if wait is None else wait
        client = self.client
        identifier = uuid.uuid4().hex
        deadline = time.monotonic() + wait
        while True:
            result = self._try_acquire(client, identifier)
            if result > 0:
                self._granted(identifier, result)
                return True
            self.holder_ttl = -result / 1000 if result < 0 else None
            remaining_wait = deadline - time.monotonic()
            if remaining_wait <= 0:
                return False
            holder_ttl = remaining_wait if self.holder_ttl is None else self.holder_ttl
            wait_for_signal(client, self._signal_key, min(remaining_wait, holder_ttl))

    def _granted(self, identifier: str, token: int) -> None:
        self.identifier = identifier
        self.token = token
        self._lost = False
        if self.auto_renew:
            client = self.client
            self._renewer = Repeater(
                self.timeout / 3,
                lambda: self._renew(client, identifier),
                name=f"rcoord-lock-renew:{self.name}",
            )
            self._renewer.start()

    def _renew(self, client: Any, identifier: str) -> bool:
        """One auto-renewal; False (which stops the renewing) once the lock is lost."""
        if self._extend_identifier(client, identifier, self._ttl_ms):
            return True
        self._mark_lost()
        logger.warning("Lock %r was lost while held (auto_renew)", self.name)
        if self.on_lost is not None:
            try:
                self.on_lost(self)
            except Exception:
                logger.exception("on_lost callback of lock %r failed", self.name)
        return False

    # -- holding -----------------------------------------------------------
    def owned(self) -> bool:
        """True while this object holds the lock (asks Redis)."""
        if self.identifier is None or self._lost:
            return False
        held = self.client.get(self._owner_key)
        return held in (self.identifier, self.identifier.encode())

    def extend(self, seconds: float | None = None) -> None:
        """Reset the TTL to ``seconds`` from now (default: the lock's ``timeout``).

        Raises ``LockLost`` when the lock is no longer held by this object.
        """
        if self.identifier is None or self._lost:
            raise LockLost(f"Lock {self.name!r} is not held by this Lock object.")
        ttl_ms = self._ttl_ms if seconds is None else max(1, int(seconds * 1000))
        if not self._extend_identifier(self.client, self.identifier, ttl_ms):
            self._mark_lost()
            raise LockLost(f"Lock {self.name!r} expired or was taken by another holder.")

    def _extend_identifier(self, client: Any, identifier: str, ttl_ms: int) -> bool:
        return bool(
            run_script("lock_extend", client, keys=[self._owner_key], args=[identifier, ttl_ms])
        )

    def _mark_lost(self) -> None:
        self._lost = True

    # -- releasing ---------------------------------------------------------
    def release(self) -> None:
        """Release the lock and wake one waiter.

        Raises ``LockLost`` when the lock was no longer held by this object (its
        TTL ran out); the current holder's lock is left alone.
        """
        identifier = self.identifier
        if identifier is None:
            raise LockLost(f"Lock {self.name!r} is not held by this Lock object.")
        self._stop_renewing()
        self.identifier = None
        if not self._release_identifier(self.client, identifier):
            raise LockLost(f"Lock {self.name!r} expired or was taken by another holder.")

    def _release_identifier(self, client: Any, identifier: str) -> bool:
        return bool(
            run_script(
                "lock_release",
                client,
                keys=[self._owner_key, self._signal_key],
                args=[identifier, self._ttl_ms],
            )
        )

    def _stop_renewing(self) -> None:
        if self._renewer is not None:
            self._renewer.stop()
            self._renewer = None

    # -- context managers --------------------------------------------------
    def _timeout(self) -> LockTimeout:
        return LockTimeout(f"Could not acquire lock {self.name!r} within {self.wait}s.")

    def __enter__(self) -> Lock:
        if not self.acquire():
            raise self._timeout()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            self.release()
        except LockLost:
            if exc_type is None:
                raise
            # Do not hide the body's own exception behind this one.
            logger.warning("Lock %r was lost before the block that held it raised", self.name)

    async def aacquire(self, wait: float | None = None) -> bool:
        """``acquire`` for async code: waits in a worker thread, never on the event loop."""
        return await run_in_thread(self.acquire, wait, undo=self._release_if_acquired_late)

    def _release_if_acquired_late(self, acquired: bool) -> None:
        if acquired:
            self.release()

    async def arelease(self) -> None:
        await run_in_thread(self.release)

    async def aextend(self, seconds: float | None = None) -> None:
        await run_in_thread(self.extend, seconds)

    async def aowned(self) -> bool:
        return await run_in_thread(self.owned)

    async def __aenter__(self) -> Lock:
        if not await self.aacquire():
            raise self._timeout()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await run_in_thread(self.__exit__, exc_type, exc, traceback)

    def __repr__(self) -> str:
        state = f"held, token {self.token}" if self.identifier else "not held"
        return f"<Lock {self.name!r} ({state})>"


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
