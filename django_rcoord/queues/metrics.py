"""Task metrics: what workers count inside the script that finishes a task, read back for
the dashboard, the JSON stats and the Prometheus endpoint (``django_rcoord.ops`` reads
them here; the queue writes and reads its metrics in this one module).

Each queue group keeps one HASH (``QueueKeys.metrics``) that ``task_finish.lua`` updates
in the same call that acknowledges, retries or dead-letters a task (no extra round trip,
and any number of worker processes add up):

- per queue, task, outcome and duration bucket: how many runs ended so;
- per queue, task and outcome: their total run time (microseconds);
- per queue, a ring of 60 fields: tasks finished in each of the last 60 minutes;
- per queue and task: deliveries held back by the task's rate or concurrency limit
  before they started (not runs: not in the counts above);
- per queue and task: tasks cancelled before they ran (counted by ``task_cancel.lua``, in
  the same step as the cancellation), or stopped by their worker while running (counted
  by ``task_stopped.lua``, which finishes the run).

``django_rcoord.ops.prometheus`` serves them to Prometheus.

Outcomes are ``succeeded``, ``retried`` (failed, another attempt is due) and ``failed``
(a dead letter now).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from django_rcoord.connection.clients import resolve_client
from django_rcoord.queues.keys import GroupKeys
from django_rcoord.queues.outcomes import Kind
from django_rcoord.queues.shards import logical_queue_name

__all__ = [
    "DURATION_BUCKETS",
    "OUTCOMES",
    "QueueMetrics",
    "cancelled_in",
    "duration_bucket",
    "finished_per_minute",
    "metric_labels",
    "read_all_metrics",
    "read_metrics",
]

#: Upper bounds (seconds) of the run-time histogram's buckets; the last is +Inf.
DURATION_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    math.inf,
)
#: The finish script's outcome -> the metric's label value.
OUTCOMES: dict[str, str] = {
    Kind.ACK: "succeeded",
    Kind.RETRY: "retried",
    Kind.DEFER: "deferred",
    Kind.DEAD: "failed",
}
_SEPARATOR = "\x1f"  # between the labels of a field name (no queue or task name holds it)
_LABEL_LIMIT = 200  # a longer task name (only a malformed message has one) is cut


def metric_labels(queue: str, task: str) -> str:
    """The labels the finish script counts a run under."""
    clean = task.replace(_SEPARATOR, " ")[:_LABEL_LIMIT] or "?"
    return f"{queue}{_SEPARATOR}{clean}"


def duration_bucket(seconds: float) -> int:
    """The index of the first bucket whose bound is at least ``seconds``."""
    return bisect.bisect_left(DURATION_BUCKETS, seconds)


@dataclass
class TaskMetrics:
    """The runs of one task of one queue: by outcome, and their run-time histogram."""

    finished: dict[str, int] = field(default_factory=dict)  # outcome -> runs
    buckets: list[int] = field(default_factory=lambda: [0] * len(DURATION_BUCKETS))
    seconds: float = 0.0  # total run time


@dataclass
class QueueMetrics:
    """The metrics of one queue group: per (queue, task), and finished per minute."""

    tasks: dict[tuple[str, str], TaskMetrics] = field(default_factory=dict)
    minutes: dict[str, dict[int, int]] = field(default_factory=dict)  # queue -> minute -> n
    cancelled: dict[tuple[str, str], int] = field(default_factory=dict)  # (queue, task) -> n
    held_back: dict[tuple[str, str], int] = field(default_factory=dict)  # (queue, task) -> n


def read_metrics(group: str, *, client: Any = None) -> QueueMetrics:
    """One HGETALL of the group's metrics HASH (its size is set by the number of queues and
    task names, not by the number of tasks run)."""
    return metrics_from_hash(resolve_client(client).hgetall(GroupKeys.of(group).metrics))


def read_all_metrics(groups: Iterable[str], *, client: Any = None) -> QueueMetrics:
    """The metrics of ``groups`` together (one pipelined HGETALL each), a queue of a group's
    shards (``RCOORD["QUEUE_SHARDS"]``) counted under the queue its tasks were queued to."""
    with resolve_client(client).pipeline(transaction=False) as pipe:
        for group in groups:
            pipe.hgetall(GroupKeys.of(group).metrics)
        hashes = pipe.execute()
    return _parse((item for raw in hashes for item in raw.items()), logical_queue_name)


def metrics_from_hash(raw: dict[bytes, bytes]) -> QueueMetrics:
    """The group's metrics from the HGETALL of its metrics HASH (read in a pipeline)."""
    return _parse(raw.items())


def _parse(
    items: Iterable[tuple[bytes, bytes]], queue_name: Callable[[str], str] = str
) -> QueueMetrics:
    """The metrics of ``items`` (fields of metrics HASHes), each queue's under
    ``queue_name(queue)``: what several fields count of one queue and task is added up."""
    found = QueueMetrics()
    for raw_field, raw_value in items:
        kind, *labels = raw_field.decode(errors="replace").split(_SEPARATOR)
        value = raw_value.decode()
        if kind == "m" and len(labels) == 2:
            minute, _, count = value.partition(":")
            if minute.isdigit() and count.isdigit():
                seen = found.minutes.setdefault(queue_name(labels[0]), {})
                seen[int(minute)] = seen.get(int(minute), 0) + int(count)
            continue
        if kind in ("c", "h") and len(labels) == 2 and value.isdigit():
            counts = found.cancelled if kind == "c" else found.held_back
            key = (queue_name(labels[0]), labels[1])
            counts[key] = counts.get(key, 0) + int(value)
            continue
        if kind not in ("n", "s") or len(labels) < 3:
            continue
        queue, task = queue_name(labels[0]), labels[1]
        outcome = OUTCOMES.get(labels[2], labels[2])
        metrics = found.tasks.setdefault((queue, task), TaskMetrics())
        if kind == "s":
            metrics.seconds += int(value) / 1e6
            continue
        if len(labels) != 4 or not labels[3].isdigit():
            continue
        index = min(int(labels[3]), len(DURATION_BUCKETS) - 1)
        metrics.buckets[index] += int(value)
        metrics.finished[outcome] = metrics.finished.get(outcome, 0) + int(value)
    return found


def finished_per_minute(metrics: QueueMetrics, queue: str, now_ms: int) -> list[int]:
    """Tasks of ``queue`` finished in each of the last 60 minutes, oldest first (the last
    is the current minute, still counting)."""
    current = now_ms // 60_000
    seen = metrics.minutes.get(queue, {})
    return [seen.get(minute, 0) for minute in range(current - 59, current + 1)]


def cancelled_in(metrics: QueueMetrics, queue: str) -> int:
    """Tasks of ``queue`` cancelled (before they ran, or stopped while running), every task
    name together."""
    return sum(count for (name, _), count in metrics.cancelled.items() if name == queue)
