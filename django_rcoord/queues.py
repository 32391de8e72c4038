"""Task queues that lose nothing: the producer side (``@task``, enqueueing, stats, dead letters).

Redis in Action 6.4.1 done right. A task message is JSON (never pickle)
stored once under its id; queues hold ids. Taking a task moves its id, in one
script, from its queue into the queue's in-flight set with a lease; the worker
renews the lease while the task runs and acknowledges it when done. A task
whose lease runs out (its worker died) goes back to the front of its queue.
Failures are retried with exponential backoff, then kept as dead letters. The
consuming loop is in ``django_rcoord.worker``.

Queue names: ``"email"`` lives in the queue group ``main``; ``"reports/pdf"``
is the queue ``pdf`` of the group ``reports``. All keys of one group share a
hash tag, so the queues one worker watches together must be in one group;
spread load over Redis Cluster with several groups served by separate workers.
"""

from __future__ import annotations

import datetime
import importlib
import importlib.util
import inspect
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.apps import apps
from django.core.serializers.json import DjangoJSONEncoder

from django_rcoord.conf import conf
from django_rcoord.connection import aresolve_client, resolve_client, slot_pipeline
from django_rcoord.exceptions import InvalidName
from django_rcoord.keys import KeySpace, decode_name
from django_rcoord.scripts import arun_script, run_script

__all__ = [
    "Task",
    "aexecute_later",
    "dead_letters",
    "enqueue_many",
    "execute_later",
    "queue_stats",
    "requeue_dead",
    "send_sold_email_via_queue",
    "task",
]

logger = logging.getLogger(__name__)

DEFAULT_GROUP = "main"
WAKE_TOKEN_MS = 60_000


class PermanentFailure(Exception):
    """Raise from a task to send it to the dead letters at once, without retries."""


# -- where queues live ------------------------------------------------------------
@dataclass(frozen=True)
class QueueKeys:
    """The keys of one queue and of the group it belongs to."""

    name: str  # as given, e.g. "email" or "reports/pdf"
    group: str
    queue: str
    messages: str
    owners: str
    failures: str
    errors: str
    queues: str
    wake: str
    schedule: str
    lateness: str
    ready: str
    in_flight: str
    delayed: str
    dead: str

    @classmethod
    def of(cls, name: str) -> QueueKeys:
        if not isinstance(name, str):
            raise InvalidName(f"a queue name must be a str, not {type(name).__name__}")
        group, slash, queue = name.rpartition("/")
        if not queue or (slash and not group):
            raise InvalidName(f"{name!r} is not a queue name ('queue' or 'group/queue')")
        group = group or DEFAULT_GROUP
        space = KeySpace("queue", group)
        return cls(
            name=name,
            group=group,
            queue=queue,
            messages=space.key("messages"),
            owners=space.key("owners"),
            failures=space.key("failures"),
            errors=space.key("errors"),
            queues=space.key("queues"),
            wake=space.key("wake"),
            schedule=space.key("schedule"),
            lateness=space.key("lateness"),
            ready=space.key(f"ready:{queue}"),
            in_flight=space.key(f"in-flight:{queue}"),
            delayed=space.key(f"delayed:{queue}"),
            dead=space.key(f"dead:{queue}"),
        )


def same_group(names: Sequence[str]) -> list[QueueKeys]:
    """The keys of ``names``, which must all be in one group (one hash slot)."""
    keys = [QueueKeys.of(name) for name in names]
    if len({queue.group for queue in keys}) > 1:
        raise ValueError(
            "Queues watched together must be in one group (one Redis Cluster slot): "
            + ", ".join(names)
        )
    return keys


# -- messages ---------------------------------------------------------------------
def encode_message(
    task_name: str, queue: str, args: Sequence[Any], kwargs: dict[str, Any]
) -> tuple[str, str]:
    """(id, JSON) of a new message; TypeError at once for arguments JSON cannot carry."""
    task_id = uuid.uuid4().hex
    body = {
        "id": task_id,
        "task": task_name,
        "queue": queue,
        "args": list(args),
        "kwargs": dict(kwargs),
        "enqueued_at": time.time(),
    }
    try:
        return task_id, json.dumps(body, cls=DjangoJSONEncoder, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"Arguments of task {task_name!r} must be JSON-serializable "
            f"(dates, decimals and UUIDs become strings): {exc}"
        ) from exc


def _enqueue_call(
    task_name: str, queue: str, args: Sequence[Any], kwargs: dict[str, Any], delay_ms: int
) -> tuple[str, list[str], list[Any]]:
    """(task id, KEYS, ARGV) of the task_enqueue script for a new message."""
    keys = QueueKeys.of(queue)
    task_id, body = encode_message(task_name, queue, args, kwargs)
    return (
        task_id,
        [keys.messages, keys.ready, keys.delayed, keys.queues, keys.wake, keys.schedule],
        [task_id, body, keys.queue, delay_ms, WAKE_TOKEN_MS],
    )


