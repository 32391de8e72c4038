"""Fan-out and fan-in: run tasks side by side, then one task with all their results.

    job = group(resize.s(photo, 200), resize.s(photo, 800)).then(publish.s(photo))

queues the children now (on their own queues, sharded or not) and ``publish(results,
photo)`` once every child has ended, exactly once: ``results`` holds each child's return
value in the children's order. ``job.id`` is the callback's task id: ``get_result`` reads
the callback's record (before it is queued: READY, with the fan-in's progress),
``fan_in_status`` the fan-in's progress, and ``cancel_fan_in`` cancels the children that
have not started and the callback.

How it holds under crashes: a child is counted in the fan-in's HASH, which sits in the
callback's queue group (its slot), by one script (``_fan_in.lua``) that counts a child
once however often it is asked to and queues the callback with the last count. A child
in the callback's group is counted by the finish call that records its end, in the same
atomic step; one in another group (or one that fails the fan-in) queues, in that step, a
task on its own queue (``CHILD_ENDED``) that counts it, and runs at least once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from django_rcoord.connection import slot_pipeline
from django_rcoord.connection.clients import resolve_client
from django_rcoord.exceptions import InvalidName
from django_rcoord.queues.cancel import cancel
from django_rcoord.queues.fan_in_state import STATUS_FIELDS, FanInStatus, fan_in_key, status_of
from django_rcoord.queues.keys import GROUP_KEYS_MS, GroupKeys, QueueKeys, group_of_task_id
from django_rcoord.queues.messages import encode_message, to_json, wire_json
from django_rcoord.queues.producer import (
    Enqueue,
    QueuedInStep,
    queue_now_in_step,
    register_group,
    send_messages,
)
from django_rcoord.queues.records import result_ttl_ms
from django_rcoord.queues.registry import Task, internal_task
from django_rcoord.queues.runs import TaskRun
from django_rcoord.scripts import run_script

logger = logging.getLogger(__name__)

__all__ = [
    "CHILD_ENDED",
    "FanIn",
    "FanInStatus",
    "cancel_fan_in",
    "fan_in_status",
    "group",
    "task_run",
]

#: The field of a child's message that names its fan-in: {"id", "n" (its place, from 1),
#: "if_failed", "queue" (its callback's)}.
FIELD = "fan_in"
#: The task a child's end queues on the child's queue: it counts the child.
CHILD_ENDED = "rcoord.fan_in.child_ended"
#: Where the callback's results go in its message until they are known: the script puts
#: them in place of the first occurrence of its JSON text, which is the callback's first
#: argument (the message's id, task and queue come before it and cannot hold a NUL).
_HOLE = "\x00rcoord:fan-in results\x00"


@dataclass(frozen=True)
class FanIn:
    """A fan-in queued: ``id`` is its callback's task id; ``children`` its children's ids,
    in order."""

    id: str
    children: list[str]


class Group:
    """Tasks to run side by side (``TaskRun``s: ``task.s(...)``, or ``task_run(task, ...)``
    for a Tasks framework task), then ``then`` one task. Every child is checked now: its
    arguments, and that it is no unique task."""

    def __init__(self, *children: TaskRun) -> None:
        if not children:
            raise ValueError("a group needs at least one task")
        self.children = children
        self._requests = [_request(child, "child") for child in children]

    def then(self, callback: TaskRun, *, client: Any = None) -> FanIn:
        """Queue the children now, and ``callback`` (called with the children's results
        first, then its own arguments) once they have all ended."""
        step = queue_now_in_step(_request(callback, "callback"))
        fan_in_id = step.task_id
        runs = [
            _marked(run, child.if_failed, place, fan_in_id, step.queue.name)
            for place, (child, run) in enumerate(zip(self.children, self._requests, strict=True), 1)
        ]
        client = resolve_client(client)
        _start(client, step, len(self.children))
        try:
            ids = send_messages(client, runs)
        except BaseException:
            # Some children may be queued: the fan-in will not call back for them.
            run_script("fan_in_cancel", client, keys=[step.queue.fan_ins], args=[fan_in_id])
            raise
        key = step.queue.fan_in(fan_in_id)
        with slot_pipeline(client, key, transaction=False) as pipe:
            pipe.hset(key, "ids", json.dumps(ids))
            pipe.hget(key, "state")
            _, state = pipe.execute()
        if state == b"failed":  # a child failed it before its ids were here
            _cancel_children(fan_in_id, step.queue, client)
        return FanIn(fan_in_id, ids)


def group(*children: TaskRun) -> Group:
    """``Group(*children)``: ``group(a.s(1), b.s(2)).then(c.s())``."""
    return Group(*children)


def task_run(task: Any, *args: Any, **kwargs: Any) -> TaskRun:
    """A run of ``task`` with these arguments, for a fan-in: a ``@task`` (as ``task.s``), or
    a Tasks framework task on a ``RedisTaskBackend``."""
    return TaskRun(task, args, kwargs)


def _request(run: TaskRun, role: str) -> Enqueue:
    """The producer's request for ``run`` (a callback's: its results first), checked:
    TypeError for arguments its function does not take or JSON cannot carry, ValueError
    for a unique task."""
    if not isinstance(run, TaskRun):
        raise TypeError(f"a fan-in's {role} is a task's run: task.s(*args, **kwargs)")
    args = (_HOLE, *run.args) if role == "callback" else run.args
    if isinstance(run.task, Task):
        request = run.task.enqueue_request(args, run.kwargs)
    else:
        # Imported here: it imports the Tasks framework, which a project may not have.
        from django_rcoord.queues.backend import framework_request

        request = framework_request(run.task, args, run.kwargs)
    if request.unique is not None:
        # A unique task queued while its claim is held is the other run: not this fan-in's.
        raise ValueError(f"a fan-in's {role} cannot be a unique task ({request.task_name})")
    encode_message(request.task_name, request.queue, request.args, request.kwargs)
    return request


def _start(client: Any, step: QueuedInStep, total: int) -> None:
    """Write fan-in ``step.task_id``'s HASH, waiting for ``total`` children."""
    _, message, queue, priority, keep_ms = step.args
    key = step.queue.fan_in(step.task_id)
    register_group(client, step.queue.group)
    with slot_pipeline(client, key, transaction=True) as pipe:
        pipe.hset(
            key,
            mapping={
                "state": "waiting",
                "total": total,
                "ended": 0,
                "failed": 0,
                "message": message,
                "hole": to_json(_HOLE),
                "queue": queue,
                "priority": priority,
                "keep_ms": keep_ms,
                "ttl_ms": result_ttl_ms(),
                "ids": "[]",
            },
        )
        pipe.pexpire(key, GROUP_KEYS_MS)  # while it waits: as long as a queue's keys
        pipe.execute()


