"""Queue scaling grid: tasks/s and server CPU per task, by primaries, workers and layout.

    python -m benchmarks.cluster_queues [--quick] [--primaries 1,3,6] [--workers 1,2,4,8,12]
                                        [--count N] [--repeats R] [--out FILE]

One cell per primaries x workers x layout. One primary is a plain Redis; three or more,
a throwaway Redis Cluster of that many primaries on loopback (each size in a child
process of its own, started once for its cells). Layouts: **one group** (every worker
watches one queue group: one hash slot, so one primary), **a group per primary** (one
group whose slot sits on each primary, picked by hand; worker i watches group
i % primaries, so the layout runs with at least as many workers as primaries) and **a
sharded queue** (one queue whose group has as many shards as there are primaries,
``RCOORD["QUEUE_SHARDS"]``: the producer spreads its tasks, worker i serves shard
i % primaries). On one primary the three are the same, and only the first is run.

Each repeat of a cell enqueues ``count`` no-op tasks (``enqueue_many``, split evenly
over the groups; over the shards by the producer), starts its worker processes (imported
and connected before the clock starts) and lets them drain in burst mode. A cell reports
tasks/s (start signal to the last worker's exit), the server CPU per drained task
(``INFO cpu`` main-thread deltas around the drain, summed over the primaries) and how
many cores the busiest primary kept busy (its CPU seconds over the drain's wall seconds:
1.00 is a saturated primary). Medians over the repeats. The grid is printed and written
as JSON (``--out``). It needs nothing from the network: an installed checkout with its
``embedded`` extra (or a redis-server on PATH, or RCOORD_REDIS_SERVER) runs it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    Measurement,
    Table,
    bench_redis,
    cpu_seconds,
    print_table,
    stop_redis,
)

CLUSTER_URL = "BENCH_CLUSTER_URL"
SINGLE_URL = "BENCH_GRID_REDIS_URL"
PRIMARIES = "BENCH_GRID_PRIMARIES"
SHARDED_GROUP = "sharded"
CHILD = "--grid-child"
TASK = "bench.cluster.noop"
RESULTS = Path(__file__).parent / "results" / "cluster_queues.json"


def cluster_client() -> Any:
    from redis.cluster import RedisCluster

    return RedisCluster.from_url(os.environ[CLUSTER_URL], socket_timeout=30)


def single_client() -> Any:
    import redis

    return redis.Redis.from_url(os.environ[SINGLE_URL], socket_timeout=30)


def configure() -> None:
    """Django settings for this process: the cluster's client when BENCH_CLUSTER_URL is
    set, else the plain Redis of BENCH_GRID_REDIS_URL; the sharded group (one shard per
    primary, from BENCH_GRID_PRIMARIES); the no-op task registered."""
    import django
    from django.conf import settings

    if not settings.configured:
        factory = "cluster_client" if os.environ.get(CLUSTER_URL) else "single_client"
        settings.configure(
            INSTALLED_APPS=["django_rcoord"],
            RCOORD={
                "CLIENT_FACTORY": f"benchmarks.cluster_queues.{factory}",
                "QUEUE_SHARDS": {SHARDED_GROUP: int(os.environ.get(PRIMARIES, "1"))},
            },
        )
        django.setup()
    from django_rcoord.queues import task
    from django_rcoord.queues.registry import get_task

    if get_task(TASK) is None:
        task(name=TASK, max_retries=0)(noop)


def noop() -> None:
    pass


def drain(queue: str, ready: Any, start: Any, finished: Any) -> None:
    """One worker process: connect, wait for the start signal, drain ``queue``, report."""
    configure()
    from django_rcoord.connection import get_client
    from django_rcoord.queues.worker import Worker

    get_client().ping()
    worker = Worker([queue], burst=True)
    ready.release()
    start.wait()
    worker.run()
    finished.put((worker.processed, time.perf_counter()))


def groups_on_distinct_primaries(client: Any, how_many: int) -> list[str]:
    """Queue names of ``how_many`` groups whose slots live on different primaries (one
    group on a plain Redis)."""
    from django_rcoord.queues.keys import QueueKeys

    if not hasattr(client, "get_node_from_key"):
        return ["g0/q"]
    chosen: dict[str, str] = {}
    index = 0
    while len(chosen) < how_many:
        name = f"g{index}/q"
        chosen.setdefault(client.get_node_from_key(QueueKeys.of(name).ready).name, name)
        index += 1
    return list(chosen.values())


def primary_cpu(client: Any) -> list[float]:
    """Each primary's main-thread CPU seconds (the process's where the server has no
    main-thread figure)."""
    if not hasattr(client, "get_primaries"):
        return [cpu_seconds(client.info("cpu"))]
    sections = client.info("cpu", target_nodes=client.get_primaries())
    return [cpu_seconds(section) for _, section in sorted(sections.items())]


def run_once(queues: list[str], served: list[str], count: int, workers: int) -> dict[str, float]:
    """One repeat of a cell: tasks/s, server CPU us per task, the busiest primary's cores.
    Tasks are queued to ``queues``, evenly; worker i serves ``served[i % len(served)]``
    (``queues`` themselves, or a sharded queue's shards)."""
    from django_rcoord.connection import get_client
    from django_rcoord.queues import enqueue_many

    client = get_client()
    client.flushall()
    per_queue = count // len(queues)
    for queue in queues:
        for first in range(0, per_queue, 1000):
            enqueue_many([(TASK, (), {})] * min(1000, per_queue - first), queue=queue)
    context = multiprocessing.get_context("spawn")
    ready, start, finished = context.Semaphore(0), context.Event(), context.Queue()
    processes = [
        context.Process(target=drain, args=(served[index % len(served)], ready, start, finished))
        for index in range(workers)
    ]
    for process in processes:
        process.start()
    for _ in processes:
        ready.acquire()
    before = primary_cpu(client)
    started = time.perf_counter()
    start.set()
    results = [finished.get(timeout=600) for _ in processes]
    wall = max(ended for _, ended in results) - started
    spent = [after - was for after, was in zip(primary_cpu(client), before, strict=True)]
    for process in processes:
        process.join()
    done = sum(processed for processed, _ in results)
    if done != per_queue * len(queues):
        raise RuntimeError(f"drained {done} tasks of {per_queue * len(queues)}")
    return {
        "tasks_per_s": done / wall,
        "server_us_per_task": sum(spent) * 1e6 / done,
        "busiest_primary_cores": max(spent) / wall,
    }


def child(primaries: int, workers: list[int], count: int, repeats: int) -> None:
    """In a child process: the cells of one server size, printed as one JSON list."""
    configure()
    from django_rcoord.connection import get_client
    from django_rcoord.queues.shards import per_shard

    client = get_client()
    groups = groups_on_distinct_primaries(client, primaries)
    # Each layout: the queues tasks are queued to, and those the workers serve.
    layouts = {"one group": (groups[:1], groups[:1])}
    if primaries > 1:
        layouts["a group per primary"] = (groups, groups)
        # One queue, QUEUE_SHARDS = primaries: producers spread it, a worker per shard.
        sharded = f"{SHARDED_GROUP}/q"
        layouts["a sharded queue"] = ([sharded], [s[0] for s in per_shard([sharded])])
    cells = []
    for layout, (queues, served) in layouts.items():
        for worker_count in workers:
            if worker_count < len(served):
                continue  # a worker watches one group: some group would go unserved
            runs = [run_once(queues, served, count, worker_count) for _ in range(repeats)]
            cells.append(
                {
                    "primaries": primaries,
                    "layout": layout,
                    "workers": worker_count,
                    "tasks_per_s": [run["tasks_per_s"] for run in runs],
                    "server_us_per_task": statistics.median(
                        run["server_us_per_task"] for run in runs
                    ),
                    "busiest_primary_cores": statistics.median(
                        run["busiest_primary_cores"] for run in runs
                    ),
                }
            )
    print(json.dumps(cells))


def measure_size(primaries: int, workers: list[int], count: int, repeats: int) -> list[Any]:
    """Start a server of ``primaries`` primaries, run its cells in a child, stop it."""
    from django_rcoord.embedded import EmbeddedCluster

    env = {key: value for key, value in os.environ.items() if key != CLUSTER_URL}
    server: Any = (
        bench_redis()
        if primaries == 1
        else EmbeddedCluster(tempfile.mkdtemp(prefix="rcoord-bench-grid-"), masters=primaries)
    )
    try:
        server.start()
        env[CLUSTER_URL if primaries > 1 else SINGLE_URL] = server.url
        env[PRIMARIES] = str(primaries)
        command = [sys.executable, "-m", "benchmarks.cluster_queues", CHILD, str(primaries)]
        command += [",".join(map(str, workers)), str(count), str(repeats)]
        output = subprocess.run(command, env=env, check=True, stdout=subprocess.PIPE, text=True)
        return json.loads(output.stdout.splitlines()[-1])
    finally:
        if primaries == 1:
            stop_redis(server)  # also one interrupted while it started
        else:
            server.stop()
        shutil.rmtree(server.data_dir, ignore_errors=True)


def numbers(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one small cell per layout")
    parser.add_argument("--primaries", type=numbers, default=[1, 3, 6])
    parser.add_argument("--workers", type=numbers, default=[1, 2, 4, 8, 12])
    parser.add_argument("--count", type=int, default=20000, help="tasks per repeat")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    options = parser.parse_args()
    if options.quick:
        options.primaries, options.workers = [1, 3], [3]
        options.count, options.repeats = 3000, 1
    began = time.monotonic()
    cells = []
    for primaries in options.primaries:
        cells += measure_size(primaries, options.workers, options.count, options.repeats)
    header = (
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} "
        f"CPUs, {options.count:,} no-op tasks per repeat, {options.repeats} repeats, "
        f"{time.monotonic() - began:.0f} s"
    )
    rows = [
        Measurement(
            f"{cell['primaries']} primaries, {cell['layout']}, {cell['workers']} workers",
            "",
            cell["tasks_per_s"],
            extra={
                "server us": round(cell["server_us_per_task"], 1),
                "busiest": round(cell["busiest_primary_cores"], 2),
            },
        )
        for cell in cells
    ]
    print(header)
    print_table(
        Table(
            "Drain by primaries, layout and workers",
            "tasks/s",
            rows,
            floor=rows[0].name,
            extra_columns=("server us", "busiest"),
            note="server us: server CPU per drained task, summed over the primaries; busiest: "
            "the busiest primary's cores (1.00 = saturated)",
        )
    )
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps({"run": header, "cells": cells}, indent=1) + "\n")


if __name__ == "__main__":
    if sys.argv[1:2] == [CHILD]:
        child(int(sys.argv[2]), numbers(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    else:
        main()
