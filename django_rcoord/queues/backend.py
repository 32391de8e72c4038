"""A backend for Django's Tasks framework on django-rcoord's queues.

    TASKS = {
        "default": {
            "BACKEND": "django_rcoord.task_backend.RedisTaskBackend",
            "QUEUES": ["default", "email"],
            "OPTIONS": {"MAX_RETRIES": 0},
        }
    }

Framework tasks share everything with the project's own ``@task``: messages,
queues (a ``queue_name`` is a django-rcoord queue name, ``group/queue``
allowed), leases, the delayed set, retries, dead letters, result records and
``manage.py run_email_worker``. ``enqueue`` is one round trip; ``aenqueue`` and
``aget_result`` are native async.
"""

from __future__ import annotations

import datetime
import inspect
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from django.core import checks
from django.utils.module_loading import import_string

from django_rcoord.connection.clients import resolve_client
from django_rcoord.exceptions import InvalidName, TaskCancelled
from django_rcoord.queues.arguments import argument_problem
from django_rcoord.queues.framework import (
    BaseTaskBackend,
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_enqueued,
)
from django_rcoord.queues.keys import split_queue_name
from django_rcoord.queues.options import RunOptions
from django_rcoord.queues.producer import (
    Enqueue,
    Enqueued,
    asend_message,
    due_time,
    send_message,
)
from django_rcoord.queues.results import CANCELLED, FAILED, TaskRecord, aget_result, get_result
from django_rcoord.queues.task_class import RedisTask, options_of
from django_rcoord.queues.task_options import run_options_of, uniqueness_of
from django_rcoord.validation import is_number

logger = logging.getLogger(__name__)

OPTION_KEYS = {"MAX_RETRIES"}


