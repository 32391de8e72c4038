"""View decorators: ``@locked`` and ``@rate_limited``."""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import math
import re
import string
from collections.abc import Callable, Iterator
from typing import Any

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, transaction
from django.http import HttpRequest, HttpResponse

from django_rcoord.connection import NO_REDIS
from django_rcoord.exceptions import InvalidName, LockLost, LockNotReplicated
from django_rcoord.identity import aget_user, client_ip, get_user, is_signed_in, requester
from django_rcoord.locks import Lock
from django_rcoord.ratelimit import RateLimitResult, ahit, check_algorithm, hit
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


def _escape_key_value(text: str) -> str:
    """A value filled into a key template, with ``%`` and ``:`` escaped: a URL argument or
    a user's field cannot spell the separators of the template around it (a user named
    ``ip`` asking for item ``127.0.0.1:x`` of ``"dl:{user.username}:{item_id}"`` would
    otherwise share an anonymous visitor's key). Values without either are unchanged."""
    return text.replace("%", "%25").replace(":", "%3A")


class _SignedInUser:
    """``user`` in a key template when someone is signed in: ``{user}`` is ``user:<pk>``
    (the middleware's "user" scope's name; never the username, which anyone may choose to
    read like another key's), and every attribute is the user's own (``{user.pk}``)."""

    def __init__(self, user: Any, requester: str) -> None:
        self._user = user
        self._requester = requester

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._user, name)

    def __getitem__(self, key: Any) -> Any:
        return self._user[key]


class _AnonymousUser:
    """``user`` in a key template when nobody is signed in: every ``{user...}`` field is
    ``ip:<client address>``, so anonymous clients are keyed apart, as the middleware's
    "user" scope keys them, instead of sharing one ``None`` key."""

    def __init__(self, requester: str) -> None:
        self._requester = requester

    def __getattr__(self, name: str) -> _AnonymousUser:
        if name.startswith("__"):
            raise AttributeError(name)
        return self

    def __getitem__(self, key: object) -> _AnonymousUser:
        return self


class _KeyFormatter(string.Formatter):
    """``str.format`` for key templates: each value filled in is escaped
    (``_escape_key_value``), except the requester that ``{user}`` stands for (``user:<pk>``
    or ``ip:<address>``, whose one ``:`` is the project's own), whatever its conversion."""

    def convert_field(self, value: Any, conversion: str | None) -> Any:
        if isinstance(value, (_SignedInUser, _AnonymousUser)):
            return value
        return super().convert_field(value, conversion)

    def format_field(self, value: Any, format_spec: str) -> str:
        if isinstance(value, (_SignedInUser, _AnonymousUser)):
            return format(value._requester, format_spec)
        return _escape_key_value(format(value, format_spec))


_key_formatter = _KeyFormatter()


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
        if self.uses_user:
            if is_signed_in(user):
                user = _SignedInUser(user, requester(request, user))
            else:
                user = _AnonymousUser(f"ip:{_escape_key_value(client_ip(request))}")
        try:
            return _key_formatter.vformat(self.key, args, {"user": user, **kwargs})
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


#: Errors of taking a lock that refuse the request (or, Redis unreachable, may fail open).
_ACQUIRE_ERRORS: tuple[type[Exception], ...] = (LockNotReplicated, *NO_REDIS)
#: Errors of releasing a lock after the view ran: logged, the response stands.
_RELEASE_ERRORS: tuple[type[Exception], ...] = (LockLost, *NO_REDIS)


class _AtomicRequestsInsideLock(set[str]):
    """The ``_non_atomic_requests`` of a sync ``@locked`` view.

    Django's handler wraps a view in ``transaction.atomic`` for each database with
    ``ATOMIC_REQUESTS`` whose alias is not in this attribute. Every alias is in this
    set, so the handler opens no transaction around the view: ``@locked`` opens them
    itself, inside the lock, so that they commit or roll back before it is released.
    The set's items are the aliases the view opted out of with
    ``transaction.non_atomic_requests`` (applied below or above ``@locked``).
    """

    def __contains__(self, alias: object) -> bool:
        return True

    def atomic_aliases(self, request: HttpRequest) -> list[str]:
        """The databases whose transaction the decorator opens, in Django's order: those
        with ATOMIC_REQUESTS that neither the view nor the view Django resolved opted
        out of (a class-based view's ``as_view()``, from its ``dispatch``)."""
        resolved = getattr(getattr(request, "resolver_match", None), "func", None)
        opted_out = {*self, *getattr(resolved, "_non_atomic_requests", ())}
        return [
            alias
            for alias, config in connections.settings.items()
            if config["ATOMIC_REQUESTS"] and alias not in opted_out
        ]


