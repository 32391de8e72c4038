"""What operators look at: one document of every queue, worker, promotion lateness and
periodic schedule, read with bounded work. ``manage.py rcoord_status`` prints it, the
dashboard shows it, ``rcoord:stats`` serves it and the Prometheus collector reads it."""

from __future__ import annotations

import json
from typing import Any

from django_rcoord.connection import resolve_client
from django_rcoord.keys import KeySpace
from django_rcoord.messages import decode_message
from django_rcoord.metrics import finished_per_minute, read_metrics
from django_rcoord.periodic import schedule_status
from django_rcoord.queue_admin import known_groups, known_queues, queue_stats
from django_rcoord.queue_keys import HEARTBEAT_TTL, QueueKeys

__all__ = ["overview"]


def overview(*, client: Any = None) -> dict[str, Any]:
    """What operators look at (``rcoord_status``, the dashboard, the JSON stats): every known
    queue (counts, the age of the task that runs next, the next due delayed task, tasks
    finished in each of the last 60 minutes), the live workers (last heartbeat, tasks
    done, the task each runs now), the lateness of the last promotions per group and the
    periodic schedules. Bounded work: a few reads per group, queue and live worker."""
    client = resolve_client(client)
    now_seconds, now_micros = client.time()
    now = now_seconds + now_micros / 1e6
    now_ms = int(now * 1000)
    queues = []
    workers = []
    worker_counts: dict[str, int] = {}
    lateness: dict[str, dict[str, int]] = {}
    groups = known_groups(client=client)
    for group in groups:
        metrics = read_metrics(group, client=client)
        for name in known_queues(group, client=client):
            keys = QueueKeys.of(name)
            stats = queue_stats(name, client=client)
            head = client.zrange(keys.ready, 0, 0)
            oldest = decode_message(client.hget(keys.messages, head[0])) if head else None
            age = now - oldest["enqueued_at"] if oldest and "enqueued_at" in oldest else None
            first_due = client.zrange(keys.delayed, 0, 0, withscores=True)
            next_due_in = first_due[0][1] / 1000 - now if first_due else None
            per_minute = finished_per_minute(metrics, name, now_ms)
            queues.append(
                {
                    "name": name,
                    "group": group,
                    **stats,
                    "oldest_ready_age": age,
                    "next_due_in": next_due_in,
                    "finished_last_hour": sum(per_minute),
                    "finished_per_minute": per_minute,
                }
            )
        space = KeySpace("queue", group)
        samples = sorted(int(ms) for ms in client.lrange(space.key("lateness"), 0, -1))
        if samples:
            lateness[group] = {
                "samples": len(samples),
                "median_ms": samples[len(samples) // 2],
                "p99_ms": samples[min(len(samples) - 1, int(len(samples) * 0.99))],
                "max_ms": samples[-1],
            }
        running: dict[str, list[str]] = {}
        if client.hlen(space.key("owners")) <= MAX_OWNERS_SHOWN:
            for task_id, worker in client.hgetall(space.key("owners")).items():
                running.setdefault(worker.decode(), []).append(task_id.decode())
        worker_counts[group] = 0
        for member in sorted(client.smembers(space.key("workers"))):
            worker_id = member.decode()
            heartbeat_key = space.key(f"worker:{worker_id}")
            with client.pipeline(transaction=False) as pipe:
                pipe.get(heartbeat_key)
                pipe.pttl(heartbeat_key)
                beat, ttl_ms = pipe.execute()
            if beat is None:  # its heartbeat ran out: the worker is gone
                client.srem(space.key("workers"), worker_id)
                continue
            worker_counts[group] += 1
            about = _heartbeat(beat)
            current = []
            for task_id in running.get(worker_id, []):
                message = decode_message(client.hget(space.key("messages"), task_id)) or {}
                current.append({"id": task_id, "task": message.get("task")})
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
    return {
        "time": now,
        "groups": groups,
        "queues": queues,
        "workers": workers,
        "worker_counts": worker_counts,
        "promotion_lateness": lateness,
        "periodic": schedule_status(client, now_ms),
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
