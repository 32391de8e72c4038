"""What a queue group holds now, read with bounded work, for those who look at it
(``rcoord_status``, the dashboard, the JSON stats, the Prometheus collector: ``ops.status``
shapes it). The queue's key layout is read here, in the queue's own package.

Four pipelined round trips a group (its keys share one hash slot), whatever its number of
queues, workers and tasks in flight, and whatever the size of their messages (one over
``MAX_MESSAGE_READ`` is left unread)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django_rcoord.connection import slot_pipeline
from django_rcoord.queues.keys import DEFAULT_GROUP, GroupKeys, QueueKeys
from django_rcoord.queues.messages import decode_message
from django_rcoord.queues.metrics import QueueMetrics, metrics_from_hash
from django_rcoord.queues.records import count_tasks, read_task_counts

__all__ = ["MAX_MESSAGE_READ", "MAX_OWNERS_SHOWN", "GroupSnapshot", "QueueState", "read_group"]

#: The largest message read (for its task's name and age); a bigger one is left unread:
#: the cost of a look does not grow with what a task was given.
MAX_MESSAGE_READ = 64 * 1024
#: Past this many tasks in flight in a group, who runs which is not read.
MAX_OWNERS_SHOWN = 1000


@dataclass
class QueueState:
    """One queue as read: its counts (``TASK_COUNTS``), the id of the task that runs next,
    the due time (server ms) of its next delayed task, and whether it is paused."""

    keys: QueueKeys
    counts: dict[str, int]
    head: bytes | None
    first_due_ms: float | None
    paused: bool


@dataclass
class GroupSnapshot:
    """A group as read: its queues; its live workers' heartbeats (worker id, heartbeat,
    its ms left) and the tasks each runs; the messages of the queues' heads and of the
    running tasks (decoded; a long one left out); its metrics and lateness samples (ms);
    how many entries its incoming list holds (tasks pushed that no take has placed on their
    queue yet: not in the queues' counts, see ``queues.incoming``)."""

    group: str
    queues: list[QueueState]
    beats: list[tuple[str, bytes, int]]
    running: dict[str, list[str]]
    messages: dict[bytes, dict[str, Any] | None]
    metrics: QueueMetrics
    lateness_ms: list[int]
    pushed: int


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
    pushed: int  # LLEN of its incoming list


def read_group(client: Any, group: str) -> GroupSnapshot:
    """``group`` as it is now, read only."""
    group_keys = GroupKeys.of(group)
    holds = _group_holds(client, group, group_keys)
    # HLEN counts the member the owners HASH keeps while tasks are in flight (_in_flight.lua).
    show_owners = holds.in_flight - 1 <= MAX_OWNERS_SHOWN
    with slot_pipeline(client, group_keys.messages, transaction=False) as pipe:
        for queue in holds.keys:
            count_tasks(pipe, queue)
            pipe.zrange(queue.ready, 0, 0)
            pipe.zrange(queue.delayed, 0, 0, withscores=True)
        if show_owners:
            pipe.hgetall(group_keys.owners)
        for worker_id in holds.worker_ids:
            pipe.get(group_keys.heartbeat(worker_id))
            pipe.pttl(group_keys.heartbeat(worker_id))
        replies = iter(pipe.execute())
    queues = [_queue_state(queue, replies, holds.paused) for queue in holds.keys]
    running: dict[str, list[str]] = {}
    if show_owners:
        for task_id, worker in next(replies).items():
            running.setdefault(worker.decode(), []).append(task_id.decode())
    beats = []
    for worker_id in holds.worker_ids:
        beat, ttl_ms = next(replies), next(replies)
        if beat is not None:  # else its heartbeat ran out: the worker is gone
            beats.append((worker_id, beat, ttl_ms))
    heads = [queue.head for queue in queues if queue.head]
    running_ids = [task_id for worker_id, _, _ in beats for task_id in running.get(worker_id, [])]
    messages = _small_messages(client, group_keys.messages, [*heads, *running_ids])
    metrics = metrics_from_hash(holds.raw_metrics)
    lateness = [int(ms) for ms in holds.raw_lateness]
    return GroupSnapshot(group, queues, beats, running, messages, metrics, lateness, holds.pushed)


def _group_holds(client: Any, group: str, group_keys: GroupKeys) -> _Holds:
    with slot_pipeline(client, group_keys.messages, transaction=False) as pipe:
        pipe.hgetall(group_keys.metrics)
        pipe.hkeys(group_keys.queues)
        pipe.lrange(group_keys.lateness, 0, -1)
        pipe.hlen(group_keys.owners)
        pipe.smembers(group_keys.workers)
        pipe.smembers(group_keys.paused)
        pipe.llen(group_keys.incoming)
        raw_metrics, raw_names, raw_lateness, in_flight, members, raw_paused, pushed = (
            pipe.execute()
        )
    paused = {member.decode() for member in raw_paused}
    # A paused queue is shown though it never had a task: the pause is there for its first.
    names = sorted({member.decode() for member in raw_names} | paused)
    keys = [QueueKeys.of(name if group == DEFAULT_GROUP else f"{group}/{name}") for name in names]
    worker_ids = sorted(member.decode() for member in members)
    return _Holds(keys, paused, worker_ids, in_flight, raw_metrics, raw_lateness, pushed)


def _queue_state(queue: QueueKeys, replies: Any, paused: set[str]) -> QueueState:
    counts = read_task_counts(replies)
    head, first_due = next(replies), next(replies)
    due_ms = first_due[0][1] if first_due else None
    return QueueState(queue, counts, head[0] if head else None, due_ms, queue.queue in paused)


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