def _enqueue(
    client: Any,
    task_name: str,
    queue: str,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    delay_ms: int,
) -> str:
    task_id, keys, argv = _enqueue_call(task_name, queue, args, kwargs, delay_ms)
    run_script("task_enqueue", client, keys=keys, args=argv)
    return task_id


async def _aenqueue(
    client: Any,
    task_name: str,
    queue: str,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    delay_ms: int,
) -> str:
    task_id, keys, argv = _enqueue_call(task_name, queue, args, kwargs, delay_ms)
    client = await aresolve_client(client)
    await arun_script("task_enqueue", client, keys=keys, args=argv)
    return task_id


def _delay_ms(delay: float | datetime.timedelta | None, eta: datetime.datetime | None) -> int:
    if delay is not None and eta is not None:
        raise ValueError("give delay or eta, not both")
    if eta is not None:
        if eta.tzinfo is None:
            raise ValueError("eta must be an aware datetime")
        seconds = (eta - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
    elif isinstance(delay, datetime.timedelta):
        seconds = delay.total_seconds()
    else:
        seconds = delay or 0
    if seconds < 0 and eta is None:
        raise ValueError("delay must not be negative")
    return max(0, int(seconds * 1000))


def execute_later(
    queue: str, name: str, args: Sequence[Any] = (), delay: float = 0, *, client: Any = None
) -> str:
    """The book's execute_later: queue task ``name`` with ``args`` (after ``delay`` seconds).

    Returns the task id. One round trip.
    """
    return _enqueue(resolve_client(client), name, queue, args, {}, _delay_ms(delay, None))


async def aexecute_later(
    queue: str, name: str, args: Sequence[Any] = (), delay: float = 0, *, client: Any = None
) -> str:
    """``execute_later`` for async code (redis.asyncio, one round trip)."""
    return await _aenqueue(client, name, queue, args, {}, _delay_ms(delay, None))


def enqueue_many(
    calls: Iterable[tuple[Task | str, Sequence[Any], dict[str, Any]]],
    *,
    queue: str | None = None,
    client: Any = None,
) -> list[str]:
    """Queue many tasks in one round trip per queue group: ``calls`` is (task or name,
    args, kwargs) triples.

    A name (not a Task) needs ``queue``. Returns the ids in order. Each group
    is one pipeline (on Redis Cluster a group is one slot, on one primary).
    """
    client = resolve_client(client)
    by_group: dict[str, list[tuple[int, str, str, Sequence[Any], dict[str, Any]]]] = {}
    count = 0
    for count, (target, args, kwargs) in enumerate(calls, 1):
        if isinstance(target, Task):
            name, target_queue = target.name, queue or target.queue
        elif queue is None:
            raise ValueError("enqueue_many needs queue= for tasks given by name")
        else:
            name, target_queue = target, queue
        group = QueueKeys.of(target_queue).group
        by_group.setdefault(group, []).append((count - 1, name, target_queue, args, kwargs))
    ids = [""] * count
    for entries in by_group.values():
        with slot_pipeline(client, QueueKeys.of(entries[0][2]).messages, transaction=False) as pipe:
            for index, name, target_queue, args, kwargs in entries:
                ids[index] = _enqueue(pipe, name, target_queue, args, kwargs, 0)
            pipe.execute()
    return ids


# -- tasks ------------------------------------------------------------------------
_registry: dict[str, Task] = {}


class Task:
    """A registered task: call it to run it here, ``delay()`` to queue it."""

    def __init__(
        self, function: Callable[..., Any], name: str, queue: str, max_retries: int
    ) -> None:
        self.function = function
        self.name = name
        self.queue = queue
        self.max_retries = max_retries
        self.signature = inspect.signature(function)
        self.__doc__ = function.__doc__
        self.__wrapped__ = function

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.function(*args, **kwargs)

    def delay(self, *args: Any, **kwargs: Any) -> str:
        """Queue a run with these arguments; returns the task id (one round trip)."""
        return _enqueue(resolve_client(None), self.name, self.queue, args, kwargs, 0)

    def schedule(
        self,
        *args: Any,
        delay: float | datetime.timedelta | None = None,
        eta: datetime.datetime | None = None,
        **kwargs: Any,
    ) -> str:
        """Queue a run ``delay`` seconds from now or at ``eta`` (by the Redis server's clock)."""
        return _enqueue(
            resolve_client(None), self.name, self.queue, args, kwargs, _delay_ms(delay, eta)
        )

    async def adelay(self, *args: Any, **kwargs: Any) -> str:
        """``delay`` for async code (redis.asyncio, one round trip)."""
        return await _aenqueue(None, self.name, self.queue, args, kwargs, 0)

    async def aschedule(
        self,
        *args: Any,
        delay: float | datetime.timedelta | None = None,
        eta: datetime.datetime | None = None,
        **kwargs: Any,
    ) -> str:
        """``schedule`` for async code (redis.asyncio, one round trip)."""
        return await _aenqueue(None, self.name, self.queue, args, kwargs, _delay_ms(delay, eta))

    def delay_on_commit(self, *args: Any, using: str | None = None, **kwargs: Any) -> None:
        """Queue the run when the current database transaction commits (at once outside one)."""
        from django.db import transaction

        encode_message(self.name, self.queue, args, kwargs)  # a bad argument fails here, now
        transaction.on_commit(lambda: self.delay(*args, **kwargs), using=using)

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.queue!r} max_retries={self.max_retries}>"


