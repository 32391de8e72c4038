"""The async face of ``Lock``: aacquire, arelease, aextend, aowned and ``async with``, on
redis.asyncio. A waiter costs no thread: async waiters of one event loop share one blocking
connection per lock (``django_rcoord.waiting.Waiting``)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from redis.exceptions import ResponseError

from django_rcoord import steps, tracing
from django_rcoord.conf import conf
from django_rcoord.connection import aslot_pipeline, outage
from django_rcoord.connection.features import SET_IFEQ
from django_rcoord.connection.loops import aresolve_client
from django_rcoord.exceptions import LockLost
from django_rcoord.locks import protocol
from django_rcoord.locks.core import Acquisition, LockCore
from django_rcoord.locks.holds import Hold
from django_rcoord.renewal import akeep_alive
from django_rcoord.scripts import arun_script
from django_rcoord.steps import Attempt

_Held = TypeVar("_Held", bound="AsyncLock")


class AsyncLock(LockCore):
    async def _aclient(self) -> Any:
        return await aresolve_client(self._client)

    # -- acquiring -----------------------------------------------------------
    @tracing.traced_wait("lock", lambda lock, _: {"rcoord.lock.token": lock.token})
    async def aacquire(self, wait: float | None = None) -> bool:
        """``acquire`` for async code, on redis.asyncio: a waiter costs no thread.

        The wait is counted from this call. A waiter cancelled while its
        attempt was in flight gives back a lock that attempt got.
        """
        acquisition = self._acquisition(wait, asyncio.get_running_loop().time)
        client = await self._aclient()
        with outage.unavailable_as_one_error(f"lock {self.name!r}"):
            await outage.aconnect(client)  # if this raises, nothing was sent
            hold = await self._asteps(acquisition, client)
        if hold is None:
            return False
        if self.auto_renew:
            self._akeep(client, hold)
        return True

    async def _asteps(self, acquisition: Acquisition, client: Any) -> Hold | None:
        face = steps.AsyncSteps(client)

        def give_back() -> Coroutine[Any, Any, Any] | None:
            in_doubt = acquisition.in_doubt  # a grant this acquire may hold, read when it fails
            return None if in_doubt is None else self._arelease_identifier(client, in_doubt)

        return await face.run(acquisition.steps, lambda step: self._aperform(face, step), give_back)

    async def _aperform(self, face: steps.AsyncSteps, step: Any) -> Any:
        client = face.client
        if isinstance(step, Attempt):
            return await face.attempts(self._atry_acquire(client, step.args, step.pause))
        # A Wait, the only other step (a hand-over is confirmed by an Attempt under it). A
        # hand-over the hub took for a waiter of this loop who has gone is passed on.
        place = face.place(self._signal_key, lambda token: self._arelease_handover(client, token))
        return await place.take(step.seconds)

    async def _atry_acquire(self, client: Any, args: tuple[Any, ...], pause: float) -> int:
        if pause:  # inside the shielded attempt: a waiter cancelled meanwhile still asks
            await asyncio.sleep(pause)
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
            await self._arelease_identifier(client, args[0])
            raise self._not_replicated(acknowledged)
        return result

    async def _arelease_handover(self, client: Any, token: bytes) -> bool:
        """A hand-over no waiter of this loop is left to take is released (and so handed
        on, or freed); False for a plain wake-up, which goes back on the list."""
        handover = protocol.handover(token)
        if handover is None:
            return False
        await self._arelease_identifier(client, handover[0])
        return True

    def _akeep(self, client: Any, hold: Hold) -> None:
        async def renew() -> bool:
            if await self._aextend_identifier(client, hold.identifier, self._ttl_ms):
                return True
            self._renewal_lost(hold)
            return False

        hold.renewal = akeep_alive(self.timeout / 3, renew, f"renewing lock {self.name!r}")

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

    async def __aexit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        try:
            await self.arelease()
        except LockLost:
            if exc_type is None:
                raise
            self._lost_before_raise()
