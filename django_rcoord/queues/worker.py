"""The consuming side of the task queues: a worker loop that loses nothing.

A ``Worker`` watches queues of one group in priority order. It takes a task in
one script (moving it into the queue's in-flight set under a lease), runs it
while a thread renews the lease, then finishes it and takes the next one in
one more script. Idle, it blocks on the group's wake-up list (no polling) and,
at most once a second, puts back tasks whose lease ran out and promotes due
retries. Bad messages become dead letters; the worker itself never crashes on
one. ``async def`` tasks are awaited on an event loop of the worker's own (one
per worker thread), so async code in them (``get_async_client()``, ``aacquire``)
works as in an ASGI view.
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import functools
import inspect
import json
import logging
import os
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import close_old_connections

from django_rcoord import __version__
from django_rcoord.conf import conf
from django_rcoord.connection import (
    RECONNECT_BACKOFF,
    REDIS_ERRORS,
    log_waited_out,
    resolve_client,
)
from django_rcoord.exceptions import RedisUnavailable, TaskNotRunnable
from django_rcoord.keys import KeySpace
from django_rcoord.ops.metrics import duration_bucket, metric_labels
from django_rcoord.queues.keys import (
    GROUP_KEYS_MS,
    HEARTBEAT_TTL,
    WAKE_TOKEN_MS,
    QueueKeys,
    same_group,
)
from django_rcoord.queues.messages import decode_message, to_json
from django_rcoord.queues.records import (
    TaskRecord,
    forget_gone_workers,
    known_groups,
    known_queues,
    queue_stats,
    record_from,
    recover_and_promote,
    result_ttl_ms,
)
from django_rcoord.queues.registry import (
    PermanentFailure,
    autodiscover_tasks,
    get_task,
    registered_tasks,
)
from django_rcoord.scripts import run_script
from django_rcoord.validation import check_batch
from django_rcoord.waiting import wait_for_signal

logger = logging.getLogger(__name__)

#: Longest an idle worker blocks before it looks for expired leases and due retries.
IDLE_CHECK = 1.0
#: How long a worker that found nothing stays registered idle (it takes again within
#: IDLE_CHECK, renewing it), ms.
IDLE_REGISTRATION_MS = int((IDLE_CHECK + 2) * 1000)
RECOVER_BATCH = 500
#: A worker takes as many tasks at once as it expects to run in this many ms (by the
#: recent average run time), at most its ``prefetch``; once a task has run longer than
#: this, the tasks taken with it go back for any worker while it runs.
PREFETCH_BUDGET_MS = 50.0
#: A finished task is acknowledged with the next take, or by the keeper thread once it
#: has waited this long (ms): a worker that dies repeats at most the tasks of the last few
#: ms, not a whole batch.
ACK_AFTER_MS = 5.0


@dataclass
class Outcome:
    """How a run ended: ``kind`` 'ack', 'retry' or 'dead'; for failures the error text (a
    traceback), the error entry of the result record and the retry delay; for 'ack' the
    return value as JSON."""

    kind: str
    task_name: str
    error: str = ""
    error_class: str = ""
    delay_ms: int = 0
    value_json: str = "null"
    exception: BaseException | None = None  # what the task raised (logged with its traceback)

    @property
    def summary(self) -> str:
        """One line for the log: the exception and its message (a traceback's last line)."""
        lines = self.error.strip().splitlines()
        return lines[-1] if lines else ""

    @property
    def error_entry(self) -> str:
        if not self.error:
            return ""
        return json.dumps({"exception_class_path": self.error_class, "traceback": self.error})


def not_runnable(task_name: str, reason: str) -> Outcome:
    """A task that cannot run here (bad message, unknown task, wrong arguments): dead."""
    return Outcome("dead", task_name, reason, _class_path(TaskNotRunnable))


@functools.lru_cache(maxsize=1024)
def _signature(function: Any) -> inspect.Signature:
    """A framework task function's signature, read once (``inspect.signature`` costs more
    than running a small task)."""
    return inspect.signature(function)


def _retry_delay_ms(earlier: int) -> int:
    """The wait before the next try of a task tried ``earlier`` times before:
    ``TASK_RETRY_BACKOFF * 2**earlier`` seconds, at most ``TASK_RETRY_BACKOFF_MAX``."""
    return int(min(conf.TASK_RETRY_BACKOFF * 2**earlier, conf.TASK_RETRY_BACKOFF_MAX) * 1000)


def _class_path(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


@dataclass
class Job:
    id: str
    body: bytes
    queue: QueueKeys
    failures: int  # failed attempts before this one
    state: str = ""  # its result record: 'RUNNING|started|last attempted|finished|workers'
    queue_index: int = 1  # of the worker's queues, 1-based (as the finish script's KEYS)

    @property
    def record(self) -> TaskRecord | None:
        """Its result record as it is now (RUNNING), from what the take script returned."""
        return self.record_of(None)

    def record_of(self, message: dict[str, Any] | None) -> TaskRecord | None:
        """``record``, from its message already decoded (``message``) when given."""
        body = self.body.encode() if isinstance(self.body, str) else self.body
        fields = [self.state.encode(), None, None, None]
        return record_from(self.id, body, fields, None, None, (0, 0), decoded=message)


@dataclass
class Done:
    """A task this worker ran, waiting to be acknowledged with its next take."""

    job: Job
    outcome: Outcome
    took_ms: float
    at: float = 0.0  # when it ended (time.monotonic())

    def script_args(self) -> list[Any]:
        """Its ten values among the finish script's ARGV (see task_finish.lua)."""
        outcome = self.outcome
        return [
            self.job.id,
            self.job.queue_index,
            outcome.kind,
            outcome.error,
            outcome.delay_ms,
            outcome.value_json,
            outcome.error_entry,
            metric_labels(self.job.queue.name, outcome.task_name),
            duration_bucket(self.took_ms / 1000),
            round(self.took_ms * 1000),
        ]


class Worker:
    """Runs tasks from ``queues`` (highest priority first) until ``stop()``.

    ``burst=True`` stops when the queues are empty; ``max_tasks`` stops after
    that many tasks. ``lease`` defaults to ``RCOORD["TASK_LEASE"]``, ``prefetch`` (the
    most tasks taken in one call) to ``RCOORD["TASK_PREFETCH"]``.

    Tasks are taken in batches: one script call finishes the tasks run since the last
    call and takes the next ones (all leased to this worker, renewed while it holds
    them). How many it takes adapts to how long tasks run: one until it has measured a
    run, then as many as fit in ``PREFETCH_BUDGET_MS`` by the recent average, at most
    ``prefetch``. Once the running task has run longer than the budget, the keeper
    thread acknowledges the tasks finished before it and gives back the ones waiting
    behind it, for any worker to take.

    The worker stops only when told: an error of the project's code fails a task (or,
    from a signal receiver, is logged), a Redis error of any kind is waited out with
    backoff, and the tasks it holds stay held (their leases renewed) meanwhile. With
    ``max_outage`` (seconds; a burst run's bound), Redis errors that last longer than that
    end ``run()`` with ``RedisUnavailable``.
    """

    def __init__(
        self,
        queues: Sequence[str],
        *,
        lease: float | None = None,
        burst: bool = False,
        max_tasks: int | None = None,
        prefetch: int | None = None,
        client: Any = None,
        stop_event: threading.Event | None = None,
        max_outage: float | None = None,
    ) -> None:
        if not queues:
            raise ValueError("a worker needs at least one queue")
        self.queues = same_group(list(queues))
        self.lease = float(conf.TASK_LEASE if lease is None else lease)
        self.burst = burst
        self.max_tasks = max_tasks
        self.max_outage = max_outage
        self.prefetch = check_batch(
            conf.TASK_PREFETCH if prefetch is None else prefetch, "prefetch"
        )
        self._client = client
        self.stopping = stop_event or threading.Event()
        self.id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.processed = 0
        self._started_at = time.time()
        first = self.queues[0]
        space = KeySpace("queue", first.group)
        self._workers_key = space.key("workers")
        self._heartbeat_key = space.key(f"worker:{self.id}")
        # The finish script's keys: the group's, this worker's last exchange, then four
        # per queue, in priority order.
        self._script_keys = [
            first.messages,
            first.owners,
            first.failures,
            first.errors,
            first.results,
            first.results_expiry,
            first.idle,
            first.metrics,
            space.key(f"exchange:{self.id}"),
            *(
                key
                for queue in self.queues
                for key in (queue.ready, queue.in_flight, queue.delayed, queue.dead)
            ),
        ]
        self._next_check = 0.0
        self._last_heartbeat = 0.0
        # What this worker holds, shared with the keeper thread under ``_holding``: tasks
        # taken and not started, the running one (since when), and those run but not yet
        # acknowledged. Every script call that changes what it holds runs under the lock
        # too, so the keeper never renews from a stale view; the condition wakes the keeper
        # when a task starts or ends.
        self._holding = threading.RLock()
        self._changed = threading.Condition(self._holding)
        self._batch: collections.deque[Job] = collections.deque()
        self._running: Job | None = None
        self._running_since = 0.0
        self._done: list[Done] = []
        self._exchanges = 0  # successful exchanges: the next one's nonce
        self._pending: tuple[list[Done], int] | None = None  # an exchange that failed
        self._next_renewal = 0.0
        self._keeper_wakes_at = 0.0  # when the keeper will look again (time.monotonic())
        self._average_ms: float | None = None  # recent run time per task (for prefetch)
        self._loop: asyncio.AbstractEventLoop | None = None  # for async def tasks
        self._idle_registered = False  # in the group's idle set (see _exchange)

    @property
    def client(self) -> Any:
        return resolve_client(self._client)

    @property
    def _lease_ms(self) -> int:
        return max(1, int(self.lease * 1000))

    def stop(self) -> None:
        """Finish the running task, then return from ``run()``."""
        self.stopping.set()

    # -- the loop --------------------------------------------------------------
    def run(self) -> int:
        """Process tasks until stopped; returns how many were processed."""
        autodiscover_tasks()
        logger.info(
            "worker %s watching %s (lease %ss, prefetch up to %d)",
            self.id,
            ", ".join(queue.name for queue in self.queues),
            self.lease,
            self.prefetch,
        )
        failures = 0  # loop turns in a row that failed
        failing_since = 0.0  # when the first of them failed (time.monotonic())
        patience: float | None = None  # how long the last acknowledgement may retry
        # One thread renews the leases of what this worker holds and gives back what waits
        # behind a long task.
        keeper = LeaseKeeper(self)
        keeper.start()
        try:
            while not self.stopping.is_set():
                try:
                    self._heartbeat()
                    job = self._next_job()
                    if job is None:
                        if self.burst:
                            break
                        self._idle()
                    else:
                        self._run_job(job)
                        if self._should_stop():
                            break
                    failures = 0
                except Exception as exc:
                    # What it holds stays held (the keeper renews it) and is finished or
                    # run on the next turn.
                    wait = RECONNECT_BACKOFF.compute(failures)
                    failing_since = failing_since if failures else time.monotonic()
                    failures += 1
                    outage = time.monotonic() - failing_since
                    if (
                        isinstance(exc, REDIS_ERRORS)
                        and self.max_outage is not None
                        and outage + wait > self.max_outage
                    ):
                        raise RedisUnavailable(
                            f"worker {self.id}: Redis unusable for {outage:.0f} s "
                            f"(max_outage {self.max_outage:g} s): {type(exc).__name__}: {exc}"
                        ) from exc
                    log_waited_out(logger, f"worker {self.id}", exc, wait)
                    self.stopping.wait(wait)
        except RedisUnavailable:
            patience = 0  # Redis was given its time already
            raise
        finally:
            try:
                self._settle(patience=patience)
            finally:
                keeper.stop()
                self._sign_off()
                self._close_loop()
        logger.info("worker %s stopped after %d tasks", self.id, self.processed)
        return self.processed

    def _next_job(self) -> Job | None:
        """The next task to run: from the batch in hand, or taken (finishing the tasks run
        since the last take in the same call); None when the queues have none."""
        with self._holding:
            if not self._batch:
                if not self._done:
                    self._recover_if_due()
                self._exchange_held(self._take_count())
                if not self._batch and self.burst:
                    self._recover_if_due(force=True)
                    self._exchange_held(self._take_count())
            if not self._batch:
                return None
            if not self._done:
                # Database connections are checked around each batch, as Django does
                # around each request, and after a task that failed.
                close_old_connections()
            job = self._batch.popleft()
            self._running, self._running_since = job, time.monotonic()
            self._wake_keeper()
            return job

    def _run_job(self, job: Job) -> None:
        finished = self._run_one(job)
        with self._holding:
            self._running = None
            finished.at = time.monotonic()
            self._done.append(finished)
            self._wake_keeper()
            self.processed += 1
            if not self._batch or finished.outcome.kind != "ack":
                close_old_connections()

    def _exchange_held(self, take: int, *, patience: float | None = None) -> None:
        """Finish the tasks run and not yet acknowledged, take up to ``take`` more into the
        batch. An exchange that failed is sent again, the same, before any other: it may
        have run with its reply lost, and only the same call (its nonce) is answered as it
        ran."""
        with self._holding:
            if self._pending is None:
                self._pending = (list(self._done), take)
            done, wanted = self._pending
            jobs = self._exchange(done, wanted, patience=patience)
            self._pending = None
            finished = {id(item) for item in done}
            self._done = [item for item in self._done if id(item) not in finished]
            self._batch.extend(jobs)

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
                self._give_back_held()
            self._batch.clear()
            self._done = []
            self._running = None

    def _wake_keeper(self) -> None:
        """Wake the keeper when it has work sooner than it planned to wake (not at every
        task: that would cost a thread switch per task); under ``_holding``."""
        if self._keeper_due() < self._keeper_wakes_at:
            self._changed.notify()

    def _keeper_due(self) -> float:
        """When the keeper has work next (time.monotonic()); under ``_holding``."""
        due = self._next_renewal
        if self._done:
            due = min(due, self._done[0].at + ACK_AFTER_MS / 1000)
        if self._running is not None and self._batch:
            due = min(due, self._running_since + PREFETCH_BUDGET_MS / 1000)
        return due

    def _keep(self) -> None:
        """The keeper thread's turn: acknowledge the tasks that ended more than
        ``ACK_AFTER_MS`` ago; once the running task has run past the prefetch budget, give
        back what waits behind it; every third of a lease, renew the leases of everything
        held. Under ``_holding``."""
        now = time.monotonic()
        if self._done and now >= self._done[0].at + ACK_AFTER_MS / 1000:
            self._exchange_held(0)
        if (
            self._running is not None
            and self._batch
            and (now - self._running_since) * 1000 > PREFETCH_BUDGET_MS
        ):
            self._give_back_held()
        if now >= self._next_renewal:
            lost = self._renew(self._held())  # raising, it stays due
            self._next_renewal = now + self.lease / 3
            for job in lost:
                logger.warning("task %s: lease lost while held (it will run again)", job.id)

    def _held(self) -> list[Job]:
        """The tasks this worker holds: taken, running, and run but not yet acknowledged."""
        running = [self._running] if self._running is not None else []
        return [*self._batch, *running, *(item.job for item in self._done)]

    def _give_back_held(self) -> None:
        """Give back the batch not started; it stays held when that fails (the next try, or
        its lease, brings it back)."""
        jobs = list(self._batch)
        try:
            self._give_back(jobs)
        except Exception as exc:  # noqa: BLE001
            logger.warning("could not give back %d task(s) (%s); trying again", len(jobs), exc)
            return
        self._batch.clear()

    def _should_stop(self) -> bool:
        if self.stopping.is_set():
            return True
        return self.max_tasks is not None and self.processed >= self.max_tasks

    def _take_count(self) -> int:
        """How many tasks the next call takes: one until a run was measured, then as many as
        fit in the prefetch budget by the recent average run time, at most ``prefetch``,
        never past ``max_tasks``."""
        if self.stopping.is_set():
            return 0
        count = 1
        if self._average_ms is not None:
            count = self.prefetch
            if self._average_ms > 0:
                count = max(1, min(count, int(PREFETCH_BUDGET_MS / self._average_ms)))
        if self.max_tasks is not None:
            count = min(count, self.max_tasks - self.processed)
        return max(0, count)

    def _idle(self) -> None:
        timeout = max(0.01, min(IDLE_CHECK, self._next_check - time.monotonic()))
        if wait_for_signal(self.client, self._group_wake_key, timeout):
            return
        self._recover_if_due(force=True)

    @property
    def _group_wake_key(self) -> str:
        return self.queues[0].wake

    def _recover_if_due(self, *, force: bool = False) -> None:
        """Put back expired leases and promote due retries, for every watched queue."""
        if not force and time.monotonic() < self._next_check:
            return
        next_due = IDLE_CHECK
        for queue in self.queues:
            recovered, _, due_in = recover_and_promote(
                queue, batch=RECOVER_BATCH, client=self.client
            )
            if recovered:
                logger.warning("put back %d task(s) of %s whose worker died", recovered, queue.name)
            if due_in is not None:
                next_due = min(next_due, due_in)
        self._next_check = time.monotonic() + next_due

    def _exchange(
        self, done: Sequence[Done], take: int, *, patience: float | None = None
    ) -> list[Job]:
        """One script call: finish the tasks in ``done`` (and log how each ended), take up
        to ``take`` more. Finding nothing, a worker that will wait for a wake-up registers
        idle in the same call: producers push wake-ups only while a worker is registered.
        With tasks to finish, it keeps trying through a Redis outage for up to a lease
        (until they are recorded, their leases would make them run again), or ``patience``
        seconds. A retried call carries the same nonce, so one whose reply was lost is
        answered as it ran, not run twice."""
        idle_ms = 0 if self.burst else IDLE_REGISTRATION_MS
        args: list[Any] = [
            self.id,
            self._lease_ms,
            result_ttl_ms(),
            idle_ms,
            "1" if self._idle_registered else "0",
            take,
            len(done),
            f"{self._exchanges}",
        ]
        for item in done:
            args += item.script_args()
        deadline = time.monotonic() + (self.lease if patience is None else patience)
        failures = 0
        while True:
            try:
                finished, taken = run_script(
                    "task_finish", self.client, keys=self._script_keys, args=args
                )
                break
            except REDIS_ERRORS as exc:
                if not done or time.monotonic() > deadline:
                    raise
                logger.error(
                    "finishing %d task(s) failed (%s: %s); retrying",
                    len(done),
                    type(exc).__name__,
                    exc,
                )
                time.sleep(RECONNECT_BACKOFF.compute(failures))
                failures += 1
        self._exchanges += 1
        for item, held in zip(done, finished, strict=True):
            if item.outcome.kind in ("retry", "defer"):  # look for it when due
                due = time.monotonic() + item.outcome.delay_ms / 1000
                self._next_check = min(self._next_check, due)
            self._log(item.job, item.outcome, bool(held), item.took_ms)
        jobs = [self._job(entry) for entry in taken]
        if take:
            self._idle_registered = not jobs and idle_ms > 0
        return jobs

    def _take(self, count: int = 1) -> Job | None:
        """Take one task (or ``count``, returning the first; tests use it)."""
        jobs = self._exchange([], count)
        return jobs[0] if jobs else None

    def _finish(self, job: Job, outcome: Outcome, took_ms: float = 0.0) -> int:
        """Finish one task on its own; 1 when this worker still held it."""
        (finished,), _ = run_script(
            "task_finish",
            self.client,
            keys=self._script_keys,
            args=[
                self.id,
                self._lease_ms,
                result_ttl_ms(),
                0,
                "0",
                0,
                1,
                "",
                *Done(job, outcome, took_ms).script_args(),
            ],
        )
        return int(finished)

    def _job(self, entry: Any) -> Job:
        task_id, body, queue_index, failures, state = entry
        return Job(
            task_id.decode(),
            body,
            self.queues[int(queue_index) - 1],
            int(failures),
            state.decode(),
            int(queue_index),
        )

    # -- one task --------------------------------------------------------------
    def _run_one(self, job: Job) -> Done:
        """Run ``job`` and say how it ended (it is finished with the next exchange)."""
        started = time.perf_counter()
        try:
            outcome = self._execute(job)
        # Anything the task's own code raises is caught in _call; this is what reading,
        # looking up or checking it raised: it cannot run here.
        except Exception as exc:  # noqa: BLE001
            outcome = self._not_here(job, "?", f"the worker could not run it: {exc!r}")
        took_ms = (time.perf_counter() - started) * 1000
        # Recent average run time, for how many tasks to take at once.
        average = self._average_ms
        self._average_ms = took_ms if average is None else average * 0.8 + took_ms * 0.2
        return Done(job, outcome, took_ms)

    def _not_here(self, job: Job, name: str, reason: str) -> Outcome:
        """A task this worker cannot run (unknown here, its module fails to import, its
        backend is not configured): back to its queue with a delay, for a worker that knows
        it (a rolling deploy's newer release), until ``TASK_MAX_DELIVERIES`` deliveries;
        then a dead letter. A deferral is not a failed attempt."""
        record = job.record  # its worker ids: one per delivery, this one included
        deliveries = max(1, record.attempts) if record is not None else 1
        if deliveries >= conf.TASK_MAX_DELIVERIES:
            return not_runnable(
                name, f"{reason}; no worker could run it in {deliveries} deliveries"
            )
        return Outcome(
            "defer",
            name,
            f"{reason} (worker {self.id}, django-rcoord {__version__}; delivery {deliveries} "
            f"of {conf.TASK_MAX_DELIVERIES})",
            _class_path(TaskNotRunnable),
            _retry_delay_ms(deliveries - 1),
        )

    @staticmethod
    def _log(job: Job, outcome: Outcome, finished: bool, took_ms: float) -> None:
        """One line per task: how it ended, why it failed, how long it ran (a failure's line
        carries the task's exception, with its traceback)."""
        name, attempt = outcome.task_name, job.failures + 1
        if not finished:
            logger.warning(
                "task %s %s: ran %.1f ms, but its lease had run out: it runs again elsewhere",
                job.id,
                name,
                took_ms,
            )
        elif outcome.kind == "ack":
            logger.info("task %s %s succeeded (ran %.1f ms)", job.id, name, took_ms)
        elif outcome.kind == "defer":
            logger.warning(
                "task %s %s cannot run here: %s; back in its queue in %.3g s",
                job.id,
                name,
                outcome.error,
                outcome.delay_ms / 1000,
            )
        elif outcome.kind == "retry":
            # With the task's exception: its traceback for the log and error trackers.
            logger.warning(
                "task %s %s failed on attempt %d (ran %.1f ms): %s; next attempt in %.3g s",
                job.id,
                name,
                attempt,
                took_ms,
                outcome.summary,
                outcome.delay_ms / 1000,
                exc_info=outcome.exception,
            )
        else:
            logger.error(
                "task %s %s failed on attempt %d (ran %.1f ms): %s; it is a dead letter now",
                job.id,
                name,
                attempt,
                took_ms,
                outcome.summary,
                exc_info=outcome.exception,
            )

    def _execute(self, job: Job) -> Outcome:
        """Run the task and say how it ended."""
        message = decode_message(job.body)
        if message is None or not isinstance(message.get("task"), str):
            return not_runnable("?", "undecodable message (not a JSON object with a task name)")
        name = message["task"]
        registered = get_task(name)
        if registered is None and message.get("backend"):
            return self._execute_framework_task(job, message, name)
        if registered is None:
            return self._not_here(job, name, f"unknown task {name!r} (not registered here)")
        args, kwargs = message.get("args", []), message.get("kwargs", {})
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            return not_runnable(name, "args must be a JSON list and kwargs a JSON object")
        try:
            registered.signature.bind(*args, **kwargs)
        except TypeError as exc:
            return not_runnable(name, f"the task does not accept these arguments: {exc}")
        return self._call(job, name, registered.function, args, kwargs, registered.max_retries)

    def _call(
        self,
        job: Job,
        name: str,
        function: Any,
        args: list[Any],
        kwargs: dict[str, Any],
        max_retries: int,
    ) -> Outcome:
        """Call a task function (awaiting an async one) and say how it ended."""
        try:
            value = function(*args, **kwargs)
            if inspect.isawaitable(value):
                value = self._await(value)
        except PermanentFailure as exc:
            return Outcome(
                "dead", name, f"PermanentFailure: {exc}", _class_path(type(exc)), exception=exc
            )
        # Whatever the task's own code raises fails the task (SystemExit too), not the worker.
        except (Exception, SystemExit) as exc:  # noqa: BLE001
            outcome = Outcome(
                "dead", name, traceback.format_exc(), _class_path(type(exc)), exception=exc
            )
            if job.failures < max_retries:
                outcome.kind, outcome.delay_ms = "retry", _retry_delay_ms(job.failures)
            return outcome
        try:
            return Outcome("ack", name, value_json=to_json(value))
        except (TypeError, ValueError) as exc:
            # Running it again would return the same: dead at once, and the worker goes on.
            return Outcome(
                "dead",
                name,
                f"the return value of task {name!r} cannot be stored as JSON: {exc}",
                _class_path(type(exc)),
            )

    def _execute_framework_task(self, job: Job, message: dict[str, Any], name: str) -> Outcome:
        """Run a task of Django's Tasks framework (enqueued by RedisTaskBackend)."""
        from django_rcoord.queues import framework
        from django_rcoord.queues.backend import (
            RedisTaskBackend,
            framework_task,
            result_from_record,
        )

        # The project's code and settings (the task's module, TASKS) may differ between the
        # releases of a rolling deploy: what fails here may run on a newer worker.
        try:
            task = framework_task(name)
        except Exception as exc:  # noqa: BLE001
            return self._not_here(job, name, f"importing {name!r} failed: {exc!r}")
        if task is None:
            return self._not_here(job, name, f"{name!r} is not a Tasks framework task here")
        try:
            backend = framework.task_backends[message["backend"]]
        # An unknown alias, or a backend whose construction fails for any reason.
        except Exception as exc:  # noqa: BLE001
            return self._not_here(job, name, f"no Tasks backend {message['backend']!r}: {exc}")
        if not isinstance(backend, RedisTaskBackend):
            return self._not_here(job, name, f"backend {backend.alias!r} is not RedisTaskBackend")
        args, kwargs = message.get("args", []), message.get("kwargs", {})
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            return not_runnable(name, "args must be a JSON list and kwargs a JSON object")
        record = job.record_of(message)
        assert record is not None  # its body is the message read above
        try:
            result = result_from_record(task, record)
        except Exception as exc:  # noqa: BLE001 - e.g. a queue this release's TASKS lacks
            return self._not_here(job, name, f"its result does not validate here: {exc!r}")
        if task.takes_context:
            args = [framework.TaskContext(task_result=result), *args]
        try:
            _signature(task.func).bind(*args, **kwargs)
        except TypeError as exc:
            return not_runnable(name, f"the task does not accept these arguments: {exc}")
        sender = type(backend)
        _send_robust(framework.task_started, "task_started", sender, result)
        outcome = self._call(job, name, task.func, args, kwargs, backend.max_retries)
        if outcome.kind != "retry":
            now = datetime.datetime.now(datetime.timezone.utc)
            object.__setattr__(result, "finished_at", now)
            if outcome.kind == "ack":
                object.__setattr__(result, "status", framework.TaskResultStatus.SUCCESSFUL)
                object.__setattr__(result, "_return_value", json.loads(outcome.value_json))
            else:
                object.__setattr__(result, "status", framework.TaskResultStatus.FAILED)
                result.errors.append(
                    framework.TaskError(
                        exception_class_path=outcome.error_class, traceback=outcome.error
                    )
                )
            if outcome.exception is None:
                _send_robust(framework.task_finished, "task_finished", sender, result)
            else:
                # Sent while the task's exception is being handled, as Django's own backends
                # do: the framework's receiver logs it with logger.exception.
                try:
                    raise outcome.exception
                except BaseException:  # noqa: BLE001 - handled: it failed the task
                    _send_robust(framework.task_finished, "task_finished", sender, result)
        return outcome

    def _await(self, awaitable: Any) -> Any:
        """Run an async task to its end on this worker's own event loop."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(_as_coroutine(awaitable))

    def _close_loop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        try:
            # Closes the loop's async clients (see connection.get_async_client).
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()

    def _renew(self, jobs: Sequence[Job]) -> list[Job]:
        """Extend the leases of ``jobs`` (one call per queue); returns those no longer held."""
        lost: list[Job] = []
        for queue, queue_jobs in _by_queue(jobs):
            held = run_script(
                "task_renew",
                self.client,
                keys=[queue.owners, queue.in_flight, queue.results, queue.results_expiry],
                args=[
                    self.id,
                    self._lease_ms,
                    result_ttl_ms() + self._lease_ms,
                    *(job.id for job in queue_jobs),
                ],
            )
            lost += [job for job, flag in zip(queue_jobs, held, strict=True) if not flag]
        return lost

    def _give_back(self, jobs: Sequence[Job]) -> None:
        """Tasks taken but not run (we are stopping, or they waited behind a long task):
        back to the front of their queue at once, for any worker (one call per queue)."""
        for queue, queue_jobs in _by_queue(jobs):
            run_script(
                "task_give_back",
                self.client,
                keys=[
                    queue.owners,
                    queue.in_flight,
                    queue.results,
                    queue.ready,
                    queue.queues,
                    queue.messages,
                    queue.wake,
                    queue.idle,
                ],
                args=[
                    self.id,
                    queue.queue,
                    GROUP_KEYS_MS,
                    WAKE_TOKEN_MS,
                    *(job.id for job in queue_jobs),
                ],
            )

    # -- presence (for rcoord_status) -----------------------------------------------
    def _heartbeat(self) -> None:
        now = time.monotonic()
        if now - self._last_heartbeat < HEARTBEAT_TTL / 3:
            return
        self._last_heartbeat = now
        with self.client.pipeline(transaction=False) as pipe:
            pipe.sadd(self._workers_key, self.id)
            pipe.expire(self._workers_key, HEARTBEAT_TTL * 4)  # gone once every worker is
            pipe.set(
                self._heartbeat_key,
                json.dumps(
                    {
                        "queues": [queue.name for queue in self.queues],
                        "done": self.processed,
                        "started": self._started_at,
                    }
                ),
                ex=HEARTBEAT_TTL,
            )
            pipe.execute()

    def _sign_off(self) -> None:
        try:
            with self.client.pipeline(transaction=False) as pipe:
                pipe.srem(self._workers_key, self.id)
                pipe.delete(self._heartbeat_key)
                pipe.zrem(self.queues[0].idle, self.id)
                pipe.execute()
            # Workers of the group that died without signing off (status pages only read).
            forget_gone_workers(self.queues[0].group, client=self.client)
        except REDIS_ERRORS as exc:
            # Its heartbeat expires on its own.
            logger.warning("worker %s could not sign off (%s)", self.id, exc)


class LeaseKeeper(threading.Thread):
    """The one thread beside a worker's loop: renews the leases of what it holds,
    acknowledges finished tasks that wait, gives back the tasks behind a long one. It
    sleeps until the worker's next due time or until a task starts or ends."""

    def __init__(self, worker: Worker) -> None:
        super().__init__(name=f"lease-keeper:{worker.id}", daemon=True)
        self.worker = worker
        self._stopped = False

    def stop(self) -> None:
        with self.worker._changed:
            self._stopped = True
            self.worker._changed.notify()
        if self.is_alive() and self is not threading.current_thread():
            self.join()

    def run(self) -> None:
        worker, failures, retry_at = self.worker, 0, 0.0
        with worker._changed:
            while not self._stopped:
                due = max(worker._keeper_due(), retry_at)
                wait = due - time.monotonic()
                if wait > 0:
                    worker._keeper_wakes_at = due
                    worker._changed.wait(wait)
                    worker._keeper_wakes_at = 0.0
                    continue
                try:
                    worker._keep()
                    failures, retry_at = 0, 0.0
                # What it could not do stays due; the worker's loop meets the same error.
                except Exception as exc:  # noqa: BLE001
                    pause = RECONNECT_BACKOFF.compute(failures)
                    failures += 1
                    logger.warning(
                        "worker %s: lease keeper failed (%s); again in %.1fs", worker.id, exc, pause
                    )
                    retry_at = time.monotonic() + pause


def default_queues() -> list[list[str]]:
    """The queues a worker watches when it is not told which: ``RCOORD["EMAIL_QUEUES"]``,
    the ``QUEUES`` of the Tasks framework's ``RedisTaskBackend`` backends and every queue a
    registered ``@task`` uses, in that order, split by queue group (a worker serves one
    group: one list per group, the default group's first)."""
    autodiscover_tasks()
    names = [*conf.EMAIL_QUEUES, *_framework_queues(), *(task.queue for task in registered_tasks())]
    by_group: dict[str, list[str]] = {}
    for name in dict.fromkeys(names):
        by_group.setdefault(QueueKeys.of(name).group, []).append(name)
    return list(by_group.values())


def _framework_queues() -> list[str]:
    try:
        from django_rcoord.queues import framework
        from django_rcoord.queues.backend import RedisTaskBackend
    except ImportError:  # Django 5.2 without the backport: no framework tasks
        return []
    names: list[str] = []
    for backend in framework.task_backends.all():
        if isinstance(backend, RedisTaskBackend):
            names += sorted(backend.queues)
    return names


def waiting_elsewhere(watched: Sequence[str], *, client: Any = None) -> dict[str, int]:
    """Queues not in ``watched`` that hold tasks ready or due later: name -> how many."""
    waiting = {}
    for group in known_groups(client=client):
        for name in known_queues(group, client=client):
            if name in watched:
                continue
            stats = queue_stats(name, client=client)
            if stats["ready"] + stats["delayed"]:
                waiting[name] = stats["ready"] + stats["delayed"]
    return waiting


def _send_robust(signal: Any, signal_name: str, sender: type, result: Any) -> None:
    """Send a Tasks framework signal; a receiver that raises is logged (Django logs its
    traceback too) and neither fails the task nor stops the worker."""
    for receiver, response in signal.send_robust(sender, task_result=result):
        if isinstance(response, Exception):
            logger.error(
                "task %s: a receiver of %s (%s) raised %r; the task goes on",
                result.id,
                signal_name,
                getattr(receiver, "__qualname__", receiver),
                response,
            )


def _by_queue(jobs: Sequence[Job]) -> list[tuple[QueueKeys, list[Job]]]:
    """``jobs`` by queue, each queue's in the order given."""
    grouped: dict[str, tuple[QueueKeys, list[Job]]] = {}
    for job in jobs:
        grouped.setdefault(job.queue.name, (job.queue, []))[1].append(job)
    return list(grouped.values())


async def _as_coroutine(awaitable: Any) -> Any:
    return await awaitable
