"""The async face of ``Lock``: aacquire, arelease, aextend, aowned and ``async with``, on
redis.asyncio. A waiter costs no thread: async waiters of one event loop share one blocking
connection per lock (``django_rcoord.waiting.Waiting``)."""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any, TypeVar

from redis.exceptions import ResponseError

from django_rcoord import tracing
from django_rcoord.conf import conf
from django_rcoord.connection import aresolve_client, aslot_pipeline
from django_rcoord.connection.features import SET_IFEQ
from django_rcoord.exceptions import LockLost
from django_rcoord.locks import protocol
from django_rcoord.locks.base import LockBase
from django_rcoord.locks.holds import Hold
from django_rcoord.renewal import akeep_alive
from django_rcoord.scripts import arun_script
from django_rcoord.waiting import Waiting, spawn

_Held = TypeVar("_Held", bound="AsyncLock")


class AsyncLock(LockBase):
    async def _aclient(self) -> Any:
        return await aresolve_client(self._client)

    # -- acquiring -----------------------------------------------------------
    @tracing.traced_wait("lock", lambda lock, _: {"rcoord.lock.token": lock.token})
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
        woken = False
        backoff = pause = 0.0
        try:
            while True:
                attempt = asyncio.ensure_future(
                    self._atry_acquire(
                        client, identifier, protocol.block_ms(deadline, now), woken, pause
                    )
                )
                try:
                    result = await asyncio.shield(attempt)
                except asyncio.CancelledError:
                    attempt.add_done_callback(
                        lambda done: self._give_back_late_grant(done, client, identifier)
                    )
                    raise
                except Exception:
                    # The server may have granted it before the reply was lost.
                    spawn(self._arelease_identifier(client, identifier))
                    raise
                if result > 0:
                    self._agranted(holder, identifier, result, client)
                    return True
                if woken and not self.fair:
                    backoff = protocol.race_backoff(backoff)
                block = self._after_refusal(result, deadline, loop.time())
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
                grant = None if token is None else protocol.handover(token)
                if grant is not None:
                    grant_identifier, fencing_token, _lease_ms = grant
                    self._agranted(holder, grant_identifier, fencing_token, client)
                    await self._aconfirm_handover(client, holder, grant_identifier)
                    if holder in self._holds:
                        return True
                woken = token is not None
                now = loop.time()
                pause = min(backoff, max(0.0, deadline - now)) if woken else 0.0
        finally:
            if waiting is not None:
                waiting.leave()

    async def _atry_acquire(
        self, client: Any, identifier: str, block_ms: int, woken: bool = False, pause: float = 0.0
    ) -> int:
        if pause:  # inside the shielded attempt: a waiter cancelled meanwhile still asks
            await asyncio.sleep(pause)
        args = self._acquire_args(identifier, block_ms, woken)
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
            raise self._not_replicated(acknowledged)
        return result

    async def _aconfirm_handover(self, client: Any, holder: Any, identifier: str) -> None:
        """A lock handed over is confirmed: extended from its grant lease to this lock's TTL;
        if the grant lapsed meanwhile, the caller goes on waiting (and asks again)."""
        try:
            extended = await self._aextend_identifier(client, identifier, self._ttl_ms)
        except BaseException:
            self._holds.forget(holder)
            spawn(self._arelease_identifier(client, identifier))
            raise
        if not extended:
            self._holds.forget(holder)

    async def _arelease_handover(self, client: Any, token: bytes) -> bool:
        """A hand-over no waiter of this loop is left to take is released (and so handed
        on, or freed); False for a plain wake-up, which goes back on the list."""
        handover = protocol.handover(token)
        if handover is None:
            return False
        await self._arelease_identifier(client, handover[0])
        return True

    def _give_back_late_grant(
        self, done: asyncio.Future[int], client: Any, identifier: str
    ) -> None:
        if not done.cancelled() and done.exception() is None and done.result() > 0:
            spawn(self._arelease_identifier(client, identifier))

    def _agranted(self, holder: Any, identifier: str, token: int, client: Any) -> Hold:
        hold = self._holds.add(holder, identifier, token)
        if self.auto_renew:

            async def renew() -> bool:
                if await self._aextend_identifier(client, hold.identifier, self._ttl_ms):
                    return True
                self._renewal_lost(hold)
                return False

            hold.renewal = akeep_alive(self.timeout / 3, renew, f"renewing lock {self.name!r}")
        return hold

    # -- holding -----------------------------------------------------------
    async def aowned(self) -> bool:
        """``owned`` for async code."""
        hold = self._holds.live()
        if hold is None:
            return False
        client = await self._aclient()
        return protocol.is_identifier(await client.get(self._owner_key), hold.identifier)

    async def aextend(self, seconds: float | None = None) -> None:
        """``extend`` for async code."""
        hold = self._holds.live_or_raise()
        ttl_ms = self._extend_ms(seconds)
        client = await self._aclient()
        if not await self._aextend_identifier(client, hold.identifier, ttl_ms):
            raise self._lost_now(hold)

    async def _aextend_identifier(self, client: Any, identifier: str, ttl_ms: int) -> bool:
        if SET_IFEQ.usable(client):
            try:
                command = protocol.extend_command(self._keys[0], identifier, ttl_ms)
                return await client.execute_command(*command) is not None
            except ResponseError as error:
                if not SET_IFEQ.refused(client, error):
                    raise
        return bool(
            await arun_script("lock_extend", client, keys=self._keys[:1], args=(identifier, ttl_ms))
        )

    # -- releasing ---------------------------------------------------------
    async def arelease(self) -> None:
        """``release`` for async code."""
        hold = self._holds.take()
        client = await self._aclient()
        if not await self._arelease_identifier(client, hold.identifier):
            raise protocol.lost(self.name)

    async def _arelease_identifier(self, client: Any, identifier: str) -> bool:
        args = self._release_args(identifier)
        return bool(await arun_script("lock_release", client, keys=self._keys, args=args))

    # -- async with --------------------------------------------------------
    async def __aenter__(self: _Held) -> _Held:
        if not await self.aacquire():
            raise protocol.timed_out(self.name, self.wait)
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
