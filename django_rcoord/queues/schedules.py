"""The schedules of ``RCOORD["PERIODIC_TASKS"]``: reading and checking the setting, the
ticks of a schedule (``cron`` in ``settings.TIME_ZONE``, ``every`` at whole multiples of
itself since the epoch), and the task each one names.

Firing the ticks, once whoever polls, is ``periodic``'s.
"""

from __future__ import annotations

import datetime
import json
import math
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cronsim import CronSim, CronSimError
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from django_rcoord.conf import conf
from django_rcoord.queues.registry import autodiscover_tasks, get_task
from django_rcoord.queues.task_class import options_of
from django_rcoord.queues.task_options import uniqueness_of
from django_rcoord.queues.unique import Uniqueness
from django_rcoord.validation import named_dicts

KEYS = {"name", "task", "cron", "every", "args", "kwargs", "catch_up"}
CATCH_UP = ("skip", "once")


@dataclass(frozen=True)
class Schedule:
    """One entry of ``RCOORD["PERIODIC_TASKS"]``, checked."""

    name: str
    task: str
    cron: str | None = None
    every: float | None = None
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    catch_up: str = "skip"

    def latest_tick(self, now_ms: int) -> int:
        """The latest tick at or before ``now_ms`` (ms since the epoch)."""
        if self.every is not None:
            period = round(self.every * 1000)
            return now_ms // period * period
        # A reverse walk yields the ticks before its start, and cronsim drops what is finer
        # than its cron's resolution from the start (2.6 and 2.7, the last for Python 3.10):
        # start one step of that resolution (a second for a six-field cron, else a minute)
        # after the step that holds ``now_ms``.
        step = 1000 if self.cron is not None and len(self.cron.split()) > 5 else 60_000
        moment = local_datetime(now_ms - now_ms % step + step)
        return _ms(next(self._cron_ticks(moment, reverse=True)))

    def next_tick(self, after_ms: int) -> int:
        """The first tick after ``after_ms``."""
        if self.every is not None:
            period = round(self.every * 1000)
            return (after_ms // period + 1) * period
        return _ms(next(self._cron_ticks(local_datetime(after_ms))))

    def _cron_ticks(self, start: datetime.datetime, *, reverse: bool = False) -> CronSim:
        if self.cron is None:  # schedules() refuses such an entry (rcoord.E024)
            raise ImproperlyConfigured(f"periodic task {self.name!r} has neither cron nor every")
        return CronSim(self.cron, start, reverse=reverse)


def local_datetime(ms: int) -> datetime.datetime:
    """The moment ``ms`` (ms since the epoch) in ``settings.TIME_ZONE``, where cron is read."""
    zone = zoneinfo.ZoneInfo(settings.TIME_ZONE or "UTC")
    return datetime.datetime.fromtimestamp(ms / 1000, tz=zone)


def _ms(moment: datetime.datetime) -> int:
    return math.floor(moment.timestamp() * 1000)


# -- reading the settings ---------------------------------------------------------------
def problems(raw: object) -> list[tuple[str, str]]:
    """What is wrong with a PERIODIC_TASKS value, as (check id, message) pairs.

    ``rcoord.E023`` for the shape (a list of dicts with known keys, a unique ``name``, a
    ``task``, JSON ``args`` / ``kwargs``, ``catch_up``), ``rcoord.E024`` for the timing
    (exactly one of ``cron`` and ``every``, a valid cron, ``every`` of 1 s or more).
    Whether ``task`` names a task is checked by ``unknown_tasks`` (it imports them).
    """
    entries, found = named_dicts(raw, KEYS, "rcoord.E023")
    for where, entry, _ in entries:
        if not isinstance(entry.get("task"), str) or not entry.get("task"):
            found.append(("rcoord.E023", f"{where} needs a 'task' (a task name or dotted path)"))
        args, kwargs = entry.get("args", []), entry.get("kwargs", {})
        if not isinstance(args, (list, tuple)) or not isinstance(kwargs, Mapping):
            found.append(("rcoord.E023", f"{where} 'args' must be a list and 'kwargs' a dict"))
        else:
            try:
                json.dumps([list(args), dict(kwargs)])
            except (TypeError, ValueError) as exc:
                found.append(("rcoord.E023", f"{where} args and kwargs must be JSON: {exc}"))
        if entry.get("catch_up", "skip") not in CATCH_UP:
            found.append(("rcoord.E023", f"{where} 'catch_up' must be 'skip' or 'once'"))
        found.extend(("rcoord.E024", f"{where} {problem}") for problem in _timing(entry))
    return found


def _timing(entry: Mapping[str, Any]) -> list[str]:
    cron, every = entry.get("cron"), entry.get("every")
    if (cron is None) == (every is None):
        return ["needs exactly one of 'cron' and 'every'"]
    if cron is not None:
        try:
            CronSim(cron, datetime.datetime(2026, 1, 1))
        except (CronSimError, TypeError, AttributeError) as exc:
            return [f"has a bad cron string {cron!r}: {exc or 'unreadable'}"]
        return []
    if isinstance(every, bool) or not isinstance(every, (int, float)) or not every >= 1:
        return [f"'every' must be a number of seconds of at least 1, not {every!r}"]
    return []


def schedules() -> list[Schedule]:
    """The configured schedules (the system checks have reported bad ones: they raise here)."""
    raw = conf.PERIODIC_TASKS
    found = problems(raw)
    if found:
        raise ImproperlyConfigured(
            "RCOORD['PERIODIC_TASKS']: " + "; ".join(text for _, text in found)
        )
    return [
        Schedule(
            name=entry["name"],
            task=entry["task"],
            cron=entry.get("cron"),
            every=entry.get("every"),
            args=list(entry.get("args", [])),
            kwargs=dict(entry.get("kwargs", {})),
            catch_up=entry.get("catch_up", "skip"),
        )
        for entry in raw
    ]


@dataclass(frozen=True)
class Target:
    """Where a schedule's task goes: its message's task name, queue, priority and extras,
    and its uniqueness (``unique_for``: a tick finding a run of it ready, delayed or
    running queues nothing)."""

    task_name: str
    queue: str
    priority: int
    extra: dict[str, Any]
    unique: Uniqueness | None = None


def resolve_target(task: str) -> Target | None:
    """The project ``@task`` registered as ``task``, else the Tasks framework task at that
    dotted path on a ``RedisTaskBackend``; None when it is neither."""

    autodiscover_tasks()
    registered = get_task(task)
    if registered is not None:
        return Target(registered.name, registered.queue, registered.priority, {}, registered.unique)
    try:
        from django_rcoord.queues.backend import RedisTaskBackend, framework_task
    except ImportError:  # the Tasks framework is not installed
        return None

    found = framework_task(task)
    if found is None or not isinstance(found.get_backend(), RedisTaskBackend):
        return None
    return Target(
        found.module_path,
        found.queue_name,
        found.priority,
        {"backend": found.backend},
        uniqueness_of(options_of(found.module_path)),
    )


def unknown_tasks(raw: object) -> list[str]:
    """The ``task`` values of well-formed entries that name no task (rcoord.E025)."""
    if problems(raw) or not isinstance(raw, (list, tuple)):  # the check narrows the type
        return []
    return [entry["task"] for entry in raw if resolve_target(entry["task"]) is None]
