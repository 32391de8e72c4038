"""What a worker holds, shared by its loop and its keeper.

A worker holds tasks in three states: taken and not started (its batch), running, and run
but not yet acknowledged. ``Holdings`` keeps them and sends every call that changes them
(the finish-and-take exchange, a give-back, a stopped run's finish) or renews their leases,
each under its lock, so the keeper never renews from a stale view and never gives back a
task the loop is starting. The lock is the object's own: the loop and the keeper ask the
object (the keeper's turn through ``when_free``, which never waits), and nothing else
takes it. When to acknowledge early, give back or renew is the keeper's decision
(``keeper``); when to stop, the loop's (``loop``).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import NamedTuple, TypeVar

from django_rcoord.queues.outcomes import Kind
from django_rcoord.queues.worker.budget import BurstQuorum, TaskBudget
from django_rcoord.queues.worker.jobs import Done, Job
from django_rcoord.queues.worker.session import QueueSession

logger = logging.getLogger(__name__)

T = TypeVar("T")


class Held(NamedTuple):
    """What a worker holds, as its keeper plans by it."""

    running: Job | None
    running_since: float  # when the running task started (time.monotonic())
    waiting: bool  # tasks taken and not started wait behind it
    oldest_done_at: float | None  # when the oldest task run, not yet acknowledged, ended


def _nothing(_: Held) -> None:
    return None


class Holdings:
    """The tasks worker ``session.worker_id`` holds. What it takes is reserved from
    ``budget`` first (loops sharing a budget never take more than it has left) and what it
    does not run is released; a take or finish is a change the loops sharing ``quorum``
    (when given) must look at again."""

    def __init__(
        self, session: QueueSession, budget: TaskBudget, quorum: BurstQuorum | None = None
    ) -> None:
        self.session = session
        self.budget = budget
        self.quorum = quorum
        self._lock = threading.RLock()
        self._batch: collections.deque[Job] = collections.deque()
        self._running: Job | None = None
        self._running_since = 0.0
        self._done: list[Done] = []
        self._pending: tuple[list[Done], int] | None = None  # an exchange that failed
        self._changed: Callable[[Held], None] = _nothing
        # The quorum's change the last exchange made (0: none): a take that found nothing
        # began after it, in the same script call as the finish that made it.
        self.changed_at = 0

    def on_change(self, callback: Callable[[Held], None]) -> None:
        """Call ``callback(held)`` when a task starts or ends, with what is held then (under
        the lock: it stays true until the next change)."""
        self._changed = callback

    def snapshot(self) -> Held:
        """What is held now, as the keeper plans by it. Read in its turn or in the change
        callback (both under the lock), it stays true until the next change: the loop's,
        or one of the keeper's own calls."""
        return Held(
            self._running,
            self._running_since,
            bool(self._batch),
            self._done[0].at if self._done else None,
        )

    # -- the loop's side -----------------------------------------------------------
    def next_job(
        self, take_count: Callable[[], int], *, burst: bool, batch_begins: Callable[[], None]
    ) -> Job | None:
        """Start the next task: from the batch in hand, or taken (``take_count()`` of them,
        finishing the tasks run since the last take in the same call; a burst worker that
        finds none puts back expired leases and takes again); None when the queues have
        none. ``batch_begins()`` is called before the first task of a batch starts (no task
        run before it waits to be acknowledged); when it raises, the task stays in the
        batch."""
        with self._lock:
            if not self._batch:
                if not self._done:
                    self.session.recover_if_due()
                self.exchange(take_count())
                if not self._batch and burst:
                    self.session.recover_if_due(force=True)
                    self.exchange(take_count())
            if not self._batch:
                return None
            if not self._done:
                batch_begins()
            job = self._batch.popleft()
            self._running, self._running_since = job, time.monotonic()
            self._changed(self.snapshot())
            return job

    def finished(self, done: Done) -> bool:
        """The running task ended (``done``): held until acknowledged. True when no task
        taken waits behind it (the batch is over)."""
        with self._lock:
            self._running = None
            done.at = time.monotonic()
            self._done.append(done)
            self._changed(self.snapshot())
            return not self._batch

    # -- calls that change what is held ----------------------------------------------
    def exchange(self, take: int, *, patience: float | None = None) -> None:
        """Finish the tasks run and not yet acknowledged, take up to ``take`` more into the
        batch. An exchange that failed is sent again, the same, before any other: it may
        have run with its reply lost, and only the same call (its nonce) is answered as it
        ran."""
        with self._lock:
            self._finish_stopped()
            if self._pending is None:
                # What it takes is reserved first: loops sharing a budget never take more.
                self._pending = (list(self._done), self.budget.reserve(take))
            done, wanted = self._pending
            jobs = self.session.exchange(done, wanted, patience=patience)
            self._pending = None
            self.budget.release(wanted - len(jobs))
            if self.quorum is not None and (done or jobs):
                self.changed_at = self.quorum.changed()
            finished = {id(item) for item in done}
            self._done = [item for item in self._done if id(item) not in finished]
            self._batch.extend(jobs)

    def _finish_stopped(self) -> None:
        """Finish the runs stopped because cancel() asked, each in its own call (rare: not
        worth a place in the finish-and-take call)."""
        for item in [item for item in self._done if item.outcome.kind is Kind.STOPPED]:
            self.session.finish_stopped(item)
            self._done = [other for other in self._done if other is not item]

    def give_back_batch(self) -> None:
        """Give back the batch not started; when that raises, it stays held (the next try,
        or its lease, brings it back)."""
        with self._lock:
            self.session.give_back(list(self._batch))
            self.budget.release(len(self._batch))
            self._batch.clear()

    def renew(self) -> tuple[list[Job], list[Job]]:
        """Extend the leases of every task held: taken, running, and run but not yet
        acknowledged. Returns those no longer held, and those ``cancel()`` asked to stop."""
        with self._lock:
            running = [self._running] if self._running is not None else []
            held = [*self._batch, *running, *(item.job for item in self._done)]
            return self.session.renew(held)

    def when_free(self, turn: Callable[[], T]) -> T | None:
        """``turn()``, with nothing changing meanwhile; None, at once, while the loop is
        changing what is held (an exchange retrying through a Redis outage holds it up to
        a lease): the keeper runs on the process's renewer, which must not wait."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return turn()
        finally:
            self._lock.release()

    def settle(self, *, patience: float | None = None) -> None:
        """On the way out: acknowledge what ran, give back what did not start. Never
        raises: what it cannot settle, the leases bring back."""
        with self._lock:
            try:
                # A failed exchange is sent again too: it may have taken tasks.
                if self._done or self._pending is not None:
                    self.exchange(0, patience=patience)
            except Exception as exc:  # noqa: BLE001
                self._cannot("acknowledge", len(self._done), exc)
            if self._batch:
                try:
                    self.give_back_batch()
                except Exception as exc:  # noqa: BLE001
                    self._cannot("give back", len(self._batch), exc)
            self.budget.release(len(self._batch))
            self._batch.clear()
            self._done = []
            self._running = None

    def _cannot(self, what: str, count: int, exc: Exception) -> None:
        logger.warning(
            "worker %s could not %s %d task(s) (%s); their leases will",
            self.session.worker_id,
            what,
            count,
            exc,
        )
