"""Running one task: no Redis here.

``TaskRunner.run(job, resolved)`` runs what ``resolve`` made of the job's message (a
``Call``: a ``@task`` and a Tasks framework task alike), calling its function (awaiting
an ``async def`` task on an event loop of the runner's own), and says how it ended as an
``Outcome``: acknowledged with a value, retried after a delay, deferred for a worker that
knows it (``refused``), or dead (``Job`` and ``Outcome`` are in ``jobs``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import signal
import threading
import time
import traceback
from collections.abc import Iterator
from typing import Any

from django_rcoord import __version__, tracing
from django_rcoord.conf import conf
from django_rcoord.exceptions import (
    ResultTooLarge,
    TaskCancelled,
    TaskNotRunnable,
    TaskTimeLimitExceeded,
)
from django_rcoord.queues.cancel import running
from django_rcoord.queues.messages import check_result_size, to_json
from django_rcoord.queues.options import DEFAULT_OPTIONS, RunOptions
from django_rcoord.queues.outcomes import Kind
from django_rcoord.queues.registry import PermanentFailure
from django_rcoord.queues.worker.jobs import (
    Call,
    Done,
    FollowUps,
    Job,
    Outcome,
    Refusal,
    class_path,
    failure,
    not_runnable,
    stopped,
)

logger = logging.getLogger(__name__)


class TaskRunner:
    """Runs tasks for worker ``worker_id``, one at a time, and says how each ended."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self._loop: asyncio.AbstractEventLoop | None = None  # for async def tasks
        # The async task being awaited, by task id, for stop() from the worker's keeper
        # thread; and the id of the one stop() cancelled.
        self._guard = threading.Lock()
        self._awaiting: tuple[str, asyncio.Future[Any]] | None = None
        self._stopped: str | None = None

    def stop(self, task_id: str) -> bool:
        """Stop the run of task ``task_id`` because ``cancel()`` asked, from any thread: an
        async task is cancelled (at its next ``await``), and fails with ``TaskCancelled``.
        A sync one cannot be interrupted (Python cannot stop a thread): it goes on, and its
        code sees ``stop_requested()``. True when it was cancelled."""
        with self._guard:
            if self._awaiting is None or self._awaiting[0] != task_id or self._loop is None:
                return False
            self._stopped = task_id
            self._loop.call_soon_threadsafe(self._awaiting[1].cancel)
            return True

    def run(self, job: Job, resolved: Call | Refusal) -> Done:
        """Run ``job``, ``resolved`` (``resolve.resolve``) to what runs it: never raises
        (what the task raises is its outcome). A traced one (``django_rcoord.tracing``) in
        a CONSUMER span, the child of its enqueue's."""
        active = tracing.tracer()
        if active is None:
            return self._run(job, resolved)
        with tracing.processing(
            active, job.message, job.id, job.queue.name, job.failures + 1
        ) as span:
            done = self._run(job, resolved)
            outcome = done.outcome
            kind = outcome.kind
            tracing.processed(span, kind.value, kind.failed, outcome.summary, outcome.exception)
            return done

    def _run(self, job: Job, resolved: Call | Refusal) -> Done:
        started = time.perf_counter()
        outcome = self.execute(job, resolved)
        return Done(job, outcome, (time.perf_counter() - started) * 1000)

    def execute(self, job: Job, call: Call | Refusal) -> Outcome:
        name = job.task_name
        if isinstance(call, Refusal):
            return refused(job, call, self.worker_id)
        call.started()
        outcome = self.call(job, name, call.function, call.args, call.kwargs, call.options)
        outcome = self.follow_up(job, outcome, call.follow_ups, call.options)
        if outcome.kind is not Kind.RETRY:  # its end is final
            call.ended(outcome)
        return outcome

    def follow_up(
        self,
        job: Job,
        outcome: Outcome,
        follow_ups: FollowUps,
        options: RunOptions,
    ) -> Outcome:
        """Attach the follow-up of ``follow_ups`` for how the run ended
        (``on_success``, or ``on_failure`` once no retry is left): the finish script queues it
        in the step that records the end, so it runs once the record is final, and only if that
        end is recorded. A follow-up of another queue group (another hash slot) cannot share
        that step: it is queued now, just before. One that cannot be queued fails a successful
        run (it is retried, the follow-up with it), and is said in a dead letter's error."""
        if not outcome.kind.is_final:
            return outcome
        succeeded = outcome.kind is Kind.ACK
        try:
            follow_up = follow_ups.after(succeeded)
            if follow_up is not None:
                step = follow_up.queued_in_step(job.id)
                if step.queue.group == job.queue.group:
                    outcome.follow_ups.append(step)
                else:
                    follow_up.delay(job.id)
        except Exception as exc:  # noqa: BLE001 - Redis, or a follow-up this release lacks
            reason = f"its {'on_success' if succeeded else 'on_failure'} follow-up "
            reason += f"could not be queued: {exc!r}"
            if not succeeded:
                outcome.error = f"{outcome.error}\n({reason})"
                return outcome
            return failure(job, options, reason, class_path(type(exc)), exc)
        return outcome

    def call(
        self,
        job: Job,
        name: str,
        function: Any,
        args: list[Any],
        kwargs: dict[str, Any],
        options: RunOptions,
    ) -> Outcome:
        """Call a task function (awaiting an async one) within its time limit and say how
        it ended."""
        limit = options.time_limit
        try:
            started = time.monotonic()
            with running(job.id):
                with _alarm(limit):  # the sync part only: an async task is cancelled instead
                    value = function(*args, **kwargs)
                if inspect.isawaitable(value):
                    left = limit and max(0.0, limit - (time.monotonic() - started))
                    value = self._await(value, left, limit, job.id)
        except PermanentFailure as exc:
            return Outcome(
                Kind.DEAD, name, f"PermanentFailure: {exc}", class_path(type(exc)), exception=exc
            )
        # Whatever the task's own code raises fails the task (SystemExit too), not the worker.
        except (Exception, SystemExit) as exc:  # noqa: BLE001
            if isinstance(exc, TaskCancelled) and self._stopped == job.id:
                return stopped(name, f"{exc}")
            return failure(job, options, traceback.format_exc(), class_path(type(exc)), exc)
        return returned(name, value)

    def _await(
        self, awaitable: Any, left: float | None, limit: float | None = None, task_id: str = ""
    ) -> Any:
        """Run an async task to its end on this runner's own event loop; cancelled (and
        ``TaskTimeLimitExceeded`` raised) after ``left`` seconds, what is left of its time
        limit of ``limit``; cancelled (and ``TaskCancelled`` raised) when ``stop(task_id)``
        is called meanwhile."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        with self._guard:
            self._stopped = None
        return self._loop.run_until_complete(self._stoppable(awaitable, left, limit, task_id))

    async def _stoppable(
        self, awaitable: Any, left: float | None, limit: float | None, task_id: str
    ) -> Any:
        run = asyncio.ensure_future(awaitable)
        with self._guard:
            self._awaiting = (task_id, run)
        try:
            return await _within(run, left, limit)
        except asyncio.CancelledError:
            if self._stopped != task_id:
                raise
            raise TaskCancelled("cancelled while running: cancel() asked it to stop") from None
        finally:
            with self._guard:
                self._awaiting = None

    def close(self) -> None:
        """Close the event loop of async tasks (and, with it, their async clients)."""
        loop, self._loop = self._loop, None
        if loop is None:
            return
        try:
            # Closes the loop's async clients (see connection.get_async_client).
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()


def refused(job: Job, refusal: Refusal, worker_id: str) -> Outcome:
    """How a task ``worker_id`` cannot run ends: dead when no worker can run it
    (``refusal.anywhere``); else (unknown here, its module fails to import, its backend is
    not configured) back to its queue with a delay, for a worker that knows it (a rolling
    deploy's newer release), until ``TASK_MAX_DELIVERIES`` deliveries, then dead. A
    deferral is not a failed attempt."""
    name, reason = job.task_name, refusal.reason
    if refusal.anywhere:
        return not_runnable(name, reason)
    record = job.record  # its worker ids: one per delivery, this one included
    deliveries = max(1, record.attempts) if record is not None else 1
    if deliveries >= conf.TASK_MAX_DELIVERIES:
        return not_runnable(name, f"{reason}; no worker could run it in {deliveries} deliveries")
    return Outcome(
        Kind.DEFER,
        name,
        f"{reason} (worker {worker_id}, django-rcoord {__version__}; delivery "
        f"{deliveries} of {conf.TASK_MAX_DELIVERIES})",
        class_path(TaskNotRunnable),
        DEFAULT_OPTIONS.retry_delay_ms(deliveries - 1),
    )


#: How a failure's line starts (then: what comes next).
_FAILED = "task %(id)s %(name)s failed on attempt %(attempt)d (ran %(took_ms).1f ms): %(summary)s; "

#: The worker's line for each way a task ends, as its level and its message, filled from
#: the run's fields (``log_outcome``). "lost": it ran, but its lease had run out first.
OUTCOME_LINES: dict[Kind | str, tuple[int, str]] = {
    "lost": (
        logging.WARNING,
        (
            "task %(id)s %(name)s: ran %(took_ms).1f ms, but its lease had run out: "
            "it runs again elsewhere"
        ),
    ),
    Kind.ACK: (logging.INFO, "task %(id)s %(name)s succeeded (ran %(took_ms).1f ms)"),
    Kind.LATER: (
        logging.INFO,
        "task %(id)s %(name)s is %(error)s: back in the delayed set for %(delay_s).3g s",
    ),
    Kind.DEFER: (
        logging.WARNING,
        "task %(id)s %(name)s cannot run here: %(error)s; back in its queue in %(delay_s).3g s",
    ),
    Kind.STOPPED: (
        logging.WARNING,
        (
            "task %(id)s %(name)s was stopped on attempt %(attempt)d (ran %(took_ms).1f ms): "
            "cancel() asked it to stop"
        ),
    ),
    Kind.RETRY: (logging.WARNING, _FAILED + "next attempt in %(delay_s).3g s"),
    Kind.DEAD: (logging.ERROR, _FAILED + "it is a dead letter now"),
}


def log_outcome(done: Done, held: bool) -> None:
    """One line per task: how it ended, why it failed, how long it ran (a failure's line
    carries the task's exception, with its traceback, unless the Tasks framework logged
    it already). ``held``: its worker still held it when it was finished."""
    job, outcome = done.job, done.outcome
    kind: Kind | str = outcome.kind if held else "lost"
    level, message = OUTCOME_LINES[kind]
    failed = kind in (Kind.RETRY, Kind.DEAD)
    fields = {
        "id": job.id,
        "name": outcome.task_name,
        "attempt": job.failures + 1,
        "took_ms": done.took_ms,
        "error": outcome.error,
        "summary": outcome.summary if failed else "",  # only a failure's line says it
        "delay_s": outcome.delay_ms / 1000,
    }
    exc_info = outcome.exception if failed and not outcome.traceback_logged else None
    logger.log(level, message, fields, exc_info=exc_info)


async def _within(awaitable: Any, left: float | None, limit: float | None) -> Any:
    if left is None:
        return await awaitable
    try:
        return await asyncio.wait_for(awaitable, left)
    except asyncio.TimeoutError:
        raise TaskTimeLimitExceeded(f"cancelled after its time limit of {limit:g} s") from None


def returned(name: str, value: Any) -> Outcome:
    """How a run of task ``name`` that returned ``value`` ended: acknowledged with the value
    as JSON, or, when it cannot be stored (JSON cannot carry it, or it is over
    ``RCOORD["MAX_RESULT_BYTES"]``), a dead letter saying why. Running it again would
    return the same: dead at once, and the worker goes on."""
    try:
        value_json = to_json(value)
        check_result_size(name, value_json)
    except (TypeError, ValueError) as exc:
        error = str(exc)
        if not isinstance(exc, ResultTooLarge):
            error = f"the return value of task {name!r} cannot be stored as JSON: {exc}"
        return Outcome(Kind.DEAD, name, error, class_path(type(exc)))
    return Outcome(Kind.ACK, name, value_json=value_json)


@contextlib.contextmanager
def _alarm(limit: float | None) -> Iterator[None]:
    """Raise ``TaskTimeLimitExceeded`` in the code running in this block once it has run
    ``limit`` seconds: a SIGALRM timer, so only in the main thread (elsewhere the block
    runs unlimited; ``run_email_worker --isolation process`` limits every task)."""
    if (
        limit is None
        or not hasattr(signal, "setitimer")
        or threading.current_thread() is not threading.main_thread()
    ):
        yield
        return

    def exceeded(signum: int, frame: Any) -> None:
        raise TaskTimeLimitExceeded(f"stopped after its time limit of {limit:g} s")

    previous = signal.signal(signal.SIGALRM, exceeded)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
