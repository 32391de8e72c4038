"""Which queues a worker watches when it is not told, and which it leaves waiting."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Collection, Sequence
from typing import Any

from django_rcoord.conf import conf
from django_rcoord.connection import slot_pipeline
from django_rcoord.connection.clients import resolve_client
from django_rcoord.connection.errors import REDIS_ERRORS
from django_rcoord.queues.keys import GroupKeys, QueueKeys
from django_rcoord.queues.records import known_groups, known_queues, queue_stats
from django_rcoord.queues.registry import autodiscover_tasks, registered_tasks

logger = logging.getLogger(__name__)


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


def waiting_elsewhere(watched: Collection[str], *, client: Any = None) -> dict[str, int]:
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


def watched_by_live_workers(*, client: Any = None) -> set[str]:
    """The queues some live worker watches, from the heartbeats of every known group's
    workers (one read of the group's worker set, one pipeline of their heartbeats)."""
    client = resolve_client(client)
    watched: set[str] = set()
    for group in known_groups(client=client):
        keys = GroupKeys.of(group)
        members = sorted(client.smembers(keys.workers))
        if not members:
            continue
        with slot_pipeline(client, keys.workers, transaction=False) as pipe:
            for member in members:
                pipe.get(keys.heartbeat(member.decode()))
            beats = pipe.execute()
        for beat in beats:
            if beat is not None:  # else it died without signing off
                watched.update(json.loads(beat).get("queues", []))
    return watched


class IdleWarning:
    """Says, while worker ``worker_id`` runs, that it serves nothing: once it took no task
    from ``queues`` for ``RCOORD["WORKER_IDLE_WARNING"]`` seconds while queues that no live
    worker watches hold tasks (at most once each that many seconds), it names them and the
    flag that serves them. (The worker command says the same once at its start.)"""

    def __init__(self, worker_id: str, queues: Sequence[str], *, client: Any = None) -> None:
        self.worker_id = worker_id
        self.queues = list(queues)
        interval = conf.WORKER_IDLE_WARNING
        self.interval = None if interval is None else float(interval)
        self._client = client
        self._idle_since = time.monotonic()

    def took(self) -> None:
        """The worker took a task: it serves something."""
        self._idle_since = time.monotonic()

    def idle(self) -> None:
        """The worker found no task: warn when it has found none for an interval."""
        now = time.monotonic()
        if self.interval is None or now - self._idle_since < self.interval:
            return
        self._idle_since = now  # the next look, one interval on
        try:
            watched = watched_by_live_workers(client=self._client)
            waiting = waiting_elsewhere(watched, client=self._client)
        except REDIS_ERRORS:
            return  # the worker's loop meets and reports the same error
        if waiting:
            logger.warning(
                "worker %s serves nothing: no task in %s for %g s, while tasks wait in queues "
                "no worker watches: %s (serve them with %s)",
                self.worker_id,
                ", ".join(self.queues),
                self.interval,
                ", ".join(f"{name} ({count})" for name, count in sorted(waiting.items())),
                serving_flags(waiting),
            )


def serving_flags(queues: Collection[str]) -> str:
    """The ``--queues`` flag of a worker that serves ``queues``: one per queue group (a
    worker serves one group)."""
    by_group: dict[str, list[str]] = {}
    for name in sorted(queues):
        by_group.setdefault(QueueKeys.of(name).group, []).append(name)
    flags = [f"--queues {' '.join(names)}" for names in by_group.values()]
    return flags[0] if len(flags) == 1 else f"a worker per group: {'; '.join(flags)}"
