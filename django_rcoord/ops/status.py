"""What operators look at: one document of every queue, worker, promotion lateness and
periodic schedule, read with bounded work. ``manage.py rcoord_status`` prints it, the
dashboard shows it, ``rcoord:stats`` serves it and the Prometheus collector reads it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django_rcoord.connection import slot_pipeline
from django_rcoord.connection.clients import resolve_client
from django_rcoord.queues.keys import DEFAULT_GROUP, HEARTBEAT_TTL, GroupKeys, QueueKeys
from django_rcoord.queues.messages import decode_message
from django_rcoord.queues.metrics import cancelled_in, finished_per_minute, metrics_from_hash
from django_rcoord.queues.options import RunOptions
from django_rcoord.queues.periodic import schedule_status
from django_rcoord.queues.records import TASK_COUNTS, count_tasks, known_groups
from django_rcoord.queues.registry import autodiscover_tasks, registered_tasks
from django_rcoord.queues.shards import logical_group, logical_queue_name, other_layout_of
from django_rcoord.semaphores import Semaphore

__all__ = ["overview"]


def overview(*, client: Any = None) -> dict[str, Any]:
    """What operators look at (``rcoord_status``, the dashboard, the JSON stats): every known
    queue (counts, the age of the task that runs next, the next due delayed task, tasks
    finished in each of the last 60 minutes, tasks cancelled before they ran, whether it
    is paused: ``pause_queue``), the live
    workers (last heartbeat, tasks done, the task each runs now), the lateness of the last
    promotions per group and the periodic schedules.

    Bounded work, read only: four pipelined round trips per group (its keys share one
    hash slot), whatever its number of queues, workers and tasks in flight, and whatever
    the size of their messages (one over ``MAX_MESSAGE_READ`` is left unread). A worker that
    died without signing off stays a member of its group's worker set until a worker
    signing off drops it (``forget_gone_workers``); here it is only left out.
    """
    client = resolve_client(client)
    now_seconds, now_micros = client.time()
    now = now_seconds + now_micros / 1e6
    now_ms = int(now * 1000)
    groups = known_groups(client=client)
    queues: list[dict[str, Any]] = []
    workers: list[dict[str, Any]] = []
    worker_counts: dict[str, int] = {}
    lateness: dict[str, dict[str, int]] = {}
    for group in groups:
        found = _read_group(client, group, now, now_ms)
        queues.extend(found.queues)
        workers.extend(found.workers)
        # A shard's workers count for its group (RCOORD["QUEUE_SHARDS"]).
        logical = logical_group(group)
        worker_counts[logical] = worker_counts.get(logical, 0) + len(found.workers)
        if found.lateness:
            lateness[group] = found.lateness
    return {
        "time": now,
        "groups": groups,
        "queues": _add_up_shards(queues),
        "workers": [{**worker, "group": logical_group(worker["group"])} for worker in workers],
        "worker_counts": worker_counts,
        "promotion_lateness": lateness,
        "periodic": schedule_status(client, now_ms),
        "task_controls": task_controls(client),
    }


def task_controls(client: Any) -> list[dict[str, Any]]:
    """Every registered ``@task`` that sets a control (a time limit, a rate, a concurrency,
    its own retries, a follow-up), with the runs holding a permit of its concurrency limit
    now (a round trip per concurrency limit). The apps' ``tasks`` modules are imported
    first, as a worker does, so that a web process sees every task."""
    autodiscover_tasks()
    rows: list[dict[str, Any]] = []
    for registered in registered_tasks():
        options = registered.options
        if options == RunOptions(max_retries=options.max_retries) and not (
            registered.on_success or registered.on_failure
        ):
            continue
        follow_ups = {
            kind: getattr(target, "name", target)
            for kind, target in (
                ("on_success", registered.on_success),
                ("on_failure", registered.on_failure),
            )
            if target is not None
        }
        rows.append(
            {
                "task": registered.name,
                "queue": registered.queue,
                "timeout": options.time_limit,
                "max_retries": options.max_retries,
                "rate": options.rate,
                "concurrency": options.concurrency,
                "limit_key": f"task:{options.limit_key or registered.name}",
                "running": None,
                **follow_ups,
            }
        )
    for row in rows:
        if row["concurrency"]:
            row["running"] = Semaphore(
                row["limit_key"], row["concurrency"], client=client
            ).holders()
    return rows


@dataclass
class _Group:
    queues: list[dict[str, Any]]
    workers: list[dict[str, Any]]
    lateness: dict[str, int] | None


@dataclass
class _Holds:
    """What a group holds, read in one round trip: its queues (those paused among them,
    by name within the group), its workers, its metrics and lateness samples."""

    keys: list[QueueKeys]
    paused: set[str]
    worker_ids: list[str]
    in_flight: int  # HLEN of its owners HASH
    raw_metrics: dict[bytes, bytes]
    raw_lateness: list[bytes]


def _group_holds(client: Any, group: str, group_keys: GroupKeys) -> _Holds:
    with slot_pipeline(client, group_keys.messages, transaction=False) as pipe:
        pipe.hgetall(group_keys.metrics)
        pipe.hkeys(group_keys.queues)
        pipe.lrange(group_keys.lateness, 0, -1)
        pipe.hlen(group_keys.owners)
        pipe.smembers(group_keys.workers)
        pipe.smembers(group_keys.paused)
        raw_metrics, raw_names, raw_lateness, in_flight, members, raw_paused = pipe.execute()
    paused = {member.decode() for member in raw_paused}
    # A paused queue is shown though it never had a task: the pause is there for its first.
    names = sorted({member.decode() for member in raw_names} | paused)
    keys = [QueueKeys.of(name if group == DEFAULT_GROUP else f"{group}/{name}") for name in names]
    worker_ids = sorted(member.decode() for member in members)
    return _Holds(keys, paused, worker_ids, in_flight, raw_metrics, raw_lateness)


def _read_group(client: Any, group: str, now: float, now_ms: int) -> _Group:
    """One group's part of the overview, in four pipelined round trips: what the group
    holds, then each queue's counts and heads and each worker's heartbeat, then the lengths
    of the messages of the heads and of the tasks running, then those not too long to read
    (``MAX_MESSAGE_READ``)."""
    group_keys = GroupKeys.of(group)
    owners_key, messages_key = group_keys.owners, group_keys.messages
    holds = _group_holds(client, group, group_keys)
    keys, worker_ids = holds.keys, holds.worker_ids
    # HLEN counts the member the owners HASH keeps while tasks are in flight (_in_flight.lua).
    show_owners = holds.in_flight - 1 <= MAX_OWNERS_SHOWN

    with slot_pipeline(client, messages_key, transaction=False) as pipe:
        for queue in keys:
            count_tasks(pipe, queue)
            pipe.zrange(queue.ready, 0, 0)
            pipe.zrange(queue.delayed, 0, 0, withscores=True)
        if show_owners:
            pipe.hgetall(owners_key)
        for worker_id in worker_ids:
            pipe.get(group_keys.heartbeat(worker_id))
            pipe.pttl(group_keys.heartbeat(worker_id))
        replies = iter(pipe.execute())
    per_queue = []
    for queue in keys:
        counts = dict(zip(TASK_COUNTS, [next(replies) for _ in TASK_COUNTS], strict=True))
        per_queue.append((queue, counts, next(replies), next(replies)))
    running: dict[str, list[str]] = {}
    if show_owners:
        for task_id, worker in next(replies).items():
            running.setdefault(worker.decode(), []).append(task_id.decode())
    beats = []
    for worker_id in worker_ids:
        beat, ttl_ms = next(replies), next(replies)
        if beat is not None:  # else its heartbeat ran out: the worker is gone
            beats.append((worker_id, beat, ttl_ms))

    heads = [head[0] for _, _, head, _ in per_queue if head]
    running_ids = [task_id for worker_id, _, _ in beats for task_id in running.get(worker_id, [])]
    wanted = [*heads, *running_ids]
    messages = _small_messages(client, messages_key, wanted)

    metrics = metrics_from_hash(holds.raw_metrics)
    queues = _queue_rows(group, per_queue, messages, metrics, now, now_ms)
    for row, (queue, *_) in zip(queues, per_queue, strict=True):
        row["paused"] = queue.queue in holds.paused
    workers = _worker_rows(group, beats, running, messages)
    lateness = _lateness_summary(holds.raw_lateness)
    return _Group(queues, workers, lateness)


def _queue_rows(
    group: str,
    per_queue: list[tuple[QueueKeys, dict[str, int], list[bytes], list[Any]]],
    messages: dict[bytes, dict[str, Any] | None],
    metrics: Any,
    now: float,
    now_ms: int,
) -> list[dict[str, Any]]:
    """Each queue's row: its counts, the age of its oldest ready task, when its next
    delayed task is due, what it finished in the last hour."""
    queues = []
    for queue, counts, head, first_due in per_queue:
        oldest = messages.get(head[0]) if head else None
        age = now - oldest["enqueued_at"] if oldest and "enqueued_at" in oldest else None
        per_minute = finished_per_minute(metrics, queue.name, now_ms)
        queues.append(
            {
                "name": queue.name,
                "group": group,
                **counts,
                "oldest_ready_age": age,
                "next_due_in": first_due[0][1] / 1000 - now if first_due else None,
                "finished_last_hour": sum(per_minute),
                "finished_per_minute": per_minute,
                "cancelled": cancelled_in(metrics, queue.name),
            }
        )
    return queues


def _add_up_shards(queues: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of a queue whose group has shards (``RCOORD["QUEUE_SHARDS"]``) added up into
    one row, named as its tasks were queued, with ``shards``: how many shards it adds up
    (with the group's own row, left from before it had shards, when there is one). The
    oldest ready task's age is the oldest row's, the next due time the soonest. A row of a
    shard of another layout than this process's keeps its own, with ``other_layout``
    naming its group (None on every other row)."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for row in queues:
        by_name.setdefault(logical_queue_name(row["name"]), []).append(row)
    rows: list[dict[str, Any]] = []
    for name, parts in by_name.items():
        shards = sum(part["name"] != name for part in parts)
        if not shards:
            rows.extend({**part, "other_layout": other_layout_of(part["group"])} for part in parts)
            continue
        total = {**parts[0], "name": name, "group": logical_group(parts[0]["group"])}
        for row in parts[1:]:
            for count in (*TASK_COUNTS, "finished_last_hour", "cancelled"):
                total[count] += row[count]
            # Paused where any of its tasks lie: a pause half done (an error between its
            # writes) is shown, and pausing again completes it.
            total["paused"] = total["paused"] or row["paused"]
            minutes = zip(total["finished_per_minute"], row["finished_per_minute"], strict=True)
            total["finished_per_minute"] = [mine + theirs for mine, theirs in minutes]
            total["oldest_ready_age"] = _most(
                max, total["oldest_ready_age"], row["oldest_ready_age"]
            )
            total["next_due_in"] = _most(min, total["next_due_in"], row["next_due_in"])
        total["shards"], total["other_layout"] = shards, None
        rows.append(total)
    return rows


def _most(pick: Any, one: float | None, other: float | None) -> float | None:
    """``pick`` (min or max) of the two that are not None."""
    if one is None or other is None:
        return other if one is None else one
    return pick(one, other)


def _worker_rows(
    group: str,
    beats: list[tuple[str, bytes, int]],
    running: dict[str, list[str]],
    messages: dict[bytes, dict[str, Any] | None],
) -> list[dict[str, Any]]:
    """Each live worker's row: its heartbeat's contents and the tasks it runs now."""
    workers = []
    for worker_id, beat, ttl_ms in beats:
        about = _heartbeat(beat)
        current = [
            {"id": task_id, "task": (messages.get(task_id.encode()) or {}).get("task")}
            for task_id in running.get(worker_id, [])
        ]
        workers.append(
            {
                "id": worker_id,
                "group": group,
                "queues": about.get("queues", []),
                "done": about.get("done"),
                "started": about.get("started"),
                "last_heartbeat_age": max(0.0, HEARTBEAT_TTL - max(ttl_ms, 0) / 1000),
                "running": current,
            }
        )
    return workers


def _lateness_summary(raw_lateness: list[bytes]) -> dict[str, int] | None:
    """The promotion lateness samples' median, p99 and worst (ms), or None for none."""
    samples = sorted(int(ms) for ms in raw_lateness)
    return (
        {
            "samples": len(samples),
            "median_ms": samples[len(samples) // 2],
            "p99_ms": samples[min(len(samples) - 1, int(len(samples) * 0.99))],
            "max_ms": samples[-1],
        }
        if samples
        else None
    )


#: The largest message the overview reads (for its task's name and age); a bigger one is
#: left unread: the overview's cost does not grow with what a task was given.
MAX_MESSAGE_READ = 64 * 1024


def _small_messages(
    client: Any, messages_key: str, task_ids: list[Any]
) -> dict[bytes, dict[str, Any] | None]:
    """The messages of ``task_ids`` at most ``MAX_MESSAGE_READ`` bytes long, decoded (their
    lengths asked first, in one round trip; then those, in another)."""
    if not task_ids:
        return {}
    with slot_pipeline(client, messages_key, transaction=False) as pipe:
        for task_id in task_ids:
            pipe.hstrlen(messages_key, task_id)
        lengths = pipe.execute()
    small = [
        task_id
        for task_id, length in zip(task_ids, lengths, strict=True)
        if 0 < length <= MAX_MESSAGE_READ
    ]
    if not small:
        return {}
    fetched = client.hmget(messages_key, small)
    return {
        task_id if isinstance(task_id, bytes) else task_id.encode(): decode_message(raw)
        for task_id, raw in zip(small, fetched, strict=True)
    }


#: Past this many tasks in flight in a group, the overview does not list who runs which.
MAX_OWNERS_SHOWN = 1000


def _heartbeat(beat: bytes) -> dict[str, Any]:
    try:
        about = json.loads(beat)
    except ValueError:
        about = None
    if not isinstance(about, dict):  # a worker of an earlier version: its queues, comma-joined
        return {"queues": beat.decode(errors="replace").split(",")}
    return about
