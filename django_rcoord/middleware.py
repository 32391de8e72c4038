"""``ConcurrencyLimitMiddleware``: at most N requests at once, per rule, across every process.

Rules come from ``RCOORD["CONCURRENCY_LIMITS"]``. A request covered by a rule
takes a permit of a fair ``Semaphore`` before the view runs and holds it until
the response is finished (for a streaming response, until its last chunk or
until the server closes it), refreshed while it runs, for at most the rule's
``max_hold`` seconds when it has one (a client that never reads the body then
holds its permit no longer). A request that gets no
permit within the rule's ``wait`` gets a 503 with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from asgiref.sync import async_to_sync, iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.urls import Resolver404, resolve

from django_rcoord.conf import conf
from django_rcoord.connection.errors import NO_REDIS
from django_rcoord.identity import aget_user, get_user
from django_rcoord.renewal import Renewal
from django_rcoord.responses import error_response, unavailable
from django_rcoord.semaphores import Semaphore
from django_rcoord.semaphores.rules import ConcurrencyRule, load_rules
from django_rcoord.steps import Steps, arun, run
from django_rcoord.waiting import spawn

logger = logging.getLogger(__name__)


@dataclass
class _Permit:
    """A permit held for a request, kept fresh by the process's renewer (``renewal``: on its
    thread when taken by sync code, on the event loop that took it for async code)."""

    semaphore: Semaphore
    identifier: str
    renewal: Renewal
    is_async: bool = False

    def stop_refreshing(self) -> None:
        self.renewal.cancel()


#: What asking Redis for one rule's permit gives: the permit, a 503, or the error that found
#: Redis out of reach.
_Taken = _Permit | HttpResponse | Exception


class ConcurrencyLimitMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)
        self._raw_rules: Any = None
        self._rules: tuple[ConcurrencyRule, ...] = ()

    # -- which rules -----------------------------------------------------------
    def rules(self) -> tuple[ConcurrencyRule, ...]:
        raw = conf.CONCURRENCY_LIMITS
        if raw is not self._raw_rules:  # settings changed (override_settings)
            self._rules = load_rules(raw)
            self._raw_rules = raw
        return self._rules

    def matching_rules(self, request: HttpRequest) -> list[ConcurrencyRule]:
        rules = self.rules()
        if not rules:
            return []
        view_names: Sequence[str] = ()
        if any(rule.url_names for rule in rules):
            try:
                match = resolve(request.path_info)
                view_names = (match.view_name, match.url_name or "")
            except Resolver404:
                pass
        return [rule for rule in rules if rule.covers(request, view_names)]

    # -- permits ---------------------------------------------------------------
    def _acquire(self, rule: ConcurrencyRule, request: HttpRequest) -> _Taken:
        """A held permit, a 503, or the error that found Redis out of reach."""
        user = get_user(request) if rule.scope == "user" else None
        semaphore = rule.semaphore_for(request, user)
        try:
            identifier = semaphore.acquire(wait=rule.wait)
        except NO_REDIS as exc:
            return exc
        if identifier is None:
            return self._too_busy(request)
        return _Permit(semaphore, identifier, semaphore.keep(identifier, max_hold=rule.max_hold))

    async def _aacquire(self, rule: ConcurrencyRule, request: HttpRequest) -> _Taken:
        """``_acquire`` on redis.asyncio; the permit is refreshed by the event loop."""
        user = await aget_user(request) if rule.scope == "user" else None
        semaphore = rule.semaphore_for(request, user)
        try:
            identifier = await semaphore.aacquire(wait=rule.wait)
        except NO_REDIS as exc:
            return exc
        if identifier is None:
            return self._too_busy(request)
        renewal = semaphore.akeep(identifier, max_hold=rule.max_hold)
        return _Permit(semaphore, identifier, renewal, is_async=True)

    def _too_busy(self, request: HttpRequest) -> HttpResponse:
        return error_response(
            request,
            503,
            "too_busy",
            "Too many requests are being served right now; try again shortly.",
            retry_after=1,
        )

    # -- the request -----------------------------------------------------------
    def __call__(self, request: HttpRequest) -> Any:
        if self.async_mode:
            return self.__acall__(request)
        rules = self.matching_rules(request)
        if not rules:
            return self.get_response(request)
        permits: list[_Permit] = []
        try:
            refused = run(_taking(request, rules, permits), partial(self._acquire, request=request))
            response = self.get_response(request) if refused is None else refused
        except BaseException:
            # A rule's step raised (a user look-up with the database down, an auth
            # backend's error), or the view did: the permits taken go back now, not at the
            # lease's end.
            _release(permits)
            raise
        return _hold_until_finished(response, permits)

    async def __acall__(self, request: HttpRequest) -> Any:
        rules = self.matching_rules(request)
        if not rules:
            return await self.get_response(request)
        permits: list[_Permit] = []
        try:
            steps = _taking(request, rules, permits)
            refused = await arun(steps, partial(self._aacquire, request=request))
            response = await self.get_response(request) if refused is None else refused
        except asyncio.CancelledError:
            spawn(_arelease(permits))
            raise
        except BaseException:
            await _arelease(permits)
            raise
        if isinstance(response, StreamingHttpResponse):
            return _hold_until_finished(response, permits)
        await _arelease(permits)
        return response


def _taking(
    request: HttpRequest, rules: list[ConcurrencyRule], permits: list[_Permit]
) -> Steps[HttpResponse | None]:
    """The core (``django_rcoord.steps``) of taking one request's permits, rule by rule: it
    yields the rule to take a permit of and receives the permit, a 503, or the error that
    found Redis out of reach (Redis is then not asked again for this request). It adds each
    permit to ``permits`` and returns the response that refuses the request, or None; what
    ``permits`` holds when it refuses or raises is the face's to give back."""
    down: Exception | None = None
    for rule in rules:
        outcome = down or (yield rule)
        if isinstance(outcome, Exception):
            down = outcome
            outcome = _unreached(request, rule, down)
        if isinstance(outcome, HttpResponse):
            return outcome
        if outcome is not None:
            permits.append(outcome)
    return None


