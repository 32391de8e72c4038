"""The core of ``Semaphore``, with no I/O: its settings, keys and script arguments, and its
acquire as steps both faces run (``django_rcoord.steps``: the sync face, ``sync``, sends
them with redis-py; the async face, ``aio``, with redis.asyncio)."""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Callable
from typing import Any

from django_rcoord.exceptions import SemaphoreTimeout
from django_rcoord.keys import encoded_instance_keys
from django_rcoord.steps import Attempt, Leave, Steps, Wait
from django_rcoord.validation import check_timeout_and_wait, is_positive_int

logger = logging.getLogger(__name__)

#: Seconds a waiter keeps its place in line without asking again.
WAITER_LEASE = 2.0

#: The keys of one semaphore: acquire takes all five, release all but the tickets.
KEY_PARTS = ("holders", "waiters", "waiter-leases", "tickets", "signal")

# Identifiers taken by ``with semaphore:`` in this thread / task, per semaphore.
_entered: contextvars.ContextVar[tuple[tuple[int, str], ...]] = contextvars.ContextVar(
    "rcoord_semaphore_entered", default=()
)


class SemaphoreCore:
    """A semaphore's name, limit, lease, fairness and default wait, its keys, and what its
    scripts are sent and answer."""

    def __init__(
        self,
        name: str,
        limit: int,
        *,
        timeout: float = 10,
        fair: bool = True,
        wait: float = 0,
        client: Any = None,
    ) -> None:
        if not is_positive_int(limit):
            raise ValueError("limit must be a positive integer")
        check_timeout_and_wait(timeout, wait)
        self.name = name
        self.limit = limit
        self.timeout = timeout
        self.fair = fair
        self.wait = wait
        self._client = client
        self._keys = encoded_instance_keys("semaphore", name, KEY_PARTS)
        self._release_keys = (*self._keys[:3], self._keys[4])

    # The keys as str, for the few commands outside the scripts.
    @property
    def _holders_key(self) -> str:
        return self._keys[0].decode()

    @property
    def _waiters_key(self) -> str:
        return self._keys[1].decode()

    @property
    def _signal_key(self) -> str:
        return self._keys[4].decode()

    @property
    def _lease_ms(self) -> int:
        return max(1, int(self.timeout * 1000))

    # -- the scripts' arguments ------------------------------------------------
    def _acquire_args(
        self, identifier: str, queue: bool, woken: bool, in_line: bool
    ) -> tuple[Any, ...]:
        """ARGV of semaphore_acquire.lua. ``in_line``: an earlier attempt of this acquire was
        refused with ``queue`` (only then does the script look the caller up in line)."""
        return (
            identifier,
            self.limit,
            self._lease_ms,
            int(self.fair),
            int(queue),
            _waiter_lease_ms(),
            int(woken),
            int(in_line),
        )

    @staticmethod
    def _release_args(identifier: str) -> tuple[str, int]:
        return identifier, _waiter_lease_ms()

    def _refresh_args(self, identifier: str) -> tuple[str, int]:
        return identifier, self._lease_ms

    # -- acquiring -------------------------------------------------------------
    def _acquisition(
        self, identifier: str, wait: float, clock: Callable[[], float]
    ) -> Steps[str | None]:
        """One acquire: ``identifier`` once it holds a permit, None when ``wait`` ran out.
        Until then ``identifier`` is a permit granted in flight or a place in line, either
        way given back by a face whose step raises."""
        deadline = clock() + wait
        woken = in_line = False
        while True:
            remaining = deadline - clock()
            result = yield Attempt(self._acquire_args(identifier, remaining > 0, woken, in_line))
            if result == 1:
                return identifier
            in_line = in_line or remaining > 0
            remaining = deadline - clock()
            if remaining <= 0:
                if wait > 0:
                    yield Leave(identifier)
                return None
            # In an async face's loop, the line for wake-ups follows the tickets.
            token = yield Wait(_block_after(result, remaining), result[2])
            woken = token is not None

    # -- keeping ---------------------------------------------------------------
    def _overdue(self, max_hold: float | None) -> Callable[[], bool]:
        """Whether a permit kept with ``max_hold`` is held past it now (said once, in the
        log: it is then no longer refreshed, and ends within its lease)."""
        until = None if max_hold is None else time.monotonic() + max_hold

        def overdue() -> bool:
            if until is None or time.monotonic() < until:
                return False
            logger.warning(
                "Permit of semaphore %r held past its max_hold of %ss: no longer refreshed",
                self.name,
                max_hold,
            )
            return True

        return overdue

    def _refreshed(self, refreshed: bool) -> bool:
        if not refreshed:
            logger.warning("Permit of semaphore %r lapsed while held", self.name)
        return refreshed

    @property
    def _keeping(self) -> str:
        return f"refreshing a permit of {self.name!r}"

    # -- with ------------------------------------------------------------------
    def _enter(self, identifier: str | None) -> str:
        """Remember a permit taken by ``with`` in this thread / task, or raise the timeout."""
        if identifier is None:
            raise SemaphoreTimeout(
                f"No permit of semaphore {self.name!r} (limit {self.limit}) within {self.wait}s."
            )
        _entered.set((*_entered.get(), (id(self), identifier)))
        return identifier

    def _pop_entered(self) -> str:
        entered = _entered.get()
        for position in range(len(entered) - 1, -1, -1):
            if entered[position][0] == id(self):
                _entered.set(entered[:position] + entered[position + 1 :])
                return entered[position][1]
        raise RuntimeError("Semaphore exited without a matching enter")

    def _exited(self, released: bool, exc_type: type[BaseException] | None) -> None:
        if not released and exc_type is None:
            logger.warning("Permit of semaphore %r had expired before release", self.name)

    def __repr__(self) -> str:
        kind = "fair" if self.fair else "counting"
        return f"<Semaphore {self.name!r} ({kind}, limit {self.limit}, timeout {self.timeout}s)>"


def _waiter_lease_ms() -> int:
    return int(WAITER_LEASE * 1000)


def _block_after(result: Any, remaining: float) -> float:
    """How long a refused caller waits for a wake-up before asking again: until its place
    in line would lapse, or a holder's lease ends, at most ``remaining``."""
    next_expiry = result[1] / 1000 if result[1] >= 0 else remaining
    return min(remaining, WAITER_LEASE / 2, max(next_expiry, 0))


def count_after(server_time: tuple[int, int]) -> str:
    """The ZCOUNT lower bound for leases still running at ``server_time`` (TIME's reply)."""
    seconds, micros = server_time
    return f"({int(seconds) * 1000 + int(micros) // 1000}"
