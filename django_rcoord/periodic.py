"""Periodic tasks: ``RCOORD["PERIODIC_TASKS"]``, fired by every ``poll_delayed``.

    RCOORD = {
        "PERIODIC_TASKS": [
            {"name": "digest", "task": "myapp.tasks.send_digest", "cron": "0 7 * * *"},
            {"name": "sweep", "task": "myapp.tasks.sweep", "every": 30, "catch_up": "once"},
        ],
    }

``task`` is the registered name of a project ``@task`` or the dotted path of a Tasks
framework task (on a ``RedisTaskBackend``). ``cron`` is read in ``settings.TIME_ZONE``;
``every`` (seconds, 1 or more, fractions allowed) ticks at whole multiples of itself since
the Unix epoch, so every poller computes the same ticks.

Each tick is queued **exactly once** however many pollers run: the claim of a tick and the
enqueue are one script (``periodic_fire.lua``) that checks the tick is due on the Redis
server's clock and later than the last tick claimed. A tick found more than
``MISSED_AFTER`` seconds late was missed (no poller ran): ``catch_up: "skip"`` (the
default) drops it, ``"once"`` runs the latest missed tick once. The message carries the
tick (``"periodic": {"name", "tick"}``) and goes through the queue like any task.
"""

from __future__ import annotations

import datetime
import functools
import json
import logging
import math
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cronsim import CronSim, CronSimError
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from django_rcoord.conf import conf
from django_rcoord.keys import KeySpace
from django_rcoord.messages import encode_message
from django_rcoord.producer import register_group
from django_rcoord.queue_keys import GROUP_KEYS_MS, WAKE_TOKEN_MS, QueueKeys
from django_rcoord.scripts import run_script

__all__ = [
    "LATENESS_SAMPLES",
    "MISSED_AFTER",
    "Schedule",
    "fire_due",
    "lateness_key",
    "schedule_status",
    "schedules",
]

logger = logging.getLogger(__name__)

#: A tick first seen more than this many seconds after it was due was missed (no poller
#: ran at that time): ``catch_up`` decides whether it runs.
MISSED_AFTER = 60.0

