"""Putting tasks on queues: one command per task (or one pipeline for many), now or later
by the Redis server's clock; sync and async. A plain task queued now is one ``RPUSH`` to
its group's incoming list while a worker of this release serves the group
(``queues.incoming``); any other, one script call."""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from django_rcoord import tracing
from django_rcoord.conf import conf
from django_rcoord.connection import outage, slot_pipeline
from django_rcoord.connection.clients import resolve_client
from django_rcoord.connection.errors import REDIS_UNAVAILABLE
from django_rcoord.connection.loops import aresolve_client
from django_rcoord.queues import incoming
from django_rcoord.queues.declared import declared_by
from django_rcoord.queues.fair import with_fair_key
from django_rcoord.queues.keys import (
    GROUP_KEYS_MS,
    WAKE_TOKEN_MS,
    QueueKeys,
    registry_keys,
)
from django_rcoord.queues.messages import check_priority, encode_message, wire_json
from django_rcoord.queues.shards import placed
from django_rcoord.queues.unique import UNIQUE_FIELD, UNIQUE_MS_FIELD, Uniqueness
from django_rcoord.scripts import arun_script, run_script


class Enqueue(NamedTuple):
    """A run of a task to queue: what every producer (``@task``, ``execute_later``, the
    Tasks framework's backend, ``enqueue_many``, follow-ups) builds and ``send_message``
    sends. ``when`` is (delay ms, due time ms since the epoch or 0), see ``due_time``;
    ``extra`` adds fields to the message (the Tasks framework's backend alias);
    ``priority`` -100..100 (higher runs first within the queue); ``unique``: queue it
    only if no task holds its claim."""

    task_name: str
    queue: str
    args: Sequence[Any]
    kwargs: dict[str, Any]
    when: tuple[int, int] = (0, 0)
    extra: dict[str, Any] | None = None
    priority: int = 0
    unique: Uniqueness | None = None


class Message(NamedTuple):
    """A new task message of a run: its queue's keys, its id, its JSON and its unique claim
    (None: not unique)."""

    keys: QueueKeys
    task_id: str
    body: str
    claim: str | None


def task_enqueue_call(message: Message, run: Enqueue) -> tuple[Sequence[Any], list[Any]]:
    """The KEYS and ARGV of task_enqueue for ``message`` of ``run``: its settings as one
    record the script reads by name, then the message."""
    keys = message.keys
    delay_ms, due_at_ms = run.when
    record: dict[str, Any] = {
        "id": message.task_id,
        "queue": keys.queue,
        "priority": run.priority,
        "delay": delay_ms,
        "due_at": due_at_ms,
        "wake_ms": WAKE_TOKEN_MS,
        "keep_ms": GROUP_KEYS_MS,
    }
    if run.unique is not None:
        record["claim"], record["claim_ms"] = message.claim, run.unique.ms
    return keys.enqueue_keys, [wire_json(record), message.body]


def pushed(message: Message, run: Enqueue) -> bytes | None:
    """The incoming entry of ``message`` when ``run`` goes to its group's incoming list (a
    plain task, now, its message at most ``incoming.MAX_PUSHED_BYTES``, while a worker of
    this release serves the group), else None."""
    if (
        run.unique is not None
        or run.when != (0, 0)
        or len(message.body) > incoming.MAX_PUSHED_BYTES
        or not incoming.pushes(message.keys.group)
    ):
        return None
    return incoming.entry(message.keys, message.task_id, message.body, run.priority)


def new_message(run: Enqueue, near: str | None = None) -> Message:
    """The message of ``run``; ``near`` as ``queue_now_in_step`` takes it."""
    task_name, queue, args, kwargs, _, extra, priority, unique = run
    fair = declared_by(task_name).fair  # its @task's, however it is queued
    extra = with_fair_key(fair, task_name, args, kwargs, extra)
    claim = unique.claim(task_name, args, kwargs) if unique is not None else None
    queue, extra = placed(queue, extra, claim, near=near)  # a shard's, when it has shards
    keys = QueueKeys.of(queue)
    if check_priority(priority):
        # Kept in the message: a task that waits (delayed, retried, put back) keeps its place.
        extra = {**(extra or {}), "priority": priority}
    context = tracing.carrier()
    if context is not None:
        extra = {**(extra or {}), tracing.TRACE_FIELD: context}
    if unique is not None:
        # In the message: the scripts that end the task find its claim there, and
        # requeue_dead how long to claim it again.
        extra = {**(extra or {}), UNIQUE_FIELD: claim, UNIQUE_MS_FIELD: unique.ms}
    task_id, body = encode_message(task_name, queue, args, kwargs, extra, group=keys.group)
    return Message(keys, task_id, body, claim)


class QueuedInStep(NamedTuple):
    """A task that another script of the group queues now, in its own atomic step (the
    finish script queues follow-up tasks so): the new task's id, its queue's keys, the five
    keys and five arguments of its ``enqueue_now`` (_ready.lua), and its unique claim ('' and
    0: none)."""

    task_id: str
    queue: QueueKeys
    keys: Sequence[Any]
    args: list[Any]
    claim: str
    claim_ms: int


