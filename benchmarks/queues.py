"""Queue benchmark: enqueue N no-op tasks, then drain them with 1 and with 4 worker processes.

    python -m benchmarks.queues [--quick] [--repeats R]

Each system enqueues with its own API, one call per task. Its worker processes
are started and fully imported first, then let through a start gate; the drain
lasts from the gate to the last task's completion (the latest of the
processes). End to end = enqueue time + drain time. The same processes serve
every repeat.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import statistics
import sys
import threading
import time
from collections.abc import Callable

from benchmarks.common import (
    Bench,
    Gate,
    Measurement,
    ScenarioResult,
    Table,
    TextTable,
    missing,
    read_result,
    report,
    spawn_workers,
    stop_workers,
)
from benchmarks.runner import run_benchmark

NAME = "queues"

# system: (row name, round trips per task: enqueue + worker side)
SYSTEMS = {
    "floor": ("PING per task, each side (the floor)", "1 + 1"),
    "django-rcoord": ("django-rcoord", "1 + 1 per batch (prefetch up to 32)"),
    "book": ("book: RPUSH / BLPOP worker (no lease, no ack)", "1 + 1"),
    "huey": ("Huey (its consumer's dequeue/execute loop)", "1 + 1"),
    "dramatiq": ("dramatiq (1 thread per process)", "1 + 2 (fetch, ack)"),
    "rq": ("RQ SimpleWorker", "3 + many"),
    "celery-solo": ("Celery, solo pool (Redis broker and result backend)", "3 + 5"),
    "celery-prefork": ("Celery, prefork pool, 1 child (--concurrency 1)", "3 + 5"),
    "celery-acks-late": ("Celery, solo pool, acks_late=True (ack after the run)", "3 + 5"),
    "arq": ("arq (its Worker: 10 jobs at a time, polls every 0.5 s)", "3 + 6"),
    "arq-poll-50ms": ("arq, poll_delay 0.05 s (its default: 0.5 s)", "3 + 6"),
    "saq": ("SAQ (its Worker: 10 jobs at a time)", "1 + 6"),
}
#: The module each peer needs, and how to install it where it is missing.
PEER_MODULES = {
    "rq": "rq",
    "huey": "huey",
    "dramatiq": "dramatiq",
    "celery-solo": "celery",
    "celery-prefork": "celery",
    "celery-acks-late": "celery",
    "arq": "arq",
    "arq-poll-50ms": "arq",
    "saq": "saq",
}
INSTALL_HINTS = {
    # arq's metadata caps redis-py below 6; the suite runs every system on one redis-py.
    "arq": "pip install --no-deps 'arq>=0.26' (its metadata caps redis-py below 6)",
}
INSTALL_HINTS["arq-poll-50ms"] = INSTALL_HINTS["arq"]
#: What each system promises about a task, read from its code at the versions measured
#: (defaults unless said): how a worker holds a task, what a worker's death costs, when a
#: task can run twice, priorities, results.
GUARANTEE_COLUMNS = (
    "system",
    "lease / ack",
    "lost on worker death",
    "duplicates window",
    "priorities",
    "results",
)
GUARANTEES = {
    "django-rcoord": (
        (
            "leased to the worker (TASK_LEASE 60 s, renewed while held); acknowledged after it "
            "ran, with the next take"
        ),
        "no: redelivered once the lease lapses; dead-lettered after TASK_MAX_DELIVERIES (5)",
        "a worker dying after a run, before its ack; a worker stalled past its lease",
        "yes (per queue: priority, then FIFO)",
        "yes (get_result; TASK_RESULT_TTL 1 day)",
    ),
    "book": (
        "none: BLPOP removes the task",
        "yes, the task it popped",
        "none",
        "the book's worker reads several lists in order; this row uses one",
        "no",
    ),
    "huey": (
        "none: its Redis storage pops the task (RPOP/BRPOP)",
        "yes, the task it was running",
        "none",
        "with PriorityRedisHuey (a ZSET); RedisHuey, this row, is FIFO",
        "yes, when enabled (off in this row)",
    ),
    "dramatiq": (
        "fetch moves messages into the worker's ack set (prefetch); acked after the run",
        "no: another worker requeues them once the dead worker's heartbeat is 60 s old",
        "a worker dying between run and ack; a live worker silent for 60 s",
        "actor priority orders only a worker's prefetched messages, not the Redis queue",
        "with its Results middleware (off in this row)",
    ),
    "rq": (
        "job in the StartedJobRegistry while it runs; the worker sends heartbeats",
        (
            "not rerun: once its registry entry expires it goes to the FailedJobRegistry "
            "(rerun only when enqueued with Retry)"
        ),
        "none by default",
        "by queue order (one queue per level)",
        "yes (result_ttl 500 s)",
    ),
    "celery-solo": (
        "message kept in kombu's 'unacked' hash; acked as the task starts (acks_late off)",
        (
            "yes, the running task; prefetched, unstarted messages return after "
            "visibility_timeout (1 h)"
        ),
        "with acks_late: a task still running after visibility_timeout (1 h)",
        "yes (a list per priority step; 4 steps of 0-9 by default)",
        "yes (Redis result backend; result_expires 1 day)",
    ),
    "arq": (
        (
            "the job stays in the queue ZSET; an in-progress key (job_timeout + 10 s = 310 s) "
            "marks it taken"
        ),
        "no: another worker runs it once the in-progress key expires; up to max_tries (5)",
        "a worker dying after a run, before its finish pipeline",
        "no (ordered by enqueue or defer time)",
        "yes (keep_result 1 h)",
    ),
    "saq": (
        "BLMOVE into an 'active' list; job timeout 10 s, heartbeat off",
        (
            "the sweep (every 60 s) finds it past its timeout and aborts it; rerun only with "
            "retries > 1 (default 1)"
        ),
        (
            "a retryable job swept while its worker still runs it (unsure how often: the worker "
            "cancels a run at its timeout)"
        ),
        "only on its Postgres queue",
        "yes (on the job; ttl 600 s)",
    ),
}
GUARANTEES["celery-prefork"] = GUARANTEES["celery-solo"]
GUARANTEES["celery-acks-late"] = (
    "message kept in kombu's 'unacked' hash; acked after the run (acks_late)",
    "no: the unacked message returns after visibility_timeout (1 h); at once on a warm shutdown",
    "a task still running after visibility_timeout (1 h); a worker dying between run and ack",
    *GUARANTEES["celery-solo"][3:],
)
GUARANTEES["arq-poll-50ms"] = GUARANTEES["arq"]

#: Celery's worker runs as its own process (benchmarks.celery_worker), with this pool.
CELERY_POOLS = {"celery-solo": "solo", "celery-prefork": "prefork", "celery-acks-late": "solo"}
#: arq's seconds between two reads of its queue, where a row sets it.
ARQ_POLL_DELAYS = {"arq-poll-50ms": 0.05}


def enqueue(system: str, client, count: int) -> None:
    from benchmarks import queue_tasks

    if system == "floor":
        for _ in range(count):
            client.ping()
    elif system == "django-rcoord":
        from django_rcoord.queues import task

        noop = task(name="bench.noop", queue="bench")(queue_tasks.noop)
        for _ in range(count):
            noop.delay()
    elif system == "book":
        for _ in range(count):
            client.rpush("book:queue", json.dumps(["noop", []]))
    elif system == "rq":
        from rq import Queue

        queue = Queue("bench", connection=client)
        for _ in range(count):
            queue.enqueue(queue_tasks.noop)
    elif system == "huey":
        huey = queue_tasks.huey_instance()
        noop = huey.task()(queue_tasks.noop)
        for _ in range(count):
            noop()
    elif system == "dramatiq":
        import dramatiq

        queue_tasks.dramatiq_broker()
        noop = dramatiq.actor(queue_tasks.noop, queue_name="bench", max_retries=0)
        for _ in range(count):
            noop.send()
    else:
        raise ValueError(system)


def producer(system: str, client) -> tuple[Callable[[int], None], Callable[[], None]]:
    """(enqueue(count), close()) for ``system``: its client made and connected before the
    clock runs, for the peers that keep one (Celery's app, arq's pool, SAQ's queue)."""
    from benchmarks import queue_tasks

    if system in CELERY_POOLS:
        app = queue_tasks.celery_app(acks_late=system == "celery-acks-late")
        noop = app.tasks["bench.noop"]

        def send(count: int) -> None:
            for _ in range(count):
                noop.delay()

        return send, app.close
    if system in ("arq", "arq-poll-50ms", "saq"):
        loop = asyncio.new_event_loop()
        if system != "saq":
            from arq import create_pool  # type: ignore[import-not-found, import-untyped, unused-ignore]

            pool = loop.run_until_complete(create_pool(queue_tasks.arq_settings()))
            enqueue_one, close = (lambda: pool.enqueue_job("arq_noop")), pool.aclose
        else:
            queue = queue_tasks.saq_queue()
            loop.run_until_complete(queue.connect())
            enqueue_one, close = (lambda: queue.enqueue("saq_noop")), queue.disconnect

        async def enqueue_all(count: int) -> None:
            for _ in range(count):
                await enqueue_one()

        def finish() -> None:
            loop.run_until_complete(close())
            loop.close()

        return (lambda count: loop.run_until_complete(enqueue_all(count))), finish
    return (lambda count: enqueue(system, client, count)), (lambda: None)


def drainer(system: str, url: str, floor_count: int):
    """In a worker process: (drain, rest): ``drain()`` empties the queue once with the
    system's own loop, ``rest()`` runs after each round (outside the measurement)."""
    import redis

    from benchmarks import queue_tasks

    client = redis.Redis.from_url(url)

    def idle() -> None:
        pass

    if system == "floor":

        def work() -> None:
            for _ in range(floor_count):
                client.ping()
            queue_tasks.last_done = time.time()

        return work, idle
    if system == "django-rcoord":
        from benchmarks.common import configure_django

        configure_django(url)
        from django_rcoord.queues import task
        from django_rcoord.queues.worker import Worker

        task(name="bench.noop", queue="bench")(queue_tasks.noop)
        return (lambda: Worker(["bench"], burst=True).run()), idle
    if system == "book":
        callbacks = {"noop": queue_tasks.noop}

        def work() -> None:
            while True:
                packed = client.blpop(["book:queue"], timeout=0.05)
                if not packed:
                    return
                name, args = json.loads(packed[1])
                callbacks[name](*args)

        return work, idle
    if system == "rq":
        from rq import Queue, SimpleWorker

        def work() -> None:
            worker = SimpleWorker([Queue("bench", connection=client)], connection=client)
            worker.work(burst=True, logging_level="ERROR")

        return work, idle
    if system == "huey":
        huey = queue_tasks.huey_instance()
        huey.task()(queue_tasks.noop)

        def work() -> None:
            # What one Huey consumer worker does per task (huey.consumer.Worker.loop).
            while True:
                message = huey.dequeue()
                if message is None:
                    return
                huey.execute(message)

        return work, idle
    if system == "dramatiq":
        import dramatiq

        broker = queue_tasks.dramatiq_broker()
        dramatiq.actor(queue_tasks.noop, queue_name="bench", max_retries=0)
        workers = []

        def work() -> None:
            # A Worker per round, started at the gate: a running one would take tasks
            # while they are enqueued (pausing it between rounds takes ~3 s each).
            worker = dramatiq.Worker(broker, worker_threads=1)
            workers.append(worker)
            worker.start()
            # qsize counts messages until acked; the drain ends at the last task anyway.
            broker.join("bench", interval=20)

        def rest() -> None:
            workers.pop().stop()
            # Worker.start adds a middleware for that worker that stop leaves in place.
            broker.middleware[:] = [
                middleware
                for middleware in broker.middleware
                if type(middleware).__name__ != "_WorkerMiddleware"
            ]

        return work, rest
    if system in ("arq", "arq-poll-50ms", "saq"):
        # One event loop and one connection pool for every round; a worker per round,
        # in its burst mode (it returns once the queue is empty).
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        if system != "saq":
            from arq import create_pool  # type: ignore[import-not-found, import-untyped, unused-ignore]
            from arq.worker import Worker as ArqWorker  # type: ignore[import-not-found, import-untyped, unused-ignore]

            pool = loop.run_until_complete(create_pool(queue_tasks.arq_settings()))
            poll_delay = ARQ_POLL_DELAYS.get(system, 0.5)  # 0.5: arq's default

            def work() -> None:
                worker = ArqWorker(
                    functions=[queue_tasks.arq_noop],
                    redis_pool=pool,
                    burst=True,
                    handle_signals=False,
                    poll_delay=poll_delay,
                )
                loop.run_until_complete(worker.main())

            return work, idle
        from saq import Worker as SaqWorker  # type: ignore[import-not-found, import-untyped, unused-ignore]

        queue = queue_tasks.saq_queue()
        loop.run_until_complete(queue.connect())

        def work() -> None:
            # Burst mode ends a worker 50 ms after a dequeue finds the queue empty.
            worker = SaqWorker(
                queue, functions=[queue_tasks.saq_noop], burst=True, dequeue_timeout=0.05
            )
            loop.run_until_complete(worker.start())

        return work, idle
    raise ValueError(system)


def drain_worker(system: str, url: str, floor_count: str, rounds: str, gate_name: str) -> None:
    """The worker process: ``rounds`` times, wait at the gate, drain, report."""
    from benchmarks import queue_tasks

    os.environ["BENCH_REDIS_URL"] = url
    if system in CELERY_POOLS:
        from benchmarks import celery_worker

        acks_late = system == "celery-acks-late"
        celery_worker.serve(CELERY_POOLS[system], url, int(rounds), gate_name, acks_late=acks_late)
        return
    import redis

    gate = Gate(redis.Redis.from_url(url), gate_name)
    work, rest = drainer(system, url, int(floor_count))
    for _ in range(int(rounds)):
        gate.pass_through()
        queue_tasks.last_done = 0.0
        started = time.time()
        work()
        report({"started": started, "finished": queue_tasks.last_done or time.time()})
        rest()


def run_system(bench: Bench, system: str, workers: int, count: int, repeats: int) -> Measurement:
    client = bench.client
    name, trips = SYSTEMS[system]
    client.flushdb()
    gate_name = f"queues:{system}:{workers}"
    gate = Gate(client, gate_name)
    children = spawn_workers(
        "benchmarks.queues",
        [system, bench.url, str(count // workers), str(repeats), gate_name],
        workers,
        stdin=system in CELERY_POOLS,
    )
    readers: list[threading.Thread] = []
    enqueue_rates, drain_rates, total_rates, commands = [], [], [], []
    try:
        send, close = producer(system, client)
        try:
            if system in CELERY_POOLS:
                reports, readers = pump_reports(children)
            for round_ in range(1, repeats + 1):
                gate.wait_ready(workers, children, round_)
                commands_before = client.info("stats")["total_commands_processed"]
                started = time.perf_counter()
                send(count)
                enqueue_seconds = time.perf_counter() - started
                gate.open(workers)
                if system in CELERY_POOLS:
                    results = celery_round(reports, count)
                else:
                    results = [read_result(child) for child in children]
                drain_seconds = max(r["finished"] for r in results) - min(
                    r["started"] for r in results
                )
                commands.append(
                    (client.info("stats")["total_commands_processed"] - commands_before) / count
                )
                if system in CELERY_POOLS:
                    for child in children:  # every task is done: hold at the gate again
                        assert child.stdin is not None  # spawned with stdin
                        child.stdin.write("done\n")
                        child.stdin.flush()
                enqueue_rates.append(count / enqueue_seconds)
                drain_rates.append(count / drain_seconds)
                total_rates.append(count / (enqueue_seconds + drain_seconds))
            for child in children:
                child.wait(60)
        finally:
            close()
    finally:
        stop_workers(children, readers)
    row = Measurement(name, trips, total_rates)
    row.extra["enqueue/s"] = statistics.median(enqueue_rates)
    row.extra["drain/s"] = statistics.median(drain_rates)
    row.extra["commands/task"] = round(statistics.median(commands), 1)
    return row


def pump_reports(children) -> tuple[queue.Queue, list[threading.Thread]]:
    """A queue of (process index, report) from every worker process, read by a thread each
    (the Celery workers report whenever they go idle, so the parent cannot read in turn)."""
    reports: queue.Queue = queue.Queue()

    def read_all(index: int, child) -> None:
        for line in child.stdout:
            if line.startswith("{"):  # not Celery's "worker: Warm shutdown" at the end
                reports.put((index, json.loads(line)))

    readers = [
        threading.Thread(target=read_all, args=(index, child), daemon=True)
        for index, child in enumerate(children)
    ]
    for reader in readers:
        reader.start()
    return reports, readers


def celery_round(reports: queue.Queue, count: int) -> list[dict]:
    """The Celery workers' latest reports, once together they have done ``count`` tasks."""
    latest: dict[int, dict] = {}
    while sum(result["done"] for result in latest.values()) < count:
        index, result = reports.get(timeout=900)
        latest[index] = result
    return list(latest.values())


def run(bench: Bench) -> ScenarioResult:
    count = bench.pick(quick=300, full=5000)
    repeats = bench.repeats_or(3)
    os.environ["BENCH_REDIS_URL"] = bench.url
    tables = []
    for workers in (1, 4):
        rows = []
        for system in SYSTEMS:
            module = PEER_MODULES.get(system)
            if module:
                try:
                    __import__(module)
                except ImportError:
                    rows.append(
                        missing(
                            SYSTEMS[system][0],
                            SYSTEMS[system][1],
                            f"{module} not installed ("
                            f"{INSTALL_HINTS.get(system, 'pip install --group bench')})",
                        )
                    )
                    continue
            rows.append(run_system(bench, system, workers, count, repeats))
        processes = "1 worker process" if workers == 1 else f"{workers} worker processes"
        tables.append(
            Table(
                f"Enqueue {count:,} no-op tasks, drain with {processes}, {repeats} runs",
                "tasks/s end to end",
                rows,
                floor=rows[0].name,
                extra_columns=("enqueue/s", "drain/s", "commands/task"),
                note="commands/task: counted by the server (commands run inside scripts "
                "included); round trips: enqueue + worker side, per task",
            )
        )
    guarantees = TextTable(
        "What each system guarantees (read from its code; defaults unless said)",
        GUARANTEE_COLUMNS,
        [(SYSTEMS[system][0], *GUARANTEES[system]) for system in SYSTEMS if system in GUARANTEES],
    )
    return ScenarioResult(
        NAME,
        "Task queues",
        tables,
        params={"count": count, "workers": [1, 4]},
        repeats=repeats,
        text_tables=[guarantees],
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        drain_worker(*sys.argv[2:])
    else:
        run_benchmark(NAME, __doc__.splitlines()[0])
