"""What operators look at: one document of every queue, worker, promotion lateness and
periodic schedule, read with bounded work. ``manage.py rcoord_status`` prints it, the
dashboard shows it, ``rcoord:stats`` serves it and the Prometheus collector reads it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django_rcoord.connection.clients import resolve_client
from django_rcoord.queues.keys import HEARTBEAT_TTL
from django_rcoord.queues.metrics import cancelled_in, finished_per_minute
from django_rcoord.queues.options import RunOptions
from django_rcoord.queues.periodic import schedule_status
from django_rcoord.queues.records import TASK_COUNTS, known_groups
from django_rcoord.queues.registry import autodiscover_tasks, registered_tasks
from django_rcoord.queues.shards import logical_group, logical_queue_name, other_layout_of
from django_rcoord.queues.snapshot import MAX_MESSAGE_READ, GroupSnapshot, QueueState, read_group
from django_rcoord.semaphores import Semaphore

__all__ = ["MAX_MESSAGE_READ", "overview"]


def overview(*, client: Any = None) -> dict[str, Any]:
    """What operators look at (``rcoord_status``, the dashboard, the JSON stats): every known
    queue (counts, the age of the task that runs next, the next due delayed task, tasks
    finished in each of the last 60 minutes, tasks cancelled before they ran, whether it
    is paused: ``pause_queue``), the live
    workers (last heartbeat, tasks done, the task each runs now), the lateness of the last
    promotions per group and the periodic schedules; per group, the tasks pushed to its
    incoming list that no worker's take has placed on their queue yet (``pushed``: the
    queues' counts leave them out, see ``queues.incoming``; a group with none is left out).

    Bounded work, read only: ``queues.snapshot.read_group``'s four pipelined round trips
    per group, whatever its number of queues, workers and tasks in flight, and whatever
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
    pushed: dict[str, int] = {}
    for group in groups:
        found = _read_group(client, group, now, now_ms)
        if found.pushed:
            pushed[group] = found.pushed
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
        "pushed": pushed,
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
    pushed: int


def _read_group(client: Any, group: str, now: float, now_ms: int) -> _Group:
    """One group's part of the overview, from what ``read_group`` read of it."""
    snapshot = read_group(client, group)
    queues = [_queue_row(group, queue, snapshot, now, now_ms) for queue in snapshot.queues]
    workers = _worker_rows(group, snapshot)
    return _Group(queues, workers, _lateness_summary(snapshot.lateness_ms), snapshot.pushed)


def _queue_row(
    group: str, queue: QueueState, snapshot: GroupSnapshot, now: float, now_ms: int
) -> dict[str, Any]:
    """A queue's row: its counts, the age of its oldest ready task, when its next delayed
    task is due, what it finished in the last hour, whether it is paused."""
    oldest = snapshot.messages.get(queue.head) if queue.head else None
    age = now - oldest["enqueued_at"] if oldest and "enqueued_at" in oldest else None
    name, metrics = queue.keys.name, snapshot.metrics
    per_minute = finished_per_minute(metrics, name, now_ms)
    return {
        "name": name,
        "group": group,
        **queue.counts,
        "oldest_ready_age": age,
        "next_due_in": None if queue.first_due_ms is None else queue.first_due_ms / 1000 - now,
        "finished_last_hour": sum(per_minute),
        "finished_per_minute": per_minute,
        "cancelled": cancelled_in(metrics, name),
        "paused": queue.paused,
    }


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


def _worker_rows(group: str, snapshot: GroupSnapshot) -> list[dict[str, Any]]:
    """Each live worker's row: its heartbeat's contents and the tasks it runs now."""
    workers = []
    for worker_id, beat, ttl_ms in snapshot.beats:
        about = _heartbeat(beat)
        current = [
            {"id": task_id, "task": (snapshot.messages.get(task_id.encode()) or {}).get("task")}
            for task_id in snapshot.running.get(worker_id, [])
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


def _lateness_summary(lateness_ms: list[int]) -> dict[str, int] | None:
    """The promotion lateness samples' median, p99 and worst (ms), or None for none."""
    samples = sorted(lateness_ms)
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


def _heartbeat(beat: bytes) -> dict[str, Any]:
    try:
        about = json.loads(beat)
    except ValueError:
        about = None
    if not isinstance(about, dict):  # a worker of an earlier version: its queues, comma-joined
        return {"queues": beat.decode(errors="replace").split(",")}
    return about
