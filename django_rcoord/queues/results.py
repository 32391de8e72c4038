"""A task's record: its statuses, ``TaskRecord``, and reading it (``get_result``,
``aget_result``, and ``record_from`` for a worker that has read the fields itself).

The scripts that queue, take and finish a task write the record; this module only reads.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError

from django_rcoord.connection.clients import resolve_client
from django_rcoord.connection.features import SCRIPT_FLAGS
from django_rcoord.connection.loops import aresolve_client
from django_rcoord.queues import incoming
from django_rcoord.queues.fan_in_state import STATUS_FIELDS, fan_in_key, status_of
from django_rcoord.queues.keys import GroupKeys, group_of_task_id
from django_rcoord.queues.messages import as_text, decode_message
from django_rcoord.queues.shards import QUEUED_AS
from django_rcoord.scripts import arun_script, run_script

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
    #: A fan-in's callback not queued yet (its id is the fan-in's): the fan-in's progress,
    #: a ``FanInStatus``; the record reads READY while the fan-in waits, CANCELLED once it
    #: failed or was cancelled.
    fan_in: Any = None

    @property
    def attempts(self) -> int:
        return len(self.worker_ids)

    @property
    def is_finished(self) -> bool:
        return self.status in (SUCCESSFUL, FAILED, CANCELLED)


def get_result(task_id: str, *, client: Any = None) -> TaskRecord | None:
    """The record of task ``task_id`` (an id ``delay()`` returned), or None when no such
    task is known: never queued, expired ``RCOORD["TASK_RESULT_TTL"]`` after it finished,
    or not a task id. A finished task's: one ``HGETALL`` of its record; any other's: one
    more round trip, a read-only script call that reads its message too; an id that call
    does not know, one more (a fan-in's callback not queued yet: see ``TaskRecord.fan_in``)."""
    keys = record_keys(task_id)
    if keys is None:
        return None
    client = resolve_client(client)
    finished = finished_record(task_id, client.hgetall(keys[4] + task_id))
    if finished is not None:
        return finished
    read_only = SCRIPT_FLAGS.usable(client)
    try:
        reply = run_script(result_script(read_only), client, keys=keys, args=(task_id,))
    except ResponseError as error:
        if not read_only or not SCRIPT_FLAGS.refused(client, error):
            raise
        reply = run_script("task_result", client, keys=keys, args=(task_id,))
    found = _record_from_reply(task_id, reply)
    if found is None and reply[7] and incoming.place(client, _group_keys(task_id), task_id):
        # Pushed to its group's incoming list, and placed just now (see queues.incoming).
        found = _record_from_reply(task_id, run_script("task_result", client, keys, (task_id,)))
    if found is not None:
        return found
    return _callback_waiting(task_id, client.hmget(_fan_in_key(task_id), *STATUS_FIELDS))


async def aget_result(task_id: str, *, client: Any = None) -> TaskRecord | None:
    """``get_result`` for async code (redis.asyncio, as many round trips)."""
    keys = record_keys(task_id)
    if keys is None:
        return None
    client = await aresolve_client(client)
    finished = finished_record(task_id, await client.hgetall(keys[4] + task_id))
    if finished is not None:
        return finished
    read_only = SCRIPT_FLAGS.usable(client)
    try:
        reply = await arun_script(result_script(read_only), client, keys=keys, args=(task_id,))
    except ResponseError as error:
        if not read_only or not SCRIPT_FLAGS.refused(client, error):
            raise
        reply = await arun_script("task_result", client, keys=keys, args=(task_id,))
    found = _record_from_reply(task_id, reply)
    if found is None and reply[7] and await incoming.aplace(client, _group_keys(task_id), task_id):
        reply = await arun_script("task_result", client, keys, (task_id,))
        found = _record_from_reply(task_id, reply)
    if found is not None:
        return found
    fields = await client.hmget(_fan_in_key(task_id), *STATUS_FIELDS)
    return _callback_waiting(task_id, fields)


def _group_keys(task_id: str) -> GroupKeys:
    """The keys of the group of ``task_id`` (a task id: ``record_keys`` found its group)."""
    group = group_of_task_id(task_id)
    assert group is not None
    return GroupKeys.of(group)


def _fan_in_key(task_id: str) -> str:
    """The key of the fan-in ``task_id`` may name (its callback's id): a task id's."""
    key = fan_in_key(task_id)
    assert key is not None  # record_keys found its group
    return key


def _callback_waiting(task_id: str, fields: list[bytes | None]) -> TaskRecord | None:
    """The record of a fan-in's callback not queued yet (``task_id`` is the fan-in's), from
    the fan-in's ``STATUS_FIELDS``; None when there is no such fan-in, or its callback was
    queued (its record is gone: expired)."""
    status = status_of(task_id, fields)
    if status is None or status.state == "fired":
        return None
    body = decode_message(fields[5]) or {}
    get = body.get
    return TaskRecord(
        id=task_id,
        task=get("task"),
        queue=get(QUEUED_AS) or get("queue"),
        backend=get("backend"),
        priority=get("priority", 0),
        status=READY if status.state == "waiting" else CANCELLED,
        args=(get("args") or [])[1:],  # the children's results go first, once known
        kwargs=get("kwargs") or {},
        enqueued_at=_to_the_ms(get("enqueued_at")),
        started_at=None,
        last_attempted_at=None,
        finished_at=None,
        fan_in=status,
    )


def record_keys(task_id: str) -> tuple[str, str, str, str, str, str] | None:
    """The keys ``task_result.lua`` reads for ``task_id`` (the last, the prefix of its
    record), or None when it is not a task id."""
    group = group_of_task_id(task_id)
    if group is None:
        return None
    keys = GroupKeys.of(group)
    return (
        keys.messages,
        keys.results,
        keys.results_expiry,
        keys.errors,
        keys.records,
        keys.incoming,
    )


#: The statuses of a finished record, as its state starts (``finished_record``).
_FINISHED_STATES = (b"SUCCESSFUL|", b"FAILED|", b"CANCELLED|")


def finished_record(task_id: str, fields: dict[bytes, bytes]) -> TaskRecord | None:
    """The ``TaskRecord`` of a finished task from the fields of its record HASH (see
    ``_records.lua``: s, v, e, m, x), which hold all of it; None when they do not (no
    record, not finished, or no message: the script reads the rest)."""
    state, message = fields.get(b"s"), fields.get(b"m")
    if state is None or message is None or not state.startswith(_FINISHED_STATES):
        return None
    parts = [state, fields.get(b"v"), fields.get(b"e"), message]
    return _record(task_id, None, parts, False, fields.get(b"x"))


def result_script(read_only: bool) -> str:
    # The read-only declaration where the server knows it (a replica may run it), the plain
    # script where not (Redis 6.2).
    return "task_result_ro" if read_only else "task_result"


def _record_from_reply(task_id: str, reply: list[Any]) -> TaskRecord | None:
    message, state, value, errors, finished_message, last_error, expired, _ = reply
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
    started_at = _at_ms(started)
    return _new_record(
        {
            "id": task_id,
            "task": get("task"),
            "queue": get(QUEUED_AS) or get("queue"),  # on a shard: the queue it was queued to
            "backend": get("backend"),
            "priority": get("priority", 0),
            "status": status,
            "args": get("args") or [],
            "kwargs": get("kwargs") or {},
            "enqueued_at": _to_the_ms(get("enqueued_at")),
            "started_at": started_at,
            # The same time as its start for a task's first attempt: one datetime.
            "last_attempted_at": started_at if attempted == started else _at_ms(attempted),
            "finished_at": _at_ms(finished),
            "worker_ids": [worker for worker in workers.split(",") if worker] if workers else [],
            "errors": error_list,
            "return_value": _value(value) if status == SUCCESSFUL else None,
            "fan_in": None,
        }
    )


def _new_record(values: dict[str, Any]) -> TaskRecord:
    """The ``TaskRecord`` of ``values`` (every field's; the dict becomes the record's own),
    made without its ``__init__``: a frozen dataclass's sets each of its 16 fields with
    ``object.__setattr__``, a quarter of reading a finished record
    (docs/explanation/benchmarks.md, Django's Tasks framework). tests/test_results.py
    checks that a record read this way has every field."""
    record = object.__new__(TaskRecord)
    object.__setattr__(record, "__dict__", values)
    return record


def _value(raw: bytes | None) -> Any:
    """A return value from its JSON; most tasks return None, which needs no parsing."""
    return None if not raw or raw == b"null" else json.loads(raw)


def _to_the_ms(seconds: Any) -> datetime.datetime | None:
    """The producer's time cut to the millisecond, the precision of the server's times:
    finer, a task could read as queued after it started."""
    if not isinstance(seconds, (int, float)):
        return None
    return _from_timestamp(int(seconds * 1000) / 1000, _UTC)


def _at_ms(ms: str | int) -> datetime.datetime | None:
    """The aware UTC datetime of ``ms`` (milliseconds since the epoch), or None for ''."""
    return _from_timestamp(int(ms) / 1000, _UTC) if ms else None


_from_timestamp, _UTC = datetime.datetime.fromtimestamp, datetime.timezone.utc
