"""Looking after queues: recovering expired leases and due tasks, counts, dead letters,
and the overview ``rcoord_status`` prints."""

from __future__ import annotations

from typing import Any

from django_rcoord.connection import resolve_client
from django_rcoord.keys import KeySpace, decode_name
from django_rcoord.messages import _text, decode_message
from django_rcoord.queue_keys import DEFAULT_GROUP, WAKE_TOKEN_MS, QueueKeys
from django_rcoord.scripts import run_script

__all__ = [
    "dead_letters",
    "known_groups",
    "known_queues",
    "overview",
    "queue_stats",
    "recover_and_promote",
    "requeue_dead",
]


#: Lateness samples (ms, due -> promoted) kept per queue group, for rcoord_status.
LATENESS_SAMPLES = 1000


def recover_and_promote(
    queue: QueueKeys, *, batch: int = 500, client: Any = None
) -> tuple[int, int, float | None]:
    """Put back ``queue``'s tasks whose lease ran out and promote its due delayed tasks.

    One script call (atomic: a task is never lost between the delayed set and
    the queue, nor promoted twice, whoever else runs this at the same moment).
    Returns (recovered, promoted, seconds until the next delayed task is due or None).
    """
    recovered, promoted, due_in_ms = run_script(
        "task_recover",
        resolve_client(client),
        keys=[
            queue.owners,
            queue.ready,
            queue.in_flight,
            queue.delayed,
            queue.wake,
            queue.lateness,
        ],
        args=[batch, WAKE_TOKEN_MS, LATENESS_SAMPLES],
    )
    return int(recovered), int(promoted), (due_in_ms / 1000 if due_in_ms >= 0 else None)


# -- inspecting -------------------------------------------------------------------
def queue_stats(queue: str, *, client: Any = None) -> dict[str, int]:
    """Counts of a queue's tasks: ready, in flight, delayed (retries included) and dead."""
    keys = QueueKeys.of(queue)
    with resolve_client(client).pipeline(transaction=False) as pipe:
        pipe.llen(keys.ready)
        pipe.zcard(keys.in_flight)
        pipe.zcard(keys.delayed)
        pipe.llen(keys.dead)
        ready, in_flight, delayed, dead = pipe.execute()
    return {"ready": ready, "in_flight": in_flight, "delayed": delayed, "dead": dead}


def dead_letters(queue: str, *, limit: int = 100, client: Any = None) -> list[dict[str, Any]]:
    """The oldest ``limit`` dead letters: each message, with ``error`` and ``failures`` added."""
    keys = QueueKeys.of(queue)
    client = resolve_client(client)
    ids = client.lrange(keys.dead, 0, limit - 1)
    if not ids:
        return []
    with client.pipeline(transaction=False) as pipe:
        pipe.hmget(keys.messages, ids)
        pipe.hmget(keys.errors, ids)
        pipe.hmget(keys.failures, ids)
        bodies, errors, failures = pipe.execute()
    letters = []
    for task_id, body, error, failed in zip(ids, bodies, errors, failures, strict=True):
        letter = decode_message(body) or {"id": task_id.decode(), "raw": _text(body)}
        letter["error"] = _text(error)
        letter["failures"] = int(failed or 0)
        letters.append(letter)
    return letters


def requeue_dead(queue: str, *, client: Any = None) -> int:
    """Send every dead letter of ``queue`` back to it, with its retries reset. Returns how many."""
    keys = QueueKeys.of(queue)
    return int(
        run_script(
            "task_requeue_dead",
            resolve_client(client),
            keys=[keys.dead, keys.ready, keys.failures, keys.errors, keys.wake],
            args=[WAKE_TOKEN_MS],
        )
    )


def known_queues(group: str = DEFAULT_GROUP, *, client: Any = None) -> list[str]:
    """Names of the queues of ``group`` that have ever had a task."""
    members = resolve_client(client).smembers(KeySpace("queue", group).key("queues"))
    names = sorted(member.decode() for member in members)
    return names if group == DEFAULT_GROUP else [f"{group}/{name}" for name in names]


# -- an overview for operators (rcoord_status) ----------------------------------------
def known_groups(*, client: Any = None) -> list[str]:
    """Queue groups that have ever had a task (the default group always)."""
    client = resolve_client(client)
    pattern = KeySpace("queue", "x").pattern.replace("{x}", "{*}").removesuffix("*") + "queues"
    groups = {DEFAULT_GROUP}
    for key in client.scan_iter(match=pattern, count=1000):
        text = key.decode()
        groups.add(decode_name(text[text.index("{") + 1 : text.index("}")]))
    return sorted(groups)


def overview(*, client: Any = None) -> dict[str, Any]:
    """Every known queue (counts, oldest ready task, next due delayed task), the live
    workers and their tasks, and the lateness of the last 100 promotions per group."""
    client = resolve_client(client)
    now_seconds, now_micros = client.time()
    now = now_seconds + now_micros / 1e6
    queues = []
    workers = []
    lateness: dict[str, dict[str, int]] = {}
    for group in known_groups(client=client):
        for name in known_queues(group, client=client):
            keys = QueueKeys.of(name)
            stats = queue_stats(name, client=client)
            oldest_id = client.lindex(keys.ready, 0)
            oldest = decode_message(client.hget(keys.messages, oldest_id)) if oldest_id else None
            age = now - oldest["enqueued_at"] if oldest and "enqueued_at" in oldest else None
            first_due = client.zrange(keys.delayed, 0, 0, withscores=True)
            next_due_in = first_due[0][1] / 1000 - now if first_due else None
            queues.append(
                {"name": name, **stats, "oldest_ready_age": age, "next_due_in": next_due_in}
            )
        space = KeySpace("queue", group)
        samples = sorted(int(ms) for ms in client.lrange(space.key("lateness"), 0, 99))
        if samples:
            lateness[group] = {
                "samples": len(samples),
                "median_ms": samples[len(samples) // 2],
                "max_ms": samples[-1],
            }
        running: dict[str, list[str]] = {}
        for task_id, worker in client.hgetall(space.key("owners")).items():
            running.setdefault(worker.decode(), []).append(task_id.decode())
        for member in sorted(client.smembers(space.key("workers"))):
            worker_id = member.decode()
            watched = client.get(space.key(f"worker:{worker_id}"))
            if watched is None:  # its heartbeat ran out: the worker is gone
                client.srem(space.key("workers"), worker_id)
                continue
            current = []
            for task_id in running.get(worker_id, []):
                message = decode_message(client.hget(space.key("messages"), task_id)) or {}
                current.append({"id": task_id, "task": message.get("task")})
            workers.append(
                {"id": worker_id, "queues": watched.decode().split(","), "running": current}
            )
    return {"queues": queues, "workers": workers, "promotion_lateness": lateness}
