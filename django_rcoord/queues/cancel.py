"""Cancelling a task that has not started (``cancel(task_id)``, ``acancel``), and asking a
running one to stop (its code reads ``stop_requested()``)."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

from django_rcoord.connection.clients import resolve_client
from django_rcoord.connection.loops import aresolve_client
from django_rcoord.queues import incoming
from django_rcoord.queues.keys import GROUP_KEYS_MS, GroupKeys, QueueKeys, group_of_task_id
from django_rcoord.queues.messages import decode_message, wire_json
from django_rcoord.queues.metrics import metric_labels
from django_rcoord.queues.records import result_ttl_ms
from django_rcoord.scripts import arun_script, run_script

#: What task_cancel answers for a task it cancelled (2: asked a running one to stop).
CANCELLED = 1


def cancel(task_id: str, *, client: Any = None) -> bool:
    """Cancel task ``task_id`` if it is queued or delayed (a retry waiting for its time
    included): it leaves its queue and will not run, its record reads CANCELLED (a finished
    status: it expires after ``RCOORD["TASK_RESULT_TTL"]``) and a unique task's claim is
    dropped. True when it was cancelled; False when it is running (or taken by a worker
    already), finished, a dead letter, or not a known task.

    A running task is not interrupted (its code may be part way through a change that
    stopping it would leave half done): it is asked to stop, and its code can check
    ``stop_requested()`` between steps. A cancellation is counted per queue and task in
    the queue group's metrics (``rcoord_tasks_cancelled_total``), in the same script call.
    Two round trips: one reads which queue holds the task, one script call cancels it (or
    asks it to stop) atomically.
    """
    group = group_of_task_id(task_id)
    if group is None:
        return False
    client = resolve_client(client)
    keys = GroupKeys.of(group)
    # Not stored yet: pushed to the incoming list, and not placed (see queues.incoming).
    body = client.hget(keys.messages, task_id) or incoming.place(client, keys, task_id)
    call = _call_for(task_id, group, body)
    if call is None:
        return False
    return run_script("task_cancel", client, keys=call[0], args=call[1]) == CANCELLED


async def acancel(task_id: str, *, client: Any = None) -> bool:
    """``cancel`` for async code (redis.asyncio)."""
    group = group_of_task_id(task_id)
    if group is None:
        return False
    client = await aresolve_client(client)
    keys = GroupKeys.of(group)
    body = await client.hget(keys.messages, task_id) or await incoming.aplace(client, keys, task_id)
    call = _call_for(task_id, group, body)
    if call is None:
        return False
    return await arun_script("task_cancel", client, keys=call[0], args=call[1]) == CANCELLED


def _call_for(task_id: str, group: str, body: Any) -> tuple[list[str], list[Any]] | None:
    """(KEYS, ARGV) of task_cancel for ``task_id`` of ``group`` whose message is ``body``."""
    message = decode_message(body)
    queue = message.get("queue") if message is not None else None
    if message is None or not isinstance(queue, str):
        return None
    task_name = message.get("task")
    try:
        keys = QueueKeys.of(queue)
    except ValueError:  # InvalidName: a message no producer of this project wrote
        return None
    if keys.group != group:
        return None
    return (
        [
            keys.messages,
            keys.ready,
            keys.delayed,
            keys.results,
            keys.records,
            keys.failures,
            keys.errors,
            keys.in_flight,
            keys.stop(task_id),
            keys.metrics,
            keys.queues,
        ],
        [
            wire_json(
                {
                    "id": task_id,
                    "result_ttl": result_ttl_ms(),
                    "stop_ms": STOP_REQUEST_MS,
                    # Counted as the finish script counts runs (rcoord_tasks_cancelled_total).
                    "labels": metric_labels(
                        keys.name, task_name if isinstance(task_name, str) else "?"
                    ),
                    "keep_ms": GROUP_KEYS_MS,
                    "queue": keys.queue,
                }
            )
        ],
    )


#: How long a request to stop a running task is kept (it is read while the task runs).
STOP_REQUEST_MS = 24 * 3600 * 1000

#: The id of the task this thread or task is running (set by the worker around each run).
_current_task_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "rcoord_current_task_id", default=None
)


def current_task_id() -> str | None:
    """The id of the task the calling code runs in (None outside a worker's task)."""
    return _current_task_id.get()


@contextlib.contextmanager
def running(task_id: str) -> Iterator[None]:
    """Make ``task_id`` the current task while the block runs (the worker's runner)."""
    token = _current_task_id.set(task_id)
    try:
        yield
    finally:
        _current_task_id.reset(token)


def stop_requested(task_id: str | None = None, *, client: Any = None) -> bool:
    """Whether ``cancel()`` asked task ``task_id`` (default: the current one) to stop. A
    long task checks it between steps and returns (or raises) early. One round trip."""
    task_id = task_id or current_task_id()
    group = group_of_task_id(task_id) if task_id else None
    if task_id is None or group is None:
        return False
    return bool(resolve_client(client).exists(GroupKeys.of(group).stop(task_id)))


async def astop_requested(task_id: str | None = None, *, client: Any = None) -> bool:
    """``stop_requested`` for async code."""
    task_id = task_id or current_task_id()
    group = group_of_task_id(task_id) if task_id else None
    if task_id is None or group is None:
        return False
    client = await aresolve_client(client)
    return bool(await client.exists(GroupKeys.of(group).stop(task_id)))
