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

Per no-op task, three phases, each in a table of its own beside its floor, measured in
the same run: **enqueue** (one ``delay()`` each: a plain task is one ``RPUSH`` to its
group's incoming list while a worker serves the group, which the benchmark's ``serving``
key says as a worker's heartbeat does, and the first call of each run reads by the script)
beside one ``RPUSH`` per round trip (what any enqueue of one call pays); **drain** (a
burst worker in this process, whose takes place what the incoming list holds: it takes up
to 32 at a time and acknowledges them with the next take, results kept) beside ``LPOP``
pipelined 100 at a time; **end to end**, their sum, beside ``RPUSH`` + ``LPOP`` pipelined
(a list with no lease, no result, no retry). The lists users run as queues are measured
the same way, one call per round trip as they run them (``server_cost_lists``): the
book's queue (``RPUSH``, ``BLPOP``) and the reliable list (``LPUSH``, ``BLMOVE`` +
``LREM``). Each row's **x floor** is its median over its floor's, which is how the
queue-core issue's targets read (enqueue <= 1.2x one ``RPUSH`` per round trip, drain
<= 5x the pipelined ``LPOP``); a last table reads them out. django-rcoord's rows once for
a plain task and once with options (``unique_for=60``, ``timeout=10``: a claim per task
and a time limit).

