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

Each tick is queued **exactly once** however many pollers run, and whatever queue group
each of them maps the task to (a rolling deploy that moves the task to another group runs
old and new pollers side by side). Three steps, each one script:

1. ``periodic_claim.lua`` claims the tick in the schedule's own hash slot
   (``rcoord:periodic:{<name>}:claim``): it must be due on the Redis server's clock and
   later than the last tick claimed. A tick claimed to fire stores its task's message and
   queue there, *pending*.
2. ``periodic_queue.lua`` queues that message in that queue's group, which records per
   schedule the latest tick it queued: queueing the same pending tick again is a no-op.
3. ``periodic_confirm.lua`` clears the pending message.

The claim and the queue are in different slots on Redis Cluster, so they cannot be one
script. A poller that dies between 1 and 3 (or whose reply is lost) leaves the tick
pending; the next pass of any poller queues the *stored* message in the *stored* queue,
not its own idea of the task's group, so the tick is neither lost nor queued twice, and a
schedule's next tick is not claimed until the pending one is confirmed (a group's record
only moves forward). A task id derived from schedule and tick would not do instead: the
queue keeps no record of ids it ran, and two releases would queue it in two groups.

A pass fires every due tick not claimed yet, oldest first, so a tick is fired however
long every poller paused (a stall, a failover) as long as it is found within
``MISSED_AFTER`` seconds. One found later than that was missed (no poller ran):
``catch_up: "skip"`` (the default) drops it, ``"once"`` runs the latest missed tick once.

