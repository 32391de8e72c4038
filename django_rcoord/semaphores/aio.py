"""The async face of ``Semaphore``: aacquire, arelease, arefresh, akeep, aholders and
``async with``, on redis.asyncio. A waiter costs no thread: async waiters of one event
loop share one blocking connection per semaphore (``django_rcoord.waiting.Waiting``)."""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any

from django_rcoord import steps, tracing
from django_rcoord.connection import aresolve_client
from django_rcoord.locks import new_identifier
from django_rcoord.renewal import Renewal, akeep_alive
from django_rcoord.scripts import arun_script
from django_rcoord.semaphores.core import SemaphoreCore, count_after
from django_rcoord.steps import Attempt, Wait
from django_rcoord.waiting import Waiting


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
        identifier = new_identifier()
        face = _AsyncSteps(self, client)
        try:
            return await steps.arun(
                self._acquisition(identifier, wait, asyncio.get_running_loop().time),
                face.perform,
            )
        except BaseException:
            # Granted or queued, perhaps in flight: either way, give the identifier up.
            face.attempts.give_back(self._arelease(client, identifier))
            raise
        finally:
            if face.waiting is not None:
                face.waiting.leave()

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

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._exited(await self.arelease(self._pop_entered()), exc_type)


class _AsyncSteps:
    """How the async face sends one acquire's steps: its attempts shielded from
    cancellation, its waits in the loop's line for the semaphore's signal list."""

    __slots__ = ("attempts", "client", "semaphore", "waiting")

    def __init__(self, semaphore: AsyncSemaphore, client: Any) -> None:
        self.semaphore = semaphore
        self.client = client
        self.attempts = steps.Shielded()
        self.waiting: Waiting | None = None

    async def perform(self, step: Any) -> Any:
        semaphore, client = self.semaphore, self.client
        if isinstance(step, Attempt):
            keys = semaphore._keys
            return await self.attempts(
                arun_script("semaphore_acquire", client, keys=keys, args=step.args)
            )
        if isinstance(step, Wait):
            if self.waiting is None:
                self.waiting = Waiting(client, semaphore._signal_key)
            return await self.waiting.take(step.seconds, step.order)
        return await semaphore._arelease(client, step.identifier)
