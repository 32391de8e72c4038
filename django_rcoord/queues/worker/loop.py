"""The worker's loop: take a task, run it, hand it back finished; never crash.

``Worker`` takes the next task, passes it through its limits (``TaskGates``), runs it
(``TaskRunner``, or ``ProcessTaskRunner`` in a child process) and holds it finished for the
next take, which acknowledges it; it waits out the errors of its turns and decides when to
stop. What it holds (a batch not started, the running task, tasks run but not yet
acknowledged) and every call that changes it are its ``Holdings``; the Redis side is its
``QueueSession``, how many to take its ``PrefetchPolicy``. Its ``LeaseKeeper``, a job on the
process's renewer (``django_rcoord.renewal``), renews the leases of what it holds while a
task runs, acknowledges finished tasks that wait, gives back the tasks queued behind a long
one and stops a running task that ``cancel()`` asked to stop.
"""

from __future__ import annotations

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
from django_rcoord.queues.fan_in import FanInCount, counted_with_end
from django_rcoord.queues.keys import same_group
from django_rcoord.queues.outcomes import Kind
from django_rcoord.queues.registry import autodiscover_tasks
from django_rcoord.queues.shards import one_shard
from django_rcoord.queues.worker.budget import BurstQuorum, TaskBudget
from django_rcoord.queues.worker.gates import TaskGates, Wait
from django_rcoord.queues.worker.holdings import Holdings
from django_rcoord.queues.worker.isolation import ProcessTaskRunner
from django_rcoord.queues.worker.jobs import Done, Job, later
from django_rcoord.queues.worker.keeper import LeaseKeeper
from django_rcoord.queues.worker.prefetch import PrefetchPolicy
from django_rcoord.queues.worker.resolve import resolve
from django_rcoord.queues.worker.runner import TaskRunner
from django_rcoord.queues.worker.session import QueueSession
from django_rcoord.queues.worker.watch import IdleWarning
from django_rcoord.validation import check_batch

logger = logging.getLogger(__name__)

#: Where a worker runs its tasks: in its own process, or in a child it can kill.
ISOLATIONS = ("inline", "process")


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
        # What this worker holds, shared with its keeper (a job of the process's renewer),
        # which renews their leases while the loop runs a task.
        self.holdings = Holdings(self.session, self.budget, self.quorum)
        self.keeper = LeaseKeeper(
            self.id, self.holdings, self.prefetch, self.runner.stop, lease=self.lease
        )
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
        self.keeper.start()
        try:
            while not self.stopping.is_set():
                try:
                    if self._turn():
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
                self.holdings.settle(patience=patience)
            finally:
                self.keeper.cancel()
                self.session.sign_off()
                self.runner.close()
        logger.info("worker %s stopped after %d tasks", self.id, self.processed)
        return self.processed

    def _turn(self) -> bool:
        """One turn of the loop: run the next task, or wait for work. True when the loop is
        done (told to stop, its task budget spent, or, bursting, out of work)."""
        self.session.heartbeat(self.processed, self._started_at)
        seen = self.quorum.seen() if self.quorum is not None else 0
        job = self._next_job()
        if job is None:
            if self.burst and self._out_of_work(max(seen, self.holdings.changed_at)):
                return True
            self.idle_warning.idle()
            self.session.wait_for_work()
            return False
        self.idle_warning.took()
        self._run_job(job)
        return self._should_stop()

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
        # Database connections are checked around each batch, as Django does around each
        # request, and after a task that failed.
        return self.holdings.next_job(
            self.take_count, burst=self.burst, batch_begins=close_old_connections
        )

    def _run_job(self, job: Job) -> None:
        """Run ``job`` unless its limits say not yet, and hold it finished for the next
        exchange. Its task is looked up once (``resolve``): its limits, its process and its
        run read that."""
        resolved = resolve(job)
        entry = self.gates.enter(job, resolved.options)
        if isinstance(entry, Wait):
            finished = Done(job, later(job, entry.delay_ms, entry.why), 0.0)
        else:
            try:
                finished = self.runner.run(job, resolved)
            finally:
                self.gates.leave(entry)
            self.prefetch.observe(finished.took_ms)
        self._count_in_fan_in(finished)
        batch_over = self.holdings.finished(finished)
        if finished.outcome.kind is Kind.LATER:
            due = finished.at + finished.outcome.delay_ms / 1000
            self._held_back_until = max(self._held_back_until, due)
            self.budget.release(1)  # it goes back: another loop may run it
        else:
            self.processed += 1
            self.budget.ran_one()
        if batch_over or finished.outcome.kind is not Kind.ACK:
            close_old_connections()

    @staticmethod
    def _count_in_fan_in(done: Done) -> None:
        """A fan-in's child's final end (however it ended: run here or in a child process,
        refused, killed) is counted in its fan-in by the step that records it, or queues
        with it the task that counts it (``fan_in.counted_with_end``)."""
        outcome, job = done.outcome, done.job
        if outcome.kind.is_final and job.message is not None:
            value = outcome.value_json if outcome.kind is Kind.ACK else None
            count = counted_with_end(job.id, job.queue, job.message, value, outcome.summary)
            if isinstance(count, FanInCount):
                outcome.fan_in = count
            elif count is not None:
                outcome.follow_ups.append(count)

    def take_count(self) -> int:
        """How many tasks the next take asks for (none once stopping)."""
        if self.stopping.is_set():
            return 0
        return self.prefetch.take_count(self.budget.left())

    def _should_stop(self) -> bool:
        if self.stopping.is_set():
            return True
        return self.budget.spent
