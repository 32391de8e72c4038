"""Framework tasks in the worker: the ``Call`` that runs one a ``RedisTaskBackend``
enqueued (its context, its signals and final result), the follow-ups ``TASK_OPTIONS``
names for it, and its run options. The worker's ``TaskRunner`` asks ``framework_call``
for a message whose ``backend`` field says it came through Django's Tasks framework, and
runs what it answers as it runs a ``@task``.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import inspect
import json
import logging
from typing import Any

from django_rcoord.queues.arguments import argument_problem
from django_rcoord.queues.backend import (
    RedisTaskBackend,
    framework_task,
    result_from_record,
    with_return_value,
)
from django_rcoord.queues.framework import (
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultStatus,
    task_backends,
    task_finished,
    task_started,
)
from django_rcoord.queues.keys import group_of_task_id
from django_rcoord.queues.outcomes import Kind
from django_rcoord.queues.producer import QueuedInStep, queue_now_in_step
from django_rcoord.queues.registry import get_task
from django_rcoord.queues.task_class import options_of
from django_rcoord.queues.task_options import follow_up_path
from django_rcoord.queues.worker.jobs import Call, FollowUp, FollowUps, Job, Outcome, Refusal

logger = logging.getLogger(__name__)


def framework_call(job: Job, message: dict[str, Any], name: str) -> Call | Refusal:
    """The ``Call`` that runs a task of Django's Tasks framework that this backend enqueued:
    its task and backend found, its context made, ``task_started`` sent before the call and
    ``task_finished`` with its final result once its end is final. What this release of the
    project cannot run (a rolling deploy's newer task or settings) is refused here only."""
    found = _task_and_backend(name, message.get("backend"))
    if isinstance(found, Refusal):
        return found
    task, backend = found
    arguments = _arguments(job, message, task)
    if isinstance(arguments, Refusal):
        return arguments
    args, kwargs, result = arguments
    sender = type(backend)
    return Call(
        task.func,
        args,
        kwargs,
        backend.run_options(task),
        FollowUps(follow_up_of(name, True), follow_up_of(name, False)),
        functools.partial(_send_robust, task_started, "task_started", sender, result),
        functools.partial(_send_finished, sender, result),
    )


def _task_and_backend(name: Any, alias: Any) -> tuple[Task, RedisTaskBackend] | Refusal:
    """The framework task at dotted path ``name`` and the ``RedisTaskBackend`` that enqueued
    it. The project's code and settings (the task's module, TASKS) may differ between the
    releases of a rolling deploy: what is refused here may run on a newer worker."""
    try:
        task = framework_task(name)
    except Exception as exc:  # noqa: BLE001
        return Refusal(f"importing {name!r} failed: {exc!r}")
    if task is None:
        return Refusal(f"{name!r} is not a Tasks framework task here")
    try:
        backend = task_backends[alias]
    # An unknown alias, or a backend whose construction fails for any reason.
    except Exception as exc:  # noqa: BLE001
        return Refusal(f"no Tasks backend {alias!r}: {exc}")
    if not isinstance(backend, RedisTaskBackend):
        return Refusal(f"backend {backend.alias!r} is not RedisTaskBackend")
    return task, backend


def _arguments(
    job: Job, message: dict[str, Any], task: Task
) -> tuple[list[Any], dict[str, Any], TaskResult] | Refusal:
    """The arguments ``task`` is called with (its context first, when it takes one), checked
    against its signature, and its result as enqueued, which its signals carry."""
    args, kwargs = message.get("args", []), message.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        return Refusal("args must be a JSON list and kwargs a JSON object", anywhere=True)
    record = job.record_of(message)
    assert record is not None  # its body is the message read above
    try:
        result = result_from_record(task, record)
    except Exception as exc:  # noqa: BLE001 - e.g. a queue this release's TASKS lacks
        return Refusal(f"its result does not validate here: {exc!r}")
    if task.takes_context:
        args = [TaskContext(task_result=result), *args]
    problem = argument_problem(_signature(task.func), args, kwargs)
    if problem is not None:
        return Refusal(f"the task does not accept these arguments: {problem}", anywhere=True)
    return args, kwargs, result


class FrameworkFollowUp:
    """A Tasks framework task that follows another (``TASK_OPTIONS``' ``on_success`` and
    ``on_failure``), queued on its own ``RedisTaskBackend`` with the first one's id."""

    def __init__(self, task: Task) -> None:
        self.task = task

    def queued_in_step(self, task_id: str) -> QueuedInStep:
        backend = self.task.get_backend()
        if not isinstance(backend, RedisTaskBackend):
            raise TypeError(f"{self.task.module_path} is not on a RedisTaskBackend")
        run = backend.enqueue_request(self.task, [task_id], {})
        return queue_now_in_step(run, near=group_of_task_id(task_id))

    def delay(self, task_id: str) -> str:
        return self.task.enqueue(task_id).id


def follow_up_of(task_path: str, succeeded: bool) -> FollowUp | Exception | None:
    """The follow-up ``TASK_OPTIONS`` names for the framework task at ``task_path`` (a
    ``@task``'s name, or a framework task's dotted path on a ``RedisTaskBackend``), None,
    or why it cannot be found here (a LookupError when it names neither, what importing it
    raised): ``FollowUps`` raises that when the run ends."""
    path = follow_up_path(options_of(task_path), succeeded)
    if path is None:
        return None
    registered = get_task(path)
    if registered is not None:
        return registered
    try:
        found = framework_task(path)
    except Exception as exc:  # noqa: BLE001 - e.g. a module this release lacks
        return exc
    if found is None or not isinstance(found.get_backend(), RedisTaskBackend):
        return LookupError(
            f"its follow-up {path!r} is neither a registered @task nor a Tasks framework "
            "task of a RedisTaskBackend"
        )
    return FrameworkFollowUp(found)


def _finished(result: TaskResult, outcome: Outcome) -> TaskResult:
    """The final ``TaskResult`` of a run that ended with ``outcome`` (``Kind.ACK`` or
    ``Kind.DEAD``)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    if outcome.kind is Kind.ACK:
        status, errors = TaskResultStatus.SUCCESSFUL, result.errors
    else:
        error = TaskError(exception_class_path=outcome.error_class, traceback=outcome.error)
        status, errors = TaskResultStatus.FAILED, [*result.errors, error]
    # django-stubs types TaskResultStatus's members oddly (see _enqueued).
    finished = dataclasses.replace(
        result,
        status=status,  # type: ignore[arg-type]
        finished_at=now,
        errors=errors,
    )
    value = json.loads(outcome.value_json) if outcome.kind is Kind.ACK else None
    return with_return_value(finished, value)


@functools.lru_cache(maxsize=1024)
def _signature(function: Any) -> inspect.Signature:
    """A framework task function's signature, read once (``inspect.signature`` costs more
    than running a small task)."""
    return inspect.signature(function)


def _send_finished(sender: type, result: TaskResult, outcome: Outcome) -> None:
    """Send ``task_finished`` with the final result of a run that ended with ``outcome``."""
    finished = _finished(result, outcome)
    if outcome.exception is None:
        _send_robust(task_finished, "task_finished", sender, finished)
        return
    # Sent while the task's exception is being handled, as Django's own backends do: the
    # framework's receiver logs it with logger.exception, so the worker's line for the run
    # does not log its traceback a second time.
    try:
        raise outcome.exception
    except BaseException:  # noqa: BLE001 - handled: it failed the task
        _send_robust(task_finished, "task_finished", sender, finished)
    outcome.traceback_logged = True


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
