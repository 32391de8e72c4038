"""Looking after queues: recovering expired leases and due tasks, counts, dead letters,
and the overview ``rcoord_status`` prints. A task's record, and reading it, are in
``results``."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from django_rcoord.conf import conf
from django_rcoord.connection import slot_pipeline
from django_rcoord.connection.clients import resolve_client
from django_rcoord.queues import incoming
from django_rcoord.queues.keys import (
    DEFAULT_GROUP,
    GROUP_KEYS_MS,
    GroupKeys,
    QueueKeys,
    registry_keys,
)
from django_rcoord.queues.messages import as_text, decode_message, wire_json
from django_rcoord.queues.shards import queues_holding, shard_queue_names
from django_rcoord.scripts import run_script
from django_rcoord.validation import check_batch

logger = logging.getLogger(__name__)

#: Lateness samples (ms, due -> promoted) kept per queue group, for rcoord_status.
LATENESS_SAMPLES = 1000


def recover_and_promote(
    queue: QueueKeys, *, batch: int = 500, client: Any = None
) -> tuple[int, int, float | None]:
    """Put back ``queue``'s tasks whose lease ran out and promote its due delayed tasks.

    One script call (atomic: a task is never lost between the delayed set and
    the queue, nor promoted twice, whoever else runs this at the same moment).
    Returns (recovered, promoted, seconds until the next delayed task is due or None).
    ``batch`` (at most 1000) bounds each kind of move of one call.
    """
    check_batch(batch, "batch")
    keys, args = _recover_call(queue, batch)
    recovered, promoted, due_in_ms, killed = run_script(
        "task_recover", resolve_client(client), keys=keys, args=args
    )
    if killed:
        logger.error(
            "%d task(s) of %s made dead letters: their workers died while running them "
            "%d times (TASK_MAX_DELIVERIES)",
            killed,
            queue.name,
            conf.TASK_MAX_DELIVERIES,
        )
    return int(recovered), int(promoted), (due_in_ms / 1000 if due_in_ms >= 0 else None)


def _recover_call(queue: QueueKeys, batch: int) -> tuple[list[str], list[bytes]]:
    """KEYS and ARGV of ``task_recover`` for ``queue``, moving ``batch`` tasks of each kind."""
    return (
        [
            queue.owners,
            queue.ready,
            queue.in_flight,
            queue.delayed,
            queue.incoming,
            queue.lateness,
            queue.results,
            queue.messages,
            queue.queues,
            queue.failures,
            queue.errors,
            queue.dead,
            queue.records,
            queue.results_expiry,
        ],
        [
            wire_json(
                {
                    "batch": batch,
                    "samples": LATENESS_SAMPLES,
                    "keep_ms": GROUP_KEYS_MS,
                    "queue": queue.queue,
                    "max_lost": conf.TASK_MAX_DELIVERIES,
                    "result_ttl": result_ttl_ms(),
                }
            )
        ],
    )


def result_ttl_ms() -> int:
    """How long a finished task's record is kept, ms (RCOORD["TASK_RESULT_TTL"])."""
    return max(1000, int(conf.TASK_RESULT_TTL * 1000))


# -- inspecting -------------------------------------------------------------------
def queue_stats(queue: str, *, client: Any = None) -> dict[str, int]:
    """Counts of a queue's tasks: ready, in flight, delayed (retries included) and dead;
    a queue of a group with shards (``RCOORD["QUEUE_SHARDS"]``) counts them all. What
    producers pushed to a group's incoming list is placed on its queues first, and counted
    there (``incoming.place``)."""
    shards = [QueueKeys.of(name) for name in shard_queue_names(queue)]
    client = resolve_client(client)
    for keys in shards:
        incoming.place(client, keys)
    with client.pipeline(transaction=False) as pipe:
        for keys in shards:
            count_tasks(pipe, keys)
        replies = iter(pipe.execute())
    counts = [read_task_counts(replies) for _ in shards]
    return {name: sum(count[name] for count in counts) for name in TASK_COUNTS}


#: The counts of ``queue_stats``, in the order ``count_tasks`` asks for them.
TASK_COUNTS = ("ready", "in_flight", "delayed", "dead")


def count_tasks(pipe: Any, keys: QueueKeys) -> None:
    """Queue on ``pipe`` the reads of a queue's ``TASK_COUNTS`` (``read_task_counts``
    reads their replies)."""
    pipe.zcard(keys.ready)
    pipe.get(keys.fair_waiting)  # ready too: behind their fair key's head (see fair)
    # Below +inf: the in-flight ZSET keeps one member there (see _in_flight.lua).
    pipe.zcount(keys.in_flight, "-inf", "(+inf")
    pipe.zcard(keys.delayed)
    pipe.llen(keys.dead)


