"""Where task queues live: the keys of a queue and of its group.

Queue names: ``"email"`` lives in the queue group ``main``; ``"reports/pdf"``
is the queue ``pdf`` of the group ``reports``. All keys of one group share a
hash tag, so the queues one worker watches together must be in one group;
spread load over Redis Cluster with several groups served by separate workers.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from django_rcoord.conf import conf
from django_rcoord.exceptions import InvalidName
from django_rcoord.keys import KeySpace, encode_name

DEFAULT_GROUP = "main"
#: Lifetime of unconsumed wake-up tokens of the pollers' lists, ms (a worker's token is on
#: the incoming list, which holds tasks: it does not expire).
WAKE_TOKEN_MS = 60_000
#: How long a group's list of queues (and its lateness samples) outlive its last task, ms.
GROUP_KEYS_MS = 30 * 24 * 3600 * 1000

#: Seconds a worker's heartbeat lives without renewal (a worker renews it every third).
HEARTBEAT_TTL = 15

_TASK_UUID = re.compile(r"[0-9a-f]{32}\Z")


@dataclass(frozen=True)
class GroupKeys:
    """The keys of one queue group: those its queues share, and the keys it keeps per
    worker and per task. The one place their layout is written; ``QueueKeys`` takes its
    group's from here."""

    group: str
    hash_tag: str  # what Redis Cluster hashes: every key of the group is in its slot
    messages: str
    owners: str
    failures: str
    errors: str
    queues: str
    incoming: str  # LIST: tasks pushed by producers, placed by the take; workers wait on it
    serving: str  # STRING while a worker of this release serves the group (``incoming``)
    readies: str  # the prefix of each queue's ready ZSET (``QueueKeys.ready``)
    schedule: str
    lateness: str
    results: str  # HASH: the claims of unique tasks, and a previous release's records
    results_expiry: str  # ZSET: when a previous release's records expire (read, not written)
    records: str  # the prefix of each task's record HASH (``record``): no key of its own
    idle: str
    periodic: str
    metrics: str
    workers: str  # SET of the ids of its workers (see ``heartbeat``)
    paused: str  # SET of the names (within the group) of its paused queues (``pause``)
    fan_ins: str  # the prefix of each fan-in's HASH (``fan_in``): no key of its own

    @classmethod
    def of(cls, group: str) -> GroupKeys:
        """The keys of ``group`` (built once per group and key prefix)."""
        return _group_keys(group, conf.KEY_PREFIX)

    @classmethod
    def _build(cls, group: str) -> GroupKeys:
        space = KeySpace("queue", group)
        return cls(
            group=group,
            hash_tag=space.hash_tag,
            messages=space.key("messages"),
            owners=space.key("owners"),
            failures=space.key("failures"),
            errors=space.key("errors"),
            queues=space.key("queues"),
            incoming=space.key("incoming"),
            serving=space.key("serving"),
            readies=space.key("ready:"),
            schedule=space.key("schedule"),
            lateness=space.key("lateness"),
            results=space.key("results"),
            results_expiry=space.key("results-expiry"),
            records=space.key("r:"),
            idle=space.key("idle"),
            periodic=space.key("periodic"),
            metrics=space.key("metrics"),
            workers=space.key("workers"),
            paused=space.key("paused"),
            fan_ins=space.key("fan-in:"),
        )

    def heartbeat(self, worker_id: str) -> str:
        """STRING of worker ``worker_id``: what it watches and has done, while it lives."""
        return self._key(f"worker:{worker_id}")

    def exchange(self, worker_id: str) -> str:
        """STRING of worker ``worker_id``'s last call to the finish script (its retries)."""
        return self._key(f"exchange:{worker_id}")

    def stop(self, task_id: str) -> str:
        """The key whose presence asks running task ``task_id`` to stop (``cancel()``)."""
        return self._key(f"stop:{task_id}")

    def record(self, task_id: str) -> str:
        """HASH of task ``task_id``'s result record (its state, value, errors, finished
        message and last error: see ``_records.lua``), in the group's slot. The scripts build
        it as this does, from the ``records`` prefix they are given."""
        return self.records + task_id

    def fan_in(self, fan_in_id: str) -> str:
        """HASH of fan-in ``fan_in_id`` (the id of its callback, a task of this group): its
        children's ends and its callback, waiting (see ``fan_in_child_ended.lua``)."""
        return self.fan_ins + fan_in_id

    def _key(self, part: str) -> str:
        return KeySpace("queue", self.group).key(part)


@functools.lru_cache(maxsize=1024)
def _group_keys(group: str, prefix: str) -> GroupKeys:
    return GroupKeys._build(group)


