"""What ``@locked`` does around a view: take the lock its key names, run the view (and
the request's transactions, for a sync view) inside it, release it once they ended."""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.http import HttpRequest, HttpResponse

from django_rcoord.connection.errors import NO_REDIS
from django_rcoord.exceptions import InvalidName, LockLost, LockNotReplicated
from django_rcoord.locks import Lock
from django_rcoord.responses import error_response, unavailable
from django_rcoord.viewkeys import KeyFunction, KeyTemplate, check_request

logger = logging.getLogger("django_rcoord.decorators")


#: Errors of taking a lock that refuse the request (or, Redis unreachable, may fail open).
ACQUIRE_ERRORS: tuple[type[Exception], ...] = (LockNotReplicated, *NO_REDIS)
#: Errors of releasing a lock after the view ran: logged, the response stands.
RELEASE_ERRORS: tuple[type[Exception], ...] = (LockLost, *NO_REDIS)


class NonAtomicRequests(set[str]):
    """The ``_non_atomic_requests`` of a sync ``@locked`` view: the databases on which
    Django's handler opens no ATOMIC_REQUESTS transaction around it.

    It holds every configured database, as ``transaction.non_atomic_requests(using=...)``
    on each would, so the handler opens none: ``@locked`` opens them itself, inside the
    lock, so that they commit or roll back before it is released. Which databases the
    view itself opted out of is ``opted_out``: those marked below ``@locked`` (read when
    it decorated the view) and those marked above it, which
    ``transaction.non_atomic_requests`` adds here.
    """

    def __init__(self, opted_out: Iterable[str]) -> None:
        super().__init__(connections)  # every alias of settings.DATABASES
        self.opted_out = set(opted_out)

    def add(self, alias: str) -> None:
        self.opted_out.add(alias)
        super().add(alias)

    def atomic_aliases(self, request: HttpRequest) -> list[str]:
        """The databases whose transaction the decorator opens, in Django's order: those
        with ATOMIC_REQUESTS that neither the view nor the view Django resolved opted
        out of (a class-based view's ``as_view()``, from its ``dispatch``)."""
        resolved = getattr(getattr(request, "resolver_match", None), "func", None)
        opted_out = self.opted_out | opted_out_of(resolved)
        return [
            alias
            for alias, config in connections.settings.items()
            if config["ATOMIC_REQUESTS"] and alias not in opted_out
        ]


def opted_out_of(view: Any) -> set[str]:
    """The databases ``view`` opted out of ATOMIC_REQUESTS on with
    ``transaction.non_atomic_requests`` (for a ``@locked`` view, its own marks)."""
    marked: Iterable[str] = getattr(view, "_non_atomic_requests", set())
    return set(getattr(marked, "opted_out", marked))


@contextlib.contextmanager
def request_transactions(aliases: list[str]) -> Iterator[None]:
    """``transaction.atomic`` on each database, nested as Django nests ATOMIC_REQUESTS."""
    with contextlib.ExitStack() as stack:
        for alias in reversed(aliases):
            stack.enter_context(transaction.atomic(using=alias))
        yield


def commits_later(connection: BaseDatabaseWrapper) -> bool:
    """Whether the view runs inside a transaction opened around it that commits after it
    returns: ATOMIC_REQUESTS around a class-based view whose method (not ``dispatch``)
    is decorated, a transaction middleware, a caller's ``atomic``.

    A test case's transaction never commits, so it does not count. Django offers no
    public way to tell it: ``in_atomic_block`` and ``get_autocommit()`` read the same in
    any atomic block, and ``atomic(durable=True)``, the one public face of the test
    case's mark, looks only at the innermost block, which here may be the request's own
    transaction opened inside the test case's. So this reads the mark Django's TestCase
    sets on the atomic blocks it opens, outermost first.
    """
    blocks = connection.atomic_blocks
    return connection.in_atomic_block and not (
        blocks and getattr(blocks[0], "_from_testcase", False)
    )


