"""Distributed locks with timeouts, fencing tokens, wake-on-release waiting and renewal.

Redis in Action 6.2 done right:

- acquiring is one script (``lock_acquire.lua``): ``SET NX PX`` and, in the same
  step, ``INCR`` of a per-name counter, returned as the fencing token;
- releasing and extending are compare-the-identifier-then-act scripts, so a
  holder whose TTL ran out can never delete or extend the next holder's lock;
- waiters do not poll: a refused caller that will wait raises a "someone waits"
  flag and ``BLPOP``s a per-lock list; a release that sees the flag hands the
  lock over on that list (a new fencing token and identifier for whoever Redis
  gives it to: the waiter blocked longest), so the lock is never free for a
  newcomer to barge in while others wait, and the waiter holds it without asking
  again. A release nobody waits for only deletes the owner key. A waiter never
  blocks longer than the holder's remaining TTL, so a holder that died is
  replaced as soon as its lock expires.

Every operation has an async twin (``aacquire``, ``arelease``, ``aextend``,
``aowned``, ``async with``) on ``redis.asyncio``: no thread, and async waiters
of one event loop share one blocking connection per lock
(``django_rcoord.waiting.SignalHub``).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from django_rcoord.conf import conf
from django_rcoord.connection import (
    aresolve_client,
    aslot_pipeline,
    resolve_client,
    slot_pipeline,
)
from django_rcoord.exceptions import LockLost, LockNotReplicated, LockTimeout, RcoordError
from django_rcoord.keys import encoded_instance_keys
from django_rcoord.scripts import arun_script, run_script
from django_rcoord.validation import check_timeout_and_wait
from django_rcoord.waiting import Repeater, Waiting, pop_signal, spawn

__all__ = [
    "Lock",
    "LockLost",
    "LockNotReplicated",
    "LockTimeout",
    "acquire_lock",
    "lock_status",
    "release_lock",
]

logger = logging.getLogger(__name__)

#: The keys of one lock, in the order its scripts take them.
KEY_PARTS = ("owner", "fence", "signal", "waiting")


def new_identifier() -> str:
    """A holder's identifier: 128 bits from the OS's CSPRNG (as uuid4's, in a third of its
    time, and fork-safe without hooks). Nobody can release or extend a lock without it."""
    return secrets.token_hex(16)


def _handover(token: bytes) -> tuple[str, int, int] | None:
    """(identifier, fencing token, TTL ms) of a lock handed over by a release, or None for
    a plain wake-up (``b"1"``)."""
    fields = token.split(b":", 2)
    if len(fields) != 3:
        return None
    return fields[2].decode(), int(fields[0]), int(fields[1])


def current_holder() -> Any:
    """Who holds what in this thread or task: the running asyncio task, else the thread."""
    # _get_running_loop() answers None where asyncio.current_task() would raise (sync
    # code), without the cost of an exception on every acquire and release.
    loop = asyncio._get_running_loop()
    task = None if loop is None else asyncio.current_task(loop)
    return task if task is not None else threading.current_thread()


@dataclass
class _Hold:
    """One holder's grant of a lock."""

    identifier: str
    token: int
    lost: bool = False
    renewer: Repeater | asyncio.Task[None] | None = None