@dataclass(frozen=True)
class QueueKeys(GroupKeys):
    """The keys of one queue: its group's, and the queue's own four."""

    name: str  # as given, e.g. "email" or "reports/pdf"
    queue: str
    ready: str
    in_flight: str
    delayed: str
    dead: str

    @classmethod
    def of(cls, name: str) -> QueueKeys:
        """The keys of queue ``name`` (built once per name and key prefix: enqueueing and
        taking look them up per task)."""
        if not isinstance(name, str):
            raise InvalidName(f"a queue name must be a str, not {type(name).__name__}")
        return _queue_keys(name, conf.KEY_PREFIX)

    @classmethod
    def _build(cls, name: str) -> QueueKeys:
        group, queue = split_queue_name(name)
        space = KeySpace("queue", group)
        return cls(
            **vars(GroupKeys.of(group)),
            name=name,
            queue=queue,
            ready=space.key(f"ready:{queue}"),  # readies + the encoded name: see incoming
            in_flight=space.key(f"in-flight:{queue}"),
            delayed=space.key(f"delayed:{queue}"),
            dead=space.key(f"dead:{queue}"),
        )

    @property
    def fair_waiting(self) -> str:
        """STRING: how many tasks with a fair key wait behind their key's head, outside the
        ready ZSET (see ``fair``). The scripts build it as this does, from ``ready``."""
        return self.ready + " waiting"

    @property
    def fair_heads(self) -> str:
        """HASH of the heads of the queue's fair keys ('k:<key>' -> id, 'i:<id>' -> key)."""
        return self.ready + " heads"

    @property
    def fair_running(self) -> str:
        """HASH: fair key -> its runs not ended, for keys with ``max_running_per_key``."""
        return self.ready + " running"

    def fair_line(self, encoded_key: str) -> str:
        """ZSET of the tasks of fair key ``encoded_key`` (as its messages hold it) waiting
        behind its head."""
        return f"{self.ready} key:{encoded_key}"

    @property
    def enqueue_task_keys(self) -> tuple[str, ...]:
        """The seven keys of ``enqueue_task`` (_enqueue.lua), in its order: task_enqueue's
        first seven KEYS, and a project's own script's (``in_script``)."""
        return (
            self.messages,
            self.ready,
            self.delayed,
            self.queues,
            self.incoming,
            self.schedule,
            self.idle,
        )

    @functools.cached_property
    def enqueue_keys(self) -> tuple[bytes, ...]:
        """The KEYS of task_enqueue, encoded once per queue (an attribute after the first
        read: a look-up keyed by these keys would hash them all per task)."""
        keys = (*self.enqueue_task_keys, self.results, self.serving)
        return tuple(key.encode() for key in keys)

    @functools.cached_property
    def enqueue_now(self) -> tuple[bytes, ...]:
        """The five keys of ``enqueue_now`` (_ready.lua), for a script that queues a task
        in its own step (follow-ups, a fan-in's callback), encoded once per queue."""
        return tuple(
            key.encode()
            for key in (self.messages, self.ready, self.queues, self.incoming, self.idle)
        )


@functools.lru_cache(maxsize=1024)
def _queue_keys(name: str, prefix: str) -> QueueKeys:
    return QueueKeys._build(name)


def split_queue_name(name: object) -> tuple[str, str]:
    """(group, queue) of a queue name; InvalidName when it is not one."""
    if not isinstance(name, str):
        raise InvalidName(f"a queue name must be a str, not {type(name).__name__}")
    group, slash, queue = name.rpartition("/")
    if not queue or (slash and not group):
        raise InvalidName(f"{name!r} is not a queue name ('queue' or 'group/queue')")
    return group or DEFAULT_GROUP, queue


def check_queue_name(name: object) -> None:
    """InvalidName unless ``name`` can name a queue, whatever ``KEY_PREFIX`` is: it builds
    no key, so ``@task`` can check its queue at import while an unusable prefix is left to
    check rcoord.E006 (an import that raised would crash ``manage.py check`` itself)."""
    group, queue = split_queue_name(name)
    encode_name(group)
    encode_name(f"in-flight:{queue}")  # the longest of the queue's key parts (see _build)


def one_group(names: Sequence[str]) -> str:
    """The group of ``names``, which must all be queue names of one group (one hash slot)."""
    groups = {split_queue_name(name)[0] for name in names}
    if len(groups) > 1:
        raise ValueError(
            "Queues watched together must be in one group (one Redis Cluster slot): "
            + ", ".join(names)
        )
    return groups.pop() if groups else DEFAULT_GROUP


def same_group(names: Sequence[str]) -> list[QueueKeys]:
    """The keys of ``names``, which must all be in one group (one hash slot)."""
    one_group(names)
    return [QueueKeys.of(name) for name in names]


def registry_keys() -> tuple[str, str]:
    """(SET of every queue group ever used, LIST that wakes pollers when one is new): one
    hash slot of their own, written by producers when they first use a group."""
    return _registry_keys(conf.KEY_PREFIX)


@functools.lru_cache(maxsize=16)
def _registry_keys(prefix: str) -> tuple[str, str]:
    space = KeySpace("queues", "registry")
    return space.key("groups"), space.key("wake")


def new_task_id(group: str) -> str:
    """A new task id; it names its group ("reports/<hex>"; the default group's are bare hex),
    so its result record can be found from the id alone."""
    hex_id = os.urandom(16).hex()  # 128 random bits, as uuid4 (which is slower to make)
    return hex_id if group == DEFAULT_GROUP else f"{group}/{hex_id}"


def group_of_task_id(task_id: object) -> str | None:
    """The group a task id names, or None when it is not a task id."""
    if not isinstance(task_id, str):
        return None
    group, slash, hex_id = task_id.rpartition("/")
    if not _TASK_UUID.match(hex_id) or (slash and not group):
        return None
    try:
        return split_queue_name(f"{group}/q")[0] if group else DEFAULT_GROUP
    except InvalidName:
        return None
