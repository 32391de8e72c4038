"""A worker's lease keeper: a job of the process's renewer (``django_rcoord.renewal``).

While the worker's loop runs a task, the keeper looks after what the worker holds
(``holdings``): it renews the leases every third of a lease, acknowledges a finished task
that has waited ``ACK_AFTER_MS``, gives back the tasks taken behind a task that runs past
the prefetch budget, and, every ``RCOORD["TASK_STOP_CHECK"]`` seconds while a task runs
(in the same call that renews the leases), asks whether ``cancel()`` asked it to stop, and
has the runner stop it. It shares the renewer's thread with the process's auto-renewing
locks and permits, so its turn never waits for the loop: while the loop changes what is
held, it looks again ``KEEPER_BUSY_RETRY`` seconds later. Its own calls to Redis (one a
queue to renew, one to acknowledge, one a queue to give back) hold up the renewer's other
jobs while they last, as each of those jobs' calls does; an acknowledgement there is one
try (``patience=0``, no retry loop on the renewer's thread): a failed turn is tried again
after a backoff.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from django_rcoord.conf import conf
from django_rcoord.connection.errors import RECONNECT_BACKOFF
from django_rcoord.queues.worker.holdings import Held, Holdings
from django_rcoord.queues.worker.jobs import Job
from django_rcoord.queues.worker.prefetch import PrefetchPolicy
from django_rcoord.renewal import Renewal, schedule

logger = logging.getLogger(__name__)

#: A finished task is acknowledged with the next take, or by the keeper once it
#: has waited this long (ms): a worker that dies repeats at most the tasks of the last few
#: ms, not a whole batch.
ACK_AFTER_MS = 5.0
#: Seconds before the keeper looks again when the worker's loop holds what the worker holds.
KEEPER_BUSY_RETRY = 0.05


class LeaseKeeper:
    """Keeps ``holdings`` of worker ``worker_id`` (its tasks leased for ``lease`` seconds)
    from ``start()`` to ``cancel()``; ``stop_task(task_id)`` stops a running task that
    ``cancel()`` asked to stop (True when it could)."""

    def __init__(
        self,
        worker_id: str,
        holdings: Holdings,
        prefetch: PrefetchPolicy,
        stop_task: Callable[[str], bool],
        *,
        lease: float,
    ) -> None:
        self.worker_id = worker_id
        self.holdings = holdings
        self.prefetch = prefetch
        self.stop_task = stop_task
        self.lease = lease
        # Asking whether cancel() asked the running task to stop (None: at renewals only).
        stop_check = conf.TASK_STOP_CHECK
        self.stop_check = None if stop_check is None else float(stop_check)
        self._renewal: Renewal | None = None  # from start() to cancel()
        self._next_renewal = 0.0
        self._renewed_at = 0.0  # the last renewal's turn (time.monotonic())
        self._stop_seen: str | None = None  # the running task whose request was seen
        self._failures = 0  # its turns in a row that failed
        self._retry_at = 0.0  # after a failed turn, not before (time.monotonic())
        holdings.on_change(self.wake)

    def start(self) -> None:
        """Keep from now on: a job of the process's renewer, first due in a third of a
        lease, or sooner when woken."""
        self._renewal = schedule(
            self.turn, self.lease / 3, f"lease keeper of worker {self.worker_id}", retry=1.0
        )

    def cancel(self) -> None:
        """Stop keeping (a turn running on the renewer ends first)."""
        if self._renewal is not None:
            self._renewal.cancel()

    @property
    def alive(self) -> bool:
        """Whether it is still a job of the process's renewer."""
        return self._renewal is not None and not self._renewal.cancelled

    def wake(self, held: Held) -> None:
        """What the worker holds changed to ``held``: look sooner than planned when there is
        work sooner (not at every change: that would cost a thread switch per task)."""
        if self._renewal is not None:
            self._renewal.wake(self._next_at(held))

    def turn(self) -> float:
        """The keeper's job on the renewer: do what is due, then say in how many seconds it
        has work again. An acknowledgement is tried once here (a lost reply is sent again,
        the same, by the next exchange); what it could not do stays due and is tried again
        after a backoff, while the worker's loop meets the same error."""
        pause = self.holdings.when_free(self._turn)
        return KEEPER_BUSY_RETRY if pause is None else pause

    def _turn(self) -> float:
        try:
            self._keep(time.monotonic())
            self._failures, self._retry_at = 0, 0.0
        except Exception as exc:  # noqa: BLE001
            pause = RECONNECT_BACKOFF.compute(self._failures)
            self._failures += 1
            logger.warning(
                "worker %s: lease keeper failed (%s); again in %.1fs", self.worker_id, exc, pause
            )
            self._retry_at = time.monotonic() + pause
        return max(0.0, self._next_at(self.holdings.snapshot()) - time.monotonic())

    def _next_at(self, held: Held) -> float:
        """When the keeper has work next (time.monotonic()) with ``held`` held, not before a
        failed turn's backoff."""
        due = self._next_renewal
        if held.oldest_done_at is not None:
            due = min(due, held.oldest_done_at + ACK_AFTER_MS / 1000)
        if held.running is not None and held.waiting:
            due = min(due, self.prefetch.give_back_at(held.running_since))
        return max(min(due, self._stop_check_at(held)), self._retry_at)

    def _stop_check_at(self, held: Held) -> float:
        """When the running task's stop request is looked for: ``stop_check`` after it
        started or after the last renewal (which looked), whichever came later; never while
        no task runs or without ``stop_check``."""
        if held.running is None or self.stop_check is None:
            return math.inf
        return max(held.running_since, self._renewed_at) + self.stop_check

    def _keep(self, now: float) -> None:
        """Acknowledge the tasks that ended more than ``ACK_AFTER_MS`` ago; once the running
        task has run past the prefetch budget, give back what waits behind it; every third
        of a lease, renew the leases of everything held (and, while a task runs, every
        ``TASK_STOP_CHECK`` seconds), and stop what cancel() asked to stop."""
        held = self.holdings.snapshot()  # what the calls below change is not read after them
        if held.oldest_done_at is not None and now >= held.oldest_done_at + ACK_AFTER_MS / 1000:
            self.holdings.exchange(0, patience=0)
        # A give-back that fails stays due and is raised after the renewal below, so the
        # turn is retried after a backoff (not at once, every turn) and leases are renewed.
        failed: Exception | None = None
        if (
            held.running is not None
            and held.waiting
            and now >= self.prefetch.give_back_at(held.running_since)
        ):
            try:
                self.holdings.give_back_batch()
            except Exception as exc:  # noqa: BLE001
                failed = exc
        if now >= self._next_renewal or now >= self._stop_check_at(held):
            lost, stop = self.holdings.renew()  # raising, it stays due
            self._next_renewal, self._renewed_at = now + self.lease / 3, now
            for job in lost:
                logger.warning("task %s: lease lost while held (it will run again)", job.id)
            for job in stop:
                self._stop(job, held.running)
        if failed is not None:
            raise failed

    def _stop(self, job: Job, running: Job | None) -> None:
        """``cancel()`` asked ``job`` to stop: stop it if it is the ``running`` task (the
        runner says whether it can). A task of the batch is left alone: it goes back with
        the batch (``give_back_at``), or runs, and is stopped then."""
        if job is not running or self._stop_seen == job.id:
            return
        self._stop_seen = job.id
        if self.stop_task(job.id):
            logger.info("task %s: cancel() asked it to stop; stopping it", job.id)
        else:
            logger.info(
                "task %s: cancel() asked it to stop; a sync task run inline cannot be "
                "interrupted: it runs on (its code sees stop_requested())",
                job.id,
            )