def _unreached(request: HttpRequest, rule: ConcurrencyRule, exc: Exception) -> HttpResponse | None:
    """Redis is out of reach for ``rule``: None when it fails open, else a 503."""
    what = f"Concurrency limit {rule.name!r}"
    return unavailable(request, exc, fail_open=rule.fail_open, what=what)


def _release(permits: list[_Permit]) -> None:
    for permit in permits:
        permit.stop_refreshing()
        try:
            permit.semaphore.release(permit.identifier)
        except NO_REDIS as exc:  # the lease ends it anyway
            logger.error("Releasing a permit of %r failed: %s", permit.semaphore.name, exc)


async def _arelease(permits: list[_Permit]) -> None:
    for permit in permits:
        permit.stop_refreshing()
        try:
            await permit.semaphore.arelease(permit.identifier)
        except NO_REDIS as exc:  # the lease ends it anyway
            logger.error("Releasing a permit of %r failed: %s", permit.semaphore.name, exc)


def _hold_until_finished(response: Any, permits: list[_Permit]) -> Any:
    """Release now, or, for a streaming response, when its body has been sent (or closed)."""
    if not isinstance(response, StreamingHttpResponse):
        _release(permits)
        return response
    if response.is_async:
        content: AsyncIterator[Any] = response.streaming_content  # type: ignore[assignment]

        async def release_after_async() -> AsyncIterator[Any]:
            try:
                async for chunk in content:
                    yield chunk
            finally:
                await _arelease(permits)

        response.streaming_content = release_after_async()
    else:
        sync_content: Iterator[Any] = response.streaming_content  # type: ignore[assignment]

        def release_after() -> Iterator[Any]:
            try:
                yield from sync_content
            finally:
                if any(permit.is_async for permit in permits):
                    # Permits of the async path, served by a sync iterator: Django runs it
                    # in a thread, without the loop the permits belong to.
                    async_to_sync(_arelease)(permits)
                else:
                    _release(permits)

        response.streaming_content = release_after()
    return response
