"""No-op tasks for every queue system of the queue benchmark (importable by their workers)."""

from __future__ import annotations

import os
import time

#: When this process last ran a task (the queue benchmark's drain ends at the last one).
last_done = 0.0


def noop() -> None:
    global last_done  # noqa: PLW0603  (read by the benchmark in the worker process)
    last_done = time.time()


def huey_instance():
    from huey import RedisHuey

    return RedisHuey("rcoord-bench", url=os.environ["BENCH_REDIS_URL"], results=False)


def dramatiq_broker():
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(url=os.environ["BENCH_REDIS_URL"])
    dramatiq.set_broker(broker)
    return broker