class Lock:
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
    (from a background thread, or a task of the loop for ``aacquire``);
    ``on_lost`` is called from there if a renewal finds the lock gone.
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
        self._keys = encoded_instance_keys("lock", name, KEY_PARTS)
        #: After a failed ``acquire``: the holder's remaining TTL in seconds (None if unknown).
        self.holder_ttl: float | None = None
        self._holds: weakref.WeakKeyDictionary[Any, _Hold] = weakref.WeakKeyDictionary()

    @property
    def client(self) -> Any:
        return resolve_client(self._client)

    # The keys as str, for the few commands outside the scripts.
    @property
    def _owner_key(self) -> str:
        return self._keys[0].decode()

    @property
    def _fence_key(self) -> str:
        return self._keys[1].decode()

    @property
    def _signal_key(self) -> str:
        return self._keys[2].decode()

    @property
    def _ttl_ms(self) -> int:
        return max(1, int(self.timeout * 1000))

    @property
    def identifier(self) -> str | None:
        """The calling thread's or task's identifier while it holds the lock, else None."""
        hold = self._holds.get(current_holder())
        return None if hold is None else hold.identifier

    @property
    def token(self) -> int | None:
        """The fencing token of the calling thread's or task's hold, else None."""
        hold = self._holds.get(current_holder())
        return None if hold is None else hold.token

    def _start(self, wait: float | None) -> tuple[Any, str, float]:
        """(holder, new identifier, wait) for an acquire by the caller, who must not hold it."""
        holder = current_holder()
        if holder in self._holds:
            raise RcoordError(
                f"Lock {self.name!r} is already held by this "
                f"{'task' if isinstance(holder, asyncio.Task) else 'thread'} (it is not "
                "re-entrant)."
            )
        return holder, new_identifier(), self.wait if wait is None else wait

    def _replication_failed(self, acknowledged: int) -> LockNotReplicated:
        replicas = conf.LOCK_REPLICAS
        return LockNotReplicated(
            f"Lock {self.name!r} was granted but only {acknowledged} of {replicas} "
            f"replicas acknowledged it within {conf.LOCK_REPLICA_TIMEOUT}s; it was given back."
        )

    def _failed_attempt(self, result: int, deadline: float, now: float) -> float | None:
        """After a refused attempt: seconds to wait for a wake-up, or None when out of time."""
        self.holder_ttl = -result / 1000 if result < 0 else None
        remaining_wait = deadline - now
        if remaining_wait <= 0:
            return None
        holder_ttl = remaining_wait if self.holder_ttl is None else self.holder_ttl
        return min(remaining_wait, holder_ttl)

    @staticmethod
    def _block_ms(deadline: float, now: float) -> int:
        """The acquire script's ARGV[3]: how long the caller may block if refused (0: it
        will not wait, and raises no "someone waits" flag)."""
        remaining = deadline - now
        return int(remaining * 1000) + 1 if remaining > 0 else 0

    # -- acquiring -----------------------------------------------------------
    def _try_acquire(self, client: Any, identifier: str, block_ms: int) -> int:
        """One attempt: the fencing token (> 0), or minus the holder's remaining TTL in ms."""
        args = (identifier, self._ttl_ms, block_ms)
        replicas = conf.LOCK_REPLICAS
        if not replicas:
            return int(run_script("lock_acquire", client, keys=self._keys, args=args))
        # WAIT counts the writes of its own connection: send it in the same pipeline.
        with slot_pipeline(client, self._owner_key, transaction=False) as pipe:
            run_script("lock_acquire", pipe, keys=self._keys, args=args)
            pipe.wait(replicas, max(1, int(conf.LOCK_REPLICA_TIMEOUT * 1000)))
            result, acknowledged = pipe.execute()
        result = int(result)
        if result > 0 and acknowledged < replicas:
            self._release_identifier(client, identifier)
            raise self._replication_failed(acknowledged)
        return result

    def acquire(self, wait: float | None = None) -> bool:
        """Take the lock, waiting up to ``wait`` seconds (default: the lock's ``wait``).

        Returns True when taken (``token`` then holds its fencing token), False
        when ``wait`` ran out.
        """
        holder, identifier, wait = self._start(wait)
        client = self.client
        now = time.monotonic()
        deadline = now + wait
        while True:
            result = self._try_acquire(client, identifier, self._block_ms(deadline, now))
            if result > 0:
                self._granted(holder, identifier, result)
                return True
            block = self._failed_attempt(result, deadline, time.monotonic())
            if block is None:
                return False
            token = pop_signal(client, self._signal_key, block)
            grant = None if token is None else self._take_handover(client, token)
            if grant is not None:
                self._granted(holder, *grant)
                return True
            now = time.monotonic()

    def _take_handover(self, client: Any, token: bytes) -> tuple[str, int] | None:
        """(identifier, fencing token) of the lock a release handed to this waiter, or None
        for a plain wake-up. A hand-over made with another TTL than this lock's is extended
        to this lock's (a second round trip, only then)."""
        handover = _handover(token)
        if handover is None:
            return None
        identifier, fencing_token, ttl_ms = handover
        if ttl_ms != self._ttl_ms and not self._extend_identifier(client, identifier, self._ttl_ms):
            return None
        return identifier, fencing_token

    def _granted(self, holder: Any, identifier: str, token: int) -> _Hold:
        hold = _Hold(identifier, token)
        self._holds[holder] = hold
        if self.auto_renew:
            client = self.client
            hold.renewer = Repeater(
                self.timeout / 3,
                lambda: self._renew(client, hold),
                name=f"rcoord-lock-renew:{self.name}",
            )
            hold.renewer.start()
        return hold

    def _renew(self, client: Any, hold: _Hold) -> bool:
        """One auto-renewal; False (which stops the renewing) once the lock is lost."""
        if self._extend_identifier(client, hold.identifier, self._ttl_ms):
            return True
        self._renewal_lost(hold)
        return False

    def _renewal_lost(self, hold: _Hold) -> None:
        hold.lost = True
        logger.warning("Lock %r was lost while held (auto_renew)", self.name)
        if self.on_lost is not None:
            try:
                self.on_lost(self)
            except Exception:
                logger.exception("on_lost callback of lock %r failed", self.name)

    # -- holding -----------------------------------------------------------
    def _live_hold(self) -> _Hold | None:
        hold = self._holds.get(current_holder())
        return None if hold is None or hold.lost else hold

    def owned(self) -> bool:
        """True while the calling thread or task holds the lock (asks Redis)."""
        hold = self._live_hold()
        if hold is None:
            return False
        return _is_identifier(self.client.get(self._owner_key), hold.identifier)

    def extend(self, seconds: float | None = None) -> None:
        """Reset the TTL to ``seconds`` from now (default: the lock's ``timeout``).

        Raises ``LockLost`` when the lock is no longer held by the calling thread or task.
        """
        hold = self._hold_to_extend()
        if not self._extend_identifier(self.client, hold.identifier, self._extend_ms(seconds)):
            raise self._lost_now(hold)

    def _hold_to_extend(self) -> _Hold:
        hold = self._live_hold()
        if hold is None:
            raise LockLost(f"Lock {self.name!r} is not held by this thread or task.")
        return hold

    def _extend_ms(self, seconds: float | None) -> int:
        return self._ttl_ms if seconds is None else max(1, int(seconds * 1000))

    def _lost_now(self, hold: _Hold) -> LockLost:
        hold.lost = True
        return LockLost(f"Lock {self.name!r} expired or was taken by another holder.")

    def _extend_identifier(self, client: Any, identifier: str, ttl_ms: int) -> bool:
        return bool(
            run_script("lock_extend", client, keys=self._keys[:1], args=(identifier, ttl_ms))
        )

    # -- releasing ---------------------------------------------------------
    def release(self) -> None:
        """Release the lock and wake one waiter.

        Raises ``LockLost`` when the calling thread or task did not hold it (or
        its TTL ran out); the current holder's lock is left alone.
        """
        hold = self._take_hold()
        if isinstance(hold.renewer, Repeater):
            hold.renewer.stop()
        if not self._release_identifier(self.client, hold.identifier):
            raise LockLost(f"Lock {self.name!r} expired or was taken by another holder.")

    def _take_hold(self) -> _Hold:
        hold = self._holds.pop(current_holder(), None)
        if hold is None:
            raise LockLost(f"Lock {self.name!r} is not held by this thread or task.")
        return hold

    def _release_args(self, identifier: str) -> tuple[str, int, int]:
        # With LOCK_REPLICAS, a grant must be acknowledged by replicas when it is made
        # (acquire sends WAIT): releases then wake a waiter instead of handing over.
        return identifier, self._ttl_ms, 0 if conf.LOCK_REPLICAS else 1

    def _release_identifier(self, client: Any, identifier: str) -> bool:
        args = self._release_args(identifier)
        return bool(run_script("lock_release", client, keys=self._keys, args=args))

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
            self._lost_before_raise()

    def _lost_before_raise(self) -> None:
        # Do not hide the body's own exception behind this one.
        logger.warning("Lock %r was lost before the block that held it raised", self.name)

    # -- async -------------------------------------------------------------
    async def _aclient(self) -> Any:
        return await aresolve_client(self._client)

    async def _atry_acquire(self, client: Any, identifier: str, block_ms: int) -> int:
        args = (identifier, self._ttl_ms, block_ms)
        replicas = conf.LOCK_REPLICAS
        if not replicas:
            return int(await arun_script("lock_acquire", client, keys=self._keys, args=args))
        pipe = await aslot_pipeline(client, self._owner_key, transaction=False)
        async with pipe:
            await arun_script("lock_acquire", pipe, keys=self._keys, args=args)
            pipe.wait(replicas, max(1, int(conf.LOCK_REPLICA_TIMEOUT * 1000)))
            result, acknowledged = await pipe.execute()
        result = int(result)
        if result > 0 and acknowledged < replicas:
            await self._arelease_identifier(client, identifier)
            raise self._replication_failed(acknowledged)
        return result

    async def aacquire(self, wait: float | None = None) -> bool:
        """``acquire`` for async code, on redis.asyncio: a waiter costs no thread.

        The wait is counted from this call. A waiter cancelled while its
        attempt was in flight gives back a lock that attempt got.
        """
        holder, identifier, wait = self._start(wait)
        loop = asyncio.get_running_loop()
        now = loop.time()
        deadline = now + wait
        client = await self._aclient()
        waiting: Waiting | None = None
        try:
            while True:
                attempt = asyncio.ensure_future(
                    self._atry_acquire(client, identifier, self._block_ms(deadline, now))
                )
                try:
                    result = await asyncio.shield(attempt)
                except asyncio.CancelledError:
                    attempt.add_done_callback(
                        lambda done: self._give_back_late_grant(done, client, identifier)
                    )
                    raise
                if result > 0:
                    self._granted_async(holder, identifier, result, client)
                    return True
                block = self._failed_attempt(result, deadline, loop.time())
                if block is None:
                    return False
                if waiting is None:
                    waiting = Waiting(
                        client,
                        self._signal_key,
                        lambda token: self._arelease_handover(client, token),
                    )
                # Between the token's arrival and the hold's record there is no await: a
                # cancellation either comes first (the hub passes the token on) or after.
                token = await waiting.take(block)
                grant = None if token is None else _handover(token)
                if grant is not None:
                    grant_identifier, fencing_token, ttl_ms = grant
                    self._granted_async(holder, grant_identifier, fencing_token, client)
                    if ttl_ms != self._ttl_ms:
                        await self._aextend_handover(client, holder, grant_identifier)
                    if holder in self._holds:
                        return True
                now = loop.time()
        finally:
            if waiting is not None:
                waiting.leave()

    async def _aextend_handover(self, client: Any, holder: Any, identifier: str) -> None:
        """A lock handed over with another TTL than this lock's gets this lock's; if it was
        lost meanwhile, the caller goes on waiting."""
        try:
            extended = await self._aextend_identifier(client, identifier, self._ttl_ms)
        except BaseException:
            self._forget_hold(holder)
            spawn(self._arelease_identifier(client, identifier))
            raise
        if not extended:
            self._forget_hold(holder)

    def _forget_hold(self, holder: Any) -> None:
        hold = self._holds.pop(holder, None)
        if hold is not None and isinstance(hold.renewer, asyncio.Task):
            hold.renewer.cancel()

    async def _arelease_handover(self, client: Any, token: bytes) -> bool:
        """A hand-over no waiter of this loop is left to take is released (and so handed
        on, or freed); False for a plain wake-up, which goes back on the list."""
        handover = _handover(token)
        if handover is None:
            return False
        await self._arelease_identifier(client, handover[0])
        return True

    def _give_back_late_grant(
        self, done: asyncio.Future[int], client: Any, identifier: str
    ) -> None:
        if not done.cancelled() and done.exception() is None and done.result() > 0:
            spawn(self._arelease_identifier(client, identifier))

    def _granted_async(self, holder: Any, identifier: str, token: int, client: Any) -> _Hold:
        hold = _Hold(identifier, token)
        self._holds[holder] = hold
        if self.auto_renew:
            hold.renewer = spawn(self._arenew_while_held(client, hold))
        return hold

    async def _arenew_while_held(self, client: Any, hold: _Hold) -> None:
        interval = self.timeout / 3
        while True:
            await asyncio.sleep(interval)
            try:
                renewed = await self._aextend_identifier(client, hold.identifier, self._ttl_ms)
            except Exception:
                logger.exception("renewing lock %r failed; retrying in %ss", self.name, interval)
                continue
            if not renewed:
                self._renewal_lost(hold)
                return

    async def arelease(self) -> None:
        """``release`` for async code."""
        hold = self._take_hold()
        if isinstance(hold.renewer, asyncio.Task):
            hold.renewer.cancel()
        elif isinstance(hold.renewer, Repeater):
            hold.renewer.stop()
        client = await self._aclient()
        if not await self._arelease_identifier(client, hold.identifier):
            raise LockLost(f"Lock {self.name!r} expired or was taken by another holder.")

    async def _arelease_identifier(self, client: Any, identifier: str) -> bool:
        args = self._release_args(identifier)
        return bool(await arun_script("lock_release", client, keys=self._keys, args=args))

    async def aextend(self, seconds: float | None = None) -> None:
        """``extend`` for async code."""
        hold = self._hold_to_extend()
        ttl_ms = self._extend_ms(seconds)
        client = await self._aclient()
        if not await self._aextend_identifier(client, hold.identifier, ttl_ms):
            raise self._lost_now(hold)

    async def _aextend_identifier(self, client: Any, identifier: str, ttl_ms: int) -> bool:
        return bool(
            await arun_script("lock_extend", client, keys=self._keys[:1], args=(identifier, ttl_ms))
        )

    async def aowned(self) -> bool:
        """``owned`` for async code."""
        hold = self._live_hold()
        if hold is None:
            return False
        client = await self._aclient()
        return _is_identifier(await client.get(self._owner_key), hold.identifier)

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
        try:
            await self.arelease()
        except LockLost:
            if exc_type is None:
                raise
            self._lost_before_raise()

    def __repr__(self) -> str:
        hold = self._holds.get(current_holder())
        state = f"held here, token {hold.token}" if hold else "not held here"
        return f"<Lock {self.name!r} ({state})>"


def _is_identifier(held: Any, identifier: str) -> bool:
    return held in (identifier, identifier.encode())


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
    """What operators see of a lock: whether it is held, the holder's remaining TTL
    (seconds; None without one) and the last fencing token granted. One round trip; the
    holder's identifier (which can release it) is not shown."""
    lock = Lock(name, client=client)
    with lock.client.pipeline(transaction=False) as pipe:
        pipe.pttl(lock._owner_key)
        pipe.get(lock._fence_key)
        ttl_ms, token = pipe.execute()
    return {
        "name": name,
        "held": ttl_ms != -2,
        "ttl": ttl_ms / 1000 if ttl_ms >= 0 else None,
        "token": int(token) if token is not None else None,
    }
