"""How parts wait without polling Redis, and how async code waits without blocking its loop.

Sync waiters ``BLPOP`` a wake-up list themselves (``wait_for_signal``). Async
waiters go through their event loop's ``SignalHub`` (``await_signal``): the
waiters of one loop on one wake-up list share a single blocking ``BLPOP``, on
a connection no short command uses, and take its tokens in the order they
came. A waiter costs a future, not a thread or a connection.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from django_rcoord import connection
from django_rcoord.conf import conf

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: The shortest BLPOP issued (BLPOP with timeout 0 would block forever).
MIN_BLOCK = 0.01


def _socket_timeout_cap(client: Any) -> float:
    """How long one BLPOP may block without tripping the client's socket timeout."""
    pool = getattr(client, "connection_pool", None)
    socket_timeout = getattr(pool, "connection_kwargs", {}).get("socket_timeout")
    if not socket_timeout:
        return math.inf
    return max(MIN_BLOCK, socket_timeout - 0.25)


def wait_for_signal(client: Any, key: str, seconds: float) -> bool:
    """Block on the wake-up list ``key`` for up to ``seconds``; True if a token was taken."""
    timeout = max(MIN_BLOCK, min(seconds, _socket_timeout_cap(client)))
    return client.blpop([key], timeout=timeout) is not None


#: Longest one shared BLPOP blocks before its hub looks whether anyone still waits.
HUB_BLOCK = 1.0
#: Lifetime of a wake-up token handed back because no waiter was left to take it, ms.
RETURNED_TOKEN_MS = 60_000


async def await_signal(client: Any, key: str, seconds: float) -> bool:
    """Wait up to ``seconds`` for a wake-up token on the list ``key``; True if one came.

    ``client`` is the redis.asyncio client of the caller's commands (the
    configured one, or one passed as ``client=``).
    """
    return await signal_hub(client).wait(key, seconds)


_hubs_of_clients: weakref.WeakKeyDictionary[Any, SignalHub] = weakref.WeakKeyDictionary()


def signal_hub(client: Any) -> SignalHub:
    """The hub of ``client``: the running loop's own for the configured client (it blocks
    on the loop's separate wait client), else one per client given by the caller."""
    clients = connection.loop_clients_if_made()
    if clients is not None and client is clients.commands:
        if clients.hub is None:
            clients.hub = SignalHub(clients.waits, clients.commands)
        return clients.hub
    hub = _hubs_of_clients.get(client)
    if hub is None:
        hub = _hubs_of_clients[client] = SignalHub(client, client)
    return hub


class SignalHub:
    """The waiters of one event loop on wake-up lists.

    Per list: a line of waiters (futures, in arrival order) and, while the line
    is not empty, one task blocking in ``BLPOP`` on ``waits``; each token it
    takes goes to the first waiter still waiting, or back to the list when none
    is left. At most ``RCOORD["ASYNC_WAIT_CONNECTIONS"]`` lists are blocked on
    at once; beyond that a list waits for a free connection in arrival order,
    and its waiters still wake at their own deadlines. Short commands (a
    holder's release) never go through ``waits``.
    """

    def __init__(self, waits: Any, commands: Any) -> None:
        self._waits = waits
        self._commands = commands
        self._lines: dict[str, collections.deque[asyncio.Future[bool]]] = {}
        self._servers: dict[str, asyncio.Task[None]] = {}
        self._connections = asyncio.Semaphore(conf.ASYNC_WAIT_CONNECTIONS)
        self._block = min(HUB_BLOCK, _socket_timeout_cap(waits))

        #: How many lists are blocked on now (one connection of ``waits`` each).
        self.blocking = 0

    async def wait(self, key: str, seconds: float) -> bool:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        line = self._lines.setdefault(key, collections.deque())
        line.append(waiter)
        if key not in self._servers:
            self._servers[key] = loop.create_task(self._serve(key, line))
        timer = loop.call_later(max(0.0, seconds), _expire, waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.result():
                self._hand_on(key, line)  # the token came as we were cancelled: pass it on
            raise
        finally:
            timer.cancel()
            try:
                line.remove(waiter)
            except ValueError:
                pass

    async def _serve(self, key: str, line: collections.deque[asyncio.Future[bool]]) -> None:
        try:
            async with self._connections:
                self.blocking += 1
                try:
                    while _anyone_waits(line):
                        popped = await self._waits.blpop([key], timeout=self._block)
                        if popped is not None:
                            self._hand_on(key, line)
                finally:
                    self.blocking -= 1
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # Redis is unreachable or refused: wake the line, whose next attempt reports it.
            logger.warning("waiting on %s failed: %s", key, exc)
            while line:
                _wake(line.popleft(), True)
        finally:
            if self._servers.get(key) is asyncio.current_task():
                del self._servers[key]
            if not line and self._lines.get(key) is line:
                del self._lines[key]
            elif line and key not in self._servers and not asyncio.get_running_loop().is_closed():
                self._servers[key] = asyncio.get_running_loop().create_task(self._serve(key, line))

    def _hand_on(self, key: str, line: collections.deque[asyncio.Future[bool]]) -> None:
        """Give a taken token to the first waiter still waiting, or back to Redis."""
        while line:
            if _wake(line.popleft(), True):
                return
        spawn(self._return_token(key))

    async def _return_token(self, key: str) -> None:
        try:
            async with self._commands.pipeline(transaction=False) as pipe:
                pipe.rpush(key, 1)
                pipe.pexpire(key, RETURNED_TOKEN_MS)
                await pipe.execute()
        except Exception as exc:
            logger.warning("could not hand back a wake-up token of %s: %s", key, exc)

    def close(self) -> None:
        for task in list(self._servers.values()):
            task.cancel()
        self._servers.clear()


# Tasks nobody awaits, kept alive until done.
_background: set[asyncio.Task[Any]] = set()


def _anyone_waits(line: collections.deque[asyncio.Future[bool]]) -> bool:
    while line and line[0].done():
        line.popleft()
    return bool(line)


def _wake(waiter: asyncio.Future[bool], value: bool) -> bool:
    if waiter.done():
        return False
    waiter.set_result(value)
    return True


def _expire(waiter: asyncio.Future[bool]) -> None:
    _wake(waiter, False)


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


class Repeater(threading.Thread):
    """Calls ``function()`` every ``interval`` seconds, from a daemon thread, until
    ``stop()`` or until it returns False. Exceptions are logged and the calls go on."""

    def __init__(self, interval: float, function: Callable[[], bool | None], name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.interval = interval
        self.function = function
        self._stopped = threading.Event()

    def stop(self) -> None:
        self._stopped.set()
        if self is not threading.current_thread() and self.is_alive():
            self.join()

    def run(self) -> None:
        while not self._stopped.wait(self.interval):
            try:
                if self.function() is False:
                    return
            except Exception:
                logger.exception("%s failed; trying again in %ss", self.name, self.interval)
