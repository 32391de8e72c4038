"""The registry of the project's own tasks: ``@task`` and the worker's look-up by name."""

from __future__ import annotations

import datetime
import importlib
import importlib.util
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from django.apps import apps
from django.db import transaction

from django_rcoord.connection.clients import resolve_client
from django_rcoord.queues.arguments import argument_problem
from django_rcoord.queues.declared import Declared, remember
from django_rcoord.queues.fair import FairKey, FairKeySource, make_fair_key
from django_rcoord.queues.keys import check_queue_name, group_of_task_id
from django_rcoord.queues.messages import check_priority, encode_message
from django_rcoord.queues.options import RunOptions
from django_rcoord.queues.producer import (
    Enqueue,
    QueuedInStep,
    asend_message,
    due_time,
    queue_now_in_step,
    send_message,
)
from django_rcoord.queues.runs import TaskRun
from django_rcoord.queues.unique import Uniqueness, make_uniqueness


class PermanentFailure(Exception):
    """Raise from a task to send it to the dead letters at once, without retries."""


_registry: dict[str, Task] = {}
#: django-rcoord's own tasks that run on the queue they are queued on (``internal_task``).
_internal: dict[str, Task] = {}


class Task:
    """A registered task: call it to run it here, ``delay()`` to queue it."""

    def __init__(
        self,
        function: Callable[..., Any],
        name: str | None,
        queue: str,
        max_retries: int,
        priority: int = 0,
        options: RunOptions | None = None,
        on_success: Task | str | None = None,
        on_failure: Task | str | None = None,
        unique: Uniqueness | None = None,
        fair: FairKey | None = None,
    ) -> None:
        self.function = function
        #: By default, the function's dotted path.
        self.name = name or f"{function.__module__}.{function.__qualname__}"
        self.queue = queue
        self.priority = priority
        #: How the worker runs it: retries, their waits, its time limit.
        self.options = options or RunOptions(max_retries=max_retries)
        #: Tasks queued with this task's id when it succeeds, or fails for good.
        self.on_success = on_success
        self.on_failure = on_failure
        #: While a run with the same arguments (or key) is ready, delayed or running, for
        #: at most its seconds, queueing another returns that run's id (see ``unique``).
        self.unique = unique
        #: Its runs' fair key (see ``fair``): served round-robin across keys in its queue.
        self.fair = fair
        self.signature = inspect.signature(function)
        # How many positional arguments a call needs when that is all there is to check
        # (only plain parameters, none optional): such a call skips Signature.bind.
        parameters = self.signature.parameters.values()
        plain = all(
            parameter.kind is parameter.POSITIONAL_OR_KEYWORD
            and parameter.default is parameter.empty
            for parameter in parameters
        )
        self._arity = len(self.signature.parameters) if plain else -1
        self.__doc__ = function.__doc__
        self.__wrapped__ = function

    @property
    def max_retries(self) -> int:
        return self.options.max_retries

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.function(*args, **kwargs)

    def check_arguments(self, args: Any, kwargs: Any) -> None:
        """TypeError now for arguments the function does not accept (rather than a dead
        letter later)."""
        if not kwargs and len(args) == self._arity:
            return
        problem = argument_problem(self.signature, args, kwargs)
        if problem is not None:
            raise TypeError(f"task {self.name!r} does not accept these arguments: {problem}")

    def enqueue_request(
        self, args: Sequence[Any], kwargs: dict[str, Any], when: tuple[int, int] = (0, 0)
    ) -> Enqueue:
        """A run of this task with these arguments (checked now), for the producer."""
        self.check_arguments(args, kwargs)
        return Enqueue(self.name, self.queue, args, kwargs, when, None, self.priority, self.unique)

    def s(self, *args: Any, **kwargs: Any) -> TaskRun:
        """A run of this task with these arguments, not queued: a child or the callback of a
        fan-in (``django_rcoord.queues.fan_in.group``), which checks them (a callback's
        with its results first)."""
        return TaskRun(self, args, kwargs)

    def delay(self, *args: Any, **kwargs: Any) -> str:
        """Queue a run with these arguments; returns the task id (one round trip). A unique
        task already queued, delayed or running returns that run's id, queueing nothing."""
        return send_message(resolve_client(None), self.enqueue_request(args, kwargs)).task_id

    def schedule(
        self,
        *args: Any,
        delay: float | datetime.timedelta | None = None,
        eta: datetime.datetime | None = None,
        **kwargs: Any,
    ) -> str:
        """Queue a run ``delay`` seconds from now or at ``eta`` (by the Redis server's clock)."""
        run = self.enqueue_request(args, kwargs, due_time(delay, eta))
        return send_message(resolve_client(None), run).task_id

    async def adelay(self, *args: Any, **kwargs: Any) -> str:
        """``delay`` for async code (redis.asyncio, one round trip)."""
        return (await asend_message(None, self.enqueue_request(args, kwargs))).task_id

    async def aschedule(
        self,
        *args: Any,
        delay: float | datetime.timedelta | None = None,
        eta: datetime.datetime | None = None,
        **kwargs: Any,
    ) -> str:
        """``schedule`` for async code (redis.asyncio, one round trip)."""
        run = self.enqueue_request(args, kwargs, due_time(delay, eta))
        return (await asend_message(None, run)).task_id

    def follow_up_task(self, succeeded: bool) -> Task | LookupError | None:
        """The task that follows a run that succeeded (``on_success``) or failed for good
        (``on_failure``), None when there is none, or a LookupError when it names a task
        that is not registered (the worker raises it when the run ends)."""
        follow_up = self.on_success if succeeded else self.on_failure
        if follow_up is None:
            return None
        found = get_task(follow_up) if isinstance(follow_up, str) else follow_up
        if found is None:
            return LookupError(f"its follow-up {follow_up!r} is not a registered task")
        return found

    def queued_in_step(self, task_id: str) -> QueuedInStep:
        """This task as the follow-up of task ``task_id`` (its one argument), for the script
        that records that task's end to queue in the same step
        (``producer.queue_now_in_step``; on ``task_id``'s shard, when that is one of this
        task's queue)."""
        run = self.enqueue_request((task_id,), {})
        return queue_now_in_step(run, near=group_of_task_id(task_id))

    def delay_on_commit(self, *args: Any, using: str | None = None, **kwargs: Any) -> None:
        """Queue the run when the current database transaction commits (at once outside one)."""

        self.check_arguments(args, kwargs)
        encode_message(self.name, self.queue, args, kwargs)  # a bad argument fails here, now
        if self.unique is not None:
            self.unique.claim(self.name, args, kwargs)  # so does a unique_key that raises
        if self.fair is not None:
            self.fair.message_fields(self.name, args, kwargs)  # and a fair_key
        transaction.on_commit(lambda: self.delay(*args, **kwargs), using=using)

    def __repr__(self) -> str:
        return (
            f"<Task {self.name} queue={self.queue!r} max_retries={self.max_retries} "
            f"priority={self.priority}"
            + (f" unique_for={self.unique.seconds:g}" if self.unique else "")
            + ">"
        )


