"""The worker's loop: take a task, run it, hand it back finished; never crash.

``Worker`` holds what it took (a batch not started, the running task, tasks run but
not yet acknowledged) and moves tasks between those states; the Redis side is its
``QueueSession``, running a task is its ``TaskRunner``, how many to take is its
``PrefetchPolicy``. Its keeper, a job on the process's renewer
(``django_rcoord.renewal``), renews the leases of what it holds, acknowledges
finished tasks that wait and gives back the tasks queued behind a long one; while a
task runs, it asks (in the same call that renews the leases) whether ``cancel()`` asked
it to stop, every ``RCOORD["TASK_STOP_CHECK"]`` seconds, and has the runner stop it.
"""

from __future__ import annotations

import collections
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

from django.db import close_old_connections

from django_rcoord.conf import conf
from django_rcoord.connection.errors import (
    RECONNECT_BACKOFF,
    REDIS_ERRORS,
    log_answering_again,
    log_waited_out,
)
from django_rcoord.exceptions import RedisUnavailable, WorkerGaveUp
from django_rcoord.queues.keys import same_group
from django_rcoord.queues.registry import autodiscover_tasks
from django_rcoord.queues.shards import one_shard
from django_rcoord.queues.worker.budget import BurstQuorum, TaskBudget
from django_rcoord.queues.worker.gates import TaskGates, Wait
from django_rcoord.queues.worker.isolation import ProcessTaskRunner
from django_rcoord.queues.worker.jobs import Done, Job, later
from django_rcoord.queues.worker.prefetch import PrefetchPolicy
from django_rcoord.queues.worker.runner import TaskRunner
from django_rcoord.queues.worker.session import QueueSession
from django_rcoord.queues.worker.watch import IdleWarning
from django_rcoord.renewal import Renewal, schedule
from django_rcoord.validation import check_batch

logger = logging.getLogger(__name__)

#: Where a worker runs its tasks: in its own process, or in a child it can kill.
ISOLATIONS = ("inline", "process")

#: A finished task is acknowledged with the next take, or by the keeper once it
#: has waited this long (ms): a worker that dies repeats at most the tasks of the last few
#: ms, not a whole batch.
ACK_AFTER_MS = 5.0
#: Seconds before the keeper looks again when the worker's loop holds what the worker holds.
KEEPER_BUSY_RETRY = 0.05


def gave_up(who: str, exc: Exception, outage: float, max_outage: float) -> Exception:
    """The error that ends a loop whose turns kept failing with ``exc`` (the last) for
    ``outage`` seconds, past ``max_outage``: ``RedisUnavailable`` for Redis's errors,
    ``WorkerGaveUp`` for any other. Its message is one line (a management command prints
    it as its last)."""
    first_line = next(iter(str(exc).strip().splitlines()), "")
    error = type(exc).__name__ + (f": {first_line}" if first_line else "")
    if isinstance(exc, REDIS_ERRORS):
        return RedisUnavailable(
            f"{who}: Redis unusable for {outage:.0f} s (max_outage {max_outage:g} s): {error}"
        )
    return WorkerGaveUp(
        f"{who}: its loop kept failing for {outage:.0f} s (max_outage {max_outage:g} s): {error}"
    )


