"""Which queues a worker watches when it is not told, and which it leaves waiting."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django_rcoord.conf import conf
from django_rcoord.queues.keys import QueueKeys
from django_rcoord.queues.records import known_groups, known_queues, queue_stats
from django_rcoord.queues.registry import autodiscover_tasks, registered_tasks


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