def read_task_counts(replies: Iterator[Any]) -> dict[str, int]:
    """The ``TASK_COUNTS`` of one queue, from the replies ``count_tasks`` asked for."""
    ready, waiting, in_flight, delayed, dead = (next(replies) for _ in range(5))
    ready += max(0, int(waiting or 0))
    return dict(zip(TASK_COUNTS, (ready, in_flight, delayed, dead), strict=True))


def dead_letters(
    queue: str, *, limit: int = 100, offset: int = 0, client: Any = None
) -> list[dict[str, Any]]:
    """``limit`` dead letters from the ``offset``-th oldest: each message, with ``error`` (the
    last error, a traceback) and ``failures`` added. A queue of a group with shards, now or
    in an earlier layout, lists its groups' dead letters one group after another."""
    check_batch(limit, "limit")
    client = resolve_client(client)
    names = layout_queues(queue, client=client)
    if len(names) == 1:
        return _dead_letters_of(QueueKeys.of(names[0]), limit, max(0, offset), client)
    letters: list[dict[str, Any]] = []
    skip = max(0, offset)
    for name in names:
        keys = QueueKeys.of(name)
        length = client.llen(keys.dead)
        if skip >= length:
            skip -= length
            continue
        letters += _dead_letters_of(keys, limit - len(letters), skip, client)
        skip = 0
        if len(letters) >= limit:
            break
    return letters


def layout_queues(queue: str, task_id: str | None = None, *, client: Any = None) -> list[str]:
    """The queues that may hold queue ``queue``'s task ``task_id`` (or any of its tasks):
    in the layout of shards now or any earlier one (``shards.queues_holding``; without a
    task id the registry is read for the earlier layouts' groups)."""
    if task_id is not None:
        return queues_holding(queue, task_id)
    return queues_holding(queue, known=known_groups(client=client))


def _dead_letters_of(keys: QueueKeys, limit: int, offset: int, client: Any) -> list[dict[str, Any]]:
    ids = client.lrange(keys.dead, offset, offset + limit - 1)
    if not ids:
        return []
    with slot_pipeline(client, keys.messages, transaction=False) as pipe:
        pipe.hmget(keys.messages, ids)
        pipe.hmget(keys.errors, ids)
        pipe.hmget(keys.failures, ids)
        bodies, errors, failures = pipe.execute()
    letters = []
    for task_id, body, error, failed in zip(ids, bodies, errors, failures, strict=True):
        letter = decode_message(body) or {"id": task_id.decode(), "raw": as_text(body)}
        letter["error"] = as_text(error)
        letter["failures"] = int(failed or 0)
        letters.append(letter)
    return letters


#: Dead letters one requeue or delete script call moves: small enough that one call does
#: not hold the server up noticeably, large enough that a big list takes few calls.
REQUEUE_BATCH = 100


def requeue_dead(queue: str, task_id: str | None = None, *, client: Any = None) -> int:
    """Send the dead letters of ``queue`` back to it (only ``task_id``, when given), with
    their retries reset. Returns how many. A queue of a group with shards: each group's,
    in the layout of shards now and in earlier ones (only the one ``task_id`` names, when
    given), back to its own group.

    In script calls of ``REQUEUE_BATCH`` letters each, oldest first: each call is atomic
    and short, so Redis never pauses long however many letters there are.
    """
    return sum(
        _requeue_dead(QueueKeys.of(name), task_id, client)
        for name in layout_queues(queue, task_id, client=client)
    )


def _requeue_dead(keys: QueueKeys, task_id: str | None, client: Any) -> int:
    return _dead_in_batches(
        "task_requeue_dead",
        client,
        [
            keys.dead,
            keys.ready,
            keys.failures,
            keys.errors,
            keys.incoming,
            keys.results,
            keys.records,
            keys.messages,
            keys.queues,
            keys.results_expiry,
        ],
        {"queue": keys.queue, "keep_ms": GROUP_KEYS_MS},
        task_id,
    )


def delete_dead(queue: str, task_id: str | None = None, *, client: Any = None) -> int:
    """Delete the dead letters of ``queue`` for good (only ``task_id``, when given); their
    result records stay until they expire. Returns how many. Bounded calls, as
    ``requeue_dead``."""
    return sum(
        _delete_dead(QueueKeys.of(name), task_id, client)
        for name in layout_queues(queue, task_id, client=client)
    )


