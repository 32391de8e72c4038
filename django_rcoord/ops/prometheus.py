"""The Prometheus endpoint's exposition: queue sizes, workers, task outcomes and run times
(from ``django_rcoord.queues.metrics``), lateness, rendered by ``prometheus-client`` (the
``metrics`` extra, imported only here)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from django_rcoord.connection.clients import resolve_client
from django_rcoord.ops.status import overview
from django_rcoord.queues.keys import QueueKeys
from django_rcoord.queues.metrics import DURATION_BUCKETS, read_all_metrics

__all__ = ["prometheus_exposition"]


def prometheus_exposition(accept: str = "", *, client: Any = None) -> tuple[bytes, str]:
    """(body, content type): every metric in the exposition format the scraper's ``Accept``
    header asks for (Prometheus' text format by default, OpenMetrics on request), rendered
    by ``prometheus-client`` (the ``metrics`` extra)."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import choose_encoder

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(resolve_client(client)))
    encoder, content_type = choose_encoder(accept)
    return encoder(registry), content_type


class _Collector:
    """Reads Redis at scrape time (bounded work: a few reads per queue group and queue)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def collect(self) -> Iterator[Any]:
        state = overview(client=self.client)
        yield from self._queues_and_workers(state)
        yield from self._task_runs(state)
        yield from self._lateness(state)
        yield from self._task_controls(state)

    def _queues_and_workers(self, state: dict[str, Any]) -> Iterator[Any]:
        """Tasks by queue and state; live workers by group."""
        from prometheus_client.core import GaugeMetricFamily

        tasks = GaugeMetricFamily(
            "rcoord_queue_tasks",
            "Tasks in a queue, by state (ready, in_flight, delayed, dead).",
            labels=["group", "queue", "state"],
        )
        for queue in state["queues"]:
            group = QueueKeys.of(queue["name"]).group
            for name in ("ready", "in_flight", "delayed", "dead"):
                tasks.add_metric([group, queue["name"], name], queue[name])
        yield tasks

        paused = GaugeMetricFamily(
            "rcoord_queue_paused",
            "1 while a queue is paused (pause_queue: no worker takes from it), else 0.",
            labels=["group", "queue"],
        )
        for queue in state["queues"]:
            paused.add_metric(
                [QueueKeys.of(queue["name"]).group, queue["name"]], int(queue["paused"])
            )
        yield paused

        workers = GaugeMetricFamily(
            "rcoord_workers", "Live workers (heartbeat not expired).", labels=["group"]
        )
        for group, count in state["worker_counts"].items():
            workers.add_metric([group], count)
        yield workers

    def _task_runs(self, state: dict[str, Any]) -> Iterator[Any]:
        """Runs that ended, cancelled, held back, and their durations, by queue and task."""
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        finished = CounterMetricFamily(
            "rcoord_tasks_finished",
            "Task runs that ended, by outcome (succeeded, retried, failed).",
            labels=["queue", "task", "outcome"],
        )
        cancelled = CounterMetricFamily(
            "rcoord_tasks_cancelled",
            "Tasks cancel() cancelled: before they ran, or stopped running, by queue and task.",
            labels=["queue", "task"],
        )
        held_back = CounterMetricFamily(
            "rcoord_tasks_held_back",
            "Deliveries of a task held back by its rate or concurrency limit before they "
            "started (back in the delayed set; not runs), by queue and task.",
            labels=["queue", "task"],
        )
        durations = HistogramMetricFamily(
            "rcoord_task_duration_seconds", "Run time of tasks.", labels=["queue", "task"]
        )
        # A group's shards (RCOORD["QUEUE_SHARDS"]) count under the queue they spread.
        metrics = read_all_metrics(state["groups"], client=self.client)
        for (queue, task), counted in sorted(metrics.tasks.items()):
            for outcome, runs in sorted(counted.finished.items()):
                finished.add_metric([queue, task, outcome], runs)
            cumulative, running = [], 0
            for bound, runs in zip(DURATION_BUCKETS, counted.buckets, strict=True):
                running += runs
                cumulative.append(("+Inf" if bound == math.inf else repr(bound), running))
            durations.add_metric([queue, task], cumulative, counted.seconds)
        for (queue, task), count in sorted(metrics.cancelled.items()):
            cancelled.add_metric([queue, task], count)
        for (queue, task), count in sorted(metrics.held_back.items()):
            held_back.add_metric([queue, task], count)
        yield finished
        yield cancelled
        yield held_back
        yield durations

    def _lateness(self, state: dict[str, Any]) -> Iterator[Any]:
        """Lateness of delayed-task promotions and of periodic fires."""
        from prometheus_client.core import GaugeMetricFamily

        lateness = GaugeMetricFamily(
            "rcoord_delayed_lateness_seconds",
            "Lateness (due -> queued, server clock) of the last 1,000 promotions of delayed "
            "tasks, by quantile (1 is the worst).",
            labels=["group", "quantile"],
        )
        for group, late in state["promotion_lateness"].items():
            for quantile, key in (("0.5", "median_ms"), ("0.99", "p99_ms"), ("1", "max_ms")):
                lateness.add_metric([group, quantile], late[key] / 1000)
        yield lateness

        periodic = GaugeMetricFamily(
            "rcoord_periodic_lateness_seconds",
            "Lateness (tick -> queued, server clock) of a periodic task's recent fires, by "
            "quantile (1 is the worst).",
            labels=["schedule", "quantile"],
        )
        for row in state["periodic"]:
            if row.get("fires"):
                for quantile, key in (
                    ("0.5", "lateness_p50_ms"),
                    ("0.99", "lateness_p99_ms"),
                    ("1", "lateness_max_ms"),
                ):
                    periodic.add_metric([row["name"], quantile], row[key] / 1000)
        yield periodic

        # What the quantiles rest on: a p99 of three samples is the worst of three.
        samples = GaugeMetricFamily(
            "rcoord_periodic_lateness_samples",
            "How many on-time fires of a periodic task its lateness quantiles rest on.",
            labels=["schedule"],
        )
        catch_ups = GaugeMetricFamily(
            "rcoord_periodic_catch_up_fires",
            "Fires of a periodic task's ticks that fell due before their poller started "
            "(not counted as lateness).",
            labels=["schedule"],
        )
        for row in state["periodic"]:
            if "error" not in row:
                samples.add_metric([row["name"]], row["lateness_samples"])
                catch_ups.add_metric([row["name"]], row["catch_up_fires"])
        yield samples
        yield catch_ups

    def _task_controls(self, state: dict[str, Any]) -> Iterator[Any]:
        """Concurrency limits of tasks: runs holding a permit, and the limit."""
        from prometheus_client.core import GaugeMetricFamily

        concurrency_running = GaugeMetricFamily(
            "rcoord_task_concurrency_running",
            "Runs of a task holding a permit of its concurrency limit now.",
            labels=["task"],
        )
        concurrency_limit = GaugeMetricFamily(
            "rcoord_task_concurrency_limit",
            "A task's concurrency limit: most runs at once across every worker.",
            labels=["task"],
        )
        for row in state["task_controls"]:
            if row["concurrency"]:
                concurrency_running.add_metric([row["task"]], row["running"])
                concurrency_limit.add_metric([row["task"]], row["concurrency"])
        yield concurrency_running
        yield concurrency_limit