class Worker:
    """Runs tasks from ``queues`` (highest priority first) until ``stop()``.

    ``burst=True`` stops when the queues are empty and no run it held back for a limit
    (concurrency, rate) is still to come due; ``max_tasks`` stops after
    that many tasks. ``lease`` defaults to ``RCOORD["TASK_LEASE"]``, ``prefetch`` (the
    most tasks taken in one call) to ``RCOORD["TASK_PREFETCH"]``.

    Tasks are taken in batches: one script call finishes the tasks run since the last
    call and takes the next ones (all leased to this worker, renewed while it holds
    them); ``PrefetchPolicy`` says how many. Once the running task has run past the
    prefetch budget, the keeper acknowledges the tasks finished before it and
    gives back the ones waiting behind it, for any worker to take.

    The worker stops only when told: an error of the project's code fails a task (or,
    from a signal receiver, is logged), any error of its loop (Redis's of any kind, or
    another: a database that refuses connections) is waited out with backoff, and the
    tasks it holds stay held (their leases renewed) meanwhile. ``max_outage`` (seconds; a
    burst run's bound) tells it when to stop waiting: a loop that keeps failing that long
    ends ``run()`` with ``RedisUnavailable`` (Redis's errors) or ``WorkerGaveUp`` (any
    other), and what it holds is given back.

    A queue of a group with shards (``RCOORD["QUEUE_SHARDS"]``) is served a shard at a time
    (give the shard's queue names: ``queues.shards.per_shard``; ``run_email_worker`` runs a
    loop per shard); ``as_named=True`` serves the queues named even so (the group's own
    keys, left from before it had shards).

    ``max_tasks`` may be a ``TaskBudget`` and ``burst`` a ``BurstQuorum``, shared by the
    loops of one process (``run_email_worker``): the limits then hold for them all together
    (see ``budget``); else for this loop.

    ``isolation="inline"`` (the default) runs tasks in this process; ``"process"`` runs
    them in a child process, which is killed at a task's time limit (see ``isolation``).

    A running task that ``cancel()`` asked to stop is stopped where it can be: an async
    task is cancelled, a task in a child process killed; both fail with ``TaskCancelled``
    and are finished (no retry, no dead letter, no follow-up). A sync task run inline
    cannot be interrupted: its code sees ``stop_requested()``.
    """

    #: The error the loop's last failed turn raised (its log says "same error again").
    _last_error: Exception | None = None

    def __init__(
        self,
        queues: Sequence[str],
        *,
        lease: float | None = None,
        burst: bool | BurstQuorum = False,
        max_tasks: int | TaskBudget | None = None,
        prefetch: int | None = None,
        client: Any = None,
        stop_event: threading.Event | None = None,
        max_outage: float | None = None,
        isolation: str = "inline",
        as_named: bool = False,
    ) -> None:
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {', '.join(ISOLATIONS)}, not {isolation!r}")
        self.queues = same_group(one_shard(queues, as_named=as_named))
        self.lease = float(conf.TASK_LEASE if lease is None else lease)
        self.burst = bool(burst)
        self.quorum = burst if isinstance(burst, BurstQuorum) else None
        self.budget = max_tasks if isinstance(max_tasks, TaskBudget) else TaskBudget(max_tasks)
        self.max_outage = max_outage
        self.prefetch = PrefetchPolicy(
            check_batch(conf.TASK_PREFETCH if prefetch is None else prefetch, "prefetch")
        )
        self.stopping = stop_event or threading.Event()
        self.id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.session = QueueSession(
            self.id, self.queues, lease=self.lease, burst=self.burst, client=client
        )
        self.isolation = isolation
        self.gates = TaskGates(self.lease, client=client)
        self.idle_warning = IdleWarning(self.id, [q.name for q in self.queues], client=client)
        self.runner: TaskRunner | ProcessTaskRunner = (
            ProcessTaskRunner(self.id) if isolation == "process" else TaskRunner(self.id)
        )
        self.processed = 0
        self._started_at = time.time()
        # What this worker holds, shared with the keeper under ``_holding``: tasks
        # taken and not started, the running one (since when), and those run but not yet
        # acknowledged. Every script call that changes what it holds runs under the lock
        # too, so the keeper never renews from a stale view.
        self._holding = threading.RLock()
        self._batch: collections.deque[Job] = collections.deque()
        self._running: Job | None = None
        self._running_since = 0.0
        self._done: list[Done] = []
        self._pending: tuple[list[Done], int] | None = None  # an exchange that failed
        self._next_renewal = 0.0
        # Asking whether cancel() asked the running task to stop (None: at renewals only).
        stop_check = conf.TASK_STOP_CHECK
        self._stop_check = None if stop_check is None else float(stop_check)
        self._next_stop_check = 0.0
        self._stop_seen: str | None = None  # the running task whose request was seen
        self._keeper: Renewal | None = None  # while run() runs
        self._keeper_failures = 0  # its turns in a row that failed
        self._keeper_retry_at = 0.0  # after a failed turn, not before (time.monotonic())
        # When the last run this worker held back for a limit (concurrency, rate) is due
        # again: a burst worker waits for it before it calls its queues done.
        self._held_back_until = 0.0

    @property
    def client(self) -> Any:
        return self.session.client

    def stop(self) -> None:
        """Finish the running task, then return from ``run()``."""
        self.stopping.set()

    # -- the loop --------------------------------------------------------------
    def run(self) -> int:
        """Process tasks until stopped; returns how many were processed."""
        autodiscover_tasks()
        logger.info(
            "worker %s watching %s (lease %ss, prefetch up to %d, %s)",
            self.id,
            ", ".join(queue.name for queue in self.queues),
            self.lease,
            self.prefetch.prefetch,
            "each task in a child process" if self.isolation == "process" else "tasks inline",
        )
        failures = 0  # loop turns in a row that failed
        failing_since = 0.0  # when the first of them failed (time.monotonic())
        patience: float | None = None  # how long the last acknowledgement may retry
        # The keeper renews the leases of what this worker holds and gives back what waits
        # behind a long task, from the process's renewer.
        self._keeper = schedule(
            self._keeper_turn, self.lease / 3, f"lease keeper of worker {self.id}", retry=1.0
        )
        try:
            while not self.stopping.is_set():
                try:
                    self.session.heartbeat(self.processed, self._started_at)
                    seen = self.quorum.seen() if self.quorum is not None else 0
                    job = self._next_job()
                    if job is None:
                        if self.burst and self._out_of_work(seen):
                            break
                        self.idle_warning.idle()
                        self.session.wait_for_work()
                    else:
                        self.idle_warning.took()
                        self._run_job(job)
                        if self._should_stop():
                            break
                    if failures:  # a whole turn went through: Redis answers
                        log_answering_again(logger, f"worker {self.id}", failures)
                    failures = 0
                except Exception as exc:  # noqa: BLE001 - waited out, or RedisUnavailable
                    # What it holds stays held (the keeper renews it) and is finished or
                    # run on the next turn.
                    failing_since = failing_since if failures else time.monotonic()
                    self._wait_out(exc, failures, failing_since)
                    failures += 1
        except RedisUnavailable:
            patience = 0  # Redis was given its time already
            raise
        finally:
            try:
                self._settle(patience=patience)
            finally:
                self._keeper.cancel()
                self.session.sign_off()
                self.runner.close()
        logger.info("worker %s stopped after %d tasks", self.id, self.processed)
        return self.processed

    def _out_of_work(self, seen: int) -> bool:
        """A burst worker's take (begun at its quorum's change ``seen``) found nothing: is
        it done? Not while a run it held back for a limit is still to come due; then alone,
        yes; with loops sharing its quorum, once none of them has work (until then it waits
        for work as any worker does, and looks again)."""
        if time.monotonic() < self._held_back_until:
            return False
        return self.quorum is None or self.quorum.found_nothing(self.id, seen)

    def _wait_out(self, exc: Exception, failures: int, failing_since: float) -> None:
        """A loop turn failed with ``exc`` (``failures`` turns before it failed too, the
        first at ``failing_since``, time.monotonic()): wait with backoff, or end ``run()``
        once the failures would outlast ``max_outage`` (see ``gave_up``)."""
        wait = RECONNECT_BACKOFF.compute(failures)
        outage = time.monotonic() - failing_since
        if self.max_outage is not None and outage + wait > self.max_outage:
            raise gave_up(f"worker {self.id}", exc, outage, self.max_outage) from exc
        previous, self._last_error = (self._last_error if failures else None), exc
        log_waited_out(logger, f"worker {self.id}", exc, wait, previous)
        self.stopping.wait(wait)

    def _next_job(self) -> Job | None:
        """The next task to run: from the batch in hand, or taken (finishing the tasks run
        since the last take in the same call); None when the queues have none."""
        with self._holding:
            if not self._batch:
                if not self._done:
                    self.session.recover_if_due()
                self._exchange_held(self.take_count())
                if not self._batch and self.burst:
                    self.session.recover_if_due(force=True)
                    self._exchange_held(self.take_count())
            if not self._batch:
                return None
            if not self._done:
                # Database connections are checked around each batch, as Django does
                # around each request, and after a task that failed.
                close_old_connections()
            job = self._batch.popleft()
            self._running, self._running_since = job, time.monotonic()
            if self._stop_check is not None:
                self._next_stop_check = self._running_since + self._stop_check
            self._wake_keeper()
            return job

    def _run_job(self, job: Job) -> None:
        """Run ``job`` unless its limits say not yet, and hold it finished for the next
        exchange."""
        entry = self.gates.enter(job)
        if isinstance(entry, Wait):
            finished = Done(job, later(job, entry.delay_ms, entry.why), 0.0)
        else:
            try:
                finished = self.runner.run(job)
            finally:
                self.gates.leave(entry)
            self.prefetch.observe(finished.took_ms)
        with self._holding:
            self._running = None
            finished.at = time.monotonic()
            if finished.outcome.kind == "later":
                due = finished.at + finished.outcome.delay_ms / 1000
                self._held_back_until = max(self._held_back_until, due)
            self._done.append(finished)
            self._wake_keeper()
            if finished.outcome.kind != "later":
                self.processed += 1
                self.budget.ran_one()
            else:
                self.budget.release(1)  # it goes back: another loop may run it
            if not self._batch or finished.outcome.kind != "ack":
                close_old_connections()

    def take_count(self) -> int:
        """How many tasks the next take asks for (none once stopping)."""
        if self.stopping.is_set():
            return 0
        return self.prefetch.take_count(self.budget.left())

    def _exchange_held(self, take: int, *, patience: float | None = None) -> None:
        """Finish the tasks run and not yet acknowledged, take up to ``take`` more into the
        batch. An exchange that failed is sent again, the same, before any other: it may
        have run with its reply lost, and only the same call (its nonce) is answered as it
        ran."""
        with self._holding:
            self._finish_stopped()
            if self._pending is None:
                # What it takes is reserved first: loops sharing a budget never take more.
                self._pending = (list(self._done), self.budget.reserve(take))
            done, wanted = self._pending
            jobs = self.session.exchange(done, wanted, patience=patience)
            self._pending = None
            self.budget.release(wanted - len(jobs))
            if self.quorum is not None and (done or jobs):
                self.quorum.changed()
            finished = {id(item) for item in done}
            self._done = [item for item in self._done if id(item) not in finished]
            self._batch.extend(jobs)

    def _finish_stopped(self) -> None:
        """Finish the runs stopped because cancel() asked, each in its own call (rare: not
        worth a place in the finish-and-take call)."""
        for item in [item for item in self._done if item.outcome.kind == "stopped"]:
            self.session.finish_stopped(item)
            self._done = [other for other in self._done if other is not item]

    def _settle(self, *, patience: float | None = None) -> None:
        """On the way out: acknowledge what ran, give back what did not start. Never
        raises: what it cannot settle, the leases bring back."""
        with self._holding:
            try:
                # A failed exchange is sent again too: it may have taken tasks.
                if self._done or self._pending is not None:
                    self._exchange_held(0, patience=patience)
            except Exception as exc:  # noqa: BLE001
                logger.warning(
                    "worker %s could not acknowledge %d task(s) (%s); their leases will",
                    self.id,
                    len(self._done),
                    exc,
                )
            if self._batch:
                try:
                    self._give_back_held()
                except Exception as exc:  # noqa: BLE001
                    logger.warning(
                        "worker %s could not give back %d task(s) (%s); their leases will",
                        self.id,
                        len(self._batch),
                        exc,
                    )
            self.budget.release(len(self._batch))
            self._batch.clear()
            self._done = []
            self._running = None

    def _should_stop(self) -> bool:
        if self.stopping.is_set():
            return True
        return self.budget.spent

    # -- the keeper's side (under ``_holding``) --------------------------------------
    def _wake_keeper(self) -> None:
        """Wake the keeper when it has work sooner than it planned to look (not at every
        task: that would cost a thread switch per task)."""
        if self._keeper is not None:
            self._keeper.wake(max(self._keeper_due(), self._keeper_retry_at))

    def _keeper_turn(self) -> float:
        """The keeper's job on the renewer: do what is due, then say in how many seconds it
        has work again. An acknowledgement is tried once here (a lost reply is sent again,
        the same, by the next exchange); what it could not do stays due and is tried again
        after a backoff, while the worker's loop meets the same error. While the loop holds
        what the worker holds (an exchange retrying through a Redis outage), the keeper looks
        again shortly instead of waiting for it: it runs on the process's renewer, which
        must stay free for every other lock and permit of the process."""
        if not self._holding.acquire(blocking=False):
            return KEEPER_BUSY_RETRY
        try:
            try:
                self._keep()
                self._keeper_failures, self._keeper_retry_at = 0, 0.0
            except Exception as exc:  # noqa: BLE001
                pause = RECONNECT_BACKOFF.compute(self._keeper_failures)
                self._keeper_failures += 1
                logger.warning(
                    "worker %s: lease keeper failed (%s); again in %.1fs", self.id, exc, pause
                )
                self._keeper_retry_at = time.monotonic() + pause
            due = max(self._keeper_due(), self._keeper_retry_at)
            return max(0.0, due - time.monotonic())
        finally:
            self._holding.release()

    def _keeper_due(self) -> float:
        """When the keeper has work next (time.monotonic())."""
        due = self._next_renewal
        if self._done:
            due = min(due, self._done[0].at + ACK_AFTER_MS / 1000)
        if self._running is not None and self._batch:
            due = min(due, self.prefetch.give_back_at(self._running_since))
        if self._running is not None and self._stop_check is not None:
            due = min(due, self._next_stop_check)
        return due

    def _keep(self) -> None:
        """The keeper thread's turn: acknowledge the tasks that ended more than
        ``ACK_AFTER_MS`` ago; once the running task has run past the prefetch budget, give
        back what waits behind it; every third of a lease, renew the leases of everything
        held (and, while a task runs, every ``TASK_STOP_CHECK`` seconds), and stop what
        cancel() asked to stop."""
        now = time.monotonic()
        if self._done and now >= self._done[0].at + ACK_AFTER_MS / 1000:
            self._exchange_held(0, patience=0)
        # A give-back that fails stays due and is raised after the renewal below, so the
        # turn is retried after a backoff (not at once, every turn) and leases are renewed.
        failed: Exception | None = None
        if (
            self._running is not None
            and self._batch
            and now >= self.prefetch.give_back_at(self._running_since)
        ):
            try:
                self._give_back_held()
            except Exception as exc:  # noqa: BLE001
                failed = exc
        checking = (
            self._running is not None
            and self._stop_check is not None
            and now >= self._next_stop_check
        )
        if now >= self._next_renewal or checking:
            lost, stop = self.session.renew(self._held())  # raising, it stays due
            self._next_renewal = now + self.lease / 3
            if self._stop_check is not None:
                self._next_stop_check = now + self._stop_check
            for job in lost:
                logger.warning("task %s: lease lost while held (it will run again)", job.id)
            for job in stop:
                self._stop(job)
        if failed is not None:
            raise failed

    def _stop(self, job: Job) -> None:
        """``cancel()`` asked ``job`` to stop: stop it if it is the running task (the runner
        says whether it can). A task of the batch is left alone: it goes back with the batch
        (``give_back_at``), or runs, and is stopped then."""
        if job is not self._running or self._stop_seen == job.id:
            return
        self._stop_seen = job.id
        if self.runner.stop(job.id):
            logger.info("task %s: cancel() asked it to stop; stopping it", job.id)
        else:
            logger.info(
                "task %s: cancel() asked it to stop; a sync task run inline cannot be "
                "interrupted: it runs on (its code sees stop_requested())",
                job.id,
            )

    def _held(self) -> list[Job]:
        """The tasks this worker holds: taken, running, and run but not yet acknowledged."""
        running = [self._running] if self._running is not None else []
        return [*self._batch, *running, *(item.job for item in self._done)]

    def _give_back_held(self) -> None:
        """Give back the batch not started; when that raises, it stays held (the next try,
        or its lease, brings it back)."""
        self.session.give_back(list(self._batch))
        self.budget.release(len(self._batch))
        self._batch.clear()