def task(
    name: str | None = None, *, queue: str = "default", max_retries: int = 3
) -> Callable[[Callable[..., Any]], Task]:
    """Register a function as a task. ``max_retries`` counts retries after the first attempt."""
    if callable(name):
        raise TypeError("use @task() or @task(name=...), with parentheses")
    if not isinstance(max_retries, int) or max_retries < 0:
        raise ValueError("max_retries must be an int >= 0")
    QueueKeys.of(queue)  # an unusable queue name fails at import time

    def register(function: Callable[..., Any]) -> Task:
        task_name = name or f"{function.__module__}.{function.__qualname__}"
        existing = _registry.get(task_name)
        if existing is not None and existing.function is not function:
            same_place = (
                existing.function.__module__ == function.__module__
                and existing.function.__qualname__ == function.__qualname__
            )
            if not same_place:  # a module imported twice registers the same function again
                raise ValueError(f"two tasks are named {task_name!r}")
        registered = Task(function, task_name, queue, max_retries)
        _registry[task_name] = registered
        return registered

    return register


def get_task(name: str) -> Task | None:
    return _registry.get(name)


def autodiscover_tasks() -> None:
    """Import the ``tasks`` module of every installed app (as a worker does at start)."""
    for config in apps.get_app_configs():
        module_name = f"{config.name}.tasks"
        if importlib.util.find_spec(module_name) is not None:
            importlib.import_module(module_name)


# -- moving tasks whose time has come -------------------------------------------------
#: Lateness samples (ms, due -> promoted) kept per queue group, for rcoord_status.
LATENESS_SAMPLES = 1000


def recover_and_promote(
    queue: QueueKeys, *, batch: int = 500, client: Any = None
) -> tuple[int, int, float | None]:
    """Put back ``queue``'s tasks whose lease ran out and promote its due delayed tasks.

    One script call (atomic: a task is never lost between the delayed set and
    the queue, nor promoted twice, whoever else runs this at the same moment).
    Returns (recovered, promoted, seconds until the next delayed task is due or None).
    """
    recovered, promoted, due_in_ms = run_script(
        "task_recover",
        resolve_client(client),
        keys=[
            queue.owners,
            queue.ready,
            queue.in_flight,
            queue.delayed,
            queue.wake,
            queue.lateness,
        ],
        args=[batch, WAKE_TOKEN_MS, LATENESS_SAMPLES],
    )
    return int(recovered), int(promoted), (due_in_ms / 1000 if due_in_ms >= 0 else None)


# -- inspecting -------------------------------------------------------------------
def queue_stats(queue: str, *, client: Any = None) -> dict[str, int]:
    """Counts of a queue's tasks: ready, in flight, delayed (retries included) and dead."""
    keys = QueueKeys.of(queue)
    with resolve_client(client).pipeline(transaction=False) as pipe:
        pipe.llen(keys.ready)
        pipe.zcard(keys.in_flight)
        pipe.zcard(keys.delayed)
        pipe.llen(keys.dead)
        ready, in_flight, delayed, dead = pipe.execute()
    return {"ready": ready, "in_flight": in_flight, "delayed": delayed, "dead": dead}


def dead_letters(queue: str, *, limit: int = 100, client: Any = None) -> list[dict[str, Any]]:
    """The oldest ``limit`` dead letters: each message, with ``error`` and ``failures`` added."""
    keys = QueueKeys.of(queue)
    client = resolve_client(client)
    ids = client.lrange(keys.dead, 0, limit - 1)
    if not ids:
        return []
    with client.pipeline(transaction=False) as pipe:
        pipe.hmget(keys.messages, ids)
        pipe.hmget(keys.errors, ids)
        pipe.hmget(keys.failures, ids)
        bodies, errors, failures = pipe.execute()
    letters = []
    for task_id, body, error, failed in zip(ids, bodies, errors, failures, strict=True):
        letter = decode_message(body) or {"id": task_id.decode(), "raw": _text(body)}
        letter["error"] = _text(error)
        letter["failures"] = int(failed or 0)
        letters.append(letter)
    return letters