@contextlib.contextmanager
def _request_transactions(aliases: list[str]) -> Iterator[None]:
    """``transaction.atomic`` on each database, nested as Django nests ATOMIC_REQUESTS."""
    with contextlib.ExitStack() as stack:
        for alias in reversed(aliases):
            stack.enter_context(transaction.atomic(using=alias))
        yield


def _enclosing_transactions() -> list[str]:
    """The databases on which the view runs inside a transaction opened around it, which
    commits after the view returns: ATOMIC_REQUESTS around a class-based view whose
    method (not ``dispatch``) is decorated, a transaction middleware, a caller's
    ``atomic``. A test case's transaction never commits, so it does not count."""
    return [
        connection.alias
        for connection in connections.all(initialized_only=True)
        if connection.in_atomic_block
        and connection.atomic_blocks
        and not getattr(connection.atomic_blocks[0], "_from_testcase", False)
    ]


def _renders_later(response: Any) -> bool:
    """A TemplateResponse, which Django's handler would render after the view returned."""
    return callable(getattr(response, "render", None))


class _LockedView:
    """What ``@locked`` does around one view, but for the calls its sync and async
    wrappers make: taking and releasing the lock, running the view, rendering."""

    def __init__(
        self,
        view: Callable[..., Any],
        key: KeyTemplate,
        *,
        timeout: float,
        wait: float,
        on_busy: Callable[[HttpRequest], HttpResponse] | None,
        fail_open: bool,
        fair: bool = True,
    ) -> None:
        self.view_name = view.__qualname__
        self.name_for = _KeyFunction(key, view, "@locked")
        self.what = f"@locked on view {self.name_for.view_name}"
        self.timeout = timeout
        self.wait = wait
        self.on_busy = on_busy
        self.fail_open = fail_open
        self.fair = fair

    def lock(self, request: HttpRequest, name: str) -> Lock | HttpResponse:
        try:
            return Lock(name, timeout=self.timeout, wait=self.wait, fair=self.fair)
        except InvalidName as exc:
            return error_response(request, 400, "bad_lock_key", str(exc))

    def refused(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        """The answer when the lock could not be asked for: a 503, or None to run the
        view without it (Redis unreachable and ``fail_open``)."""
        if isinstance(exc, LockNotReplicated):
            logger.error("@locked view %s: %s", self.view_name, exc)
            return error_response(
                request,
                503,
                "lock_not_replicated",
                "The lock could not be made durable; try again shortly.",
                retry_after=1,
            )
        refused = unavailable(request, exc, fail_open=self.fail_open, what=self.what)
        if refused is None:
            request.rcoord_lock = None  # type: ignore[attr-defined]
        return refused

    def busy(self, request: HttpRequest, lock: Lock) -> HttpResponse:
        if self.on_busy is not None:
            return self.on_busy(request)
        # The holder's remaining TTL is what the lock knows: an upper bound (the holder
        # releases it when its view ends, usually sooner; an auto-renewing one may extend).
        retry_after = lock.holder_ttl if lock.holder_ttl is not None else self.timeout
        seconds = max(1, math.ceil(retry_after))
        return error_response(
            request,
            409,
            "locked",
            f"This resource is busy: its current holder's lock runs out within {seconds} s "
            "at the latest, and is usually released sooner.",
            retry_after=retry_after,
        )

    def release_failed(self, lock: Lock, exc: Exception) -> None:
        # The view has run: its response stands.
        if isinstance(exc, LockLost):
            logger.error(
                "@locked view %s outlived its lock %r (timeout %ss): another request may "
                "have run at the same time",
                self.view_name,
                lock.name,
                self.timeout,
            )
        else:
            logger.error(
                "@locked view %s could not release its lock %r, which expires within %ss: "
                "Redis unavailable: %s",
                self.view_name,
                lock.name,
                self.timeout,
                exc,
            )

    def release(self, lock: Lock) -> None:
        try:
            lock.release()
        except _RELEASE_ERRORS as exc:
            self.release_failed(lock, exc)

    async def arelease(self, lock: Lock) -> None:
        try:
            await lock.arelease()
        except _RELEASE_ERRORS as exc:
            self.release_failed(lock, exc)

    @contextlib.contextmanager
    def held(self, lock: Lock) -> Iterator[None]:
        """Release ``lock`` when the block ends or, when it ran inside transactions
        opened around it, once they have all committed (on_commit; if one rolls back
        instead, the lock ends with its timeout). A block that raises releases at once:
        its writes were rolled back (the request's transaction, or its savepoint in
        an enclosing one), or are left to the rollback of whoever opened the
        transaction around it, invisible to other requests until then."""
        enclosing = set(_enclosing_transactions())
        try:
            yield
        except BaseException:
            self.release(lock)
            raise
        if not enclosing:
            self.release(lock)
            return

        def on_commit_of(alias: str) -> Callable[[], None]:
            def committed() -> None:
                enclosing.discard(alias)
                if not enclosing:
                    self.release(lock)

            return committed

        for alias in list(enclosing):
            # Robust: the transaction has committed; a failure is logged, not raised.
            transaction.on_commit(on_commit_of(alias), using=alias, robust=True)


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
    _check_fail_open(fail_open, "@locked")

    def decorator(view: Callable[..., Any]) -> Callable[..., Any]:
        locked_view = _LockedView(
            view,
            key,
            timeout=timeout,
            wait=wait,
            on_busy=on_busy,
            fail_open=fail_open,
            fair=fair,
        )
        name_for = locked_view.name_for

        if iscoroutinefunction(view):
            # Django has no async transactions: an async view opens its own, and is
            # released after they ended. Under ATOMIC_REQUESTS it must opt out
            # (transaction.non_atomic_requests), as Django asks of every async view.
            async def run_async(request: HttpRequest, args: tuple, kwargs: dict) -> Any:
                response = await view(request, *args, **kwargs)
                if _renders_later(response):
                    await sync_to_async(response.render, thread_sensitive=True)()
                return response

            @functools.wraps(view)
            async def async_wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
                _check_request(request, "locked")
                lock = locked_view.lock(request, await name_for.async_name(request, args, kwargs))
                if isinstance(lock, HttpResponse):
                    return lock
                try:
                    acquired = await lock.aacquire()
                except _ACQUIRE_ERRORS as exc:
                    refused = locked_view.refused(request, exc)
                    return (
                        refused if refused is not None else await run_async(request, args, kwargs)
                    )
                if not acquired:
                    return locked_view.busy(request, lock)
                request.rcoord_lock = lock  # type: ignore[attr-defined]
                try:
                    return await run_async(request, args, kwargs)
                finally:
                    await locked_view.arelease(lock)

            return async_wrapper

        atomic_requests = _AtomicRequestsInsideLock(getattr(view, "_non_atomic_requests", ()))

        def run(request: HttpRequest, args: tuple, kwargs: dict) -> Any:
            with _request_transactions(atomic_requests.atomic_aliases(request)):
                response = view(request, *args, **kwargs)
                if _renders_later(response):
                    response.render()
            return response

        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            _check_request(request, "locked")
            lock = locked_view.lock(request, name_for.sync_name(request, args, kwargs))
            if isinstance(lock, HttpResponse):
                return lock
            try:
                acquired = lock.acquire()
            except _ACQUIRE_ERRORS as exc:
                refused = locked_view.refused(request, exc)
                return refused if refused is not None else run(request, args, kwargs)
            if not acquired:
                return locked_view.busy(request, lock)
            request.rcoord_lock = lock  # type: ignore[attr-defined]
            with locked_view.held(lock):
                return run(request, args, kwargs)

        wrapper._non_atomic_requests = atomic_requests  # type: ignore[attr-defined]
        return wrapper

    return decorator


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
    if not is_positive_int(limit):
        raise ImproperlyConfigured("@rate_limited: limit must be a positive integer.")
    if not is_number(seconds) or not seconds > 0:
        raise ImproperlyConfigured("@rate_limited: seconds must be a positive number.")
    try:
        check_algorithm(algorithm)
    except ValueError as exc:
        raise ImproperlyConfigured(f"@rate_limited: {exc}.") from None
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
                        await name_for.async_name(request, args, kwargs),
                        limit,
                        seconds,
                        algorithm=algorithm,
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
                result = hit(
                    name_for.sync_name(request, args, kwargs), limit, seconds, algorithm=algorithm
                )
            except InvalidName as exc:
                return bad_key(request, exc)
            except NO_REDIS as exc:
                refused = unavailable(request, exc, fail_open=fail_open, what=what)
            else:
                refused = refusal(request, result)
            return refused if refused is not None else view(request, *args, **kwargs)

        return wrapper

    return decorator
