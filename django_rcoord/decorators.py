"""View decorators: ``@locked`` and ``@rate_limited``."""

from __future__ import annotations

import functools
import inspect
import logging
import re
import string
from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse

from django_rcoord.connection import NO_REDIS
from django_rcoord.exceptions import InvalidName, LockLost, LockNotReplicated
from django_rcoord.identity import aget_user, get_user, is_signed_in, requester
from django_rcoord.locks import Lock
from django_rcoord.ratelimit import RateLimitResult, ahit, hit
from django_rcoord.responses import error_response, unavailable
from django_rcoord.validation import is_number, is_positive_int

logger = logging.getLogger(__name__)

KeyTemplate = str | Callable[..., Any]


class LockedRequest(HttpRequest):
    """The request a ``@locked`` view receives, for its type hints: ``rcoord_lock`` is the
    lock held, or None when ``fail_open=True`` let the view run without it."""

    rcoord_lock: Lock | None


def _check_request(request: Any, decorator: str) -> None:
    # As Django's own view decorators do: on a method without method_decorator, the
    # first argument is ``self``.
    if not hasattr(request, "META"):
        raise TypeError(
            f"{decorator} didn't receive an HttpRequest. If you are decorating a method, "
            "be sure to use @method_decorator."
        )


def _check_fail_open(fail_open: object, decorator: str) -> None:
    if not isinstance(fail_open, bool):
        raise ImproperlyConfigured(f"{decorator}: fail_open must be True or False.")


class _AnonymousUser:
    """``user`` in a key template when nobody is signed in: every ``{user...}`` field is
    ``ip:<client address>``, so anonymous clients are keyed apart, as the middleware's
    "user" scope keys them, instead of sharing one ``None`` key."""

    def __init__(self, requester: str) -> None:
        self.requester = requester

    def __getattr__(self, name: str) -> _AnonymousUser:
        if name.startswith("__"):
            raise AttributeError(name)
        return self

    def __getitem__(self, key: object) -> _AnonymousUser:
        return self

    def __format__(self, spec: str) -> str:
        return format(self.requester, spec)

    def __str__(self) -> str:  # "{user!s}"
        return self.requester


class _KeyFunction:
    """Turns a decorator's ``key`` into the name for one request.

    A format string is filled from the URL arguments and ``user``; the user is
    loaded only when the template names it, with ``await request.auser()`` on
    async views, and stands for the client's IP when nobody is signed in. A
    callable gets ``(request, *args, **kwargs)``; on async views it may be a
    coroutine function.
    """

    def __init__(self, key: KeyTemplate, view: Callable[..., Any], decorator: str) -> None:
        self.key = key
        self.decorator = decorator
        self.view_name = f"{view.__module__}.{getattr(view, '__qualname__', view)}"
        self.uses_user = False
        if callable(key):
            return
        if not isinstance(key, str) or not key:
            raise ImproperlyConfigured(
                f"{decorator} on {self.view_name}: key must be a str or a callable."
            )
        try:
            fields = [field for _, field, _, _ in string.Formatter().parse(key) if field]
        except ValueError as exc:
            raise ImproperlyConfigured(
                f"{decorator} key {key!r} on {self.view_name}: {exc}"
            ) from exc
        self.uses_user = any(re.match(r"user\b", field) for field in fields)

    def __call__(self, request: HttpRequest, args: tuple, kwargs: dict, user: Any) -> Any:
        """The name (or, from an async callable, an awaitable of it)."""
        if callable(self.key):
            return self.key(request, *args, **kwargs)
        if self.uses_user and not is_signed_in(user):
            user = _AnonymousUser(requester(request, user))
        try:
            return self.key.format(*args, **{"user": user, **kwargs})
        except (KeyError, IndexError, AttributeError) as exc:
            raise ImproperlyConfigured(
                f"{self.decorator} key {self.key!r} on view {self.view_name} names {exc}, which "
                f"the view does not get (URL kwargs: {sorted(kwargs)}; 'user' is request.user)."
            ) from exc

    def sync_name(self, request: HttpRequest, args: tuple, kwargs: dict) -> str:
        user = get_user(request) if self.uses_user else None
        return self(request, args, kwargs, user)

    async def async_name(self, request: HttpRequest, args: tuple, kwargs: dict) -> str:
        user = await aget_user(request) if self.uses_user else None
        name = self(request, args, kwargs, user)
        return await name if inspect.isawaitable(name) else name