def requeue_dead(queue: str, *, client: Any = None) -> int:
    """Send every dead letter of ``queue`` back to it, with its retries reset. Returns how many."""
    keys = QueueKeys.of(queue)
    return int(
        run_script(
            "task_requeue_dead",
            resolve_client(client),
            keys=[keys.dead, keys.ready, keys.failures, keys.errors, keys.wake],
            args=[WAKE_TOKEN_MS],
        )
    )


def known_queues(group: str = DEFAULT_GROUP, *, client: Any = None) -> list[str]:
    """Names of the queues of ``group`` that have ever had a task."""
    members = resolve_client(client).smembers(KeySpace("queue", group).key("queues"))
    names = sorted(member.decode() for member in members)
    return names if group == DEFAULT_GROUP else [f"{group}/{name}" for name in names]


def decode_message(body: bytes | str | None) -> dict[str, Any] | None:
    """The message as a dict, or None when it is not a JSON object."""
    if body is None:
        return None
    try:
        message = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    return message if isinstance(message, dict) else None


def _text(value: bytes | str | None) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value


# -- the sold-item email (Redis in Action 6.4.1) -------------------------------------
def send_sold_email_via_queue(
    seller: str, item: str, price: Any, buyer: str, *, client: Any = None
) -> str:
    """Queue the e-mail telling ``seller`` that ``buyer`` bought ``item`` for ``price``."""
    from django_rcoord.tasks import send_sold_email

    return _enqueue(
        resolve_client(client),
        send_sold_email.name,
        send_sold_email.queue,
        (seller, item, price, buyer),
        {},
        0,
    )


def default_email_queues() -> list[str]:
    return list(conf.EMAIL_QUEUES)


# -- an overview for operators (rcoord_status) ----------------------------------------
def known_groups(*, client: Any = None) -> list[str]:
    """Queue groups that have ever had a task (the default group always)."""
    client = resolve_client(client)
    pattern = KeySpace("queue", "x").pattern.replace("{x}", "{*}").removesuffix("*") + "queues"
    groups = {DEFAULT_GROUP}
    for key in client.scan_iter(match=pattern, count=1000):
        text = key.decode()
        groups.add(decode_name(text[text.index("{") + 1 : text.index("}")]))
    return sorted(groups)


def overview(*, client: Any = None) -> dict[str, Any]:
    """Every known queue (counts, oldest ready task, next due delayed task), the live
    workers and their tasks, and the lateness of the last 100 promotions per group."""
    client = resolve_client(client)
    now_seconds, now_micros = client.time()
    now = now_seconds + now_micros / 1e6
    queues = []
    workers = []
    lateness: dict[str, dict[str, int]] = {}
    for group in known_groups(client=client):
        for name in known_queues(group, client=client):
            keys = QueueKeys.of(name)
            stats = queue_stats(name, client=client)
            oldest_id = client.lindex(keys.ready, 0)
            oldest = decode_message(client.hget(keys.messages, oldest_id)) if oldest_id else None
            age = now - oldest["enqueued_at"] if oldest and "enqueued_at" in oldest else None
            first_due = client.zrange(keys.delayed, 0, 0, withscores=True)
            next_due_in = first_due[0][1] / 1000 - now if first_due else None
            queues.append(
                {"name": name, **stats, "oldest_ready_age": age, "next_due_in": next_due_in}
            )
        space = KeySpace("queue", group)
        samples = sorted(int(ms) for ms in client.lrange(space.key("lateness"), 0, 99))
        if samples:
            lateness[group] = {
                "samples": len(samples),
                "median_ms": samples[len(samples) // 2],
                "max_ms": samples[-1],
            }
        running: dict[str, list[str]] = {}
        for task_id, worker in client.hgetall(space.key("owners")).items():
            running.setdefault(worker.decode(), []).append(task_id.decode())
        for member in sorted(client.smembers(space.key("workers"))):
            worker_id = member.decode()
            watched = client.get(space.key(f"worker:{worker_id}"))
            if watched is None:  # its heartbeat ran out: the worker is gone
                client.srem(space.key("workers"), worker_id)
                continue
            current = []
            for task_id in running.get(worker_id, []):
                message = decode_message(client.hget(space.key("messages"), task_id)) or {}
                current.append({"id": task_id, "task": message.get("task")})
            workers.append(
                {"id": worker_id, "queues": watched.decode().split(","), "running": current}
            )
    return {"queues": queues, "workers": workers, "promotion_lateness": lateness}
