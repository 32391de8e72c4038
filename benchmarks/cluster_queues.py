"""Queue throughput on a 3-master Redis Cluster: work spread over three queue
groups (one per primary) beside the same work in one group, same worker count.

python -m benchmarks.cluster_queues [--count N] [--workers W] [--repeats R]

Each repeat enqueues ``count`` no-op tasks (split evenly over the groups), then
starts ``workers`` worker processes (imported and connected before the clock
starts) that drain them in burst mode; the rate is tasks per second from the
start signal to the last worker's exit. With three groups, worker i watches
group i % 3; with one group, every worker watches it.
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import os
import tempfile
import time

from benchmarks.common import Measurement, Table, print_table

CLUSTER_URL = "BENCH_CLUSTER_URL"


def cluster_client():
    from redis.cluster import RedisCluster

    return RedisCluster.from_url(os.environ[CLUSTER_URL], socket_timeout=30)


def configure() -> None:
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            INSTALLED_APPS=["django_rcoord"],
            RCOORD={"CLIENT_FACTORY": "benchmarks.cluster_queues.cluster_client"},
        )
        django.setup()
    from django_rcoord.queues import task

    task(name="bench.cluster.noop", max_retries=0)(noop)


def noop() -> None:
    pass


def drain(queue: str, ready, start, finished) -> None:
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


def groups_on_distinct_primaries(client, how_many: int) -> list[str]:
    """Queue group names whose slots live on ``how_many`` different primaries."""
    from django_rcoord.queues.keys import QueueKeys

    chosen: dict[str, str] = {}
    index = 0
    while len(chosen) < how_many:
        name = f"g{index}/q"
        node = client.get_node_from_key(QueueKeys.of(name).ready).name
        chosen.setdefault(node, name)
        index += 1
    return list(chosen.values())


def run_once(queues: list[str], count: int, workers: int) -> float:
    from django_rcoord.connection import get_client
    from django_rcoord.queues import enqueue_many

    client = get_client()
    client.flushall()
    per_queue = count // len(queues)
    for queue in queues:
        for first in range(0, per_queue, 1000):
            size = min(1000, per_queue - first)
            enqueue_many([("bench.cluster.noop", (), {})] * size, queue=queue)
    context = multiprocessing.get_context("spawn")
    ready, start, finished = context.Semaphore(0), context.Event(), context.Queue()
    processes = [
        context.Process(target=drain, args=(queues[index % len(queues)], ready, start, finished))
        for index in range(workers)
    ]
    for process in processes:
        process.start()
    for _ in processes:
        ready.acquire()
    started = time.perf_counter()
    start.set()
    results = [finished.get(timeout=600) for _ in processes]
    for process in processes:
        process.join()
    done = sum(processed for processed, _ in results)
    if done != per_queue * len(queues):
        raise RuntimeError(f"drained {done} tasks of {per_queue * len(queues)}")
    return done / (max(ended for _, ended in results) - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=15000, help="tasks per repeat")
    parser.add_argument("--workers", type=int, default=3, help="worker processes")
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()

    from django_rcoord.embedded import EmbeddedCluster

    server = EmbeddedCluster(tempfile.mkdtemp(prefix="rcoord-bench-cluster-")).start()
    os.environ[CLUSTER_URL] = server.url
    try:
        configure()
        from django_rcoord.connection import get_client

        client = get_client()
        primary = client.get_redis_connection(client.get_primaries()[0])
        version = primary.info("server")["redis_version"]
        print(
            f"{datetime.date.today()}: Redis {version} cluster of 3 primaries on loopback, "
            f"{os.cpu_count()} CPUs; {options.count:,} no-op tasks, {options.workers} worker "
            f"processes, {options.repeats} repeats"
        )
        spread = groups_on_distinct_primaries(client, 3)
        layouts = {"1 group (1 primary)": spread[:1], "3 groups (3 primaries)": spread}
        rows = [Measurement(name, "1 + 1", []) for name in layouts]
        for _ in range(options.repeats):
            for row in rows:  # interleaved, so drift hits both
                row.values.append(run_once(layouts[row.name], options.count, options.workers))
        print_table(
            Table(
                f"Enqueue then drain with {options.workers} worker processes",
                "tasks/s",
                rows,
                floor=rows[0].name,
                note="vs floor = against one group",
            )
        )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
