"""``RedisTask``: the Tasks framework's ``Task`` of a ``RedisTaskBackend``, which takes our
own per-task options on Django's decorator, next to the function::

    from django.tasks import task

    @task(timeout=600, unique_for=300, max_retries=3)
    def export(report_id): ...

Django 6.1 (and the django-tasks backport on Django 5.2) hands the decorator's extra keyword
arguments to the backend's ``task_class``; Django 6.0 does not, and a task there takes its
options from ``RCOORD["TASK_OPTIONS"]`` only. An option is checked when the task is defined:
a misspelt one is a ``TypeError`` naming the known ones, a bad value a ``ValueError``.

``options_of(path)`` is what a task runs with: its decorator's options, with
``RCOORD["TASK_OPTIONS"][path]`` over them (settings win; check rcoord.W005 says where a
task has both).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

from django.utils.module_loading import import_string

from django_rcoord.conf import conf
from django_rcoord.queues.framework import Task
from django_rcoord.queues.task_options import OPTIONS, option_problems

#: Django's own fields of a Task (those its decorator and ``using()`` pass).
_TASK_FIELDS = frozenset(field.name for field in dataclasses.fields(Task))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True, init=False)
class RedisTask(Task):
    """A Tasks framework task with the options our ``@task`` takes (``timeout``,
    ``unique_for``, ``max_retries``...), as sorted (name, value) pairs."""

    options: tuple[tuple[str, Any], ...] = ()

    def __init__(self, **kwargs: Any) -> None:
        given = dict(kwargs.pop("options", ()))
        for name in [name for name in kwargs if name not in _TASK_FIELDS]:
            if name not in OPTIONS:
                raise TypeError(
                    f"{name!r} is not an option of a RedisTaskBackend task "
                    f"(known: {', '.join(sorted(OPTIONS))})"
                )
            given[name] = kwargs.pop(name)
        for option, problem in option_problems(given):
            raise ValueError(
                f"task option {option}={given[option]!r}: {problem}"
                if option
                else f"@task {problem}"
            )
        for field in dataclasses.fields(self):
            if field.name == "options":
                value: Any = tuple(sorted(given.items()))
            elif field.name in kwargs:
                value = kwargs.pop(field.name)
            elif field.default is not dataclasses.MISSING:
                value = field.default
            else:
                raise TypeError(f"RedisTask needs {field.name!r}")
            object.__setattr__(self, field.name, value)
        if kwargs:
            raise TypeError(f"unexpected arguments {sorted(kwargs)}")
        self.__post_init__()


@functools.lru_cache(maxsize=1024)
def declared_options(task_path: str) -> tuple[tuple[str, Any], ...]:
    """The options the decorator of the framework task at ``task_path`` gave (none for a
    task that is not a ``RedisTask``, or not found)."""
    try:
        found = import_string(task_path)
    except ImportError:
        return ()
    return found.options if isinstance(found, RedisTask) else ()


def options_of(task_path: str) -> Mapping[str, Any]:
    """The options the task at ``task_path`` runs with: its decorator's, with
    ``RCOORD["TASK_OPTIONS"][task_path]`` over them."""
    configured = conf.TASK_OPTIONS.get(task_path) or {}
    declared = declared_options(task_path)
    return {**dict(declared), **configured} if declared else configured
