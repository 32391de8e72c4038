"""The worker's calls to its lease scripts (``task_renew``, ``task_give_back``) and to
``task_stopped``, built here and nowhere else: the call's settings go as one JSON record
the script reads by name (as ``finish.FinishProtocol`` sends the finish's), then the ids of
the tasks it is about."""

from __future__ import annotations

from collections.abc import Sequence

from django_rcoord.queues.keys import GROUP_KEYS_MS, QueueKeys
from django_rcoord.queues.messages import wire_json
from django_rcoord.queues.metrics import metric_labels
from django_rcoord.queues.records import result_ttl_ms
from django_rcoord.queues.worker.finish import ScriptCall
from django_rcoord.queues.worker.jobs import Done

__all__ = ["give_back_call", "renew_call", "stopped_call"]


def renew_call(
    queue: QueueKeys, worker_id: str, lease_ms: int, task_ids: Sequence[str]
) -> ScriptCall:
    """``task_renew``: extend the leases of ``task_ids`` of ``queue`` by ``lease_ms`` from
    now, saying which ``cancel()`` asked to stop (their stop keys, in the same order)."""
    keys = [queue.owners, queue.in_flight, *(queue.stop(task_id) for task_id in task_ids)]
    record = {"worker": worker_id, "lease_ms": lease_ms}
    return keys, [wire_json(record), *task_ids]


def stopped_call(done: Done, worker_id: str) -> ScriptCall:
    """``task_stopped``: the run ``done``, stopped because ``cancel()`` asked, ends FAILED."""
    job, queue = done.job, done.job.queue
    keys = [
        queue.messages,
        queue.owners,
        queue.failures,
        queue.errors,
        queue.results,
        queue.records,
        queue.in_flight,
        queue.stop(job.id),
        queue.metrics,
        queue.ready,
        queue.queues,
    ]
    record = {
        "worker": worker_id,
        "id": job.id,
        "result_ttl": result_ttl_ms(),
        "entry": done.outcome.error_entry,
        "labels": metric_labels(queue.name, done.outcome.task_name),
        "keep_ms": GROUP_KEYS_MS,
        "queue": queue.queue,
    }
    return keys, [wire_json(record)]


def give_back_call(queue: QueueKeys, worker_id: str, task_ids: Sequence[str]) -> ScriptCall:
    """``task_give_back``: ``task_ids`` of ``queue``, taken and not run, back to the front
    of their queue."""
    keys = [
        queue.owners,
        queue.in_flight,
        queue.records,
        queue.ready,
        queue.queues,
        queue.messages,
        queue.incoming,
        queue.idle,
        queue.results,
    ]
    record = {
        "worker": worker_id,
        "queue": queue.queue,
        "keep_ms": GROUP_KEYS_MS,
    }
    return keys, [wire_json(record), *task_ids]