def task(
    name: str | None = None,
    *,
    queue: str = "default",
    max_retries: int = 3,
    priority: int = 0,
    timeout: float | None = None,
    retry_backoff: float | None = None,
    retry_backoff_max: float | None = None,
    retry_jitter: float | None = None,
    rate: str | None = None,
    concurrency: int | None = None,
    limit_key: str | None = None,
    on_success: Task | str | None = None,
    on_failure: Task | str | None = None,
    unique_for: float | None = None,
    unique_key: Callable[..., str] | None = None,
    fair_key: FairKeySource | None = None,
    max_running_per_key: int | None = None,
    rate_per_key: str | None = None,
) -> Callable[[Callable[..., Any]], Task]:
    """Register a function as a task: call it to run it here, ``delay()`` to queue it on
    ``queue``, where a higher ``priority`` (-100..100) runs first (equal ones in the order
    they were queued). ``max_retries`` to ``limit_key`` say how workers run it
    (``RunOptions`` tells each; None: its ``RCOORD`` setting).
    ``on_success`` and ``on_failure`` (a task, or a task's name) are queued with the
    task's id when it succeeds, or fails for good (no retries left). ``unique_for``
    (seconds): while a run with the same arguments (or the same ``unique_key(*args,
    **kwargs)``, a str) is ready, delayed or running, for at most that long, queueing the
    task again returns that run's id and queues nothing. ``fair_key`` (a str, or a function
    of the arguments returning one or None): runs served round-robin across keys, at most
    ``max_running_per_key`` of a key at once and ``rate_per_key`` starts of a key
    (``"10/m"``) across every worker (see ``django_rcoord.queues.fair``)."""
    if callable(name):
        raise TypeError("use @task() or @task(name=...), with parentheses")
    # Each value is checked now, at import time: a ValueError or TypeError for a bad one.
    options = RunOptions(
        max_retries=max_retries,
        timeout=timeout,
        retry_backoff=retry_backoff,
        retry_backoff_max=retry_backoff_max,
        retry_jitter=retry_jitter,
        rate=rate,
        concurrency=concurrency,
        limit_key=limit_key,
        rate_per_key=rate_per_key,
    )
    unique = make_uniqueness(unique_for, unique_key)
    fair = make_fair_key(fair_key, max_running_per_key, rate_per_key)
    return _registering(name, queue, priority, options, (on_success, on_failure), unique, fair)


