"""Tasks of Django's Tasks framework, run by RedisTaskBackend (tests/test_task_backend.py)."""

from __future__ import annotations

import asyncio
import os
import time

from django_rcoord.connection import get_client
from django_rcoord.queues.framework import TaskContext, task, task_finished, task_started

RAN = "test:framework-ran"


def _broken_receiver(sender: object, **kwargs: object) -> None:
    raise RuntimeError("a project's receiver that raises")


if os.environ.get("RCOORD_TEST_BROKEN_RECEIVERS"):
    # A project whose receivers of the worker's signals raise (tests/test_worker_faults.py).
    task_started.connect(_broken_receiver)
    task_finished.connect(_broken_receiver)


@task()
def add(a: int, b: int) -> int:
    get_client().rpush(RAN, f"add:{a}+{b}")
    return a + b


@task()
def boom(marker: str) -> None:
    raise ValueError(f"{marker} went boom")


@task(takes_context=True)
def attempt_number(context: TaskContext, marker: str) -> dict:
    return {"attempt": context.attempt, "id": context.task_result.id, "marker": marker}


@task()
async def add_later(a: int, b: int) -> int:
    await asyncio.sleep(0.001)
    return a + b


@task(queue_name="slow")
def sleep_then_return(seconds: float) -> str:
    """Sleep ``seconds`` on the first run only (a run a test kills), then return."""
    client = get_client()
    client.rpush("test:framework-started", "1")
    if client.set("test:framework-blocked", 1, nx=True):
        time.sleep(seconds)
    return "woke"


@task()
def note_finished(result_id: str) -> str:
    """A framework follow-up: records which task it follows and that task's status, as
    the follow-up reads it (final: the finish script queued it)."""
    from django_rcoord.queues import get_result

    record = get_result(result_id)
    seen = f"{result_id} {record.status if record is not None else 'none'}"
    get_client().rpush("test:followed", seen)
    return seen


@task()
def gather(results: list, label: str) -> dict:
    """A fan-in's callback (tests/test_fan_in.py)."""
    return {"label": label, "results": results}