Calls are sent back to back, the server's main thread and the client pinned to one CPU,
the same (``benchmarks.pinning``): the same command costs the server 2-4x more when calls
arrive milliseconds apart. Every table once on one Redis and once on a throwaway 3-primary Redis
Cluster (its primaries' counters summed; measured by a child process whose client is the
cluster's, ``BENCH_CLUSTER_URL``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks import server_cost_lists
from benchmarks.common import (
    Bench,
    Measurement,
    ScenarioResult,
    Table,
    TextTable,
    cpu_seconds,
    percentile,
)
from benchmarks.pinning import pinned
from benchmarks.runner import run_benchmark

NAME = "server_cost"
QUEUE = "cost"
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


#: Each phase's rows, its floor first: (pattern, row name, round trips). A row is the
#: pattern's enqueue, its drain (take and acknowledge, or take + finish), or their sum.
PHASES: dict[str, list[tuple[str, str, str]]] = {
    "enqueue": [
        ("one call", "one RPUSH per round trip (the enqueue floor)", "1 per task"),
        ("floor", "RPUSH, pipelined 100 at a time", "1 per 100 tasks"),
        ("book", "the book's queue: RPUSH", "1 per task"),
        ("reliable", "reliable list: LPUSH", "1 per task"),
        ("plain", "django-rcoord: enqueue (delay)", "1 RPUSH"),
        ("options", "with unique_for and timeout: enqueue", "1 script"),
    ],
    "drain": [
        ("floor", "LPOP, pipelined 100 at a time (the drain floor)", "1 per 100 tasks"),
        ("book", "the book's queue: BLPOP", "1 per task"),
        ("reliable", "reliable list: BLMOVE + LREM", "2 per task"),
        ("plain", "django-rcoord: take + finish (burst worker)", "1 script per batch"),
        ("options", "with unique_for and timeout: take + finish", "1 script per batch"),
    ],
    "end to end": [
        ("floor", "RPUSH + LPOP per task, pipelined (the floor)", "2 per 100 tasks"),
        ("book", "the book's queue: end to end", "2 per task"),
        ("reliable", "reliable list: end to end", "3 per task"),
        ("plain", "django-rcoord: end to end", ""),
        ("options", "with unique_for and timeout: end to end", ""),
    ],
}


def measure(bench: Bench, count: int, repeats: int) -> list[Measurement]:
    """Every row of ``PHASES``, in server CPU us per task (the commandstats split in
    ``extra``); each repeat measures every row once, in turn."""
    client = bench.client
    by_task = tasks()
    results: dict[tuple[str, str], list[Counters]] = {}

    def add(pattern: str, enqueued: Counters, drained: Counters | None) -> None:
        results.setdefault((pattern, "enqueue"), []).append(enqueued)
        if drained is not None:
            results.setdefault((pattern, "drain"), []).append(drained)
            results.setdefault((pattern, "end to end"), []).append(enqueued + drained)

    for _ in range(repeats):
        for pattern, (put, take) in server_cost_lists.patterns(client, count).items():
            client.flushdb()
            enqueued = per_task_us(client, count, put)
            add(pattern, enqueued, None if take is None else per_task_us(client, count, take))
        for kind, noop in by_task.items():
            client.flushdb()
            serve(client)
            enqueued = per_task_us(
                client, count, lambda noop=noop, kind=kind: enqueue(noop, kind, count)
            )
            add(kind, enqueued, drain(client, count))
    return [
        row(name, round_trips, results[pattern, phase])
        for phase, rows in PHASES.items()
        for pattern, name, round_trips in rows
    ]


def serve(client: Any) -> None:
    """Set the group's ``serving`` key, as a worker's heartbeat keeps it (a worker serves the
    queue in production), and forget it was seen: the first ``delay()`` reads it, by the
    script, as a producer does every few seconds; the others push (``queues.incoming``)."""
    from django_rcoord.queues import incoming
    from django_rcoord.queues.keys import QueueKeys

    client.set(QueueKeys.of(QUEUE).serving, 1, ex=3600)
    incoming.forget_serving()


def drain(client: Any, count: int) -> Counters:
    """What a burst worker in this process spends the server to run the queue's ``count``
    tasks."""
    from django_rcoord.queues.worker import Worker

    worker = Worker([QUEUE], burst=True)
    drained = per_task_us(client, count, worker.run)
    if worker.processed != count:
        raise RuntimeError(f"the worker ran {worker.processed} of {count} tasks")
    return drained


def row(name: str, round_trips: str, values: list[Counters]) -> Measurement:
    return Measurement(
        name,
        round_trips,
        [counters.cpu for counters in values],
        extra={
            "in scripts": round(percentile([c.scripts for c in values], 0.5), 2),
            "in commands": round(percentile([c.commands for c in values], 0.5), 2),
        },
    )


def cluster_rows(count: int, repeats: int) -> tuple[list[Measurement], str]:
    """The same rows on a throwaway 3-primary Redis Cluster (the counters summed over the
    primaries), measured by a child process whose client is the cluster's; and how the
    child pinned it."""
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
    measured = json.loads(child.stdout.splitlines()[-1])
    rows = [
        Measurement(row["name"], row["round_trips"], row["values"], extra=row["extra"])
        for row in measured["rows"]
    ]
    return rows, measured["pinned"]


def cluster_child(count: int, repeats: int) -> None:
    """In the child: measure on the cluster of ``BENCH_CLUSTER_URL``, its primaries and this
    process pinned; print the rows and the pinning as JSON."""
    from benchmarks.cluster_queues import cluster_client, configure

    configure()
    client = cluster_client()
    with pinned(client) as how:
        rows = measure(Bench(client, os.environ[CLUSTER_URL], quick=True), count, repeats)
    print(json.dumps({"pinned": how, "rows": [vars(row) for row in rows]}))


TITLES = {"enqueue": "Enqueue", "drain": "Drain (take + finish)", "end to end": "End to end"}
RATIO = "x floor"
NOTE = (
    f"{RATIO}: this row's median over the floor's, of the same run (vs floor is its "
    "inverse); server CPU: INFO cpu (main thread) deltas; in scripts, in commands: INFO "
    "commandstats usec deltas, of the scripts (the commands they run included) and of every "
    "other command (the commands the scripts ran among them); medians. Calls sent back to "
    "back, the server and the client pinned to one CPU (see params): the same command "
    "costs the server 2-4x more when calls arrive milliseconds apart"
)


def phase_tables(rows: list[Measurement], where: str, count: int, repeats: int) -> list[Table]:
    """One table per phase of ``PHASES``, its floor the phase's first row; each row's
    ``x floor`` its cost over that floor's (``Table.vs_floor`` inverted: that one is a
    speed)."""
    by_name = {row.name: row for row in rows}
    tables = []
    for phase, specs in PHASES.items():
        table = Table(
            f"{TITLES[phase]}: server CPU per no-op task, {where} "
            f"({count:,} tasks, {repeats} runs)",
            "server CPU us per task",
            [by_name[name] for _, name, _ in specs],
            floor=specs[0][1],
            lower_is_better=True,
            extra_columns=(RATIO, "in scripts", "in commands"),
            note=NOTE,
        )
        for row in table.rows:
            speed = table.vs_floor(row)
            row.extra[RATIO] = None if speed is None else round(1 / speed, 2)
        tables.append(table)
    return tables


#: The queue-core issue's targets: (phase, row, the most it may cost over its floor).
TARGETS = (
    ("enqueue", "django-rcoord: enqueue (delay)", 1.2),
    ("enqueue", "with unique_for and timeout: enqueue", None),
    ("drain", "django-rcoord: take + finish (burst worker)", 5.0),
    ("drain", "with unique_for and timeout: take + finish", None),
)


def targets(by_place: dict[str, list[Table]]) -> TextTable:
    """The targets read from this run's tables: each row's ``x floor`` on each server."""
    rows: list[Sequence[str]] = []
    for phase, name, most in TARGETS:
        index = list(PHASES).index(phase)
        found = []
        for tables in by_place.values():
            table = tables[index]
            ratio = next(row for row in table.rows if row.name == name).extra[RATIO]
            found.append("-" if ratio is None else f"{ratio:.2f}x")
        goal = "(beside it)" if most is None else f"<= {most}x"
        rows.append([f"{name} / {PHASES[phase][0][1]}", *found, goal])
    return TextTable(
        "The queue-core issue's targets, read from this run (x floor)",
        ["", *by_place, "target"],
        rows,
    )


def run(bench: Bench) -> ScenarioResult:
    count = bench.pick(quick=2000, full=20000)
    repeats = bench.repeats_or(3)
    with pinned(bench.client) as how:
        rows = measure(bench, count, repeats)
    cluster, cluster_how = cluster_rows(count, repeats)
    by_place = {
        "one Redis": phase_tables(rows, "one Redis", count, repeats),
        "Redis Cluster": phase_tables(cluster, "a 3-primary Redis Cluster", count, repeats),
    }
    return ScenarioResult(
        NAME,
        "Server CPU per task",
        [table for tables in by_place.values() for table in tables],
        params={"tasks": count, "pinned": how, "cluster pinned": cluster_how},
        repeats=repeats,
        text_tables=[targets(by_place)],
    )


if __name__ == "__main__":
    if sys.argv[1:2] == [CLUSTER_CHILD]:
        cluster_child(int(sys.argv[2]), int(sys.argv[3]))
    else:
        run_benchmark(NAME, (__doc__ or "").splitlines()[0])
