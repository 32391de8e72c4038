"""Django's Tasks framework, wherever it comes from: the one import shim.

Django 6.0 and newer ship it as ``django.tasks``; on Django 5.2 the
``django-tasks`` backport (``pip install "django-rcoord[tasks]"``) provides the
same API as ``django_tasks``. Everything django-rcoord uses of it is imported
here, and only here.
"""

from __future__ import annotations

import django

#: Django 6.0 and newer have the framework built in. The type check reads one branch, the
#: one its Django runs: nox's mypy sessions pass ``--always-true BUILTIN_TASKS`` on Django
#: 6 and ``--always-false BUILTIN_TASKS`` on 5.2 with the backport.
BUILTIN_TASKS = django.VERSION >= (6, 0)

if BUILTIN_TASKS:
    from django.tasks import TaskContext, TaskResult, TaskResultStatus, task, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskError
    from django.tasks.exceptions import InvalidTask as InvalidTaskError
    from django.tasks.exceptions import TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started

    SOURCE = "django.tasks"
else:  # Django 5.2 with the backport
    from django_tasks import TaskContext, TaskResult, TaskResultStatus, task, task_backends
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskError
    from django_tasks.exceptions import InvalidTaskError, TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started

    SOURCE = "django_tasks"


#: Whether the framework's ``task`` decorator hands its extra keyword arguments to the
#: backend's ``task_class`` (Django 6.1 and newer, and the django-tasks backport; not
#: Django 6.0): our per-task options on Django's decorator (``task_class.RedisTask``).
DECORATOR_OPTIONS = django.VERSION >= (6, 1) or not BUILTIN_TASKS


def register_checks() -> None:
    """Register the framework's own system check (each backend's ``check()``), as importing
    its package does on Django 6 and its app's ``ready()`` does with the backport."""
    if BUILTIN_TASKS:
        import django.tasks.checks  # noqa: F401
    else:
        import django_tasks.checks  # noqa: F401


__all__ = [
    "DECORATOR_OPTIONS",
    "SOURCE",
    "BaseTaskBackend",
    "InvalidTaskError",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "register_checks",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
