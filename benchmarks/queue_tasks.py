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


def celery_app(*, acks_late: bool = False):
    """Celery on this Redis: its Redis broker (kombu's Redis transport) and its Redis result
    backend, otherwise Celery's defaults (early ack unless ``acks_late``, prefetch
    multiplier 4)."""
    from celery import Celery  # type: ignore[import-not-found, import-untyped, unused-ignore]

    url = os.environ["BENCH_REDIS_URL"]
    app = Celery("rcoord-bench", broker=url, backend=url, set_as_current=False)
    # The benchmark's processes report to their parent on stdout.
    app.conf.worker_redirect_stdouts = False
    app.conf.broker_connection_retry_on_startup = True
    app.conf.task_default_queue = "bench"
    app.conf.task_acks_late = acks_late
    app.task(name="bench.noop")(noop)
    return app


async def arq_noop(ctx) -> None:
    noop()


async def saq_noop(ctx) -> None:
    noop()


def arq_settings():
    from arq.connections import RedisSettings  # type: ignore[import-not-found, import-untyped, unused-ignore]

    return RedisSettings.from_dsn(os.environ["BENCH_REDIS_URL"])


def saq_queue():
    from saq import Queue  # type: ignore[import-not-found, import-untyped, unused-ignore]

    return Queue.from_url(os.environ["BENCH_REDIS_URL"], name="bench")
