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

    def cancel(self) -> None:
        raise NotImplementedError

    def wake(self, at: float) -> None:
        """Run it no later than ``at`` (its clock's time): sooner than planned when its
        holder has work for it (a worker's finished task to acknowledge)."""
        raise NotImplementedError


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
        self._due: list[tuple[float, int, int, _ThreadRenewal]] = []
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
        if renewal.cancelled:
            return
        renewal._version += 1
        renewal.at = at
        heapq.heappush(self._due, (at, next(_order), renewal._version, renewal))
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rcoord-renewer", daemon=True)
            self._thread.start()
        elif self._due[0][3] is renewal:  # sooner than the thread planned to wake
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
            except Exception:
                logger.exception("%s failed; trying again in %ss", renewal.name, renewal.retry)
                delay = renewal.retry
            except BaseException:
                # Past Exception (a SystemExit, a stray KeyboardInterrupt): that job ends,
                # and the thread goes on with every other renewal of the process.
                logger.exception("%s raised past Exception; it is stopped", renewal.name)
                delay = None
            with self._lock:
                renewal.running = False
                self._changed.notify_all()  # a cancel() may wait for this run
                wake_at, renewal.wake_at = renewal.wake_at, None
                if delay is not None:
                    at = time.monotonic() + delay
                    self._push(renewal, at if wake_at is None else min(at, wake_at))

    def _next_due(self) -> _ThreadRenewal | None:
        """The renewal due now, taken off the table; else waits (under the lock) and
        returns None."""
        while self._due:
            at, _, version, renewal = self._due[0]
            if renewal.cancelled or version != renewal._version:
                heapq.heappop(self._due)
                continue
            wait = at - time.monotonic()
            if wait > 0:
                self._changed.wait(wait)
                return None
            heapq.heappop(self._due)
            return renewal
        self._changed.wait()
        return None


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
        self._due: list[tuple[float, int, int, _LoopRenewal]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._runs: set[asyncio.Task[None]] = set()  # strong references until they end

    def schedule(self, renewal: _LoopRenewal, at: float) -> None:
        if renewal.cancelled:
            return
        renewal._version += 1
        renewal.at = at
        heapq.heappush(self._due, (at, next(_order), renewal._version, renewal))
        if self._due[0][3] is renewal:
            self._arm()

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._due:
            _, _, version, renewal = self._due[0]
            if not renewal.cancelled and version == renewal._version:
                self._timer = self.loop.call_at(self._due[0][0], self._fire)
                return
            heapq.heappop(self._due)

    def _fire(self) -> None:
        self._timer = None
        now = self.loop.time()
        while self._due and self._due[0][0] <= now:
            _, _, version, renewal = heapq.heappop(self._due)
            if renewal.cancelled or version != renewal._version:
                continue
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
        except Exception:
            logger.exception("%s failed; trying again in %ss", renewal.name, renewal.retry)
            delay = renewal.retry
        except BaseException:
            # That job ends; the loop and its other renewals go on.
            logger.exception("%s raised past Exception; it is stopped", renewal.name)
            delay = None
        finally:
            renewal.run = None
        wake_at, renewal.wake_at = renewal.wake_at, None
        if delay is not None:
            at = self.loop.time() + delay
            self.schedule(renewal, at if wake_at is None else min(at, wake_at))


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
