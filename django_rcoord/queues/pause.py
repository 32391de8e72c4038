"""Pausing a queue for every worker at once (``pause_queue``, ``resume_queue`` and their
async twins ``apause_queue``, ``aresume_queue``).

A paused queue keeps its tasks and takes new ones; no worker takes from it until it is
resumed. The state is in Redis, in the SET ``paused`` of the queue's group (the names of
its paused queues within the group), which the finish-and-take script reads on every
take (``_take.lua``): a worker's next take after the pause leaves the queue alone,
whichever process paused it, and a worker that starts later finds it paused too. Tasks
running go on and finish; a worker that holds tasks it took before the pause (its
prefetch, tens of ms of work at most: see ``worker.prefetch``) runs them.

A queue group with shards (``RCOORD["QUEUE_SHARDS"]``) is paused in its own keys and in
every shard it can have in any layout (``shards.every_layout``), so the pause holds
whatever the number of shards is now or becomes. A shard's own queue name
(``"reports~7/pdf"``) pauses that shard alone.

Resuming wakes the group's idle workers at once, with a token on the group's incoming
list (where they wait), so they take from it without waiting for their next look.
"""

from __future__ import annotations

import logging
from typing import Any

from django_rcoord.connection.clients import resolve_client
from django_rcoord.connection.loops import aresolve_client
from django_rcoord.queues.keys import QueueKeys, split_queue_name
from django_rcoord.queues.producer import aregister_group, register_group
from django_rcoord.queues.shards import every_layout

__all__ = ["apause_queue", "aresume_queue", "pause_queue", "resume_queue"]

logger = logging.getLogger(__name__)


def pause_queue(queue: str, *, client: Any = None) -> bool:
    """Stop every worker taking tasks from ``queue`` (``"email"``, ``"reports/pdf"``) until
    ``resume_queue``; its tasks, and those queued meanwhile, wait in it. Running tasks
    finish. True when it was not paused (anywhere it lives) before; pausing again is
    harmless. Two round trips (on Redis Cluster, one per primary, then one)."""
    targets = _targets(queue)
    client = resolve_client(client)
    with client.pipeline(transaction=False) as pipe:
        for keys in targets:
            pipe.sadd(keys.paused, keys.queue)
        added = pipe.execute()
    # In the registry the status pages read, for a group that never had a task.
    register_group(client, targets[0].group, force=True)
    return _log("paused", queue, any(added))


async def apause_queue(queue: str, *, client: Any = None) -> bool:
    """``pause_queue`` for async code (redis.asyncio)."""
    targets = _targets(queue)
    client = await aresolve_client(client)
    async with client.pipeline(transaction=False) as pipe:
        for keys in targets:
            pipe.sadd(keys.paused, keys.queue)
        added = await pipe.execute()
    await aregister_group(client, targets[0].group, force=True)
    return _log("paused", queue, any(added))


def resume_queue(queue: str, *, client: Any = None) -> bool:
    """Let workers take from ``queue`` again, and wake those waiting idle on its group at
    once. True when it was paused (anywhere it lives); resuming a queue that is not paused
    is harmless. Two round trips (on Redis Cluster, two per primary)."""
    targets = _targets(queue)
    client = resolve_client(client)
    with client.pipeline(transaction=False) as pipe:
        _unpause(pipe, targets)
        replies = pipe.execute()
    wakes = _wakes(targets, replies)
    if wakes:
        with client.pipeline(transaction=False) as pipe:
            _push_wakes(pipe, wakes)
            pipe.execute()
    return _log("resumed", queue, any(replies[0::2]))


async def aresume_queue(queue: str, *, client: Any = None) -> bool:
    """``resume_queue`` for async code (redis.asyncio)."""
    targets = _targets(queue)
    client = await aresolve_client(client)
    async with client.pipeline(transaction=False) as pipe:
        _unpause(pipe, targets)
        replies = await pipe.execute()
    wakes = _wakes(targets, replies)
    if wakes:
        async with client.pipeline(transaction=False) as pipe:
            _push_wakes(pipe, wakes)
            await pipe.execute()
    return _log("resumed", queue, any(replies[0::2]))


def _targets(queue: str) -> list[QueueKeys]:
    """The keys of ``queue`` in every group that may hold its tasks (InvalidName when it is
    no queue name)."""
    group, name = split_queue_name(queue)
    return [QueueKeys.of(f"{each}/{name}") for each in every_layout(group)]


def _unpause(pipe: Any, targets: list[QueueKeys]) -> None:
    """Queue, per group: take the queue out of its paused SET, count its idle workers. A
    worker registered idle after the count took after the removal, so it saw the queue
    resumed: no worker is left asleep on a resumed queue's tasks."""
    for keys in targets:
        pipe.srem(keys.paused, keys.queue)
        pipe.zcard(keys.idle)


def _wakes(targets: list[QueueKeys], replies: list[Any]) -> list[str]:
    """The incoming list of each group where the queue was paused and workers wait."""
    return [
        keys.incoming
        for keys, removed, idle in zip(targets, replies[0::2], replies[1::2], strict=True)
        if removed and idle
    ]


def _push_wakes(pipe: Any, wakes: list[str]) -> None:
    """One wake-up token ('') on each incoming list: idle workers wait on the list without
    taking from it, so one wakes them all, and the take drops it (see _incoming.lua)."""
    for key in wakes:
        pipe.rpush(key, "")


def _log(verb: str, queue: str, changed: bool) -> bool:
    if changed:
        logger.info("queue %s %s", queue, verb)
    return changed