def _registering(
    name: str | None,
    queue: str,
    priority: int,
    options: RunOptions,
    follow_ups: tuple[Task | str | None, Task | str | None],
    unique: Uniqueness | None,
    fair: FairKey | None = None,
) -> Callable[[Callable[..., Any]], Task]:
    """The decorator ``@task`` returns, once it checked where the task is queued and what
    follows it (a follow-up named is looked up when it is queued: it may be registered
    later). It registers each function it decorates as a ``Task``."""
    check_queue_name(queue)
    check_priority(priority)
    if any(each is not None and not isinstance(each, (Task, str)) for each in follow_ups):
        raise TypeError("on_success and on_failure take a task or a task's name")

    def register(function: Callable[..., Any]) -> Task:
        retries = options.max_retries
        made = Task(function, name, queue, retries, priority, options, *follow_ups, unique, fair)
        return _register(made)

    return register


def _register(made: Task) -> Task:
    """Add ``made`` to the registry under its name. ValueError when another function
    already has the name (a module imported twice registers the same function again:
    that is no clash)."""
    existing = _registry.get(made.name)
    if existing is not None and existing.function is not made.function:
        function = made.function
        if (existing.function.__module__, existing.function.__qualname__) != (
            function.__module__,
            function.__qualname__,
        ):
            raise ValueError(f"two tasks are named {made.name!r}")
    _registry[made.name] = made
    remember(made.name, Declared(made.unique, made.fair))
    return made


def internal_task(name: str, *, max_retries: int) -> Callable[[Callable[..., Any]], Task]:
    """``@task`` for a task of django-rcoord's own that runs on whichever queue it is queued
    on (a fan-in's count, on its child's queue): workers find it by name, and it is left
    out of ``registered_tasks`` (it has no queue of its own to watch or to show)."""

    def register(function: Callable[..., Any]) -> Task:
        made = Task(function, name, "default", max_retries)
        _internal[name] = made
        return made

    return register


def registered_tasks() -> list[Task]:
    """Every task registered so far, in the order they were."""
    return list(_registry.values())


def get_task(name: str) -> Task | None:
    return _registry.get(name) or _internal.get(name)


def tasks_modules() -> list[str]:
    """The names of the installed apps' ``tasks`` modules, in INSTALLED_APPS order."""
    names = (f"{config.name}.tasks" for config in apps.get_app_configs())
    return [name for name in names if importlib.util.find_spec(name) is not None]


def autodiscover_tasks() -> None:
    """Import the ``tasks`` module of every installed app (as a worker does at start; the
    system check rcoord.E036 imports the same modules)."""
    for module_name in tasks_modules():
        importlib.import_module(module_name)
