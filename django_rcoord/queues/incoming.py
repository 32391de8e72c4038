"""A plain task queued now is one ``RPUSH``, no script: an entry on its group's incoming
list, which the next take of a worker places on the task's queue (``_incoming.lua``: its
message stored, its place in the ready ZSET given, in the order the entries came).

A producer pushes there only while a worker of this release serves the group: every
worker's heartbeat keeps the group's ``serving`` key, and a producer reads it with its
script calls (at least every ``SERVING_CHECK`` seconds a group). Without one (no worker
yet, or only a previous release's, which never reads the list) it queues through the
script, as before: nothing pushed waits for a worker that cannot place it.
"""

from __future__ import annotations

import time
from typing import Any

from django_rcoord.conf import conf
from django_rcoord.queues.keys import GroupKeys, QueueKeys
from django_rcoord.scripts import arun_script, run_script

#: Seconds a process trusts what it last saw of a group's ``serving`` key.
SERVING_CHECK = 5.0
#: The longest message pushed (ASCII JSON: bytes); a longer one goes through the script.
#: A take places up to 1,000 entries in one call (_incoming.lua): this bounds what one
#: call copies (4 MB), where ``MAX_MESSAGE_BYTES`` allows messages of 10 MB.
MAX_PUSHED_BYTES = 4096

#: (key prefix, group) -> until when (``time.monotonic()``) this process pushes the group's
#: plain tasks to its incoming list.
_serving: dict[tuple[str, str], float] = {}


def pushes(group: str) -> bool:
    """Whether a plain task of ``group`` queued now goes to the incoming list: a worker of
    this release served the group when this process last looked."""
    return time.monotonic() < _serving.get((conf.KEY_PREFIX, group), 0.0)


def saw_serving(group: str, served: Any) -> None:
    """Note what a read of the group's ``serving`` key answered (``EXISTS``: 1 or 0)."""
    until = time.monotonic() + SERVING_CHECK if served else 0.0
    _serving[(conf.KEY_PREFIX, group)] = until


def forget_serving() -> None:
    """Forget every group's ``serving`` key seen (the next enqueue of each reads it again)."""
    _serving.clear()


def entry(keys: QueueKeys, task_id: str, body: str, priority: int) -> bytes:
    """The incoming entry of task ``task_id`` of queue ``keys`` with message ``body``:
    '<priority> <queue> <id length> <id><message>', the queue as its keys spell it (no
    space), the length in bytes, as Lua counts them."""
    raw_id = task_id.encode()
    head = f"{priority} {_placed_as(keys)} {len(raw_id)} ".encode()
    return head + raw_id + body.encode()


def _placed_as(keys: QueueKeys) -> str:
    """The queue's name as its ready ZSET's key spells it after the group's ready prefix."""
    return keys.ready[len(keys.readies) :]


def _place_call(keys: GroupKeys, task_id: str) -> tuple[list[str], list[str]]:
    return [keys.incoming, keys.readies, keys.messages, keys.queues], [task_id]


def place(client: Any, keys: GroupKeys, task_id: str = "") -> bytes | None:
    """Place what group ``keys``'s incoming list holds on its queues, for a reader that must
    see every queued task: until task ``task_id``'s message is stored (its message, None
    when it is not queued), or one batch for ``task_id`` ''. One script call."""
    script_keys, args = _place_call(keys, task_id)
    return run_script("task_place", client, keys=script_keys, args=args)


async def aplace(client: Any, keys: GroupKeys, task_id: str = "") -> bytes | None:
    """``place`` for redis.asyncio clients."""
    script_keys, args = _place_call(keys, task_id)
    return await arun_script("task_place", client, keys=script_keys, args=args)