def _delete_dead(keys: QueueKeys, task_id: str | None, client: Any) -> int:
    return _dead_in_batches(
        "task_delete_dead",
        client,
        [keys.dead, keys.messages, keys.failures, keys.errors, keys.results],
        {},
        task_id,
    )


def _dead_in_batches(
    script: str, client: Any, keys: list[str], call: dict[str, Any], task_id: str | None
) -> int:
    """Call ``script`` (which handles at most ``REQUEUE_BATCH`` dead letters, or the one
    ``task_id`` names) until it handles fewer; returns how many it handled in all.
    ``call``: the script's own settings, beside the batch and the id."""
    client = resolve_client(client)
    args = [wire_json({**call, "batch": REQUEUE_BATCH, "id": task_id or ""})]
    one = task_id is not None
    handled = 0
    while True:
        count = int(run_script(script, client, keys=keys, args=args))
        handled += count
        if one or count < REQUEUE_BATCH:
            return handled


def holding_nothing(groups: list[str], *, client: Any = None) -> list[str]:
    """Of ``groups``, those that hold no task in any state (their messages HASH is empty)
    and had none queued for ``GROUP_KEYS_MS`` (their list of queues expired)."""
    client = resolve_client(client)
    with client.pipeline(transaction=False) as pipe:
        for group in groups:
            pipe.exists(GroupKeys.of(group).queues)
            pipe.exists(GroupKeys.of(group).messages)
        found = pipe.execute()
    return [group for n, group in enumerate(groups) if not (found[2 * n] or found[2 * n + 1])]


def forget_gone_groups(empty: list[str] | None = None, *, client: Any = None) -> list[str]:
    """Drop from the registry the groups that are gone: they hold nothing (see
    ``holding_nothing``) and no worker is signed on to them. Returns them. Workers stop
    serving such a group (an earlier shard layout's) and pollers stop watching it. A group
    a producer uses again is recorded again: each is looked at once more after the drop,
    and put back if a task came meanwhile. ``empty``: the registry's groups already found
    holding nothing (read here when not given)."""
    client = resolve_client(client)
    if empty is None:
        empty = holding_nothing(known_groups(client=client), client=client)
    empty = [group for group in empty if group != DEFAULT_GROUP]
    with client.pipeline(transaction=False) as pipe:
        for group in empty:
            pipe.exists(GroupKeys.of(group).workers)
        gone = [group for group, served in zip(empty, pipe.execute(), strict=True) if not served]
    if not gone:
        return []
    registry = registry_keys()[0]
    client.srem(registry, *gone)
    # A producer records a group after its first task's keys exist: one whose list of
    # queues exists now was recorded again between the read and the drop, or is about to be.
    with client.pipeline(transaction=False) as pipe:
        for group in gone:
            pipe.exists(GroupKeys.of(group).queues)
        back = [group for group, exists in zip(gone, pipe.execute(), strict=True) if exists]
    if back:
        client.sadd(registry, *back)
    return [group for group in gone if group not in back]


def known_queues(group: str = DEFAULT_GROUP, *, client: Any = None) -> list[str]:
    """Names of the queues of ``group`` that have ever had a task."""
    members = resolve_client(client).hkeys(GroupKeys.of(group).queues)
    names = sorted(member.decode() for member in members)
    return names if group == DEFAULT_GROUP else [f"{group}/{name}" for name in names]


def forget_gone_workers(group: str = DEFAULT_GROUP, *, client: Any = None) -> int:
    """Drop from ``group``'s set of workers those whose heartbeat ran out (workers that died
    without signing off); returns how many. A worker signing off calls it, so the status
    pages and endpoints, which only read, need not: they leave such members out. One that
    was only late comes back with its next heartbeat."""
    group_keys = GroupKeys.of(group)
    workers_key = group_keys.workers
    client = resolve_client(client)
    members = sorted(client.smembers(workers_key))
    if not members:
        return 0
    with slot_pipeline(client, workers_key, transaction=False) as pipe:
        for member in members:
            pipe.exists(group_keys.heartbeat(member.decode()))
        alive = pipe.execute()
    gone = [member for member, exists in zip(members, alive, strict=True) if not exists]
    if gone:
        client.srem(workers_key, *gone)
    return len(gone)


# -- groups and queues ----------------------------------------------------------------
def known_groups(*, client: Any = None) -> list[str]:
    """Queue groups that have had a task in the last 30 days (the default group always), from
    the registry producers write when they first use a group."""
    members = resolve_client(client).smembers(registry_keys()[0])
    return sorted({DEFAULT_GROUP, *(member.decode() for member in members)})