def _marked(run: Enqueue, if_failed: str, place: int, fan_in_id: str, queue: str) -> Enqueue:
    """``run`` marked as the ``place``-th child of fan-in ``fan_in_id`` (its callback on
    ``queue``)."""
    mark = {"id": fan_in_id, "n": place, "if_failed": if_failed, "queue": queue}
    return run._replace(extra={**(run.extra or {}), FIELD: mark})


class FanInCount(NamedTuple):
    """A child's count in its fan-in, made by the finish step that records its end when the
    fan-in's callback is in the child's group (one slot): ``keys`` are the fan-in prefix
    and the callback queue's five enqueue keys; the rest is what ``_fan_in.lua``'s
    ``fan_in_count`` takes."""

    keys: tuple[Any, ...]
    fan_in_id: str
    place: int
    value: str
    how: str


def counted_with_end(
    task_id: str, queue: QueueKeys, message: dict[str, Any], value_json: str | None, error: str
) -> FanInCount | QueuedInStep | None:
    """For the worker: how task ``task_id`` (of ``queue``, ``message``) is counted in its
    fan-in with its final end (``value_json``: its return value's JSON when it succeeded,
    else None and ``error``, its exception and message). A ``FanInCount`` for the finish
    step itself when the callback is in ``queue``'s group and the end does not fail the
    fan-in; else the ``CHILD_ENDED`` task to queue with it (a failed fan-in's children
    are cancelled by that task). None when it is no fan-in's child."""
    mark = message.get(FIELD)
    if not isinstance(mark, dict):
        return None
    fan_in_id, place, if_failed = mark.get("id"), mark.get("n"), mark.get("if_failed")
    try:
        callback = QueueKeys.of(mark.get("queue"))  # type: ignore[arg-type]
    except InvalidName:
        callback = None
    if not (isinstance(fan_in_id, str) and isinstance(place, int) and callback is not None):
        logger.error("task %s: its fan-in mark %r is not one this release wrote", task_id, mark)
        return None
    value, how = _counted(task_id, if_failed, value_json, error)
    if callback.group == queue.group and how != "fail":
        keys = (callback.fan_ins, *callback.enqueue_now)
        return FanInCount(keys, fan_in_id, place, value, how)
    args = (fan_in_id, place, task_id, if_failed, callback.name, value_json, error)
    # The top priority (of -100..100): a count waits behind no other task of the child's
    # queue, which the callback would otherwise wait for.
    run = Enqueue(CHILD_ENDED, queue.name, args, {}, priority=100)
    return queue_now_in_step(run, near=queue.group)


