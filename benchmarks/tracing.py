"""What OpenTelemetry tracing costs the queue: enqueue and drain, traced and not.

    python -m benchmarks.tracing [--quick] [--repeats R]
    python -m benchmarks --only tracing

Three ways, side by side in one process and one run, on a no-op task:

- **OpenTelemetry absent**: what a project without the ``otel`` extra runs (the hooks find
  no API and return at once). The floor.
- **the API, no provider**: ``opentelemetry-api`` installed and no tracer provider
  configured, as a project that has the API through another package runs: each hook asks
  the API for its provider and finds the default proxy. This row's cost over the floor
  is the instrumentation's overhead (the issue's bound: under 3%).
- **traced**: an SDK ``TracerProvider`` whose spans go to an in-memory exporter (a
  PRODUCER span per enqueue, a CONSUMER span per run, the trace context in each message):
  what tracing itself costs, for information.

Enqueue: ``delay()`` calls, the ways taking turns every 50 calls. Drain: a burst
``Worker`` in this process over a full queue, the ways taking turns per repeat.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from benchmarks.common import Bench, Measurement, ScenarioResult, Table, measure_side_by_side
from benchmarks.runner import run_benchmark

NAME = "tracing"
QUEUE = "tracing"
ABSENT = "OpenTelemetry absent"
NO_PROVIDER = "the API, no provider (the instrumentation's overhead)"
TRACED = "traced: SDK provider, in-memory exporter"


def ways() -> dict[str, Callable[[], Any]]:
    """Each way, as the ``tracing.tracer`` function the hooks call."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from django_rcoord import tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    sdk_tracer = provider.get_tracer("django_rcoord")

    def traced() -> Any:
        exporter.clear()  # keep memory flat: the spans are made and exported, then dropped
        return sdk_tracer

    return {ABSENT: lambda: None, NO_PROVIDER: tracing.tracer, TRACED: traced}


@contextmanager
def way(tracer: Callable[[], Any]) -> Iterator[None]:
    """Run the hooks with ``tracer`` as ``django_rcoord.tracing.tracer``."""
    from django_rcoord import tracing

    shipped = tracing.tracer
    tracing.tracer = tracer
    try:
        yield
    finally:
        tracing.tracer = shipped


def noop_task() -> Any:
    from benchmarks import queue_tasks
    from django_rcoord.queues import task

    return task(name="bench.tracing.noop", queue=QUEUE, max_retries=0)(queue_tasks.noop)


def enqueue_rows(bench: Bench, count: int, repeats: int) -> list[Measurement]:
    noop = noop_task()
    operations = []
    for name, tracer in ways().items():

        def enqueue(tracer: Callable[[], Any] = tracer) -> None:
            with way(tracer):
                noop.delay()

        operations.append((name, "1", enqueue))
    rows = measure_side_by_side(operations, count=count, repeats=repeats)
    bench.client.flushdb()
    return rows


def drain_rows(bench: Bench, count: int, repeats: int) -> list[Measurement]:
    from django_rcoord.queues.worker import Worker

    noop = noop_task()
    by_name = ways()
    rows = {name: Measurement(name, "1 per batch", []) for name in by_name}
    for round_ in range(repeats + 1):  # the first round warms up and is not kept
        for name, tracer in by_name.items():
            bench.client.flushdb()
            for _ in range(count):
                noop.delay()
            worker = Worker([QUEUE], burst=True)
            with way(tracer):
                started = time.perf_counter()
                worker.run()
                seconds = time.perf_counter() - started
            if worker.processed != count:
                raise RuntimeError(f"the worker ran {worker.processed} of {count} tasks")
            if round_:
                rows[name].values.append(count / seconds)
    bench.client.flushdb()
    return list(rows.values())


def run(bench: Bench) -> ScenarioResult:
    count = bench.pick(quick=2000, full=10000)
    repeats = bench.repeats_or(5)
    note = "vs floor: the rate beside OpenTelemetry absent's (0.97 = 3% slower)"
    rows = {
        f"Enqueue with tracing: {count:,} delay() calls, {repeats} runs": enqueue_rows,
        f"Drain with tracing: {count:,} no-op tasks, one burst worker, {repeats} runs": drain_rows,
    }
    tables = [
        Table(title, "tasks/s", measure(bench, count, repeats), floor=ABSENT, note=note)
        for title, measure in rows.items()
    ]
    return ScenarioResult(NAME, "OpenTelemetry tracing", tables, params={}, repeats=repeats)


if __name__ == "__main__":
    run_benchmark(NAME, (__doc__ or "").splitlines()[0])
