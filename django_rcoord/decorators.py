"""View decorators: ``@locked`` and ``@rate_limited``."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse

from django_rcoord.connection.errors import NO_REDIS
from django_rcoord.exceptions import InvalidName
from django_rcoord.locked_view import LockedView
from django_rcoord.locks import Lock
from django_rcoord.ratelimit import RateLimitResult, ahit, check_algorithm, hit
from django_rcoord.responses import error_response, unavailable
from django_rcoord.validation import is_number, is_positive_int
from django_rcoord.viewkeys import KeyFunction, KeyTemplate, check_fail_open, check_request


class LockedRequest(HttpRequest):
    """The request a ``@locked`` view receives, for its type hints: ``rcoord_lock`` is the
    lock held, or None when ``fail_open=True`` let the view run without it."""

    rcoord_lock: Lock | None


def locked(
    key: KeyTemplate,
    *,
    timeout: float = 10,
    wait: float = 0,
    on_busy: Callable[[HttpRequest], HttpResponse] | None = None,
    fail_open: bool = False,
    fair: bool = True,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Run the view holding the lock named by ``key``; busy after ``wait`` -> 409.

    ``key`` is a format string filled from the view's URL arguments and
    ``user`` (``request.user``; ``ip:<address>`` when nobody is signed in), e.g.
    ``"purchase:{item_id}"`` or ``"profile:{user.pk}"``, or a callable
    ``(request, *args, **kwargs) -> str``.
    The lock lives ``timeout`` seconds at most. It is released once the view's work
    is over: a TemplateResponse is rendered inside the lock, and the request's
    transactions (``ATOMIC_REQUESTS``, opened by the decorator inside the lock for a
    sync view) have committed or rolled back; a view that raises releases at once,
    after the rollback. The view finds the lock (and its fencing token) as
    ``request.rcoord_lock``. When busy, the response is ``on_busy(request)`` or a 409
    with ``Retry-After`` (JSON for JSON clients); a grant that
    ``RCOORD["LOCK_REPLICAS"]`` replicas did not acknowledge gives a 503. When Redis
    cannot be reached, the request gets a 503 with ``Retry-After``, or with
    ``fail_open=True`` the view runs without the lock (``request.rcoord_lock`` is None).
    Works on sync and async views, and on class-based views through
    ``method_decorator``. On async views the lock is taken and waited for on
    redis.asyncio (no thread), the user of a ``{user...}`` key is loaded with
    ``await request.auser()``, and a callable key may be a coroutine function.
    ``fair=False`` takes a non-fair lock (see ``Lock``: a release frees it for whoever
    asks first, rather than handing it to the longest waiter).
    """
    check_fail_open(fail_open, "@locked")

    def decorator(view: Callable[..., Any]) -> Callable[..., Any]:
        return _locked_wrapper(
            view,
            LockedView(
                view,
                key,
                timeout=timeout,
                wait=wait,
                on_busy=on_busy,
                fail_open=fail_open,
                fair=fair,
            ),
        )

    return decorator


def _locked_wrapper(view: Callable[..., Any], locked_view: LockedView) -> Callable[..., Any]:
    """``view`` run by ``locked_view``: an async wrapper for an async view, else a sync one
    that tells Django's handler to open no transaction around it (``LockedView`` opens
    them inside the lock)."""
    if iscoroutinefunction(view):

        @functools.wraps(view)
        async def async_wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            return await locked_view.acall(request, args, kwargs)

        return async_wrapper

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        return locked_view.call(request, args, kwargs)

    wrapper._non_atomic_requests = locked_view.atomic_requests  # type: ignore[attr-defined]
    return wrapper