Lateness (tick -> queued, server clock) is what operators watch, so only fires a running
poller made count: a *catch-up* fire, of a tick that fell due before the firing poller's
first pass (the ticks under ``MISSED_AFTER`` old when a poller starts, or a missed one run
by ``catch_up: "once"``), is counted apart (the claim's ``catch_ups``), and its delay is
not a lateness sample.
The message carries the tick (``"periodic": {"name", "tick"}``) and goes through the queue
like any task. Reading the setting, a schedule's ticks and the task it names are in
``schedules``.
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass
from typing import Any

from django_rcoord.keys import instance_keys
from django_rcoord.queues.keys import GROUP_KEYS_MS, QueueKeys
from django_rcoord.queues.messages import decode_message, encode_message
from django_rcoord.queues.producer import GROUP_CREATED, register_group
from django_rcoord.queues.schedules import (
    Schedule,
    Target,
    local_datetime,
    resolve_target,
    schedules,
)
from django_rcoord.queues.shards import placed
from django_rcoord.queues.unique import UNIQUE_FIELD, UNIQUE_MS_FIELD
from django_rcoord.scripts import run_script

logger = logging.getLogger(__name__)

#: A tick first seen more than this many seconds after it was due was missed (no poller
#: ran at that time): ``catch_up`` decides whether it runs.
MISSED_AFTER = 60.0

#: Lateness samples (ms, tick -> queued, server clock) kept per schedule, for rcoord_status.
LATENESS_SAMPLES = 1000


# -- firing -------------------------------------------------------------------------------
@functools.lru_cache(maxsize=256)
def _target(task: str) -> Target | None:
    return resolve_target(task)


def fire_due(
    client: Any,
    now_ms: int,
    found: list[Schedule] | None = None,
    *,
    started_ms: int | None = None,
) -> tuple[int, float]:
    """Fire every schedule's due tick (once, whoever else tries). Returns (tasks queued,
    seconds from ``now_ms`` (the server's clock) until the next tick of any schedule).

    ``started_ms``: when the calling poller made its first pass (server clock); a tick due
    before it is a catch-up fire, not counted as lateness."""
    fired = 0
    next_ms: int | None = None
    for schedule in schedules() if found is None else found:
        target = _target(schedule.task)
        fired += _fire(client, schedule, target, now_ms, started_ms)
        if target is None:  # reported by check rcoord.E025
            continue
        following = schedule.next_tick(max(now_ms, schedule.latest_tick(now_ms)))
        next_ms = following if next_ms is None else min(next_ms, following)
    return fired, (math.inf if next_ms is None else max(0.0, (next_ms - now_ms) / 1000))


def claim_key(name: str) -> str:
    """The HASH that claims the ticks of the schedule ``name``, in its own hash slot (not
    its task's queue group: which group that is may differ between two releases)."""
    return instance_keys("periodic", name, _CLAIM_PARTS)[0]


def lateness_key(name: str) -> str:
    """The LIST of the schedule ``name``'s lateness samples (ms, tick -> queued), beside
    its claim."""
    return instance_keys("periodic", name, _CLAIM_PARTS)[1]


_CLAIM_PARTS = ("claim", "lateness")
# What a poller reads of a claim each pass: the last claimed tick and any pending one.
_CLAIM_FIELDS = ("tick", "pending", "queue", "priority", "id", "message")

# periodic_claim's answers.
_NOT_DUE, _TAKEN, _CLAIMED, _SKIPPED, _EARLIER_PENDING = -1, 0, 1, 2, 3
#: The most claims one pass makes for a schedule: a schedule's ticks are at least a second
#: apart, so a pass that finds more due than this has found them taken meanwhile.
_MAX_CLAIMS_PER_PASS = 2 * round(MISSED_AFTER) + 8


@dataclass(frozen=True)
class PendingTick:
    """A tick claimed to fire whose task is not yet confirmed queued: the message and the
    queue the claim stored with it (whoever queues it queues exactly these)."""

    tick: int
    queue: str
    priority: int
    task_id: str
    message: bytes | str


def _read_claim(client: Any, name: str) -> tuple[int | None, PendingTick | None]:
    """(last claimed tick or None, the pending tick or None) of the schedule ``name``."""
    last, pending, queue, priority, task_id, message = client.hmget(claim_key(name), _CLAIM_FIELDS)
    last_tick = None if last is None else int(last)
    if pending is None or queue is None or task_id is None or message is None:
        return last_tick, None
    found = PendingTick(int(pending), queue.decode(), int(priority or 0), task_id.decode(), message)
    return (found.tick if last_tick is None else last_tick), found


def _fire(
    client: Any, schedule: Schedule, target: Target | None, now_ms: int, started_ms: int | None
) -> int:
    """Queue the schedule's pending tick, if any, then claim and queue each of its due ticks
    not claimed yet, oldest first: a tick less than ``MISSED_AFTER`` late is fired however
    long every poller paused, and the ticks older than that are handled by one claim (of
    the latest of them) as ``catch_up`` says. Returns how many tasks this call queued."""
    fired = 0
    latest = schedule.latest_tick(now_ms)
    # Each turn claims a tick or finds one claimed meanwhile (the claim only moves forward):
    # the missed ticks, then at most MISSED_AFTER / every, plus a few taken by other pollers.
    for _ in range(_MAX_CLAIMS_PER_PASS):
        last, pending = _read_claim(client, schedule.name)
        if pending is not None:
            fired += _queue_pending(client, schedule.name, pending)
        if target is None:
            return fired
        if last is None:
            # First sight: ticks from now on (a past tick of a new schedule is no miss).
            last = latest if now_ms - latest > MISSED_AFTER * 1000 else latest - 1
        if latest <= last:
            return fired
        tick, mode = _next_claim(schedule, last, now_ms, started_ms)
        claimed = _pending_tick(schedule, target, tick)
        outcome = _claim(client, schedule.name, tick, mode, claimed)
        if outcome == _CLAIMED:
            fired += _queue_pending(client, schedule.name, claimed)
        elif outcome == _SKIPPED:
            logger.warning(
                "periodic %s: tick %s was missed (no poller ran then); skipped",
                schedule.name,
                local_datetime(tick).isoformat(),
            )
        elif outcome == _NOT_DUE:
            return fired  # the server's clock is behind this pass's: the next pass
        # Else taken already (or an earlier tick is pending): by another poller, or by this
        # call's own claim whose reply was cut and which was sent again. The next turn reads
        # the claim again and queues what is pending (once, whoever does), rather than
        # leave it to a later pass.
    return fired


def _claim(client: Any, name: str, tick: int, mode: str, claimed: PendingTick) -> int:
    """Claim ``tick`` of schedule ``name`` (``periodic_claim.lua``) with the task it queues,
    ``claimed``: ``_CLAIMED``, ``_SKIPPED``, ``_NOT_DUE`` or taken already."""
    args = [tick, mode, claimed.queue, claimed.priority, claimed.task_id, claimed.message]
    keys = [claim_key(name)]
    return int(run_script("periodic_claim", client, keys=keys, args=[*args, GROUP_KEYS_MS]))


def _next_claim(
    schedule: Schedule, last: int, now_ms: int, started_ms: int | None
) -> tuple[int, str]:
    """(the tick after the schedule's ``last`` claimed one, how to claim it): ``"fire"``,
    ``"catch-up"`` (due before this poller's first pass, or missed with ``catch_up:
    "once"``) or ``"skip"``. Of missed ticks, the latest stands for them all."""
    tick = schedule.next_tick(last)
    missed = now_ms - tick > MISSED_AFTER * 1000
    if missed:
        tick = schedule.latest_tick(now_ms - round(MISSED_AFTER * 1000) - 1)
    if missed and schedule.catch_up == "skip":
        return tick, "skip"
    if missed or (started_ms is not None and tick < started_ms):
        return tick, "catch-up"  # no poller ran when it fell due: its delay is no lateness
    return tick, "fire"


def _pending_tick(schedule: Schedule, target: Target, tick: int) -> PendingTick:
    """The message of the schedule's task for ``tick``, as its claim stores it."""
    extra = {**target.extra, "periodic": {"name": schedule.name, "tick": tick / 1000}}
    if target.priority:
        extra["priority"] = target.priority
    claim = None
    if target.unique is not None:
        # As delay() writes it: the scripts that end the run release the claim.
        claim = target.unique.claim(target.task_name, schedule.args, schedule.kwargs)
        extra[UNIQUE_FIELD], extra[UNIQUE_MS_FIELD] = claim, target.unique.ms
    # A shard's, when it has shards: in turns per schedule, so each schedule's ticks spread
    # over the shards (in turns per group, schedules fired one after another would not).
    queue, fields = placed(target.queue, extra, claim, turn=f"periodic:{schedule.name}")
    task_id, body = encode_message(target.task_name, queue, schedule.args, schedule.kwargs, fields)
    return PendingTick(tick, queue, target.priority, task_id, body)


def _queue_pending(client: Any, name: str, pending: PendingTick) -> int:
    """Queue a claimed tick's task in the queue its claim names (a no-op when that group
    holds the tick already), then confirm it. Returns 1 when this call queued it."""
    keys = QueueKeys.of(pending.queue)
    register_group(client, keys.group)  # so pollers watch it (once per process and hour)
    script_keys = [keys.periodic, keys.messages, keys.ready, keys.queues, keys.incoming, keys.idle]
    args = [
        name,
        pending.tick,
        pending.task_id,
        pending.message,
        keys.queue,
        pending.priority,
        GROUP_KEYS_MS,
    ]
    claim, claim_ms = _unique_claim(pending.message)
    if claim is not None:
        script_keys.append(keys.results)
        args += [claim, claim_ms]
    status, queued_at = run_script("periodic_queue", client, keys=script_keys, args=args)
    if status == _HELD:
        logger.info(
            "periodic %s: tick %s not queued: a run of its unique task is ready, delayed "
            "or running",
            name,
            local_datetime(pending.tick).isoformat(),
        )
    if status == GROUP_CREATED:
        register_group(client, keys.group, force=True)
    run_script(
        "periodic_confirm",
        client,
        keys=[claim_key(name), lateness_key(name)],
        args=[pending.tick, queued_at, LATENESS_SAMPLES, GROUP_KEYS_MS],
    )
    return 1 if status in (1, GROUP_CREATED) else 0


#: What periodic_queue answers when a run of the tick's unique task holds its claim.
_HELD = 3


def _unique_claim(message: bytes | str) -> tuple[str | None, int]:
    """(the unique claim a pending tick's message names, how long it lasts, ms), or
    (None, 0) for a task that is not unique."""
    body = decode_message(message) or {}
    claim, claim_ms = body.get(UNIQUE_FIELD), body.get(UNIQUE_MS_FIELD)
    if isinstance(claim, str) and claim.startswith("u:") and isinstance(claim_ms, int):
        return claim, claim_ms
    return None, 0


def schedule_status(client: Any, now_ms: int) -> list[dict[str, Any]]:
    """Each schedule's last claimed tick, its lateness (None after a catch-up fire, which
    ``last_fire`` names), the lateness of its recent on-time fires (median, p99, max over
    the last ``LATENESS_SAMPLES``, and how many samples that is), how many catch-up fires
    there were, and its next tick."""
    rows = []
    for schedule in schedules():
        target = _target(schedule.task)
        row: dict[str, Any] = {"name": schedule.name, "task": schedule.task}
        if target is None:
            rows.append({**row, "error": "unknown task"})
            continue
        last, late, at, kind, catch_ups = client.hmget(
            claim_key(schedule.name), ["tick", "late", "at", "kind", "catch_ups"]
        )
        samples = sorted(int(ms) for ms in client.lrange(lateness_key(schedule.name), 0, -1))
        last_fire = _LAST_FIRE.get(kind, "on time") if last is not None else None
        rows.append(
            {
                **row,
                "every": schedule.every,
                "cron": schedule.cron,
                "last_tick": _iso(last),
                "last_fired": _iso(at),
                "last_fire": last_fire,
                "lateness_ms": int(late) if late is not None and last_fire == "on time" else None,
                "fires": len(samples),  # the on-time fires the statistics rest on
                "lateness_samples": len(samples),
                "catch_up_fires": int(catch_ups or 0),
                "lateness_p50_ms": _at_fraction(samples, 0.5),
                "lateness_p99_ms": _at_fraction(samples, 0.99),
                "lateness_max_ms": samples[-1] if samples else None,
                "next_tick": local_datetime(schedule.next_tick(now_ms)).isoformat(),
            }
        )
    return rows


# How the last claimed tick was handled (the claim's kind), for schedule_status.
_LAST_FIRE = {b"catch-up": "catch-up", b"skip": "skipped (missed)"}


def _at_fraction(ordered: list[int], fraction: float) -> int | None:
    """The nearest-rank percentile: the smallest sample with ``fraction`` of them at or
    below it (of two samples, the median is the lower)."""
    if not ordered:
        return None
    return ordered[max(0, math.ceil(len(ordered) * fraction) - 1)]


def _iso(ms: bytes | None) -> str | None:
    return local_datetime(int(ms)).isoformat() if ms is not None else None