#: Lateness samples (ms, tick -> queued, server clock) kept per schedule, for rcoord_status.
LATENESS_SAMPLES = 1000

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
        moment = _at(now_ms) + datetime.timedelta(microseconds=1)
        return _ms(next(self._cron_ticks(moment, reverse=True)))

    def next_tick(self, after_ms: int) -> int:
        """The first tick after ``after_ms``."""
        if self.every is not None:
            period = round(self.every * 1000)
            return (after_ms // period + 1) * period
        return _ms(next(self._cron_ticks(_at(after_ms))))

    def _cron_ticks(self, start: datetime.datetime, *, reverse: bool = False) -> CronSim:
        if self.cron is None:  # schedules() refuses such an entry (rcoord.E024)
            raise ImproperlyConfigured(f"periodic task {self.name!r} has neither cron nor every")
        return CronSim(self.cron, start, reverse=reverse)


def _at(ms: int) -> datetime.datetime:
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
    if not isinstance(raw, (list, tuple)):
        return [("rcoord.E023", f"must be a list of dicts, not {type(raw).__name__}")]
    found: list[tuple[str, str]] = []
    names: set[str] = set()
    for index, entry in enumerate(raw):
        where = f"[{index}]"
        if not isinstance(entry, Mapping):
            found.append(("rcoord.E023", f"{where} must be a dict, not {type(entry).__name__}"))
            continue
        unknown = sorted(set(entry) - KEYS)
        if unknown:
            found.append(("rcoord.E023", f"{where} has unknown keys {unknown}"))
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            found.append(("rcoord.E023", f"{where} needs a 'name' (a non-empty str)"))
        elif name in names:
            found.append(("rcoord.E023", f"{where} repeats the name {name!r}"))
        else:
            names.add(name)
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
    """Where a schedule's task goes: its message's task name, queue, priority and extras."""

    task_name: str
    queue: str
    priority: int
    extra: dict[str, Any]


def resolve_target(task: str) -> Target | None:
    """The project ``@task`` registered as ``task``, else the Tasks framework task at that
    dotted path on a ``RedisTaskBackend``; None when it is neither."""
    from django_rcoord.registry import autodiscover_tasks, get_task

    autodiscover_tasks()
    registered = get_task(task)
    if registered is not None:
        return Target(registered.name, registered.queue, registered.priority, {})
    try:
        from django_rcoord.task_backend import RedisTaskBackend, framework_task
    except ImportError:  # the Tasks framework is not installed
        return None
    found = framework_task(task)
    if found is None or not isinstance(found.get_backend(), RedisTaskBackend):
        return None
    return Target(found.module_path, found.queue_name, found.priority, {"backend": found.backend})


def unknown_tasks(raw: object) -> list[str]:
    """The ``task`` values of well-formed entries that name no task (rcoord.E025)."""
    if problems(raw) or not isinstance(raw, (list, tuple)):  # the check narrows the type
        return []
    return [entry["task"] for entry in raw if resolve_target(entry["task"]) is None]


# -- firing -------------------------------------------------------------------------------
@functools.lru_cache(maxsize=256)
def _target(task: str) -> Target | None:
    return resolve_target(task)


def fire_due(client: Any, now_ms: int, found: list[Schedule] | None = None) -> tuple[int, float]:
    """Fire every schedule's due tick (once, whoever else tries). Returns (tasks queued,
    seconds from ``now_ms`` (the server's clock) until the next tick of any schedule)."""
    fired = 0
    next_ms: int | None = None
    for schedule in schedules() if found is None else found:
        target = _target(schedule.task)
        if target is None:  # reported by check rcoord.E025
            continue
        keys = QueueKeys.of(target.queue)
        register_group(client, keys.group)  # so pollers watch it (once per process and hour)
        last = client.hget(keys.periodic, schedule.name)
        latest = schedule.latest_tick(now_ms)
        if last is None:
            # First sight: ticks from now on (a past tick of a new schedule is no miss).
            last_ms = latest if now_ms - latest > MISSED_AFTER * 1000 else latest - 1
        else:
            last_ms = int(last)
        if latest > last_ms:
            missed = now_ms - latest > MISSED_AFTER * 1000
            mode = "skip" if missed and schedule.catch_up == "skip" else "fire"
            outcome = _fire(client, schedule, target, keys, latest, mode)
            fired += outcome == 1
            if outcome == 2:
                logger.warning(
                    "periodic %s: tick %s was missed (no poller ran then); skipped",
                    schedule.name,
                    _at(latest).isoformat(),
                )
        following = schedule.next_tick(max(now_ms, latest))
        next_ms = following if next_ms is None else min(next_ms, following)
    return fired, (math.inf if next_ms is None else max(0.0, (next_ms - now_ms) / 1000))


@functools.lru_cache(maxsize=256)
def _lateness_key(group: str, name: str, prefix: str) -> str:
    return KeySpace("queue", group).key(f"periodic-lateness:{name}")


def lateness_key(keys: QueueKeys, name: str) -> str:
    """The LIST of the schedule ``name``'s lateness samples, in its task's queue group."""
    return _lateness_key(keys.group, name, conf.KEY_PREFIX)


def _fire(
    client: Any, schedule: Schedule, target: Target, keys: QueueKeys, tick: int, mode: str
) -> int:
    extra = {**target.extra, "periodic": {"name": schedule.name, "tick": tick / 1000}}
    if target.priority:
        extra["priority"] = target.priority
    task_id, body = encode_message(
        target.task_name, target.queue, schedule.args, schedule.kwargs, extra
    )
    return int(
        run_script(
            "periodic_fire",
            client,
            keys=[
                keys.periodic,
                keys.messages,
                keys.ready,
                keys.queues,
                keys.wake,
                keys.idle,
                lateness_key(keys, schedule.name),
            ],
            args=[
                schedule.name,
                tick,
                mode,
                task_id,
                body,
                keys.queue,
                target.priority,
                WAKE_TOKEN_MS,
                GROUP_KEYS_MS,
                LATENESS_SAMPLES,
            ],
        )
    )


def schedule_status(client: Any, now_ms: int) -> list[dict[str, Any]]:
    """Each schedule's last claimed tick, its lateness, the lateness of its recent fires
    (median, p99, max over the last ``LATENESS_SAMPLES``) and its next tick."""
    rows = []
    for schedule in schedules():
        target = _target(schedule.task)
        row: dict[str, Any] = {"name": schedule.name, "task": schedule.task}
        if target is None:
            rows.append({**row, "error": "unknown task"})
            continue
        keys = QueueKeys.of(target.queue)
        last, late, at = client.hmget(
            keys.periodic, [schedule.name, f"{schedule.name}:late", f"{schedule.name}:at"]
        )
        samples = sorted(int(ms) for ms in client.lrange(lateness_key(keys, schedule.name), 0, -1))
        rows.append(
            {
                **row,
                "every": schedule.every,
                "cron": schedule.cron,
                "last_tick": _iso(last),
                "last_fired": _iso(at),
                "lateness_ms": int(late) if late is not None else None,
                "fires": len(samples),
                "lateness_p50_ms": _at_fraction(samples, 0.5),
                "lateness_p99_ms": _at_fraction(samples, 0.99),
                "lateness_max_ms": samples[-1] if samples else None,
                "next_tick": _at(schedule.next_tick(now_ms)).isoformat(),
            }
        )
    return rows


def _at_fraction(ordered: list[int], fraction: float) -> int | None:
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))] if ordered else None


def _iso(ms: bytes | None) -> str | None:
    return _at(int(ms)).isoformat() if ms is not None else None
