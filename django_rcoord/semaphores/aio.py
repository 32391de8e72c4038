"""The async face of ``Semaphore``: aacquire, arelease, arefresh, akeep, aholders and
``async with``, on redis.asyncio. A waiter costs no thread: async waiters of one event
loop share one blocking connection per semaphore (``django_rcoord.waiting.Waiting``)."""

from __future__ import annotations

import asyncio
from typing import Any

from django_rcoord import steps, tracing
from django_rcoord.connection import outage
from django_rcoord.connection.loops import aresolve_client
from django_rcoord.locks import new_identifier
from django_rcoord.renewal import Renewal, akeep_alive
from django_rcoord.scripts import arun_script
from django_rcoord.semaphores.core import SemaphoreCore, count_after
from django_rcoord.steps import Attempt, Wait


class AsyncSemaphore(SemaphoreCore):
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
        with outage.unavailable_as_one_error(f"semaphore {self.name!r}"):
            await outage.aconnect(client)  # if this raises, nothing was sent
            return await self._asteps(client, new_identifier(), wait)

    async def _asteps(self, client: Any, identifier: str, wait: float) -> str | None:
        face = steps.AsyncSteps(client)
        return await face.run(
            self._acquisition(identifier, wait, asyncio.get_running_loop().time),
            lambda step: self._aperform(face, step),
            # Granted or queued, perhaps in flight: either way, give the identifier up.
            lambda: self._arelease(client, identifier),
        )

    async def _aperform(self, face: steps.AsyncSteps, step: Any) -> Any:
        client = face.client
        if isinstance(step, Attempt):
            attempt = arun_script("semaphore_acquire", client, keys=self._keys, args=step.args)
            return await face.attempts(attempt)
        if isinstance(step, Wait):
            return await face.place(self._signal_key).take(step.seconds, step.order)
        return await self._arelease(client, step.identifier)  # a waiter leaves the line

    async def arelease(self, identifier: str) -> bool:
        """``release`` for async code."""
        return await self._arelease(await self._aclient(), identifier)

    async def _arelease(self, client: Any, identifier: str) -> bool:
        args = self._release_args(identifier)
        return bool(
            await arun_script("semaphore_release", client, keys=self._release_keys, args=args)
        )

    async def arefresh(self, identifier: str) -> bool:
        """``refresh`` for async code."""
        client = await self._aclient()
        args = self._refresh_args(identifier)
        return bool(await arun_script("semaphore_refresh", client, keys=self._keys[:1], args=args))

    def akeep(self, identifier: str, *, max_hold: float | None = None) -> Renewal:
        """``keep`` for async code: refreshed on the running event loop."""
        overdue = self._overdue(max_hold)

        async def refresh() -> bool:
            return not overdue() and self._refreshed(await self.arefresh(identifier))

        return akeep_alive(self.timeout / 3, refresh, self._keeping)

    async def aholders(self) -> int:
        """``holders`` for async code."""
        client = await self._aclient()
        return int(await client.zcount(self._holders_key, count_after(await client.time()), "+inf"))

    async def __aenter__(self) -> str:
        return self._enter(await self.aacquire(self.wait))

    async def __aexit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        self._exited(await self.arelease(self._pop_entered()), exc_type)
