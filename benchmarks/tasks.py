"""Tasks benchmark: enqueue, run and read the result of N no-op tasks of Django's Tasks
framework, with one worker process.

    python -m benchmarks.tasks [--quick] [--repeats R]

Rows: django-rcoord's RedisTaskBackend, django-tasks-rq (RQ's SimpleWorker, its
fastest worker), django-tasks-redis (Redis Streams, its own worker loop; Django 6
only) and django-rcoord's own ``@task`` with ``queues.get_result``.
Each run: the parent enqueues N tasks one call each, then opens the start gate
of one worker process (imported and connected beforehand), which runs them all
(``burst``); then the parent reads every result one call each and checks it is
SUCCESSFUL. End to end = enqueue + run + results. Round trips are counted by the
client in each process (one per command or pipeline sent); commands by the
server (commands inside scripts included); memory is the server's used_memory
after the run over the N results it keeps.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Any

import django

from benchmarks.common import (
    TURN,
    Bench,
    Gate,
    Measurement,
    Operation,
    RoundTrips,
    ScenarioResult,
    Table,
    TextTable,
    measure_side_by_side,
    missing,
    ping_operation,
    read_result,
    report,
    spawn_workers,
    stop_workers,
)
from benchmarks.queues import GUARANTEE_COLUMNS
from benchmarks.queues import GUARANTEES as QUEUE_GUARANTEES
from benchmarks.runner import run_benchmark

NAME = "tasks"

SYSTEMS = {
    "rcoord-framework": "django-rcoord RedisTaskBackend",
    "rq-framework": "django-tasks-rq (RQ SimpleWorker)",
    "streams-framework": "django-tasks-redis (Redis Streams, its worker loop)",
    "rcoord-task": "django-rcoord @task + queues.get_result",
}
PEER_MODULES = {"rq-framework": "django_tasks_rq", "streams-framework": "django_tasks_redis"}
#: Peers that need Django 6's own Tasks framework (django.tasks), and how to install them.
DJANGO_6_ONLY = {
    "streams-framework": "pip install 'django~=6.1' 'django-tasks-redis>=0.4' (Python >= 3.12)"
}
#: What each system guarantees, read from its code (defaults unless said): the columns
#: of the queue benchmark's table, so speed is read beside safety.
GUARANTEES = {
    "rcoord-framework": (
        *QUEUE_GUARANTEES["django-rcoord"][:3],
        "yes (the framework's -100..100 within a queue: priority, then FIFO)",
        (
            "yes (get_result of a finished task: one HGETALL, a script call otherwise; "
            "TASK_RESULT_TTL 1 day)"
        ),
    ),
    "rq-framework": (
        *QUEUE_GUARANTEES["rq"][:3],
        "no: only the highest priority (100) goes to the front of its queue",
        "yes (RQ's job hash; result_ttl 500 s)",
    ),
    "streams-framework": (
        (
            "XREADGROUP leaves the entry pending for its consumer; a script marks the task "
            "RUNNING; XACK and XDEL after the run"
        ),
        (
            "no: a worker's sweep (XPENDING, XCLAIM) puts a task pending for "
            "REDIS_CLAIM_TIMEOUT (300 s) back to READY; failed after REDIS_MAX_DELIVERIES "
            "(5) starts"
        ),
        (
            "a task still running after REDIS_CLAIM_TIMEOUT (no heartbeat); a worker dying "
            "between its run and its ack"
        ),
        "three levels (a stream each for priority > 0, 0, < 0)",
        "yes (a hash per task, read by one HGETALL; REDIS_RESULT_TTL 30 days)",
    ),
}
GUARANTEES["rcoord-task"] = GUARANTEES["rcoord-framework"]
FRAMEWORK_NOOPS = {
    "rcoord-framework": "rcoord_noop",
    "rq-framework": "rq_noop",
    "streams-framework": "streams_noop",
}


def _calls(system: str):
    """(enqueue one, get its status) for ``system``, in this process."""
    if system == "rcoord-task":
        from django_rcoord.queues import get_result, task

        noop = task(name="bench.noop", queue="bench")(_noop())

        def status(task_id: str) -> str | None:
            record = get_result(task_id)
            return record.status if record is not None else None

        return noop.delay, status
    from benchmarks import framework_tasks

    framework_noop = getattr(framework_tasks, FRAMEWORK_NOOPS[system])
    return (
        lambda: framework_noop.enqueue().id,
        lambda result_id: str(framework_noop.get_result(result_id).status),
    )


def _noop():
    from benchmarks import queue_tasks

    return queue_tasks.noop


def _drain(system: str):
    """In the worker process: run every queued task once (the system's own worker)."""
    if system == "rq-framework":
        import django_rq
        from django_tasks_rq import Job
        from rq import SimpleWorker

        queue = django_rq.get_queue("bench", job_class=Job)

        def work() -> None:
            worker = SimpleWorker([queue], connection=queue.connection, job_class=Job)
            worker.work(burst=True, logging_level="ERROR")

        return work
    if system == "streams-framework":
        from django_tasks_redis import executor  # type: ignore[import-not-found, import-untyped, unused-ignore]

        from benchmarks import framework_tasks

        worker_id = executor.generate_worker_id()
        # What its run_redis_tasks command runs (without --continuous: until the queue is empty).
        return lambda: executor.process_tasks(
            queue_name="bench", backend_name="streams", worker_id=worker_id
        )
    from django_rcoord.queues.worker import Worker

    if system == "rcoord-task":
        from django_rcoord.queues import task

        task(name="bench.noop", queue="bench")(_noop())
    else:
        from benchmarks import framework_tasks  # noqa: F401  (the task's module, imported)
    return lambda: Worker(["bench"], burst=True).run()


def drain_worker(system: str, url: str, rounds: str, gate_name: str) -> None:
    """The worker process: ``rounds`` times, wait at the gate, run everything, report."""
    import redis

    from benchmarks import queue_tasks
    from benchmarks.common import configure_django

    os.environ["BENCH_REDIS_URL"] = url
    configure_django(url)
    gate = Gate(redis.Redis.from_url(url), gate_name)
    work = _drain(system)
    for _ in range(int(rounds)):
        gate.pass_through()
        queue_tasks.last_done = 0.0
        RoundTrips.reset()
        started = time.time()
        work()
        finished = queue_tasks.last_done or time.time()
        report({"started": started, "finished": finished, "round_trips": RoundTrips.count})


def _clear(client) -> None:
    """Delete the last round's keys, freeing their memory now (DEL, not UNLINK), so the
    next round's memory is measured from a clean start."""
    for pattern in ("rcoord:*", "rq:*", "django_tasks:*"):
        keys = list(client.scan_iter(match=pattern, count=1000))
        for start in range(0, len(keys), 1000):
            client.delete(*keys[start : start + 1000])


def run_system(bench: Bench, system: str, count: int, repeats: int) -> Measurement:
    client = bench.client
    enqueue_one, status_of = _calls(system)
    gate_name = f"tasks:{system}"
    client.flushdb()
    (child,) = spawn_workers("benchmarks.tasks", [system, bench.url, str(repeats), gate_name], 1)
    gate = Gate(client, gate_name)
    totals, phases, trips, commands, memory = [], [], [], [], []
    try:
        for round_ in range(1, repeats + 1):
            gate.wait_ready(1, [child], round_)
            _clear(client)  # the last round's tasks and results (not the gate's keys)
            memory_before = client.info("memory")["used_memory"]
            commands_before = client.info("stats")["total_commands_processed"]
            RoundTrips.reset()
            started = time.perf_counter()
            ids = [enqueue_one() for _ in range(count)]
            enqueued = time.perf_counter()
            enqueue_trips = RoundTrips.count
            gate.open(1)
            drained = read_result(child)
            commands_run = client.info("stats")["total_commands_processed"]
            RoundTrips.reset()
            read_started = time.perf_counter()
            statuses = [status_of(task_id) for task_id in ids]
            read_seconds = time.perf_counter() - read_started
            result_trips = RoundTrips.count
            commands_after = client.info("stats")["total_commands_processed"]
            memory.append((client.info("memory")["used_memory"] - memory_before) / count)
            bad = [status for status in statuses if "SUCCESSFUL" not in status]
            if bad:
                raise RuntimeError(f"{system}: {len(bad)} of {count} not SUCCESSFUL ({bad[0]})")
            enqueue_seconds = enqueued - started
            run_seconds = drained["finished"] - drained["started"]
            totals.append(count / (enqueue_seconds + run_seconds + read_seconds))
            phases.append((count / enqueue_seconds, count / run_seconds, count / read_seconds))
            trips.append(
                (enqueue_trips / count, drained["round_trips"] / count, result_trips / count)
            )
            # Each phase's server commands, less the INFO calls and the gate's RPUSH.
            commands.append((commands_run - commands_before - 2, commands_after - commands_run - 1))
        child.wait(60)
    finally:
        stop_workers([child])

    def median(values, index):
        return statistics.median(value[index] for value in values)

    enqueue_rt, worker_rt, result_rt = (round(median(trips, i), 2) for i in range(3))
    row = Measurement(SYSTEMS[system], f"{enqueue_rt:g} + {worker_rt:g} + {result_rt:g}", totals)
    row.extra["enqueue/s"] = median(phases, 0)
    row.extra["run/s"] = median(phases, 1)
    row.extra["get_result/s"] = median(phases, 2)
    row.extra["worker round trips/task"] = worker_rt
    row.extra["commands/task"] = round(median(commands, 0) / count + median(commands, 1) / count, 1)
    row.extra["bytes/result"] = round(statistics.median(memory))
    return row


def unavailable(system: str) -> str | None:
    """Why ``system`` cannot run here, or None."""
    if system in DJANGO_6_ONLY and django.VERSION < (6, 0):
        return f"needs Django 6 (django.tasks), this is Django {django.get_version()}"
    module = PEER_MODULES.get(system)
    if module:
        try:
            __import__(module)
        except ImportError:
            how = DJANGO_6_ONLY.get(system, "pip install --group bench")
            return f"{module} not installed ({how})"
    return None


#: Finished tasks each system's reads go round (one result read again and again would
#: measure a hot cache line, not a lookup).
READ_TASKS = 50


def get_result_side_by_side(bench: Bench, *, count: int, repeats: int) -> Table:
    """``get_result`` of finished tasks through the Tasks framework, ours and
    django-tasks-redis's, with the commands under them as references, the rows taking
    turns (``measure_side_by_side``): what a page polling a task's status pays per poll."""
    from benchmarks import framework_tasks
    from django_rcoord.queues import get_result
    from django_rcoord.queues.keys import GroupKeys, group_of_task_id

    client = bench.client
    client.flushdb()
    ours = framework_tasks.rcoord_noop
    ids = [ours.enqueue().id for _ in range(READ_TASKS)]
    _drain("rcoord-framework")()
    group = group_of_task_id(ids[0])
    assert group is not None, "a task id of this backend names its group"
    record_of = GroupKeys.of(group).record
    turn = iter(range(1 << 62))

    def next_id(of: list[str]) -> str:
        return of[next(turn) % READ_TASKS]

    our_read: Operation = (
        "django-rcoord task.get_result (RedisTaskBackend)",
        "1",
        lambda: ours.get_result(next_id(ids)),
    )
    # The framework rows and the one command each read of a finished task sends, for
    # server_us_per_read.
    framework: list[tuple[Operation, str]] = [(our_read, "cmdstat_hgetall")]
    operations = [
        ping_operation(client, 1),
        our_read,
        ("django-rcoord queues.get_result", "1", lambda: get_result(next_id(ids))),
        (
            "bare HGETALL of a django-rcoord record (no decoding)",
            "1",
            lambda: client.hgetall(record_of(next_id(ids))),
        ),
    ]
    theirs = SYSTEMS["streams-framework"] + " task.get_result"
    reason = unavailable("streams-framework")
    if reason is None:
        from django_tasks_redis.utils import get_result_key  # type: ignore[import-not-found, import-untyped, unused-ignore]

        streams = framework_tasks.streams_noop
        their_ids = [streams.enqueue().id for _ in range(READ_TASKS)]
        _drain("streams-framework")()
        backend: Any = streams.get_backend()
        their_keys = [get_result_key(backend.key_prefix, backend.alias, i) for i in their_ids]
        their_read: Operation = (theirs, "1", lambda: streams.get_result(next_id(their_ids)))
        operations[2:2] = [their_read]
        framework.append((their_read, "cmdstat_hgetall"))
        operations.append(
            (
                "bare HGETALL of a django-tasks-redis result (no decoding)",
                "1",
                lambda: client.hgetall(next_id(their_keys)),
            )
        )
    rows = measure_side_by_side(operations, count=count, repeats=repeats)
    if reason is not None:
        rows.insert(2, missing(theirs, "1", reason))
    by_name = {row.name: row for row in rows}
    if not by_name[theirs].missing:
        for row in rows[1:]:
            if not row.missing:
                row.extra["vs django-tasks-redis"] = f"{row.median / by_name[theirs].median:.2f}x"
    for name, server_us in server_us_per_read(client, framework, count).items():
        by_name[name].extra["server us/read"] = server_us
    for operation_id in ids:
        status = str(ours.get_result(operation_id).status)
        if "SUCCESSFUL" not in status:
            raise RuntimeError(f"a read task is {status}, not SUCCESSFUL")
    return Table(
        f"get_result of {READ_TASKS} finished tasks, side by side, {repeats} x {count:,}",
        "reads/s",
        rows,
        floor=rows[0].name,
        extra_columns=("vs django-tasks-redis", "server us/read"),
        note="each row a read of one finished task's whole result, in turns of "
        f"{TURN} with the others (sync calls; one client, one connection each); server "
        "us/read: what the server spent in the command each read sends (INFO commandstats), "
        "each framework row reading on its own",
    )


def server_us_per_read(
    client: Any, reads: list[tuple[Operation, str]], count: int
) -> dict[str, float]:
    """What the server spends per read of each row of ``reads`` (each with the one command
    its read sends, as INFO commandstats names it), from INFO commandstats over ``count``
    reads of each, one row after the other (both send HGETALL: the counters cannot tell
    two rows apart in turns). By row name."""
    found = {}
    for (name, _, operation), command in reads:
        client.config_resetstat()
        for _ in range(count):
            operation()
        found[name] = round(float(client.info("commandstats")[command]["usec_per_call"]), 2)
    return found


def run(bench: Bench) -> ScenarioResult:
    count = bench.pick(quick=300, full=5000)
    repeats = bench.repeats_or(3)
    os.environ["BENCH_REDIS_URL"] = bench.url
    RoundTrips.install()
    rows = []
    for system in SYSTEMS:
        reason = unavailable(system)
        if reason:
            rows.append(missing(SYSTEMS[system], "", reason))
            continue
        rows.append(run_system(bench, system, count, repeats))
    table = Table(
        f"Enqueue, run (1 worker process) and get the result of {count:,} no-op tasks, "
        f"{repeats} runs",
        "tasks/s end to end",
        rows,
        floor=rows[0].name,
        extra_columns=(
            "enqueue/s",
            "run/s",
            "get_result/s",
            "worker round trips/task",
            "commands/task",
            "bytes/result",
        ),
        note="round trips per task: enqueue + worker + get_result, counted by the clients; "
        "commands/task: counted by the server (inside scripts included); bytes/result: "
        "the server's used_memory after the run, per stored result",
    )
    guarantees = TextTable(
        "What each system guarantees (read from its code; defaults unless said)",
        GUARANTEE_COLUMNS,
        [(SYSTEMS[system], *GUARANTEES[system]) for system in SYSTEMS],
    )
    reads = get_result_side_by_side(
        bench, count=bench.pick(quick=300, full=3000), repeats=bench.pick(quick=3, full=5)
    )
    return ScenarioResult(
        NAME,
        "Django's Tasks framework",
        [table, reads],
        params={"count": count},
        repeats=repeats,
        text_tables=[guarantees],
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        from benchmarks.common import RoundTrips as _RoundTrips

        _RoundTrips.install()
        drain_worker(*sys.argv[2:])
    else:
        run_benchmark(NAME, __doc__.splitlines()[0])
