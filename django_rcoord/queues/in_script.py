"""A task queued by a project's own Lua script, in the same atomic step as its writes
(``enqueue_in_script``): the keys and arguments of ``enqueue_task`` (_enqueue.lua)."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django_rcoord.connection.clients import resolve_client
from django_rcoord.queues.keys import GROUP_KEYS_MS, WAKE_TOKEN_MS, QueueKeys
from django_rcoord.queues.producer import (
    GROUP_CREATED,
    due_time,
    new_message,
    register_group,
    resolve_target,
)

__all__ = ["ScriptedEnqueue", "enqueue_in_script"]


@dataclass(frozen=True)
class ScriptedEnqueue:
    """A task for a project's own Lua script to queue in the same atomic step as its writes.

    The script includes the queue's helper (``--! include django_rcoord:_enqueue``), takes
    ``keys`` among its KEYS and ``args`` among its ARGV, and calls
    ``enqueue_task(<the 7 keys>, <the 8 args>)`` in that order. After the script, call
    ``registered(client, result)`` with what ``enqueue_task`` returned.
    """

    task_id: str
    group: str
    #: The queue group's hash tag: the script's other keys must share it on Redis Cluster.
    hash_tag: str
    keys: list[str]
    args: list[Any]

    def registered(self, client: Any, result: Any) -> None:
        """Record the group again in the registry pollers read when the script's
        ``enqueue_task`` returned 2 (it found the group's keys new: Redis had lost them)."""
        if result == GROUP_CREATED:
            register_group(resolve_client(client), self.group, force=True)


def enqueue_in_script(
    target: Any,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    queue: str | None = None,
    delay: float | datetime.timedelta | None = None,
    eta: datetime.datetime | None = None,
    client: Any = None,
) -> ScriptedEnqueue:
    """Prepare a task (a ``@task``, or a name with ``queue``) for a project's own script to
    queue with its writes: either both happen or neither, and a crash between them cannot
    lose the task. ``queue`` overrides a task's own (e.g. a queue in the group of the
    script's other keys). Arguments are checked here, as ``delay()`` checks them; the group
    is registered for pollers (once per process and hour) before the script runs.
    ValueError for a unique task (``unique_for``): its claim cannot be checked there."""
    kwargs = dict(kwargs or {})
    run = resolve_target(target, args, kwargs, queue, "enqueue_in_script")
    if run.unique is not None:
        # A project's script queues the task with enqueue_task, which checks no claim.
        raise ValueError(
            f"enqueue_in_script cannot keep {run.task_name!r} unique (unique_for): a project's own "
            "script queues it without the uniqueness check; queue it with delay(), or "
            "define it without unique_for"
        )
    run = run._replace(when=due_time(delay, eta))
    task_id, keys, body = (message := new_message(run)).task_id, message.keys, message.body
    argv = _full_args(task_id, body, keys, run.when, run.priority)
    register_group(resolve_client(client), keys.group)
    return ScriptedEnqueue(task_id, keys.group, keys.hash_tag, list(keys.enqueue_task_keys), argv)


def _full_args(
    task_id: str, body: str, keys: QueueKeys, when: tuple[int, int], priority: int
) -> list[Any]:
    """The eight arguments of ``enqueue_task`` (_enqueue.lua), for a project's own script."""
    delay_ms, due_at_ms = when
    return [task_id, body, keys.queue, delay_ms, WAKE_TOKEN_MS, GROUP_KEYS_MS, due_at_ms, priority]
