"""Running tasks in a child process, so that one past its time limit can be stopped.

A sync task cannot be interrupted safely in a thread: Python has no way to stop a
thread from outside, and a task stuck in C code or a socket read ignores signals.
``ProcessTaskRunner`` runs each task in a child process of its own (started once,
with Django set up, and kept for the next tasks): the child raises
``TaskTimeLimitExceeded`` inside a task at its limit (as the worker's main thread
does), and the parent kills the child ``HARD_LIMIT_GRACE`` seconds later if the task
has not ended by then, records the run as failed, and starts a new child for the
next task. A task that kills its process (a crash, ``os._exit``, the OOM killer)
fails too, instead of taking the worker down with it. A task ``cancel()`` asked to
stop (``stop``, called by the worker's keeper) is killed the same way, sync or async,
and fails with ``TaskCancelled``.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from django_rcoord.exceptions import TaskTimeLimitExceeded
from django_rcoord.queues.options import RunOptions
from django_rcoord.queues.registry import autodiscover_tasks
from django_rcoord.queues.worker.jobs import (
    Call,
    Done,
    Job,
    Outcome,
    Refusal,
    class_path,
    failure,
    stopped,
)
from django_rcoord.queues.worker.resolve import resolve
from django_rcoord.queues.worker.runner import TaskRunner, refused

logger = logging.getLogger(__name__)

#: Seconds after a task's time limit before its process is killed: time for the task to
#: end on its own once ``TaskTimeLimitExceeded`` was raised in it.
HARD_LIMIT_GRACE = 1.0
#: Seconds a child may take to start (a fresh interpreter sets Django up) and begin a task
#: before it is killed. A task's time limit counts from when it began in the child, not
#: from when it was sent: a slow start on a busy machine is not the task's time.
CHILD_START_LIMIT = 120.0
#: What the child sends when it begins a task, before the task's outcome.
_BEGUN = "begun"


class ProcessTaskRunner:
    """Runs tasks for worker ``worker_id`` in a child process, one at a time, with the
    interface of ``TaskRunner`` (``run`` and ``close``)."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self._process: Any = None
        self._connection: Connection | None = None
        # The task the child runs and whether stop() killed it, for stop() from the
        # worker's keeper (on the process's renewer thread).
        self._guard = threading.Lock()
        self._running: str | None = None
        self._stopped = False

    def stop(self, task_id: str) -> bool:
        """Kill the child while it runs task ``task_id`` (``cancel()`` asked it to stop):
        the run fails with ``TaskCancelled`` and the next task gets a new child. Any
        thread; True when it was killed."""
        with self._guard:
            process = self._process
            if self._running != task_id or process is None:
                return False
            logger.warning(
                "worker %s: task %s was asked to stop; killing its process %s",
                self.worker_id,
                task_id,
                process.pid,
            )
            self._stopped = True
            process.kill()
            return True

    def run(self, job: Job, resolved: Call | Refusal) -> Done:
        """Run ``job`` in the child (which looks its task up again: a ``Call`` holds the
        parent's functions); never raises. One this worker cannot run is refused here."""
        started = time.perf_counter()
        if isinstance(resolved, Refusal):
            outcome = refused(job, resolved, self.worker_id)
        else:
            outcome = self._run_in_child(job, resolved.options)
        return Done(job, outcome, (time.perf_counter() - started) * 1000)

    def _run_in_child(self, job: Job, options: RunOptions) -> Outcome:
        try:
            connection = self._child()
            with self._guard:
                self._running, self._stopped = job.id, False
            connection.send(job)
            return self._answer(connection, job, options)
        except (EOFError, OSError) as exc:  # the child died: the pipe closed under us
            return self._died(job, options, exc)
        finally:
            with self._guard:
                self._running, killed = None, self._stopped
            if killed and self._process is not None:
                # It answered before stop() killed it: the next task needs a new child.
                process = self._process
                self._forget_child()
                process.join()

    def _answer(self, connection: Connection, job: Job, options: RunOptions) -> Outcome:
        """The child's outcome of ``job``, or a failure once it overruns its start or its
        time limit (the child is killed then)."""
        limit = options.time_limit
        begun = connection.poll(CHILD_START_LIMIT)
        if begun:
            connection.recv()  # _BEGUN: the time limit counts from now
        if begun and connection.poll(None if limit is None else limit + HARD_LIMIT_GRACE):
            kind, name, error, error_class, delay_ms, value, follow_ups = connection.recv()
            return Outcome(kind, name, error, error_class, delay_ms, value, follow_ups=follow_ups)
        if not begun:
            why = f"its process did not begin it within {CHILD_START_LIMIT:g} s"
            self._kill(f"task {job.id}: {why}")
            return _failed(job, options, ChildProcessError, why)
        self._kill(f"task {job.id} ran past its time limit of {limit:g} s")
        why = f"killed after its time limit of {limit:g} s"
        return _failed(job, options, TaskTimeLimitExceeded, why)

    def _died(self, job: Job, options: RunOptions, exc: Exception) -> Outcome:
        """How ``job`` ended when its child died under it: stopped when ``stop()`` killed
        it, else failed, with the child's exit status."""
        process = self._process
        self._forget_child()
        code = None
        if process is not None:
            process.join(5)
            code = process.exitcode
        if self._stopped:
            return stopped(job.task_name, "its process was killed: cancel() asked it to stop")
        reason = _exit_reason(code) if code is not None else repr(exc)
        return _failed(job, options, ChildProcessError, f"the task's process died ({reason})")

    def close(self) -> None:
        """Stop the child (it finishes nothing: ``run`` is not running)."""
        connection, process = self._connection, self._process
        self._forget_child()
        if connection is not None:
            with contextlib.suppress(OSError):
                connection.send(None)
            connection.close()
        if process is not None:
            process.join(5)
            if process.is_alive():
                process.kill()
                process.join()

    def _child(self) -> Connection:
        if self._connection is not None and self._process is not None and self._process.is_alive():
            return self._connection
        self._forget_child()
        # A fresh interpreter ("spawn"): nothing of the worker's threads, locks or open
        # connections is copied into the child.
        context = multiprocessing.get_context("spawn")
        parent_end, child_end = context.Pipe()
        process = context.Process(
            target=serve_tasks,
            args=(child_end, self.worker_id, os.environ.get("DJANGO_SETTINGS_MODULE")),
            name=f"task-runner:{self.worker_id}",
            daemon=True,
        )
        process.start()
        child_end.close()
        self._process, self._connection = process, parent_end
        return parent_end

    def _kill(self, why: str) -> None:
        process = self._process
        logger.warning("worker %s: %s; killing its process %s", self.worker_id, why, process.pid)
        self._forget_child()
        process.kill()
        process.join()

    def _forget_child(self) -> None:
        if self._connection is not None:
            self._connection.close()
        self._process, self._connection = None, None


def serve_tasks(connection: Connection, worker_id: str, settings_module: str | None) -> None:
    """The child's loop: set Django up, then run each job received until told to stop."""
    # Ctrl-C and a service manager's SIGTERM reach the whole process group: the worker
    # decides when its child stops (after the running task), so the child ignores them.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if settings_module:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", settings_module)
    import django

    django.setup()

    autodiscover_tasks()
    runner = TaskRunner(worker_id)
    try:
        while True:
            try:
                job = connection.recv()
            except EOFError:  # the worker is gone
                return
            if job is None:
                return
            connection.send(_BEGUN)
            outcome = runner.run(job, resolve(job)).outcome
            connection.send(
                (
                    outcome.kind,
                    outcome.task_name,
                    outcome.error,
                    outcome.error_class,
                    outcome.delay_ms,
                    outcome.value_json,
                    outcome.follow_ups,  # queued by the parent's finish script
                )
            )
    finally:
        runner.close()


def _failed(job: Job, options: RunOptions, kind: type, reason: str) -> Outcome:
    """The outcome of a run the parent had to end: a failure, retried like any other."""
    return failure(job, options, f"{kind.__name__}: {reason}", class_path(kind))


def _exit_reason(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exit code {code}"