def rate_limited(
    key: KeyTemplate,
    *,
    limit: int,
    seconds: float,
    algorithm: str = "fixed",
    fail_open: bool = True,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Allow ``limit`` calls of the view per ``seconds`` for each value of ``key``; then 429.

    ``key`` is filled like ``@locked``'s (``"download:{user.pk}"``, where ``user``
    is ``ip:<address>`` for anonymous clients, or a callable). ``algorithm`` is one
    of ``ratelimit.ALGORITHMS``: "fixed" (a window that starts at its first call),
    "sliding" (exact: at most ``limit`` in any ``seconds``), "sliding_counter" (its
    approximation by two counters) or "gcra" (calls spaced ``seconds / limit`` apart,
    bursts up to ``limit``); see ``ratelimit.hit``. Over the limit, the response is
    429 with ``Retry-After`` (the seconds until a call would be allowed), JSON for
    JSON clients. An unknown ``algorithm`` raises ``ImproperlyConfigured`` when the
    view is decorated. When Redis cannot be reached the view runs unlimited
    (``fail_open=True``, the default, as in the middleware), or with
    ``fail_open=False`` the request gets a 503 with ``Retry-After``. Sync, async and
    class-based views.
    """
    _check_rate_arguments(limit, seconds, algorithm, fail_open)

    def decorator(view: Callable[..., Any]) -> Callable[..., Any]:
        name_for = KeyFunction(key, view, "@rate_limited")
        limiter = _ViewLimit(name_for, limit, seconds, algorithm, fail_open)
        if iscoroutinefunction(view):

            @functools.wraps(view)
            async def async_wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
                refused = await limiter.arefusal(request, args, kwargs)
                return refused if refused is not None else await view(request, *args, **kwargs)

            return async_wrapper

        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            refused = limiter.refusal(request, args, kwargs)
            return refused if refused is not None else view(request, *args, **kwargs)

        return wrapper

    return decorator


def _check_rate_arguments(limit: int, seconds: float, algorithm: str, fail_open: bool) -> None:
    if not is_positive_int(limit):
        raise ImproperlyConfigured("@rate_limited: limit must be a positive integer.")
    if not is_number(seconds) or not seconds > 0:
        raise ImproperlyConfigured("@rate_limited: seconds must be a positive number.")
    try:
        check_algorithm(algorithm)
    except ValueError as exc:
        raise ImproperlyConfigured(f"@rate_limited: {exc}.") from None
    check_fail_open(fail_open, "@rate_limited")


class _ViewLimit:
    """What ``@rate_limited`` asks before a view runs: the response that refuses the
    request (429 over the limit, 400 for an unusable key, 503 when Redis cannot be
    reached and not ``fail_open``), or None to run the view."""

    def __init__(
        self, name_for: KeyFunction, limit: int, seconds: float, algorithm: str, fail_open: bool
    ) -> None:
        self.name_for = name_for
        self.limit, self.seconds, self.algorithm = limit, seconds, algorithm
        self.fail_open = fail_open
        self.what = f"@rate_limited on view {name_for.view_name}"

    def refusal(self, request: HttpRequest, args: tuple, kwargs: dict) -> HttpResponse | None:
        check_request(request, "rate_limited")
        try:
            name = self.name_for.sync_name(request, args, kwargs)
            return self._over(
                request, hit(name, self.limit, self.seconds, algorithm=self.algorithm)
            )
        except InvalidName as exc:
            return error_response(request, 400, "bad_rate_limit_key", str(exc))
        except NO_REDIS as exc:
            return unavailable(request, exc, fail_open=self.fail_open, what=self.what)

    async def arefusal(
        self, request: HttpRequest, args: tuple, kwargs: dict
    ) -> HttpResponse | None:
        check_request(request, "rate_limited")
        try:
            name = await self.name_for.async_name(request, args, kwargs)
            result = await ahit(name, self.limit, self.seconds, algorithm=self.algorithm)
        except InvalidName as exc:
            return error_response(request, 400, "bad_rate_limit_key", str(exc))
        except NO_REDIS as exc:
            return unavailable(request, exc, fail_open=self.fail_open, what=self.what)
        return self._over(request, result)

    def _over(self, request: HttpRequest, result: RateLimitResult) -> HttpResponse | None:
        if result.allowed:
            return None
        return error_response(
            request,
            429,
            "rate_limited",
            f"Too many requests: {self.limit} per {self.seconds:g} seconds.",
            retry_after=result.retry_after,
        )