class RedisTaskBackend(BaseTaskBackend):
    #: Django's Task, with our per-task options on its decorator (``task_class``).
    task_class = RedisTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    @property
    def max_retries(self) -> int:
        """Retries after a failed first attempt (OPTIONS["MAX_RETRIES"], default 0: the
        framework's tasks fail at once)."""
        return int(self.options.get("MAX_RETRIES", 0))

    def run_options(self, task: Task) -> RunOptions:
        """How the worker runs ``task``: what its decorator and ``RCOORD["TASK_OPTIONS"]`` set
        for it, this backend's retries otherwise, the settings for the rest."""
        return run_options_of(options_of(task.module_path), self.max_retries)

    # -- producing ---------------------------------------------------------------
    def enqueue_request(self, task: Task, args: Any, kwargs: Any) -> Enqueue:
        """The producer's request for a run of ``task`` (validated), as
        ``Task.enqueue_request`` makes them; its uniqueness from the task's options."""
        self.validate_task(task)
        # run_after is read on the Redis server's clock, like every due time.
        when = due_time(None, task.run_after) if task.run_after is not None else (0, 0)
        extra = {"backend": self.alias}
        unique = uniqueness_of(options_of(task.module_path))
        return Enqueue(
            task.module_path, task.queue_name, args, kwargs, when, extra, task.priority, unique
        )

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        enqueued = send_message(resolve_client(None), self.enqueue_request(task, args, kwargs))
        return self._enqueued(task, enqueued, args, kwargs)

    async def aenqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        enqueued = await asend_message(None, self.enqueue_request(task, args, kwargs))
        return self._enqueued(task, enqueued, args, kwargs)

    def _enqueued(self, task: Task, enqueued: Enqueued, args: Any, kwargs: Any) -> TaskResult:
        """The result ``enqueue`` returns. For a unique task already queued, delayed or
        running, it carries that run's id (READY here: ``refresh()`` reads its status) and
        ``task_enqueued`` is not sent: nothing was queued."""
        task_id = enqueued.task_id
        result: TaskResult = TaskResult(
            task=task,
            id=task_id,
            # django-stubs types the members of TaskResultStatus as EllipsisType (its stub
            # declares them `READY = ...`); at run time this is TaskResultStatus.READY.
            status=TaskResultStatus.READY,  # type: ignore[arg-type]
            enqueued_at=datetime.datetime.now(datetime.timezone.utc),
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=list(args),
            kwargs=dict(kwargs),
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        if enqueued.queued:
            task_enqueued.send(type(self), task_result=result)
        return result

    # -- results -----------------------------------------------------------------
    def get_result(self, result_id: str) -> TaskResult:
        return self._result(result_id, get_result(result_id))

    async def aget_result(self, result_id: str) -> TaskResult:
        return self._result(result_id, await aget_result(result_id))

    def _result(self, result_id: str, record: TaskRecord | None) -> TaskResult:
        task = framework_task(record.task) if record is not None else None
        if record is None or task is None or record.backend != self.alias:
            raise TaskResultDoesNotExist(result_id)
        return result_from_record(task, record)

    # -- checks ------------------------------------------------------------------
    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        # A list, as the base class returns (and django-stubs declares).
        return [*super().check(**kwargs), *self._option_messages()]

    def _option_messages(self) -> Iterator[checks.CheckMessage]:
        where = f"TASKS[{self.alias!r}]"
        unknown = sorted(set(self.options) - OPTION_KEYS)
        if unknown:
            yield checks.Error(
                f"{where}['OPTIONS'] has unknown keys {unknown}.",
                hint=f"Known: {', '.join(sorted(OPTION_KEYS))}.",
                id="rcoord.E018",
            )
        retries = self.options.get("MAX_RETRIES", 0)
        if not is_number(retries) or retries < 0 or int(retries) != retries:
            yield checks.Error(
                f"{where}['OPTIONS']['MAX_RETRIES'] must be an int of 0 or more, not {retries!r}.",
                hint="0 (the default) fails a task at its first error, as Django's own "
                "backends do.",
                id="rcoord.E018",
            )
        groups = set()
        for name in sorted(self.queues):
            try:
                groups.add(split_queue_name(name)[0])
            except InvalidName as exc:
                yield checks.Error(
                    f"{where}['QUEUES'] has {name!r}, which is not a queue name: {exc}.",
                    hint="A queue name is 'queue' or 'group/queue'.",
                    id="rcoord.E019",
                )
        if len(groups) > 1:
            yield checks.Warning(
                f"{where}['QUEUES'] spans the queue groups {sorted(groups)}: one worker "
                "serves queues of one group only.",
                hint="Run a worker per group (run_email_worker --queues group/a group/b), "
                "or keep the queues in one group.",
                id="rcoord.W003",
            )


def framework_request(task: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Enqueue:
    """The producer's request for a run of framework task ``task`` on its
    ``RedisTaskBackend`` (a fan-in's child or callback): TypeError when it is no such task
    or its function does not take these arguments."""
    backend = task.get_backend() if isinstance(task, Task) else None
    if not isinstance(backend, RedisTaskBackend):
        raise TypeError(
            f"{task!r} is neither a @task nor a Tasks framework task of a RedisTaskBackend"
        )
    given = [None, *args] if task.takes_context else list(args)  # its context comes first
    problem = argument_problem(inspect.signature(task.func), given, kwargs)
    if problem is not None:
        raise TypeError(f"task {task.module_path!r} does not accept these arguments: {problem}")
    return backend.enqueue_request(task, list(args), kwargs)


def framework_task(path: str | None) -> Task | None:
    """The framework ``Task`` at dotted ``path`` (a task's ``module_path``), or None."""
    if not path:
        return None
    found = _found_tasks.get(path)
    if found is None:
        try:
            found = import_string(path)
        except ImportError:
            return None  # perhaps not yet: a rolling deploy's newer task is looked up again
        if not isinstance(found, Task):
            return None
        _found_tasks[path] = found
    return found


#: Tasks found by path: a task is a module's attribute, there for the process's life, and
#: a page polling a result looks its task up per poll.
_found_tasks: dict[str, Task] = {}


def result_from_record(task: Task, record: TaskRecord) -> TaskResult:
    """The framework's ``TaskResult`` of a django-rcoord result record. The framework has
    no cancelled status: a CANCELLED record reads FAILED, its last error a
    ``django_rcoord.exceptions.TaskCancelled``."""
    if (task.queue_name, task.priority) != (record.queue, record.priority):
        task = task.using(queue_name=record.queue, priority=record.priority)
    errors = record.errors
    status = record.status
    if status == CANCELLED:
        status = FAILED
        errors = [*errors, _CANCELLED_ERROR]
    result: TaskResult = TaskResult(
        task=task,
        id=record.id,
        status=_STATUSES.get(status) or TaskResultStatus(status),
        enqueued_at=record.enqueued_at,
        started_at=record.started_at,
        finished_at=record.finished_at,
        last_attempted_at=record.last_attempted_at,
        args=record.args,
        kwargs=record.kwargs,
        backend=record.backend or "default",
        errors=[
            TaskError(
                exception_class_path=error.get("exception_class_path", ""),
                traceback=error.get("traceback", ""),
            )
            for error in errors
        ],
        worker_ids=list(record.worker_ids),
    )
    return with_return_value(result, record.return_value)


#: A record's status as the framework's: a look-up costs less than the enum's call (which
#: raises for a status it does not know).
_STATUSES = {status.value: status for status in TaskResultStatus.__members__.values()}
#: The last error of a CANCELLED record, which the framework reads as FAILED.
_CANCELLED_ERROR = {
    "exception_class_path": f"{TaskCancelled.__module__}.{TaskCancelled.__qualname__}",
    "traceback": "cancelled by django_rcoord.queues.cancel() before it ran",
}


def with_return_value(result: TaskResult, value: Any) -> TaskResult:
    """``result`` carrying ``value`` as its return value. ``TaskResult`` is frozen and its
    return value is not an ``__init__`` field: the framework's own backends set it the same
    way, and this is the one place django-rcoord does."""
    object.__setattr__(result, "_return_value", value)
    return result
