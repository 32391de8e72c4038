"""What the Redis server spends on each task: server CPU per task, beside a floor.

    python -m benchmarks.server_cost [--quick] [--repeats R]
    python -m benchmarks --only server_cost

The server's own counters are read around each phase: ``INFO cpu`` (the main thread's
user + system time where the server reports it, Redis 6.2+ and Valkey; the process's
otherwise) and ``INFO commandstats``: the time spent in scripts (``EVALSHA``, the commands
they run included) and in every other command (the commands the scripts ran, the floor's,
and a worker's few own; the benchmark's ``INFO`` and ``CONFIG`` left out). A script's time
less the commands it ran is its own work: invoking it, its Lua, each ``redis.call``.
They count the server's work only, so the client running on the same machine does not
count, whatever the machine's load (a busy machine makes both a little dearer).

Per no-op task: **enqueue** (one ``delay()`` each), **take + finish** (a burst worker in
this process: it takes up to 32 at a time and acknowledges them with the next take),
and **end to end**, their sum. The floor, in the same run: a bare ``RPUSH`` and ``LPOP``
per task, pipelined 100 at a time (what a list costs the server, with no lease, no
result, no retry). Each row once for a plain task and once with options
(``unique_for=60``, ``timeout=10``: a claim per task and a time limit). Every row once on
one Redis and once on a throwaway 3-primary Redis Cluster (its primaries' counters
summed; measured by a child process whose client is the cluster's, ``BENCH_CLUSTER_URL``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from benchmarks.common import (
    Bench,
    Measurement,
    ScenarioResult,
    Table,
    cpu_seconds,
    percentile,
)
from benchmarks.runner import run_benchmark

NAME = "server_cost"
QUEUE = "cost"
FLOOR_BATCH = 100
CLUSTER_URL = "BENCH_CLUSTER_URL"
CLUSTER_CHILD = "--cluster-child"


@dataclass(frozen=True)
class Counters:
    """The server's CPU seconds, its seconds in scripts and in every other command (those
    the scripts ran among them: commandstats counts a script's commands under their own
    names too), as it reports them."""

    cpu: float
    scripts: float
    commands: float

    def __sub__(self, other: Counters) -> Counters:
        return Counters(
            self.cpu - other.cpu, self.scripts - other.scripts, self.commands - other.commands
        )

    def __add__(self, other: Counters) -> Counters:
        return Counters(
            self.cpu + other.cpu, self.scripts + other.scripts, self.commands + other.commands
        )


def read_counters(client: Any) -> Counters:
    """The server's counters; on Redis Cluster, the sum of every primary's."""
    if not hasattr(client, "get_primaries"):
        return Counters(
            cpu_seconds(client.info("cpu")), *_command_seconds(client.info("commandstats"))
        )
    primaries = client.get_primaries()
    cpu = client.info("cpu", target_nodes=primaries)
    stats = [
        _command_seconds(section)
        for section in client.info("commandstats", target_nodes=primaries).values()
    ]
    return Counters(
        sum(cpu_seconds(section) for section in cpu.values()),
        sum(scripts for scripts, _ in stats),
        sum(commands for _, commands in stats),
    )


#: Commands that run a script (their time includes the commands the script runs).
SCRIPT_COMMANDS = {"cmdstat_eval", "cmdstat_evalsha", "cmdstat_eval_ro", "cmdstat_evalsha_ro"}


def _command_seconds(section: dict[str, Any]) -> tuple[float, float]:
    """(seconds in scripts, seconds in every other command) of an INFO commandstats
    section, the benchmark's own INFO and CONFIG left out."""
    scripts = commands = 0.0
    for name, stats in section.items():
        if (
            not isinstance(stats, dict)
            or name == "cmdstat_info"
            or name.startswith("cmdstat_config")
        ):
            continue
        if name in SCRIPT_COMMANDS:
            scripts += float(stats["usec"])
        else:
            commands += float(stats["usec"])
    return scripts / 1e6, commands / 1e6


def per_task_us(client: Any, count: int, work: Any) -> Counters:
    """Run ``work()`` and return what the server spent on it, in us per task."""
    before = read_counters(client)
    work()
    spent = read_counters(client) - before
    return Counters(
        spent.cpu * 1e6 / count, spent.scripts * 1e6 / count, spent.commands * 1e6 / count
    )


def floor_work(client: Any, count: int) -> tuple[Any, Any]:
    """The floor's two halves: RPUSH ``count`` items, then LPOP them, pipelined."""

    def push() -> None:
        for start in range(0, count, FLOOR_BATCH):
            with client.pipeline(transaction=False) as pipe:
                for _ in range(min(FLOOR_BATCH, count - start)):
                    pipe.rpush("cost:floor", b"x" * 40)
                pipe.execute()

    def pop() -> None:
        for start in range(0, count, FLOOR_BATCH):
            with client.pipeline(transaction=False) as pipe:
                for _ in range(min(FLOOR_BATCH, count - start)):
                    pipe.lpop("cost:floor")
                pipe.execute()

    return push, pop


def tasks() -> dict[str, Any]:
    """The benchmark's two tasks: plain, and with options."""
    from benchmarks import queue_tasks
    from django_rcoord.queues import task

    return {
        "plain": task(name="bench.cost.noop", queue=QUEUE, max_retries=0)(queue_tasks.noop),
        "options": task(
            name="bench.cost.options", queue=QUEUE, max_retries=0, unique_for=60, timeout=10
        )(noop_with_argument),
    }


