"""One renewer per process: keeps every lease alive while its holder still needs it.

Lock holds with ``auto_renew``, the concurrency-limit middleware's permits and a
worker's task leases all need the same thing: call something again and again, on
time, until told to stop. A ``Renewal`` is one such job. Sync jobs run on one
daemon thread per process (``keep_alive``), over a table of due times; async jobs
run on the event loop that asked (``akeep_alive``), one short task per renewal
and none while nothing is due: no thread per lease, no task per lease.

A job returns the seconds until it is due again, or None when it is done (its
lease is lost or no longer needed). A job that raises is logged and tried again
after its ``retry`` delay; one that raises past ``Exception`` is logged and
stopped, and every other job goes on.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

logger = logging.getLogger(__name__)

_order = itertools.count()  # ties between equal due times, first come first served


class Renewal:
    """One job the renewer runs until it returns None or ``cancel()`` is called."""

    def __init__(self, name: str, retry: float) -> None:
        self.name = name
        self.retry = retry
        self.at = 0.0  # when it is due next (time.monotonic(), or the loop's time)
        self.cancelled = False
        self.wake_at: float | None = None  # a wake() that came while it ran
        self._version = 0  # bumped by each scheduling: older entries in the table are stale

    def failed(self, error: BaseException) -> float | None:
        """Log a run that raised ``error``; the seconds until it is tried again: its
        ``retry`` after an Exception, never (it is stopped) after one past Exception (a
        SystemExit, a stray KeyboardInterrupt)."""
        if isinstance(error, Exception):
            logger.error("%s failed; trying again in %ss", self.name, self.retry, exc_info=error)
            return self.retry
        logger.error("%s raised past Exception; it is stopped", self.name, exc_info=error)
        return None

    def next_at(self, delay: float | None, now: float) -> float | None:
        """When a run that asked for ``delay`` is due again (None: never), no later than a
        ``wake`` that came while it ran."""
        wake_at, self.wake_at = self.wake_at, None
        if delay is None:
            return None
        return now + delay if wake_at is None else min(now + delay, wake_at)

    def cancel(self) -> None:
        raise NotImplementedError

    def wake(self, at: float) -> None:
        """Run it no later than ``at`` (its clock's time): sooner than planned when its
        holder has work for it (a worker's finished task to acknowledge)."""
        raise NotImplementedError


class _DueTable:
    """Renewals by due time (a heap). Scheduling a renewal again leaves its older entry in
    the heap, stale (its version is behind), as does a cancel; stale heads are dropped
    when the first due is read."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, Any]] = []

    def push(self, renewal: Renewal, at: float) -> bool:
        """Put ``renewal`` in, due at ``at``; True when it is now the first due."""
        if renewal.cancelled:
            return False
        renewal._version += 1
        renewal.at = at
        heapq.heappush(self._heap, (at, next(_order), renewal._version, renewal))
        return self._heap[0][3] is renewal

    def first(self) -> tuple[float, Any] | None:
        """(due time, renewal) of the first live entry, left in the table; None if none."""
        while self._heap:
            at, _, version, renewal = self._heap[0]
            if not renewal.cancelled and version == renewal._version:
                return at, renewal
            heapq.heappop(self._heap)
        return None

    def pop_due(self, now: float) -> Any | None:
        """The first live renewal if it is due by ``now``, taken off the table."""
        first = self.first()
        if first is None or first[0] > now:
            return None
        heapq.heappop(self._heap)
        return first[1]


# -- sync: one thread per process ----------------------------------------------------------
class _ThreadRenewal(Renewal):
    def __init__(
        self, renewer: _Renewer, job: Callable[[], float | None], name: str, retry: float
    ) -> None:
        super().__init__(name, retry)
        self._renewer = renewer
        self.job = job
        self.running = False

    def cancel(self) -> None:
        """Stop it; when it is running on the renewer's thread, wait for that run to end (so
        no renewal lands after, say, the lock was released)."""
        self._renewer.cancel(self)

    def wake(self, at: float) -> None:
        self._renewer.wake(self, at)


class _Renewer:
    """The process's renewal thread and its table of due times (a heap)."""

    def __init__(self) -> None:
        self.forget_all()

    def forget_all(self) -> None:
        """Start afresh: in a forked child (a pre-forking server's worker) there is no
        renewal thread, and the parent's leases are the parent's to renew."""
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._due = _DueTable()
        self._thread: threading.Thread | None = None

    def schedule(self, renewal: _ThreadRenewal, at: float) -> None:
        with self._lock:
            self._push(renewal, at)

    def wake(self, renewal: _ThreadRenewal, at: float) -> None:
        with self._lock:
            if renewal.running:  # its run ends with the next due time: remember this one
                renewal.wake_at = at if renewal.wake_at is None else min(at, renewal.wake_at)
            elif at < renewal.at:
                self._push(renewal, at)

    def _push(self, renewal: _ThreadRenewal, at: float) -> None:
        """Put ``renewal`` in the table, due at ``at`` (under the lock)."""
        first = self._due.push(renewal, at)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rcoord-renewer", daemon=True)
            self._thread.start()
        elif first:  # sooner than the thread planned to wake
            # notify_all: cancel() waits on the same condition.
            self._changed.notify_all()

    def cancel(self, renewal: _ThreadRenewal) -> None:
        with self._lock:
            renewal.cancelled = True
            if threading.current_thread() is self._thread:
                return
            while renewal.running:
                self._changed.wait()

    def _run(self) -> None:
        while True:
            with self._lock:
                renewal = self._next_due()
                if renewal is None:
                    continue
                renewal.running = True
            try:
                delay = renewal.job()
            except BaseException as error:  # noqa: BLE001 (the thread goes on with the others)
                delay = renewal.failed(error)
            with self._lock:
                renewal.running = False
                self._changed.notify_all()  # a cancel() may wait for this run
                at = renewal.next_at(delay, time.monotonic())
                if at is not None:
                    self._push(renewal, at)

    def _next_due(self) -> _ThreadRenewal | None:
        """The renewal due now, taken off the table; else waits (under the lock) and
        returns None."""
        now = time.monotonic()
        renewal = self._due.pop_due(now)
        if renewal is None:
            first = self._due.first()
            self._changed.wait(None if first is None else first[0] - now)
        return renewal


_renewer = _Renewer()


os.register_at_fork(after_in_child=_renewer.forget_all)


def keep_alive(
    interval: float, renew: Callable[[], bool], name: str, *, first: float | None = None
) -> Renewal:
    """Call ``renew()`` every ``interval`` seconds (first after ``first``, default
    ``interval``) from the renewal thread, until it returns False or the renewal is
    cancelled."""
    return schedule(
        lambda: interval if renew() else None,
        interval if first is None else first,
        name,
        retry=interval,
    )


def schedule(job: Callable[[], float | None], delay: float, name: str, *, retry: float) -> Renewal:
    """Run ``job()`` after ``delay`` seconds on the renewal thread, then again after as many
    seconds as it returns, until it returns None or the renewal is cancelled."""
    renewal = _ThreadRenewal(_renewer, job, name, retry)
    _renewer.schedule(renewal, time.monotonic() + delay)
    return renewal


# -- async: on the event loop that asked -----------------------------------------------------
class _LoopRenewal(Renewal):
    def __init__(
        self,
        renewer: _LoopRenewer,
        job: Callable[[], Awaitable[float | None]],
        name: str,
        retry: float,
    ) -> None:
        super().__init__(name, retry)
        self._renewer = renewer
        self.job = job
        self.run: asyncio.Task[None] | None = None

    def cancel(self) -> None:
        """Stop it; a run in flight is cancelled."""
        self.cancelled = True
        run, loop = self.run, self._renewer.loop
        if run is None:
            return
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if here is loop:
            run.cancel()
        elif not loop.is_closed():  # from another thread (a sync response's iterator)
            loop.call_soon_threadsafe(run.cancel)

    def wake(self, at: float) -> None:
        if self.run is not None:
            self.wake_at = at if self.wake_at is None else min(at, self.wake_at)
        elif at < self.at:
            self._renewer.schedule(self, at)


class _LoopRenewer:
    """One event loop's renewals: a timer handle for the earliest, a short task per run."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._due = _DueTable()
        self._timer: asyncio.TimerHandle | None = None
        self._runs: set[asyncio.Task[None]] = set()  # strong references until they end

    def schedule(self, renewal: _LoopRenewal, at: float) -> None:
        if self._due.push(renewal, at):
            self._arm()

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        first = self._due.first()
        if first is not None:
            self._timer = self.loop.call_at(first[0], self._fire)

    def _fire(self) -> None:
        self._timer = None
        now = self.loop.time()
        while (renewal := self._due.pop_due(now)) is not None:
            run = self.loop.create_task(self._run(renewal), name=renewal.name)
            renewal.run = run
            self._runs.add(run)
            run.add_done_callback(self._runs.discard)
        self._arm()

    async def _run(self, renewal: _LoopRenewal) -> None:
        try:
            delay = await renewal.job()
        except asyncio.CancelledError:
            return
        except BaseException as error:  # noqa: BLE001 (the loop goes on with the others)
            delay = renewal.failed(error)
        finally:
            renewal.run = None
        at = renewal.next_at(delay, self.loop.time())
        if at is not None:
            self.schedule(renewal, at)


_loop_renewers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopRenewer] = (
    weakref.WeakKeyDictionary()
)


def akeep_alive(interval: float, renew: Callable[[], Awaitable[bool]], name: str) -> Renewal:
    """``keep_alive`` for async code: ``await renew()`` every ``interval`` seconds on the
    running event loop, until it returns False or the renewal is cancelled."""

    async def job() -> float | None:
        return interval if await renew() else None

    loop = asyncio.get_running_loop()
    renewer = _loop_renewers.get(loop)
    if renewer is None:
        renewer = _loop_renewers[loop] = _LoopRenewer(loop)
    renewal = _LoopRenewal(renewer, job, name, interval)
    renewer.schedule(renewal, loop.time() + interval)
    return renewal