def enclosing_transactions() -> list[str]:
    """The databases on which the view runs inside a transaction that commits after it."""
    return [
        connection.alias
        for connection in connections.all(initialized_only=True)
        if commits_later(connection)
    ]


def renders_later(response: Any) -> bool:
    """A TemplateResponse, which Django's handler would render after the view returned."""
    return callable(getattr(response, "render", None))


class LockedView:
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
        self.view = view
        self.view_name = view.__qualname__
        #: The wrapper's ``_non_atomic_requests`` (sync views only: see the class).
        self.atomic_requests = NonAtomicRequests(opted_out_of(view))
        self.name_for = KeyFunction(key, view, "@locked")
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
        return unavailable(request, exc, fail_open=self.fail_open, what=self.what)

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
        except RELEASE_ERRORS as exc:
            self.release_failed(lock, exc)

    async def arelease(self, lock: Lock) -> None:
        try:
            await lock.arelease()
        except RELEASE_ERRORS as exc:
            self.release_failed(lock, exc)

    @contextlib.contextmanager
    def held(self, lock: Lock) -> Iterator[None]:
        """Release ``lock`` when the block ends or, when it ran inside transactions
        opened around it, once they have all committed (on_commit; if one rolls back
        instead, the lock ends with its timeout). A block that raises releases at once:
        its writes were rolled back (the request's transaction, or its savepoint in
        an enclosing one), or are left to the rollback of whoever opened the
        transaction around it, invisible to other requests until then."""
        enclosing = set(enclosing_transactions())
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

    # -- the wrappers' calls ------------------------------------------------------
    def call(self, request: HttpRequest, args: tuple, kwargs: dict) -> Any:
        """The sync wrapper: take the lock, run the view and its transactions inside it."""
        check_request(request, "locked")
        lock = self.lock(request, self.name_for.sync_name(request, args, kwargs))
        if isinstance(lock, HttpResponse):
            return lock
        try:
            acquired = lock.acquire()
        except ACQUIRE_ERRORS as exc:
            refused = self.refused(request, exc)
            if refused is not None:
                return refused
            request.rcoord_lock = None  # type: ignore[attr-defined]
            return self._run(request, args, kwargs)
        if not acquired:
            return self.busy(request, lock)
        request.rcoord_lock = lock  # type: ignore[attr-defined]
        with self.held(lock):
            return self._run(request, args, kwargs)

    async def acall(self, request: HttpRequest, args: tuple, kwargs: dict) -> Any:
        """The async wrapper. Django has no async transactions: an async view opens its
        own, and the lock is released after they ended. Under ATOMIC_REQUESTS it must opt
        out (``transaction.non_atomic_requests``), as Django asks of every async view."""
        check_request(request, "locked")
        lock = self.lock(request, await self.name_for.async_name(request, args, kwargs))
        if isinstance(lock, HttpResponse):
            return lock
        try:
            acquired = await lock.aacquire()
        except ACQUIRE_ERRORS as exc:
            refused = self.refused(request, exc)
            if refused is not None:
                return refused
            request.rcoord_lock = None  # type: ignore[attr-defined]
            return await self._arun(request, args, kwargs)
        if not acquired:
            return self.busy(request, lock)
        request.rcoord_lock = lock  # type: ignore[attr-defined]
        try:
            return await self._arun(request, args, kwargs)
        finally:
            await self.arelease(lock)

    def _run(self, request: HttpRequest, args: tuple, kwargs: dict) -> Any:
        with request_transactions(self.atomic_requests.atomic_aliases(request)):
            response = self.view(request, *args, **kwargs)
            if renders_later(response):
                response.render()
        return response

    async def _arun(self, request: HttpRequest, args: tuple, kwargs: dict) -> Any:
        response = await self.view(request, *args, **kwargs)
        if renders_later(response):
            await sync_to_async(response.render, thread_sensitive=True)()
        return response