def noop_with_argument(number: int) -> None:
    pass


def enqueue(noop: Any, kind: str, count: int) -> None:
    """``count`` delay() calls (new arguments each: a unique task's claims all differ)."""
    if kind == "plain":
        for _ in range(count):
            noop.delay()
    else:
        for number in range(count):
            noop.delay(number)


def measure(bench: Bench, count: int, repeats: int) -> list[Measurement]:
    """One row per phase and kind of task, in server CPU us per task (commands' us in
    ``extra``)."""
    from django_rcoord.queues.worker import Worker

    client = bench.client
    by_task = tasks()
    results: dict[str, list[Counters]] = {}

    def add(row: str, counters: Counters) -> None:
        results.setdefault(row, []).append(counters)

    for _ in range(repeats):
        client.flushdb()
        push, pop = floor_work(client, count)
        pushed, popped = per_task_us(client, count, push), per_task_us(client, count, pop)
        add("floor", pushed + popped)
        for kind, noop in by_task.items():
            client.flushdb()
            enqueued = per_task_us(
                client, count, lambda noop=noop, kind=kind: enqueue(noop, kind, count)
            )
            worker = Worker([QUEUE], burst=True)
            drained = per_task_us(client, count, worker.run)
            if worker.processed != count:
                raise RuntimeError(f"the worker ran {worker.processed} of {count} tasks")
            add(f"{kind}:enqueue", enqueued)
            add(f"{kind}:take+finish", drained)
            add(f"{kind}:end to end", enqueued + drained)
    names = {
        "floor": ("RPUSH + LPOP per task, pipelined (the floor)", "2 commands"),
        "plain:enqueue": ("django-rcoord: enqueue (delay)", "1 script"),
        "plain:take+finish": ("django-rcoord: take + finish (burst worker)", "1 script per batch"),
        "plain:end to end": ("django-rcoord: end to end", ""),
        "options:enqueue": ("with unique_for and timeout: enqueue", "1 script"),
        "options:take+finish": ("with unique_for and timeout: take + finish", "1 script per batch"),
        "options:end to end": ("with unique_for and timeout: end to end", ""),
    }
    return [
        Measurement(
            names[row][0],
            names[row][1],
            [counters.cpu for counters in values],
            extra={
                "in scripts": round(percentile([c.scripts for c in values], 0.5), 2),
                "in commands": round(percentile([c.commands for c in values], 0.5), 2),
            },
        )
        for row, values in results.items()
    ]


def cluster_rows(count: int, repeats: int) -> list[Measurement]:
    """The same rows on a throwaway 3-primary Redis Cluster (the counters summed over the
    primaries), measured by a child process whose client is the cluster's."""
    from django_rcoord.embedded import EmbeddedCluster

    cluster = EmbeddedCluster(tempfile.mkdtemp(prefix="rcoord-bench-cost-")).start()
    try:
        child = subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.server_cost",
                CLUSTER_CHILD,
                str(count),
                str(repeats),
            ],
            env={**os.environ, CLUSTER_URL: cluster.url},
            capture_output=True,
            text=True,
            check=True,
        )
    finally:
        cluster.stop()
        shutil.rmtree(cluster.data_dir, ignore_errors=True)
    return [
        Measurement(
            f"cluster: {row['name']}", row["round_trips"], row["values"], extra=row["extra"]
        )
        for row in json.loads(child.stdout.splitlines()[-1])
    ]


def cluster_child(count: int, repeats: int) -> None:
    """In the child: measure on the cluster of ``BENCH_CLUSTER_URL``, print the rows as JSON."""
    from benchmarks.cluster_queues import cluster_client, configure

    configure()
    client = cluster_client()
    rows = measure(Bench(client, os.environ[CLUSTER_URL], quick=True), count, repeats)
    print(json.dumps([vars(row) for row in rows]))


def table(bench: Bench) -> Table:
    count = bench.pick(quick=2000, full=20000)
    repeats = bench.repeats_or(3)
    return Table(
        f"Server CPU per no-op task: {count:,} tasks, {repeats} runs, on one Redis and on a "
        "3-primary Redis Cluster",
        "server CPU us per task",
        measure(bench, count, repeats) + cluster_rows(count, repeats),
        floor="RPUSH + LPOP per task, pipelined (the floor)",
        lower_is_better=True,
        extra_columns=("in scripts", "in commands"),
        note="server CPU: INFO cpu (main thread) deltas; in scripts, in commands: INFO "
        "commandstats usec deltas, of the scripts (the commands they run included) and of "
        "every other command (the commands the scripts ran among them); medians",
    )


def run(bench: Bench) -> ScenarioResult:
    result = table(bench)
    repeats = len(result.rows[0].values)
    return ScenarioResult(NAME, "Server CPU per task", [result], params={}, repeats=repeats)


if __name__ == "__main__":
    if sys.argv[1:2] == [CLUSTER_CHILD]:
        cluster_child(int(sys.argv[2]), int(sys.argv[3]))
    else:
        run_benchmark(NAME, (__doc__ or "").splitlines()[0])
