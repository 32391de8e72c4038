"""View decorators: ``@locked`` and ``@rate_limited``."""

from __future__ import annotations

import functools
import logging
import string
from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse

from django_rcoord.exceptions import InvalidName, LockLost, LockNotReplicated
from django_rcoord.locks import Lock
from django_rcoord.ratelimit import hit
from django_rcoord.responses import error_response
from django_rcoord.validation import is_number, is_positive_int
from django_rcoord.waiting import run_in_thread

logger = logging.getLogger(__name__)

KeyTemplate = str | Callable[..., str]


def _key_function(
    key: KeyTemplate, view: Callable[..., Any], decorator: str = "@locked"
) -> Callable[..., str]:
    """Turn ``key`` into ``f(request, args, kwargs) -> name``."""
    view_name = f"{view.__module__}.{getattr(view, '__qualname__', view)}"
    if callable(key):

        def from_callable(request: HttpRequest, args: tuple, kwargs: dict) -> str:
            return key(request, *args, **kwargs)

        return from_callable
    if not isinstance(key, str) or not key:
        raise ImproperlyConfigured(f"{decorator} on {view_name}: key must be a str or a callable.")
    try:
        list(string.Formatter().parse(key))
    except ValueError as exc:
        raise ImproperlyConfigured(f"{decorator} key {key!r} on {view_name}: {exc}") from exc

    def from_template(request: HttpRequest, args: tuple, kwargs: dict) -> str:
        try:
            return key.format(*args, **{"user": getattr(request, "user", None), **kwargs})
        except (KeyError, IndexError, AttributeError) as exc:
            raise ImproperlyConfigured(
                f"{decorator} key {key!r} on view {view_name} names {exc}, which the view does not "
                f"get (URL kwargs: {sorted(kwargs)}; 'user' is request.user)."
            ) from exc

    return from_template


def locked(
    key: KeyTemplate,
    *,
    timeout: float = 10,
    wait: float = 0,
    on_busy: Callable[[HttpRequest], HttpResponse] | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Run the view holding the lock named by ``key``; busy after ``wait`` -> 409.

    ``key`` is a format string filled from the view's URL arguments and
    ``user`` (``request.user``), e.g. ``"purchase:{item_id}"`` or
    ``"profile:{user.pk}"``, or a callable ``(request, *args, **kwargs) -> str``.
    The lock lives ``timeout`` seconds at most and is released when the view
    returns or raises; the view finds it (and its fencing token) as
    ``request.rcoord_lock``. When busy, the response is ``on_busy(request)`` or a 409
    with ``Retry-After`` (JSON for JSON clients); a grant that
    ``RCOORD["LOCK_REPLICAS"]`` replicas did not acknowledge gives a 503. Works on sync and async
    views, and on class-based views through ``method_decorator``.
    """

    def decorator(view: Callable[..., Any]) -> Callable[..., Any]:
        name_for = _key_function(key, view)

        def prepare(request: HttpRequest, args: tuple, kwargs: dict) -> Lock | HttpResponse:
            try:
                return Lock(name_for(request, args, kwargs), timeout=timeout, wait=wait)
            except InvalidName as exc:
                return error_response(request, 400, "bad_lock_key", str(exc))

        def busy(request: HttpRequest, lock: Lock) -> HttpResponse:
            if on_busy is not None:
                return on_busy(request)
            return error_response(
                request,
                409,
                "locked",
                "This resource is busy; try again shortly.",
                retry_after=lock.holder_ttl if lock.holder_ttl is not None else timeout,
            )

        def not_replicated(request: HttpRequest, exc: LockNotReplicated) -> HttpResponse:
            logger.error("@locked view %s: %s", view.__qualname__, exc)
            return error_response(
                request,
                503,
                "lock_not_replicated",
                "The lock could not be made durable; try again shortly.",
                retry_after=1,
            )

        def report_loss(lock: Lock) -> None:
            logger.error(
                "@locked view %s outlived its lock %r (timeout %ss): another request may "
                "have run at the same time",
                view.__qualname__,
                lock.name,
                timeout,
            )

        if iscoroutinefunction(view):

            @functools.wraps(view)
            async def async_wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
                lock = prepare(request, args, kwargs)
                if isinstance(lock, HttpResponse):
                    return lock
                try:
                    if not await lock.aacquire():
                        return busy(request, lock)
                except LockNotReplicated as exc:
                    return not_replicated(request, exc)
                request.rcoord_lock = lock  # type: ignore[attr-defined]
                try:
                    return await view(request, *args, **kwargs)
                finally:
                    try:
                        await lock.arelease()
                    except LockLost:
                        report_loss(lock)

            return async_wrapper

        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            lock = prepare(request, args, kwargs)
            if isinstance(lock, HttpResponse):
                return lock
            try:
                if not lock.acquire():
                    return busy(request, lock)
            except LockNotReplicated as exc:
                return not_replicated(request, exc)
            request.rcoord_lock = lock  # type: ignore[attr-defined]
            try:
                return view(request, *args, **kwargs)
            finally:
                try:
                    lock.release()
                except LockLost:
                    report_loss(lock)

        return wrapper

    return decorator


def rate_limited(
    key: KeyTemplate, *, limit: int, seconds: float
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Allow ``limit`` calls of the view per ``seconds`` for each value of ``key``; then 429.

    ``key`` is filled like ``@locked``'s (``"download:{user.pk}"``, or a
    callable). The window starts at its first call (``ratelimit.allow_n``). Over
    the limit, the response is 429 with ``Retry-After`` (the seconds until the
    window ends), JSON for JSON clients. Sync, async and class-based views.
    """
    if not is_positive_int(limit):
        raise ImproperlyConfigured("@rate_limited: limit must be a positive integer.")
    if not is_number(seconds) or not seconds > 0:
        raise ImproperlyConfigured("@rate_limited: seconds must be a positive number.")

    def decorator(view: Callable[..., Any]) -> Callable[..., Any]:
        name_for = _key_function(key, view, "@rate_limited")

        def refusal(request: HttpRequest, args: tuple, kwargs: dict) -> HttpResponse | None:
            try:
                name = name_for(request, args, kwargs)
                result = hit(name, limit, seconds)
            except InvalidName as exc:
                return error_response(request, 400, "bad_rate_limit_key", str(exc))
            if result.allowed:
                return None
            return error_response(
                request,
                429,
                "rate_limited",
                f"Too many requests: {limit} per {seconds:g} seconds.",
                retry_after=result.retry_after,
            )

        if iscoroutinefunction(view):

            @functools.wraps(view)
            async def async_wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
                refused = await run_in_thread(refusal, request, args, kwargs)
                return refused if refused is not None else await view(request, *args, **kwargs)

            return async_wrapper

        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            refused = refusal(request, args, kwargs)
            return refused if refused is not None else view(request, *args, **kwargs)

        return wrapper

    return decorator
