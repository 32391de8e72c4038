"""Queue benchmark: enqueue N no-op tasks, then drain them with one worker process.

    python -m benchmarks.queues [--count N] [--repeats R]

Each system enqueues with its own API, one call per task. Its worker process
is started and fully imported first, then told to go; it drains the queue and
reports how long that took. End to end = enqueue time + drain time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from benchmarks.common import run_benchmark

SYSTEMS = ("floor", "django-rcoord", "book", "rq", "huey", "dramatiq")


def enqueue(system: str, client, count: int) -> None:
    from benchmarks import queue_tasks

    if system == "floor":
        return
    if system == "django-rcoord":
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


def drain(system: str, url: str, count: int) -> None:
    """Run in the worker process: wait for the go signal, drain, print seconds."""
    import redis

    from benchmarks import queue_tasks
    from benchmarks.common import configure_django

    os.environ["BENCH_REDIS_URL"] = url
    client = redis.Redis.from_url(url)
    if system == "floor":

        def work() -> None:
            for _ in range(count):
                client.ping()
                client.ping()
                client.ping()

    elif system == "django-rcoord":
        configure_django(url)
        from django_rcoord.queues import task
        from django_rcoord.worker import Worker

        task(name="bench.noop", queue="bench")(queue_tasks.noop)
        worker = Worker(["bench"], burst=True)

        def work() -> None:
            worker.run()

    elif system == "book":

        def work() -> None:
            callbacks = {"noop": queue_tasks.noop}
            while True:
                packed = client.blpop(["book:queue"], timeout=0.05)
                if not packed:
                    return
                name, args = json.loads(packed[1])
                callbacks[name](*args)

    elif system == "rq":
        from rq import Queue, SimpleWorker

        worker = SimpleWorker([Queue("bench", connection=client)], connection=client)

        def work() -> None:
            worker.work(burst=True, logging_level="ERROR")

    elif system == "huey":
        huey = queue_tasks.huey_instance()
        huey.task()(queue_tasks.noop)

        def work() -> None:
            # What one Huey consumer worker does per task (huey.consumer.Worker.loop).
            while True:
                message = huey.dequeue()
                if message is None:
                    return
                huey.execute(message)

    elif system == "dramatiq":
        import dramatiq

        broker = queue_tasks.dramatiq_broker()
        dramatiq.actor(queue_tasks.noop, queue_name="bench", max_retries=0)
        worker = dramatiq.Worker(broker, worker_threads=1)

        def work() -> None:
            worker.start()
            broker.join("bench")
            worker.join()
            worker.stop()

    else:
        raise ValueError(system)
    client.blpop(["bench:go"], timeout=120)
    started = time.perf_counter()
    work()
    print(json.dumps({"seconds": time.perf_counter() - started}))


def run_one(system: str, client, url: str, count: int) -> tuple[float, float, float]:
    client.flushdb()
    commands_before = client.info("stats")["total_commands_processed"]
    started = time.perf_counter()
    enqueue(system, client, count)
    enqueue_seconds = time.perf_counter() - started
    worker = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.queues", "--drain", system, url, str(count)],
        stdout=subprocess.PIPE,
        text=True,
    )
    # Wait until the worker process is imported and blocked on the go signal.
    while not any(entry.get("cmd") == "blpop" for entry in client.client_list()):
        time.sleep(0.02)
        if worker.poll() is not None:
            raise RuntimeError(f"{system} worker exited early")
    client.rpush("bench:go", 1)
    output, _ = worker.communicate(timeout=600)
    drain_seconds = json.loads(output.strip().splitlines()[-1])["seconds"]
    commands = client.info("stats")["total_commands_processed"] - commands_before
    return enqueue_seconds, drain_seconds, commands / count


def scenario(client, count: int, repeats: int) -> None:
    import statistics

    url = f"redis://127.0.0.1:{client.connection_pool.connection_kwargs['port']}/0"
    os.environ["BENCH_REDIS_URL"] = url
    available = []
    for system in SYSTEMS:
        module = {"rq": "rq", "huey": "huey", "dramatiq": "dramatiq"}.get(system)
        if module:
            try:
                __import__(module)
            except ImportError:
                print(f"({system} not installed: pip install 'django-rcoord[bench]')")
                continue
        available.append(system)
    print(f"\nEnqueue {count} no-op tasks, then drain with one worker process; {repeats} runs")
    print(
        f"{'':<16} {'commands/task':>14} {'enqueue/s':>10} {'drain/s':>9} "
        f"{'end to end/s':>13} {'spread':>7}"
    )
    for system in available:
        runs = [run_one(system, client, url, count) for _ in range(repeats)]
        enqueue_rates = [count / e if e else float("inf") for e, _, _ in runs]
        drain_rates = [count / d for _, d, _ in runs]
        total_rates = [count / (e + d) for e, d, _ in runs]
        commands = statistics.median(c for _, _, c in runs)
        median_total = statistics.median(total_rates)
        spread = (max(total_rates) - min(total_rates)) / median_total
        enqueue_text = "-" if system == "floor" else f"{statistics.median(enqueue_rates):,.0f}"
        print(
            f"{system:<16} {commands:>14.1f} {enqueue_text:>10} "
            f"{statistics.median(drain_rates):>9,.0f} {median_total:>13,.0f} {spread:>6.0%}"
        )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--drain":
        drain(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        run_benchmark(__doc__.splitlines()[0], scenario)
