"""Fan-in benchmark: how soon the callback runs after the last child, and what counting
the children costs.

    python -m benchmarks.fan_in [--quick] [--repeats R]

1,000 no-op children (200 with --quick) and their callback (``group(...).then(...)``),
drained by two burst workers in threads of this process, beside the same number of no-op
tasks queued with ``enqueue_many`` and no callback, drained the same way. The latency is
read from the records, on the Redis server's clock: the callback's start less the last
child's end. It holds the recording of that child's end (the worker's next exchange),
its count (a task of its own) and the take of the callback.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from benchmarks import queue_tasks
from benchmarks.common import Bench, Measurement, ScenarioResult, Table
from benchmarks.runner import run_benchmark

NAME = "fan_in"
QUEUE = "bench"
WORKERS = 2


def callback(results: list[Any]) -> int:
    return len(results)


def run(bench: Bench) -> ScenarioResult:
    from django_rcoord.queues import enqueue_many, get_result, group, task

    client = bench.client
    count = bench.pick(quick=200, full=1000)
    repeats = bench.repeats_or(3)
    child = task(name="bench.fan_in.child", queue=QUEUE)(queue_tasks.noop)
    done = task(name="bench.fan_in.callback", queue=QUEUE)(callback)
    latencies: list[float] = []

    def plain() -> float:
        client.flushdb()
        enqueue_many([(child, (), {})] * count)
        return count / _drain()

    def fan_in() -> float:
        client.flushdb()
        job = group(*(child.s() for _ in range(count))).then(done.s())
        elapsed = _drain()
        finished = get_result(job.id)
        assert finished is not None
        assert finished.return_value == count, finished
        children = [get_result(child_id) for child_id in job.children]
        last = max(record.finished_at for record in children if record and record.finished_at)
        assert finished.started_at is not None
        latencies.append((finished.started_at - last).total_seconds() * 1000)
        return count / elapsed

    # In turns, so that a stall of the machine falls on both alike.
    pairs = [(plain(), fan_in()) for _ in range(repeats)]
    rows = [
        Measurement("no-op tasks, no callback (enqueue_many)", "-", [p for p, _ in pairs]),
        Measurement(
            "the same as a fan-in's children, with its callback", "-", [f for _, f in pairs]
        ),
    ]
    drain = Table(
        f"{count:,} no-op tasks drained by {WORKERS} workers, {repeats} runs",
        "tasks/s",
        rows,
        floor=rows[0].name,
        note="each fan-in child also queues and runs the task that counts it",
    )
    latency = Table(
        f"The callback's start after the last of {count:,} children ended, {repeats} runs",
        "ms",
        [Measurement("fan-in callback latency (server clock)", "-", latencies)],
        lower_is_better=True,
    )
    return ScenarioResult(
        NAME,
        "Fan-in",
        [drain, latency],
        params={
            "children": count,
            "workers": WORKERS,
        },
        repeats=repeats,
    )


def _drain() -> float:
    """Seconds for ``WORKERS`` burst workers in threads to drain the queue."""
    from django_rcoord.queues.worker import Worker

    workers = [Worker([QUEUE], burst=True) for _ in range(WORKERS)]
    threads = [threading.Thread(target=worker.run) for worker in workers]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


if __name__ == "__main__":
    run_benchmark(NAME, __doc__.split("\n")[0])