def queue_now_in_step(run: Enqueue, *, near: str | None = None) -> QueuedInStep:
    """``run`` for a script to queue now (see ``QueuedInStep``); TypeError at once for
    arguments JSON cannot carry. ``near``: the script's group, the shard to queue it on
    when its queue has shards and that is one of them (unless it is unique)."""
    keys, task_id, body, claim = new_message(run, near)
    unique = run.unique
    return QueuedInStep(
        task_id,
        keys,
        keys.enqueue_now,
        _now_args(task_id, body, keys, run.priority),
        claim or "",
        unique.ms if unique is not None else 0,
    )


def _now_args(task_id: str, body: str, keys: QueueKeys, priority: int) -> list[Any]:
    """The five arguments of ``enqueue_now`` (_ready.lua): queue a task now, in a step."""
    return [task_id, body, keys.queue, priority, _GROUP_KEYS_MS]


# A constant argument of every enqueue in a step, encoded once.
_GROUP_KEYS_MS = str(GROUP_KEYS_MS).encode()


#: Seconds a process trusts its last registration of a group (see ``register_group``).
REGISTRY_REFRESH = 3600.0
#: (key prefix, group) -> until when (``time.monotonic()``) this process trusts its last
#: registration of the group.
_registered: dict[tuple[str, str], float] = {}

#: What task_enqueue returns when it created the group's list of queues.
GROUP_CREATED = 2


def _registration(group: str, force: bool) -> tuple[list[str], list[Any]] | None:
    """KEYS and ARGV of group_register when this process has not registered ``group``
    lately (or ``force``), else None."""
    if not force and time.monotonic() < _registered.get((conf.KEY_PREFIX, group), 0.0):
        return None
    return list(registry_keys()), [group, GROUP_KEYS_MS, WAKE_TOKEN_MS]


def _registered_now(group: str) -> None:
    _registered[(conf.KEY_PREFIX, group)] = time.monotonic() + REGISTRY_REFRESH


def register_group(client: Any, group: str, *, force: bool = False) -> None:
    """Put ``group`` in the registry pollers read: once per process and hour, and again
    whenever an enqueue finds the group's keys new (Redis lost them), so pollers never
    need SCAN to find a group."""
    call = _registration(group, force)
    if call is not None:
        run_script("group_register", client, keys=call[0], args=call[1])
        _registered_now(group)


async def aregister_group(client: Any, group: str, *, force: bool = False) -> None:
    """``register_group`` for redis.asyncio clients."""
    call = _registration(group, force)
    if call is not None:
        await arun_script("group_register", client, keys=call[0], args=call[1])
        _registered_now(group)


class Enqueued(NamedTuple):
    """What queueing one task did: its id, and whether it was queued (False: a unique
    task's claim was held, ``task_id`` is the holder's and nothing was queued)."""

    task_id: str
    queued: bool


def _enqueued(task_id: str, reply: Any) -> Enqueued:
    """The ``Enqueued`` of task_enqueue's ``queued`` (1, 2, or a unique claim's holder)."""
    if type(reply) is int:
        return Enqueued(task_id, True)
    if isinstance(reply, bytes):
        return Enqueued(reply.decode(), False)
    return Enqueued(reply, False)  # a client that decodes replies


def _answered(message: Message, reply: Any) -> tuple[Enqueued, bool]:
    """(what queueing ``message`` did, whether the group's list of queues was created by it)
    from task_enqueue's ``reply``, noting whether a worker of this release serves the group."""
    queued, serving = reply
    incoming.saw_serving(message.keys.group, serving)
    return _enqueued(message.task_id, queued), queued == GROUP_CREATED


@tracing.traced_send
def send_message(client: Any, run: Enqueue) -> Enqueued:
    """Queue ``run``: one ``RPUSH`` to its group's incoming list (``incoming``), or one
    script call. Every producer (``@task``, ``execute_later``, the framework backend) ends
    here: a traced one (``django_rcoord.tracing``) in a PRODUCER span."""
    message = new_message(run)
    keys = message.keys
    try:
        entry = pushed(message, run)
        if entry is not None:
            client.rpush(keys.incoming, entry)
            return Enqueued(message.task_id, True)
        register_group(client, keys.group)
        script_keys, argv = task_enqueue_call(message, run)
        done, created = _answered(message, run_script("task_enqueue", client, script_keys, argv))
        if created:
            register_group(client, keys.group, force=True)
    except REDIS_UNAVAILABLE as exc:
        outage.raise_unavailable(f"queueing task {run.task_name!r}", exc)
    return done


@tracing.traced_send
async def asend_message(client: Any, run: Enqueue) -> Enqueued:
    """``send_message`` on ``redis.asyncio``."""
    message = new_message(run)
    keys = message.keys
    client = await aresolve_client(client)
    try:
        entry = pushed(message, run)
        if entry is not None:
            await client.rpush(keys.incoming, entry)
            return Enqueued(message.task_id, True)
        await aregister_group(client, keys.group)
        script_keys, argv = task_enqueue_call(message, run)
        reply = await arun_script("task_enqueue", client, script_keys, argv)
        done, created = _answered(message, reply)
        if created:
            await aregister_group(client, keys.group, force=True)
    except REDIS_UNAVAILABLE as exc:
        outage.raise_unavailable(f"queueing task {run.task_name!r}", exc)
    return done


