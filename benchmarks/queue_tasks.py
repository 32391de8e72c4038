"""No-op tasks for every queue system of the queue benchmark (importable by their workers)."""

from __future__ import annotations

import os


def noop() -> None:
    pass


def huey_instance():
    from huey import RedisHuey

    return RedisHuey("rcoord-bench", url=os.environ["BENCH_REDIS_URL"], results=False)


def dramatiq_broker():
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(url=os.environ["BENCH_REDIS_URL"])
    dramatiq.set_broker(broker)
    return broker
