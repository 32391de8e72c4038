"""How parts wait without polling Redis, and how async code waits without blocking its loop.

Sync waiters ``BLPOP`` a wake-up list themselves (``wait_for_signal``). Async
waiters go through their event loop's ``SignalHub`` (``Waiting``): the
waiters of one loop on one wake-up list share a single blocking ``BLPOP``, on
a connection no short command uses, and take its tokens in the order they
came. A waiter costs a future, not a thread or a connection.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import math
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from django_rcoord.conf import conf
from django_rcoord.connection import loops
from django_rcoord.exceptions import RcoordError

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: The shortest BLPOP issued (BLPOP with timeout 0 would block forever).
MIN_BLOCK = 0.01


def socket_timeout_cap(client: Any) -> float:
    """How long one BLPOP may block without tripping the client's socket timeout."""
    pool = getattr(client, "connection_pool", None)
    if pool is None and hasattr(client, "get_default_node"):  # Redis Cluster: a node's pool
        node = client.get_default_node()
        pool = getattr(getattr(node, "redis_connection", None), "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if pool is None or kwargs is None:
        return math.inf
    if "socket_timeout" in kwargs:
        socket_timeout = kwargs["socket_timeout"]
    else:
        # Not given: the connection class's own default (5 s since redis-py 6, none before).
        socket_timeout = _default_socket_timeout(pool)
    if not socket_timeout:
        return math.inf
    return max(MIN_BLOCK, socket_timeout - 0.25)


#: The default socket timeout of each pool's connections, read once per pool.
_pool_defaults: weakref.WeakKeyDictionary[Any, float | None] = weakref.WeakKeyDictionary()


def _default_socket_timeout(pool: Any) -> float | None:
    """The socket timeout a connection of ``pool`` gets when its kwargs give none, as
    redis-py sets it: read from a connection made with the pool's kwargs and never
    connected (a constructor opens no socket)."""
    try:
        return _pool_defaults[pool]
    except (KeyError, TypeError):
        pass
    try:
        timeout = pool.connection_class(**pool.connection_kwargs).socket_timeout
    except Exception:  # noqa: BLE001 - a class that cannot be made so: no cap, as before
        timeout = None
    timeout = float(timeout) if isinstance(timeout, (int, float)) else None
    # A pool that takes no weak reference is asked again next time.
    with contextlib.suppress(TypeError):
        _pool_defaults[pool] = timeout
    return timeout


def wait_for_signal(client: Any, key: str, seconds: float) -> bool:
    """Block on the wake-up list ``key`` for up to ``seconds``; True if a token was taken."""
    return pop_signal(client, key, seconds) is not None


def wait_for_entry(client: Any, key: str, seconds: float) -> bool:
    """Block until the list ``key`` holds something, for up to ``seconds``, taking nothing
    (a BLMOVE of its head back onto its head): every waiter wakes, and what woke them stays
    for the one that takes it. True when the list held something."""
    timeout = max(MIN_BLOCK, min(seconds, socket_timeout_cap(client)))
    return client.blmove(key, key, timeout, "LEFT", "LEFT") is not None


def pop_signal(client: Any, key: str, seconds: float) -> bytes | None:
    """Block on the wake-up list ``key`` for up to ``seconds``; the token taken, or None."""
    timeout = max(MIN_BLOCK, min(seconds, socket_timeout_cap(client)))
    popped = client.blpop([key], timeout=timeout)
    return None if popped is None else popped[1]


#: Longest one shared BLPOP blocks before its hub looks whether anyone still waits.
HUB_BLOCK = 1.0
#: Lifetime of a wake-up token handed back because no waiter was left to take it, ms.
RETURNED_TOKEN_MS = 60_000


class Waiting:
    """One async waiter's place in line for wake-up tokens of the list ``key``.

    ``await wait(seconds)`` returns True when a token came, False when
    ``seconds`` passed; ``await take(seconds)`` returns the token itself, or
    None. The place is taken at the first ``wait`` and kept between waits (a
    waiter that asks Redis again in between does not go to the back of the
    line); ``leave()`` gives it up. ``order`` (a fair semaphore's
    ticket) places the waiter among the others by it; without one, by arrival.
    ``client`` is the redis.asyncio client of the caller's commands (the
    configured one, or one passed as ``client=``). ``unclaimed`` is what becomes
    of a token the hub took when no waiter of its loop waits any more (a lock's
    hand-over is released); without it, or when it returns False, the token goes
    back on the list. The place holds ``client`` (its hub refers to it weakly).
    """

    __slots__ = ("_client", "_hub", "_key", "future", "joined", "order", "unclaimed")

    def __init__(self, client: Any, key: str, unclaimed: Unclaimed | None = None) -> None:
        self._client = client
        self._hub = signal_hub(client)
        self._key = key
        self.future: asyncio.Future[bytes | None] | None = None  # set while waiting
        self.joined = False
        self.order: float = math.inf
        self.unclaimed = unclaimed

    async def wait(self, seconds: float, order: float | None = None) -> bool:
        return await self.take(seconds, order) is not None

    async def take(self, seconds: float, order: float | None = None) -> bytes | None:
        if order is not None and not self.joined:
            self.order = order
        return await self._hub.wait(self._key, self, seconds)

    def leave(self) -> None:
        self._hub.leave(self._key, self)


#: What a hub does with a token nobody of its loop waits for: True when it was dealt with.
Unclaimed = Callable[[bytes], Awaitable[bool]]

#: The hubs of clients passed as ``client=``. A hub refers to its client weakly, so the
#: client (and with it its entry here) goes once its caller drops it.
_hubs_of_clients: weakref.WeakKeyDictionary[Any, SignalHub] = weakref.WeakKeyDictionary()


def signal_hub(client: Any) -> SignalHub:
    """The hub of ``client``: the running loop's own for the configured client (it blocks
    on the loop's separate wait client), else one per client given by the caller."""
    clients = loops.loop_clients_if_made()
    if clients is not None and client is clients.commands:
        if clients.hub is None:
            clients.hub = SignalHub(clients.waits, clients.commands)
        return clients.hub
    hub = _hubs_of_clients.get(client)
    if hub is None:
        hub = _hubs_of_clients[client] = SignalHub(client, client, weak=True)
    return hub


class SignalHub:
    """The waiters of one event loop on wake-up lists.

    Per list: a line of places (``Waiting``, in arrival order) and, while the
    line is not empty, one task blocking in ``BLPOP`` on ``waits``; each token it
    takes goes to the first place whose waiter is waiting now, or back to the
    list when none is. At most ``RCOORD["ASYNC_WAIT_CONNECTIONS"]`` lists are
    blocked on at once; beyond that a list waits for a free connection in
    arrival order, and its waiters still wake at their own deadlines. Short
    commands (a holder's release) never go through ``waits``. A token is handed
    to its waiter as it was popped (a lock's hand-over carries the grant).

    A ``BLPOP`` that fails (connection closed or reset, an error reply) wakes
    the waiters waiting on its list, which ask Redis again, once: if the next
    ``BLPOP`` on that list fails too before any came back, the waiters waiting
    then get its error. Nobody waits in a loop of failures, and the warning is
    logged once.

    ``weak=True`` (the hub of a client passed as ``client=``): the hub refers
    to its clients weakly and holds nothing that holds them once its lines are
    empty, so dropping the client drops the hub. Its waiters' places hold the
    client while they wait.
    """

    def __init__(self, waits: Any, commands: Any, *, weak: bool = False) -> None:
        self._waits: Callable[[], Any] = weakref.ref(waits) if weak else _strong(waits)
        self._commands: Callable[[], Any] = weakref.ref(commands) if weak else _strong(commands)
        self._lines: dict[str, list[Waiting]] = {}
        self._unclaimed: dict[str, Unclaimed] = {}
        self._servers: dict[str, asyncio.Task[None]] = {}
        #: Lists whose last BLPOP failed: their waiters have asked Redis again once.
        self._failing: set[str] = set()
        #: Per list whose server pauses: resolved when someone waits again or the line empties.
        self._resume: dict[str, asyncio.Future[None]] = {}
        self._connections = asyncio.Semaphore(conf.ASYNC_WAIT_CONNECTIONS)
        self._block = min(HUB_BLOCK, socket_timeout_cap(waits))
        #: How many lists are blocked on now (one connection of ``waits`` each).
        self.blocking = 0

    async def wait(self, key: str, place: Waiting, seconds: float) -> bytes | None:
        loop = asyncio.get_running_loop()
        line = self._lines.get(key)
        if line is None:
            line = self._lines[key] = []
        if not place.joined:
            bisect.insort_right(line, place, key=_order)
            place.joined = True
            if place.unclaimed is not None:
                self._unclaimed[key] = place.unclaimed
        if key not in self._servers:
            self._servers[key] = loop.create_task(self._serve(key, line))
        waiter = place.future = loop.create_future()
        self._wake_server(key)
        timer = loop.call_later(max(0.0, seconds), _expire, waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if (
                waiter.done()
                and not waiter.cancelled()
                and waiter.exception() is None
                and waiter.result() is not None
            ):
                # The token came as we were cancelled: pass it on.
                self._hand_on(key, line, waiter.result(), self._commands())
            raise
        finally:
            timer.cancel()
            place.future = None

    def waiting(self, key: str) -> int:
        """How many waiters of this loop are in line on the list ``key``."""
        return len(self._lines.get(key, ()))

    def leave(self, key: str, place: Waiting) -> None:
        line = self._lines.get(key)
        if place.joined and line is not None:
            line.remove(place)
            if not line:
                if key in self._servers:
                    self._wake_server(key)  # to end
                else:
                    self._forget(key)
        place.joined = False

    def _wake_server(self, key: str) -> None:
        resume = self._resume.pop(key, None)
        if resume is not None and not resume.done():
            resume.set_result(None)

    def _forget(self, key: str) -> None:
        # Nobody is in line: drop what the line kept (its hand-over callback holds a client).
        del self._lines[key]
        self._unclaimed.pop(key, None)
        self._failing.discard(key)

    async def _serve(self, key: str, line: list[Waiting]) -> None:
        # Held strongly only while someone is in line (their places hold the client too).
        waits, commands = self._waits(), self._commands()
        try:
            if waits is None or commands is None:
                raise RcoordError("the client this list was waited on with is gone")
            async with self._connections:
                await loops.aresolve_client(waits)
                self.blocking += 1
                try:
                    while line:
                        if not _someone_waits(line):
                            # The woken are asking Redis again, or leaving: no BLPOP (one
                            # after the last left could outlive the caller's client).
                            await self._pause(key)
                            continue
                        popped = await waits.blpop([key], timeout=self._block)
                        self._failing.discard(key)
                        if popped is not None:
                            self._hand_on(key, line, popped[1], commands)
                finally:
                    self.blocking -= 1
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 (whatever ends the BLPOP, the line must hear)
            self._failed(key, line, exc)
        finally:
            if self._servers.get(key) is asyncio.current_task():
                del self._servers[key]
            if not line and self._lines.get(key) is line:
                self._forget(key)

    async def _pause(self, key: str) -> None:
        resume = self._resume[key] = asyncio.get_running_loop().create_future()
        try:
            await resume
        finally:
            if self._resume.get(key) is resume:
                del self._resume[key]

    def _failed(self, key: str, line: list[Waiting], exc: Exception) -> None:
        """The BLPOP on ``key`` failed: its waiters ask Redis again, or, if the last one
        failed too, get the error."""
        if not line:
            # The last waiter left while it blocked (e.g. its caller then closed the client).
            logger.debug("waiting on %s ended with nobody in line: %s", key, str(exc))
            return
        waiting = [
            place.future for place in line if place.future is not None and not place.future.done()
        ]
        if key in self._failing:
            logger.debug(
                "waiting on %s failed again: %s; %d waiters fail", key, str(exc), len(waiting)
            )
            for future in waiting:
                future.set_exception(exc)
            return
        self._failing.add(key)
        logger.warning("waiting on %s failed: %s; its waiters ask Redis again", key, str(exc))
        for future in waiting:
            _expire(future)

    def _hand_on(self, key: str, line: list[Waiting], token: bytes, commands: Any) -> None:
        """Give a taken token to the first place waiting now, or back to Redis."""
        for place in line:
            if place.future is not None and _wake(place.future, token):
                return
        spawn(self._return_token(commands, key, token, self._unclaimed.get(key)))

    async def _return_token(
        self, commands: Any, key: str, token: bytes, unclaimed: Unclaimed | None
    ) -> None:
        try:
            if unclaimed is not None and await unclaimed(token):
                return
            if commands is None:
                raise RcoordError("its client is gone")
            async with commands.pipeline(transaction=False) as pipe:
                pipe.rpush(key, token)
                pipe.pexpire(key, RETURNED_TOKEN_MS)
                await pipe.execute()
        except Exception as exc:  # noqa: BLE001 (a background task: log, never die unseen)
            logger.warning("could not hand back a wake-up token of %s: %s", key, exc)

    def close(self) -> None:
        for task in list(self._servers.values()):
            task.cancel()
        self._servers.clear()


# Tasks nobody awaits, kept alive until done.
_background: set[asyncio.Task[Any]] = set()


def _strong(client: Any) -> Callable[[], Any]:
    return lambda: client


def _someone_waits(line: list[Waiting]) -> bool:
    """True when a place of ``line`` waits for a token now."""
    return any(place.future is not None and not place.future.done() for place in line)


def _order(place: Waiting) -> float:
    return place.order


def _wake(waiter: asyncio.Future[bytes | None], token: bytes) -> bool:
    if waiter.done():
        return False
    waiter.set_result(token)
    return True


def _expire(waiter: asyncio.Future[bytes | None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def spawn(coroutine: Any) -> asyncio.Task[Any]:
    """Run ``coroutine`` in the background of the running loop (e.g. to give back a lock a
    cancelled waiter got), keeping its task alive and logging its failure."""
    task = asyncio.get_running_loop().create_task(coroutine)
    _background.add(task)

    def done(finished: asyncio.Task[Any]) -> None:
        _background.discard(finished)
        if not finished.cancelled() and finished.exception() is not None:
            logger.error("background %r failed", coroutine, exc_info=finished.exception())

    task.add_done_callback(done)
    return task