def due_time(
    delay: float | datetime.timedelta | None, eta: datetime.datetime | None = None
) -> tuple[int, int]:
    """(delay ms, due time ms since the epoch or 0) for the enqueue script: a delay counts
    from the moment the server stores the task, an ``eta`` is read on the server's clock."""
    if delay is not None and eta is not None:
        raise ValueError("give delay or eta, not both")
    if eta is not None:
        if eta.tzinfo is None:
            raise ValueError("eta must be an aware datetime")
        return 0, max(1, int(eta.timestamp() * 1000))
    seconds = delay.total_seconds() if isinstance(delay, datetime.timedelta) else delay or 0
    if seconds < 0:
        raise ValueError("delay must not be negative")
    return int(seconds * 1000), 0


def execute_later(
    queue: str, name: str, args: Sequence[Any] = (), delay: float = 0, *, client: Any = None
) -> str:
    """The book's execute_later: queue task ``name`` with ``args`` (after ``delay`` seconds).

    Returns the task id (a unique ``@task``'s already queued, when it is). One round trip.
    """
    run = Enqueue(name, queue, args, {}, due_time(delay), unique=declared_by(name).unique)
    return send_message(resolve_client(client), run).task_id


async def aexecute_later(
    queue: str, name: str, args: Sequence[Any] = (), delay: float = 0, *, client: Any = None
) -> str:
    """``execute_later`` for async code (redis.asyncio, one round trip)."""
    run = Enqueue(name, queue, args, {}, due_time(delay), unique=declared_by(name).unique)
    return (await asend_message(client, run)).task_id


def routed(run: Enqueue) -> Enqueue:
    """``run`` on the queue of the shard it goes to (itself when its group has no shards):
    routing a run twice keeps its first shard."""
    if not conf.QUEUE_SHARDS:
        return run
    claim = run.unique.claim(run.task_name, run.args, run.kwargs) if run.unique else None
    queue, extra = placed(run.queue, run.extra, claim)
    return run._replace(queue=queue, extra=extra)


def resolve_target(
    target: Any, args: Sequence[Any], kwargs: dict[str, Any], queue: str | None, caller: str
) -> Enqueue:
    """A run, now, of a ``@task`` (its arguments checked; ``queue`` overrides its own) or
    of a task name, which needs ``queue`` (the uniqueness of the ``@task`` of that name,
    if one is registered)."""
    if not isinstance(target, str):  # a registered task
        return target.enqueue_request(args, kwargs)._replace(queue=queue or target.queue)
    if queue is None:
        raise ValueError(f"{caller} needs queue= for a task given by name")
    return Enqueue(target, queue, args, kwargs, unique=declared_by(target).unique)


def enqueue_many(
    calls: Iterable[tuple[Any, Sequence[Any], dict[str, Any]]],
    *,
    queue: str | None = None,
    client: Any = None,
) -> list[str]:
    """Queue many tasks in one round trip per queue group (``send_messages``): ``calls`` is
    (task or name, args, kwargs) triples (a task: a ``@task`` of django_rcoord.queues; a
    name needs ``queue``). Returns the ids in order."""
    runs = [
        resolve_target(target, args, kwargs, queue, "enqueue_many")
        for target, args, kwargs in calls
    ]
    return send_messages(resolve_client(client), runs)


def send_messages(client: Any, runs: Sequence[Enqueue]) -> list[str]:
    """Queue ``runs`` in one round trip per queue group (one pipeline: on Redis Cluster a
    group is one slot, on one primary), each on the shard it goes to, pushed to the
    group's incoming list or by the script as ``send_message`` would; returns their ids in
    order (a unique task whose claim another holds: that one's)."""
    by_group: dict[str, list[tuple[int, Enqueue]]] = {}
    for index, run in enumerate(map(routed, runs)):
        by_group.setdefault(QueueKeys.of(run.queue).group, []).append((index, run))
    ids = [""] * len(runs)
    for group in by_group:
        register_group(client, group)
    for entries in by_group.values():
        queue_keys = QueueKeys.of(entries[0][1].queue)
        with slot_pipeline(client, queue_keys.messages, transaction=False) as pipe:
            sent: list[tuple[int, Message, bool]] = []
            for index, run in entries:
                message = new_message(run)
                entry = pushed(message, run)
                if entry is not None:
                    pipe.rpush(message.keys.incoming, entry)
                else:
                    run_script("task_enqueue", pipe, *task_enqueue_call(message, run))
                sent.append((index, message, entry is not None))
            replies = pipe.execute()
        created = False
        for (index, message, was_pushed), reply in zip(sent, replies, strict=True):
            ids[index] = message.task_id
            if not was_pushed:
                # A unique task whose claim was held (maybe by an earlier one of these).
                done, new_group = _answered(message, reply)
                ids[index], created = done.task_id, created or new_group
        if created:
            register_group(client, queue_keys.group, force=True)
    return ids
