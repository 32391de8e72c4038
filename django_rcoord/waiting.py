"""How parts wait without polling Redis, and how async code waits without blocking its loop."""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections.abc import Callable
from typing import Any, TypeVar

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


async def run_in_thread(
    function: Callable[..., T], *args: Any, undo: Callable[[T], None] | None = None
) -> T:
    """Run blocking ``function(*args)`` in the default executor and await it.

    If the awaiting task is cancelled, the thread cannot be stopped; ``undo`` is
    called with its result when it finishes (e.g. to give back a lock it got late).
    """
    future = asyncio.get_running_loop().run_in_executor(None, function, *args)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        if undo is not None:

            def undo_when_done(done: asyncio.Future[T]) -> None:
                if done.cancelled() or done.exception() is not None:
                    return
                try:
                    undo(done.result())
                except Exception:
                    logger.exception("Undoing %s after a cancel failed", function)

            future.add_done_callback(undo_when_done)
        raise


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
