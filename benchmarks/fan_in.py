"""Fan-in benchmark: how soon the callback runs after the last child, and what counting
the children costs.

    python -m benchmarks.fan_in [--quick] [--repeats R]

1,000 no-op children (200 with --quick) and their callback (``group(...).then(...)``),
drained by two burst workers in threads of this process, beside the same number of no-op
tasks queued with ``enqueue_many`` and no callback, drained the same way; the callback in
the children's queue group (counted by the finish calls that record the children's ends),
then in another group (counted by a task of each child's own, the callback run by a
worker of that group in a third thread). The latency is read from the records, on the
Redis server's clock: the callback's start less the last child's end.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from benchmarks import queue_tasks
from benchmarks.common import Bench, Measurement, ScenarioResult, Table
from benchmarks.runner import run_benchmark

NAME = "fan_in"
QUEUE = "bench"
ELSEWHERE = "fan-in/bench"  # another queue group
WORKERS = 2
ROWS = (
    ("no-op tasks, no callback (enqueue_many)", "-"),
    ("the same as a fan-in's children, the callback in their group", "-"),
    ("the same, the callback in another group", "-"),
)


def callback(results: list[Any]) -> int:
    return len(results)


def run(bench: Bench) -> ScenarioResult:
    from django_rcoord.queues import enqueue_many, get_result, group, task

    client = bench.client
    count = bench.pick(quick=200, full=1000)
    repeats = bench.repeats_or(3)
    child = task(name="bench.fan_in.child", queue=QUEUE)(queue_tasks.noop)
    callbacks = {
        queue: task(name=f"bench.fan_in.callback.{queue}", queue=queue)(callback)
        for queue in (QUEUE, ELSEWHERE)
    }
    latencies: dict[str, list[float]] = {QUEUE: [], ELSEWHERE: []}

    def plain() -> float:
        client.flushdb()
        enqueue_many([(child, (), {})] * count)
        return count / _drain(lambda: True)

    def fan_in(queue: str) -> float:
        client.flushdb()
        job = group(*(child.s() for _ in range(count))).then(callbacks[queue].s())

        def called_back() -> bool:
            record = get_result(job.id)
            return record is not None and record.is_finished

        elapsed = _drain(called_back, queue if queue != QUEUE else None)
        finished = get_result(job.id)
        assert finished is not None
        assert finished.return_value == count, finished
        assert finished.started_at is not None
        children = [get_result(child_id) for child_id in job.children]
        last = max(record.finished_at for record in children if record and record.finished_at)
        latencies[queue].append((finished.started_at - last).total_seconds() * 1000)
        return count / elapsed

    # In turns, so that a stall of the machine falls on each alike.
    runs = [(plain(), fan_in(QUEUE), fan_in(ELSEWHERE)) for _ in range(repeats)]
    rows = [
        Measurement(name, trips, [values[index] for values in runs])
        for index, (name, trips) in enumerate(ROWS)
    ]
    drain = Table(
        f"{count:,} no-op tasks drained by {WORKERS} workers, {repeats} runs",
        "tasks/s",
        rows,
        floor=rows[0].name,
        note="a child in its callback's queue group is counted by the finish call that "
        "records its end; one in another group by a task of its own",
    )
    latency = Table(
        f"The callback's start after the last of {count:,} children ended, {repeats} runs",
        "ms",
        [
            Measurement("callback in the children's queue group", "-", latencies[QUEUE]),
            Measurement(
                "callback in another group (a worker of its own)", "-", latencies[ELSEWHERE]
            ),
        ],
        lower_is_better=True,
        note="read from the records, on the server's clock (to the millisecond)",
    )
    return ScenarioResult(
        NAME,
        "Fan-in",
        [drain, latency],
        params={"children": count, "workers": WORKERS},
        repeats=repeats,
    )


def _drain(done: Callable[[], bool], elsewhere: str | None = None) -> float:
    """Seconds for ``WORKERS`` burst workers in threads to drain the queue and ``done()``
    to be true, with a worker on queue ``elsewhere`` meanwhile when it is given."""
    from django_rcoord.queues.worker import Worker

    workers = [Worker([QUEUE], burst=True) for _ in range(WORKERS)]
    other = Worker([elsewhere]) if elsewhere else None
    threads = [threading.Thread(target=worker.run) for worker in workers]
    if other is not None:
        threads.append(threading.Thread(target=other.run))
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads[:WORKERS]:
        thread.join()
    while not done():
        time.sleep(0.0005)
    elapsed = time.perf_counter() - started
    if other is not None:
        other.stop()
        threads[-1].join()
    return elapsed


if __name__ == "__main__":
    run_benchmark(NAME, __doc__.split("\n")[0])
