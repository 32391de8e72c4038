"""One core, two faces: an operation that waits on Redis, written once with no I/O.

A core is a generator: it yields the next step (an attempt, a wait, a confirmation: plain
records of what to send) and receives the reply, and it alone decides what the state
becomes and what comes next. ``run`` performs its steps with a sync face's calls,
``arun`` with an async face's awaits, so the two faces of ``Lock.acquire`` and
``Semaphore.acquire`` differ only in how a step is sent and cannot drift apart. A core
raises what its caller should see; a step's own error propagates from the face.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from django_rcoord.waiting import Unclaimed, Waiting, spawn

Result = TypeVar("Result")

#: A core: yields steps, receives their replies, returns its result.
Steps = Generator[Any, Any, Result]


@dataclass(frozen=True, slots=True)
class Attempt:
    """Run the acquire script with ``args``, after a pause of ``pause`` seconds."""

    args: tuple[Any, ...]
    pause: float = 0.0


@dataclass(frozen=True, slots=True)
class Wait:
    """Block up to ``seconds`` on the wake-up list; ``order`` places an async waiter among
    the others of its loop (a fair semaphore's ticket). Reply: the token, or None."""

    seconds: float
    order: float | None = None


@dataclass(frozen=True, slots=True)
class Leave:
    """Give ``identifier`` up (a waiter out of time leaves the line)."""

    identifier: str


def run(steps: Steps[Result], perform: Callable[[Any], Any]) -> Result:
    """Drive ``steps`` to its result, performing each step with ``perform``."""
    finished, value = advance(steps, None)
    while not finished:
        finished, value = advance(steps, perform(value))
    return value


async def arun(steps: Steps[Result], perform: Callable[[Any], Awaitable[Any]]) -> Result:
    """``run`` for an async face."""
    finished, value = advance(steps, None)
    while not finished:
        finished, value = advance(steps, await perform(value))
    return value


def advance(steps: Steps[Any], reply: Any) -> tuple[bool, Any]:
    """(False, the next step) or, once ``steps`` returned, (True, its result). Only the
    core's own end is caught here: a step's error, or a StopIteration it raised, is not."""
    try:
        return False, steps.send(reply)
    except StopIteration as done:
        return True, done.value


class Shielded:
    """An async face's attempts: each runs to its end even if its waiter is cancelled
    meanwhile (the server may grant it all the same), so what it got can be given back
    once it is known, not before."""

    __slots__ = ("attempt",)

    def __init__(self) -> None:
        self.attempt: asyncio.Future[Any] | None = None

    async def __call__(self, attempt: Coroutine[Any, Any, Result]) -> Result:
        self.attempt = asyncio.ensure_future(attempt)
        return await asyncio.shield(self.attempt)

    def give_back(self, release: Coroutine[Any, Any, Any]) -> None:
        """Run ``release`` in the background, after the attempt in flight (if any) ends."""
        spawn(self._after_attempt(release))

    async def _after_attempt(self, release: Coroutine[Any, Any, Any]) -> None:
        attempt = self.attempt
        if attempt is not None and not attempt.done():
            await asyncio.wait([attempt])
        await release


class AsyncSteps:
    """What an async face keeps while it sends one acquire's steps: the client, its
    attempts (shielded) and its place in the loop's line for the signal list (taken at
    the first wait, kept between waits, left with ``leave``)."""

    __slots__ = ("attempts", "client", "waiting")

    def __init__(self, client: Any) -> None:
        self.client = client
        self.attempts = Shielded()
        self.waiting: Waiting | None = None

    def place(self, key: str, unclaimed: Unclaimed | None = None) -> Waiting:
        if self.waiting is None:
            self.waiting = Waiting(self.client, key, unclaimed)
        return self.waiting

    def leave(self) -> None:
        if self.waiting is not None:
            self.waiting.leave()

    async def run(
        self,
        steps: Steps[Result],
        perform: Callable[[Any], Awaitable[Any]],
        give_back: Callable[[], Coroutine[Any, Any, Any] | None],
    ) -> Result:
        """``arun(steps, perform)``; when it raises (a cancelled waiter, a cut reply), what
        may have been granted is given back (``give_back()``'s release, None for nothing),
        after the attempt in flight ends. The line is left either way."""
        try:
            return await arun(steps, perform)
        except BaseException:
            release = give_back()
            if release is not None:
                self.attempts.give_back(release)
            raise
        finally:
            self.leave()
