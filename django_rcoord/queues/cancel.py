"""Cancelling a task that has not started: ``cancel(task_id)`` and ``acancel``."""

from __future__ import annotations

from typing import Any

from django_rcoord.connection import aresolve_client, resolve_client
from django_rcoord.queues.keys import QueueKeys, group_of_task_id
from django_rcoord.queues.messages import decode_message
from django_rcoord.queues.records import result_ttl_ms
from django_rcoord.scripts import arun_script, run_script

__all__ = ["acancel", "cancel"]


def cancel(task_id: str, *, client: Any = None) -> bool:
    """Cancel task ``task_id`` if it is queued or delayed (a retry waiting for its time
    included): it leaves its queue and will not run, its record reads CANCELLED (a finished
    status: it expires after ``RCOORD["TASK_RESULT_TTL"]``) and a unique task's claim is
    dropped. True when it was cancelled; False when it is running (or taken by a worker
    already), finished, a dead letter, or not a known task.

    A running task is not interrupted: its code may be part way through a change that
    stopping it would leave half done. Two round trips: one reads which queue holds the
    task, one script call cancels it atomically.
    """
    group = group_of_task_id(task_id)
    if group is None:
        return False
    client = resolve_client(client)
    body = client.hget(QueueKeys.of(f"{group}/q").messages, task_id)
    call = _call_for(task_id, group, body)
    if call is None:
        return False
    return bool(run_script("task_cancel", client, keys=call[0], args=call[1]))


async def acancel(task_id: str, *, client: Any = None) -> bool:
    """``cancel`` for async code (redis.asyncio)."""
    group = group_of_task_id(task_id)
    if group is None:
        return False
    client = await aresolve_client(client)
    body = await client.hget(QueueKeys.of(f"{group}/q").messages, task_id)
    call = _call_for(task_id, group, body)
    if call is None:
        return False
    return bool(await arun_script("task_cancel", client, keys=call[0], args=call[1]))


def _call_for(task_id: str, group: str, body: Any) -> tuple[list[str], list[Any]] | None:
    """(KEYS, ARGV) of task_cancel for ``task_id`` of ``group`` whose message is ``body``."""
    message = decode_message(body)
    queue = message.get("queue") if message is not None else None
    if not isinstance(queue, str):
        return None
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
            keys.results_expiry,
            keys.failures,
            keys.errors,
        ],
        [task_id, result_ttl_ms()],
    )