def _counted(task_id: str, if_failed: Any, value_json: str | None, error: str) -> tuple[str, str]:
    """(the child's place in the callback's results, JSON; how it ended for the count:
    'ok', 'fail' or 'failed')."""
    if value_json is not None:
        return value_json, "ok"
    if if_failed == "continue":
        return to_json({"failed": task_id, "error": error}), "failed"
    return "null", "failed" if if_failed == "ignore" else "fail"


@internal_task(CHILD_ENDED, max_retries=10)
def child_ended(
    fan_in_id: str,
    place: int,
    child_id: str,
    if_failed: str,
    queue: str,
    value_json: str | None,
    error: str = "",
) -> str:
    """Count child ``child_id`` (the ``place``-th) of fan-in ``fan_in_id``, whose callback
    is on ``queue``, as it ended (``value_json`` or ``error``, see ``counted_with_end``:
    the callback is in another group than the child, or the child fails the fan-in);
    queue the callback when it is the last, cancel the children left when it failed it."""
    value, how = _counted(child_id, if_failed, value_json, error)
    keys = QueueKeys.of(queue)
    said = run_script(
        "fan_in_child_ended",
        resolve_client(None),
        keys=[keys.fan_ins, *keys.enqueue_now],
        args=[wire_json({"id": fan_in_id, "n": place, "value": value, "how": how})],
    )
    said = said.decode() if isinstance(said, bytes) else said
    if said == "failed":
        _cancel_children(fan_in_id, keys)
    return said


def fan_in_status(fan_in_id: str, *, client: Any = None) -> FanInStatus | None:
    """Where fan-in ``fan_in_id`` stands, or None when it is not known (or expired: it is
    kept ``RCOORD["TASK_RESULT_TTL"]`` once over). ``get_result(fan_in_id)`` gives the same
    as its record's ``fan_in`` until the callback is queued."""
    key = fan_in_key(fan_in_id)
    if key is None:
        return None
    return status_of(fan_in_id, resolve_client(client).hmget(key, *STATUS_FIELDS))


def cancel_fan_in(fan_in_id: str, *, client: Any = None) -> bool:
    """Cancel fan-in ``fan_in_id``: its callback will not run, and its children that have
    not started are cancelled (``cancel``: the running ones are asked to stop). True when
    it was waiting; False when its callback is queued already, or it is over or unknown."""
    group = group_of_task_id(fan_in_id)
    if group is None:
        return False
    keys = GroupKeys.of(group)
    client = resolve_client(client)
    cancelled = run_script("fan_in_cancel", client, keys=[keys.fan_ins], args=[fan_in_id])
    if cancelled:
        _cancel_children(fan_in_id, keys, client)
    return bool(cancelled)


def _cancel_children(fan_in_id: str, keys: GroupKeys, client: Any = None) -> Sequence[str]:
    """Cancel the children of ``fan_in_id`` that have not started; returns those."""
    client = resolve_client(client)
    ids = json.loads(client.hget(keys.fan_in(fan_in_id), "ids") or "[]")
    return [child for child in ids if cancel(child, client=client)]