def locked(
    key: KeyTemplate,
    *,
    timeout: float = 10,
    wait: float = 0,
    on_busy: Callable[[HttpRequest], HttpResponse] | None = None,
    fail_open: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Run the view holding the lock named by ``key``; busy after ``wait`` -> 409.

    ``key`` is a format string filled from the view's URL arguments and
    ``user`` (``request.user``; ``ip:<address>`` when nobody is signed in), e.g.
    ``"purchase:{item_id}"`` or ``"profile:{user.pk}"``, or a callable
    ``(request, *args, **kwargs) -> str``.
    The lock lives ``timeout`` seconds at most and is released when the view
    returns or raises; the view finds it (and its fencing token) as
    ``request.rcoord_lock``. When busy, the response is ``on_busy(request)`` or a 409
    with ``Retry-After`` (JSON for JSON clients); a grant that
    ``RCOORD["LOCK_REPLICAS"]`` replicas did not acknowledge gives a 503. When Redis
    cannot be reached, the request gets a 503 with ``Retry-After``, or with
    ``fail_open=True`` the view runs without the lock (``request.rcoord_lock`` is None).
    Works on sync and async views, and on class-based views through
    ``method_decorator``. On async views the lock is taken and waited for on
    redis.asyncio (no thread), the user of a ``{user...}`` key is loaded with
    ``await request.auser()``, and a callable key may be a coroutine function.
    """
    _check_fail_open(fail_open, "@locked")

    def decorator(view: Callable[..., Any]) -> Callable[..., Any]:
        name_for = _KeyFunction(key, view, "@locked")
        what = f"@locked on view {name_for.view_name}"

        def prepare(request: HttpRequest, name: str) -> Lock | HttpResponse:
            try:
                return Lock(name, timeout=timeout, wait=wait)
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

        def no_redis(request: HttpRequest, exc: BaseException) -> HttpResponse | None:
            """A 503, or None to run the view without the lock (fail open)."""
            refused = unavailable(request, exc, fail_open=fail_open, what=what)
            if refused is None:
                request.rcoord_lock = None  # type: ignore[attr-defined]
            return refused

        def report_loss(lock: Lock) -> None:
            logger.error(
                "@locked view %s outlived its lock %r (timeout %ss): another request may "
                "have run at the same time",
                view.__qualname__,
                lock.name,
                timeout,
            )

        def report_unreleased(lock: Lock, exc: BaseException) -> None:
            # The view has run: its response stands, and the lock ends with its timeout.
            logger.error(
                "@locked view %s could not release its lock %r, which expires within %ss: "
                "Redis unavailable: %s",
                view.__qualname__,
                lock.name,
                timeout,
                exc,
            )

        if iscoroutinefunction(view):

            @functools.wraps(view)
            async def async_wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
                _check_request(request, "locked")
                lock = prepare(request, await name_for.async_name(request, args, kwargs))
                if isinstance(lock, HttpResponse):
                    return lock
                try:
                    acquired = await lock.aacquire()
                except LockNotReplicated as exc:
                    return not_replicated(request, exc)
                except NO_REDIS as exc:
                    refused = no_redis(request, exc)
                    return refused if refused is not None else await view(request, *args, **kwargs)
                if not acquired:
                    return busy(request, lock)
                request.rcoord_lock = lock  # type: ignore[attr-defined]
                try:
                    return await view(request, *args, **kwargs)
                finally:
                    try:
                        await lock.arelease()
                    except LockLost:
                        report_loss(lock)
                    except NO_REDIS as exc:
                        report_unreleased(lock, exc)

            return async_wrapper

        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            _check_request(request, "locked")
            lock = prepare(request, name_for.sync_name(request, args, kwargs))
            if isinstance(lock, HttpResponse):
                return lock
            try:
                acquired = lock.acquire()
            except LockNotReplicated as exc:
                return not_replicated(request, exc)
            except NO_REDIS as exc:
                refused = no_redis(request, exc)
                return refused if refused is not None else view(request, *args, **kwargs)
            if not acquired:
                return busy(request, lock)
            request.rcoord_lock = lock  # type: ignore[attr-defined]
            try:
                return view(request, *args, **kwargs)
            finally:
                try:
                    lock.release()
                except LockLost:
                    report_loss(lock)
                except NO_REDIS as exc:
                    report_unreleased(lock, exc)

        return wrapper

    return decorator


def rate_limited(
    key: KeyTemplate, *, limit: int, seconds: float, fail_open: bool = True
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Allow ``limit`` calls of the view per ``seconds`` for each value of ``key``; then 429.

    ``key`` is filled like ``@locked``'s (``"download:{user.pk}"``, where ``user``
    is ``ip:<address>`` for anonymous clients, or a callable). The window starts at
    its first call (``ratelimit.allow_n``). Over the limit, the response is 429 with
    ``Retry-After`` (the seconds until the window ends), JSON for JSON clients. When
    Redis cannot be reached the view runs unlimited (``fail_open=True``, the default,
    as in the middleware), or with ``fail_open=False`` the request gets a 503 with
    ``Retry-After``. Sync, async and class-based views.
    """
    if not is_positive_int(limit):
        raise ImproperlyConfigured("@rate_limited: limit must be a positive integer.")
    if not is_number(seconds) or not seconds > 0:
        raise ImproperlyConfigured("@rate_limited: seconds must be a positive number.")
    _check_fail_open(fail_open, "@rate_limited")

    def decorator(view: Callable[..., Any]) -> Callable[..., Any]:
        name_for = _KeyFunction(key, view, "@rate_limited")
        what = f"@rate_limited on view {name_for.view_name}"

        def refusal(request: HttpRequest, result: RateLimitResult) -> HttpResponse | None:
            if result.allowed:
                return None
            return error_response(
                request,
                429,
                "rate_limited",
                f"Too many requests: {limit} per {seconds:g} seconds.",
                retry_after=result.retry_after,
            )

        def bad_key(request: HttpRequest, exc: InvalidName) -> HttpResponse:
            return error_response(request, 400, "bad_rate_limit_key", str(exc))

        if iscoroutinefunction(view):

            @functools.wraps(view)
            async def async_wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
                _check_request(request, "rate_limited")
                try:
                    result = await ahit(
                        await name_for.async_name(request, args, kwargs), limit, seconds
                    )
                except InvalidName as exc:
                    return bad_key(request, exc)
                except NO_REDIS as exc:
                    refused = unavailable(request, exc, fail_open=fail_open, what=what)
                else:
                    refused = refusal(request, result)
                return refused if refused is not None else await view(request, *args, **kwargs)

            return async_wrapper

        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            _check_request(request, "rate_limited")
            try:
                result = hit(name_for.sync_name(request, args, kwargs), limit, seconds)
            except InvalidName as exc:
                return bad_key(request, exc)
            except NO_REDIS as exc:
                refused = unavailable(request, exc, fail_open=fail_open, what=what)
            else:
                refused = refusal(request, result)
            return refused if refused is not None else view(request, *args, **kwargs)

        return wrapper

    return decorator
