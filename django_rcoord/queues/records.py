"""Looking after queues: recovering expired leases and due tasks, counts, dead letters,
and the overview ``rcoord_status`` prints."""

from __future__ import annotations

import datetime
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError

from django_rcoord.conf import conf
from django_rcoord.connection import aresolve_client, resolve_client, slot_pipeline
from django_rcoord.connection.features import SCRIPT_FLAGS
from django_rcoord.keys import KeySpace
from django_rcoord.queues.keys import (
    DEFAULT_GROUP,
    GROUP_KEYS_MS,
    WAKE_TOKEN_MS,
    QueueKeys,
    group_of_task_id,
    registry_keys,
)
from django_rcoord.queues.messages import as_text, decode_message
from django_rcoord.scripts import arun_script, run_script
from django_rcoord.validation import check_batch

__all__ = [
    "TaskRecord",
    "aget_result",
    "dead_letters",
    "delete_dead",
    "get_result",
    "known_groups",
    "known_queues",
    "queue_stats",
    "recover_and_promote",
    "requeue_dead",
]


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
    recovered, promoted, due_in_ms, killed = run_script(
        "task_recover",
        resolve_client(client),
        keys=[
            queue.owners,
            queue.ready,
            queue.in_flight,
            queue.delayed,
            queue.wake,
            queue.lateness,
            queue.results,
            queue.messages,
            queue.queues,
            queue.failures,
            queue.errors,
            queue.dead,
            queue.results_expiry,
        ],
        args=[
            batch,
            WAKE_TOKEN_MS,
            LATENESS_SAMPLES,
            GROUP_KEYS_MS,
            queue.queue,
            conf.TASK_MAX_DELIVERIES,
            result_ttl_ms(),
        ],
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


def result_ttl_ms() -> int:
    """How long a finished task's record is kept, ms (RCOORD["TASK_RESULT_TTL"])."""
    return max(1000, int(conf.TASK_RESULT_TTL * 1000))


# -- inspecting -------------------------------------------------------------------
def queue_stats(queue: str, *, client: Any = None) -> dict[str, int]:
    """Counts of a queue's tasks: ready, in flight, delayed (retries included) and dead."""
    keys = QueueKeys.of(queue)
    with resolve_client(client).pipeline(transaction=False) as pipe:
        count_tasks(pipe, keys)
        return dict(zip(TASK_COUNTS, pipe.execute(), strict=True))


#: The counts of ``queue_stats``, in the order ``count_tasks`` asks for them.
TASK_COUNTS = ("ready", "in_flight", "delayed", "dead")


def count_tasks(pipe: Any, keys: QueueKeys) -> None:
    """Queue on ``pipe`` the reads of a queue's ``TASK_COUNTS``, one reply each."""
    pipe.zcard(keys.ready)
    pipe.zcard(keys.in_flight)
    pipe.zcard(keys.delayed)
    pipe.llen(keys.dead)


def dead_letters(
    queue: str, *, limit: int = 100, offset: int = 0, client: Any = None
) -> list[dict[str, Any]]:
    """``limit`` dead letters from the ``offset``-th oldest: each message, with ``error`` (the
    last error, a traceback) and ``failures`` added."""
    check_batch(limit, "limit")
    keys = QueueKeys.of(queue)
    client = resolve_client(client)
    ids = client.lrange(keys.dead, max(0, offset), max(0, offset) + limit - 1)
    if not ids:
        return []
    with client.pipeline(transaction=False) as pipe:
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
    their retries reset. Returns how many.

    In script calls of ``REQUEUE_BATCH`` letters each, oldest first: each call is atomic
    and short, so Redis never pauses long however many letters there are.
    """
    keys = QueueKeys.of(queue)
    return _dead_in_batches(
        "task_requeue_dead",
        client,
        [
            keys.dead,
            keys.ready,
            keys.failures,
            keys.errors,
            keys.wake,
            keys.results,
            keys.results_expiry,
            keys.messages,
            keys.queues,
        ],
        [WAKE_TOKEN_MS, keys.queue, GROUP_KEYS_MS, REQUEUE_BATCH, task_id or ""],
        one=task_id is not None,
    )


def delete_dead(queue: str, task_id: str | None = None, *, client: Any = None) -> int:
    """Delete the dead letters of ``queue`` for good (only ``task_id``, when given); their
    result records stay until they expire. Returns how many. Bounded calls, as
    ``requeue_dead``."""
    keys = QueueKeys.of(queue)
    return _dead_in_batches(
        "task_delete_dead",
        client,
        [keys.dead, keys.messages, keys.failures, keys.errors, keys.results],
        [REQUEUE_BATCH, task_id or ""],
        one=task_id is not None,
    )


def _dead_in_batches(
    script: str, client: Any, keys: list[str], args: list[Any], *, one: bool
) -> int:
    """Call ``script`` (which handles at most ``REQUEUE_BATCH`` dead letters, or the one
    named) until it handles fewer; returns how many it handled in all."""
    client = resolve_client(client)
    handled = 0
    while True:
        count = int(run_script(script, client, keys=keys, args=args))
        handled += count
        if one or count < REQUEUE_BATCH:
            return handled


def known_queues(group: str = DEFAULT_GROUP, *, client: Any = None) -> list[str]:
    """Names of the queues of ``group`` that have ever had a task."""
    members = resolve_client(client).hkeys(KeySpace("queue", group).key("queues"))
    names = sorted(member.decode() for member in members)
    return names if group == DEFAULT_GROUP else [f"{group}/{name}" for name in names]


def forget_gone_workers(group: str = DEFAULT_GROUP, *, client: Any = None) -> int:
    """Drop from ``group``'s set of workers those whose heartbeat ran out (workers that died
    without signing off); returns how many. A worker signing off calls it, so the status
    pages and endpoints, which only read, need not: they leave such members out. One that
    was only late comes back with its next heartbeat."""
    space = KeySpace("queue", group)
    workers_key = space.key("workers")
    client = resolve_client(client)
    members = sorted(client.smembers(workers_key))
    if not members:
        return 0
    with slot_pipeline(client, workers_key, transaction=False) as pipe:
        for member in members:
            pipe.exists(space.key(f"worker:{member.decode()}"))
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


# -- results -------------------------------------------------------------------------
#: The statuses of a task's record (the values of Django's Tasks framework, and CANCELLED:
#: ``cancel()`` took it off its queue before it ran; the framework reads it as FAILED).
READY, RUNNING, SUCCESSFUL, FAILED = "READY", "RUNNING", "SUCCESSFUL", "FAILED"
CANCELLED = "CANCELLED"


@dataclass(frozen=True)
class TaskRecord:
    """What is known of one task: written by the scripts that queue, take and finish it.

    ``errors`` holds one ``{"exception_class_path", "traceback"}`` per failed
    attempt; ``worker_ids`` one worker id per attempt. Times are the Redis
    server's (``enqueued_at``: the producer's clock), as aware UTC datetimes to the
    millisecond, so that one record's times compare as their clocks do.
    """

    id: str
    task: str | None
    queue: str | None
    backend: str | None  # the Tasks framework backend alias of a framework task
    priority: int
    status: str
    args: list[Any]
    kwargs: dict[str, Any]
    enqueued_at: datetime.datetime | None
    started_at: datetime.datetime | None
    last_attempted_at: datetime.datetime | None
    finished_at: datetime.datetime | None
    worker_ids: list[str] = field(default_factory=list)
    errors: list[dict[str, str]] = field(default_factory=list)
    return_value: Any = None

    @property
    def attempts(self) -> int:
        return len(self.worker_ids)

    @property
    def is_finished(self) -> bool:
        return self.status in (SUCCESSFUL, FAILED, CANCELLED)


def get_result(task_id: str, *, client: Any = None) -> TaskRecord | None:
    """The record of task ``task_id`` (an id ``delay()`` returned), or None when no such
    task is known: never queued, expired ``RCOORD["TASK_RESULT_TTL"]`` after it finished,
    or not a task id. One round trip: one read-only script call."""
    keys = record_keys(task_id)
    if keys is None:
        return None
    client = resolve_client(client)
    read_only = SCRIPT_FLAGS.usable(client)
    try:
        reply = run_script(result_script(read_only), client, keys=keys, args=(task_id,))
    except ResponseError as error:
        if not read_only or not SCRIPT_FLAGS.refused(client, error):
            raise
        reply = run_script("task_result", client, keys=keys, args=(task_id,))
    return _record_from_reply(task_id, reply)


async def aget_result(task_id: str, *, client: Any = None) -> TaskRecord | None:
    """``get_result`` for async code (redis.asyncio, one round trip)."""
    keys = record_keys(task_id)
    if keys is None:
        return None
    client = await aresolve_client(client)
    read_only = SCRIPT_FLAGS.usable(client)
    try:
        reply = await arun_script(result_script(read_only), client, keys=keys, args=(task_id,))
    except ResponseError as error:
        if not read_only or not SCRIPT_FLAGS.refused(client, error):
            raise
        reply = await arun_script("task_result", client, keys=keys, args=(task_id,))
    return _record_from_reply(task_id, reply)


def record_keys(task_id: str) -> tuple[str, str, str, str] | None:
    """The keys ``task_result.lua`` reads for ``task_id``, or None when it is not a task id."""
    group = group_of_task_id(task_id)
    if group is None:
        return None
    keys = QueueKeys.of(f"{group}/q")
    return keys.messages, keys.results, keys.results_expiry, keys.errors


def result_script(read_only: bool) -> str:
    # The read-only declaration where the server knows it (a replica may run it), the plain
    # script where not (Redis 6.2).
    return "task_result_ro" if read_only else "task_result"


def _record_from_reply(task_id: str, reply: list[Any]) -> TaskRecord | None:
    message, state, value, errors, finished_message, last_error, expired = reply
    fields = [state, value, errors, finished_message]
    return _record(task_id, message, fields, bool(expired), last_error)


def record_from(
    task_id: str,
    message: bytes | None,
    fields: list[bytes | None],
    expires: float | None,
    last_error: bytes | None,
    now: tuple[int, int],
    *,
    decoded: dict[str, Any] | None = None,
) -> TaskRecord | None:
    """A ``TaskRecord`` from a task's message, its results fields (state, value, errors,
    finished message), its record's expiry (server ms; None: none), its last error and the
    server's ``TIME`` (None when there is no such task); ``decoded``: ``message`` as a dict,
    when the caller has decoded it already."""
    expired = expires is not None and expires <= now[0] * 1000 + now[1] // 1000
    return _record(task_id, message, fields, expired, last_error, decoded)


def _record(
    task_id: str,
    message: bytes | None,
    fields: list[bytes | None],
    expired: bool,
    last_error: bytes | None,
    decoded: dict[str, Any] | None = None,
) -> TaskRecord | None:
    state, value, errors, finished_message = fields
    body = decoded or decode_message(message if message is not None else finished_message)
    if body is None:
        return None
    if expired:
        state = value = errors = None  # expired, not swept yet
        if message is None:
            return None
    # 'STATUS|started|last attempted|finished|worker ids' (ms), every part optional.
    parts = state.decode().split("|", 4) if state else []
    if len(parts) < 5:
        parts += [""] * (5 - len(parts))
    status, started, attempted, finished, workers = parts
    # A queued task without a record is READY; a dead letter whose record expired, FAILED.
    status = status or (FAILED if last_error is not None else READY)
    error_list = json.loads(errors) if errors else []
    if errors is None and last_error is not None:
        error_list = [{"exception_class_path": "", "traceback": as_text(last_error)}]
    get = body.get
    return TaskRecord(
        id=task_id,
        task=get("task"),
        queue=get("queue"),
        backend=get("backend"),
        priority=get("priority", 0),
        status=status,
        args=get("args") or [],
        kwargs=get("kwargs") or {},
        enqueued_at=_to_the_ms(get("enqueued_at")),
        started_at=_at_ms(started),
        last_attempted_at=_at_ms(attempted),
        finished_at=_at_ms(finished),
        worker_ids=[worker for worker in workers.split(",") if worker] if workers else [],
        errors=error_list,
        return_value=json.loads(value) if value and status == SUCCESSFUL else None,
    )


def _to_the_ms(seconds: Any) -> datetime.datetime | None:
    """The producer's time cut to the millisecond, the precision of the server's times:
    finer, a task could read as queued after it started."""
    if not isinstance(seconds, (int, float)):
        return None
    return _at_ms(int(seconds * 1000))


def _at_ms(ms: str | int) -> datetime.datetime | None:
    """The aware UTC datetime of ``ms`` (milliseconds since the epoch), or None for ''."""
    return datetime.datetime.fromtimestamp(int(ms) / 1000, datetime.timezone.utc) if ms else None
