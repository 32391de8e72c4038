"""Fair queues benchmark: how long a key with one task waits behind a key with many.

    python -m benchmarks.fair [--quick] [--repeats R]

One key with 100,000 no-op tasks waiting (5,000 with --quick), then 50 keys with one task
each, queued with ``enqueue_many``; two workers in threads of this process take from the
queue, one task a take, until the 50 have started. Each of the 50 records when it
started, on the Redis server's clock; its wait is that less the server's time when the 50
were queued. Beside it the same run without keys (``@task`` without ``fair_key``): the 50
wait behind the whole backlog. The big key's tasks that workers took before the last of
the 50 started are counted.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

from benchmarks.common import Bench, Measurement, ScenarioResult, Table
from benchmarks.runner import run_benchmark

NAME = "fair"
QUEUE = "bench"
WORKERS = 2
SMALL_KEYS = 50
STARTS = "bench:fair:starts"
#: The big key's tasks that workers took before the last of the small keys' started.
TAKEN_FIRST = "big key's taken first"
#: The client the tasks record their starts with (this process's threads run them).
_client: Any = None


def big(key: str) -> None:
    """A no-op task of the big key."""


def small(key: str) -> None:
    """A task of a small key: it records when it started, on the server's clock, and how
    many tasks were ready then."""
    from django_rcoord.queues import queue_stats

    seconds, microseconds = _client.time()
    ready = queue_stats(QUEUE, client=_client)["ready"]
    _client.rpush(STARTS, f"{seconds * 1000 + microseconds / 1000}|{ready}")


def run(bench: Bench) -> ScenarioResult:
    from django_rcoord.queues import task

    global _client  # noqa: PLW0603  (read by the tasks, in this process's worker threads)
    _client = bench.client
    count = bench.pick(quick=5_000, full=100_000)
    repeats = bench.repeats_or(3)
    ways = {
        keyed: (
            task(name=f"bench.fair.big.{keyed}", queue=QUEUE, **_keyed(keyed))(big),
            task(name=f"bench.fair.small.{keyed}", queue=QUEUE, **_keyed(keyed))(small),
        )
        for keyed in (True, False)
    }
    waits: dict[bool, list[list[float]]] = {True: [], False: []}
    ahead: dict[bool, list[float]] = {True: [], False: []}
    # In turns, so that a stall of the machine falls on each alike.
    for _ in range(repeats):
        for keyed, (big_task, small_task) in ways.items():
            wait, ran = _one_run(bench.client, big_task, small_task, count)
            waits[keyed].append(wait)
            ahead[keyed].append(ran)
    rows = []
    for keyed, label in ((False, "no keys"), (True, "fair_key")):
        for how, pick in (("median", statistics.median), ("longest", max)):
            rows.append(
                Measurement(
                    f"{label}: the {SMALL_KEYS} one-task keys' {how} wait",
                    "-",
                    [pick(wait) for wait in waits[keyed]],
                    extra={TAKEN_FIRST: statistics.median(ahead[keyed])},
                )
            )
    table = Table(
        f"One key with {count:,} tasks waiting, then {SMALL_KEYS} keys with one each; "
        f"{WORKERS} workers, {repeats} runs",
        "ms",
        rows,
        floor=rows[0].name,
        lower_is_better=True,
        extra_columns=(TAKEN_FIRST,),
        note="each wait: the task's start less the time the 50 were queued, on the server's "
        "clock (to the millisecond)",
    )
    return ScenarioResult(
        NAME,
        "Fair queues",
        [table],
        params={"big_key_tasks": count, "small_keys": SMALL_KEYS, "workers": WORKERS},
        repeats=repeats,
    )


def _keyed(keyed: bool) -> dict[str, Any]:
    return {"fair_key": lambda key: key} if keyed else {}


def _one_run(client: Any, big_task: Any, small_task: Any, count: int) -> tuple[list[float], int]:
    """The waits of the small keys' tasks (ms), and how many big-key tasks workers took
    before the last of them started (those not ready then: every small one was taken)."""
    from django_rcoord.queues import enqueue_many

    client.flushdb()
    for first in range(0, count, 10_000):
        enqueue_many([(big_task, ("big",), {})] * min(10_000, count - first))
    seconds, microseconds = client.time()
    queued_at = seconds * 1000 + microseconds / 1000
    enqueue_many([(small_task, (f"small{n}",), {}) for n in range(SMALL_KEYS)])
    _work_until(lambda: client.llen(STARTS) >= SMALL_KEYS)
    starts = [entry.decode().split("|") for entry in client.lrange(STARTS, 0, -1)]
    waits = [float(ms) - queued_at for ms, _ in starts]
    return waits, count - int(starts[-1][1])


def _work_until(done: Any) -> None:
    """``WORKERS`` workers in threads take from the queue until ``done()``; then they stop
    (and give back what they hold)."""
    from django_rcoord.queues.worker import Worker

    # One task a take: a worker thread holding a prefetched batch waits for the GIL while
    # the other runs, which would measure the threads' turns, not the queue's order.
    workers = [Worker([QUEUE], prefetch=1) for _ in range(WORKERS)]
    threads = [threading.Thread(target=worker.run) for worker in workers]
    for thread in threads:
        thread.start()
    while not done():
        time.sleep(0.001)
    for worker in workers:
        worker.stop()
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    run_benchmark(NAME, __doc__.split("\n")[0])
