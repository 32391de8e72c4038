"""Sharded queue groups: one logical queue over many hash slots (``RCOORD["QUEUE_SHARDS"]``).

A queue group lives in one hash slot, so on Redis Cluster on one primary. A group given
``N`` shards (``RCOORD["QUEUE_SHARDS"] = {"reports": 3}``) is spread over ``N`` groups of
its own, its shards, named ``"<group>~<j>"``. The shards of ``N`` are the first ``N`` of one
sequence per group (so every layout's shards are among those of any larger one), placed so
that on a cluster whose slots are split evenly over ``N`` primaries (up to 10) each holds
one shard. Each shard is an ordinary queue group:
its own ready, delayed and dead sets, task ids that name it (so ``get_result``, ``cancel``
and the delayed-task poller find a task from its id alone), its own workers.

- A producer spreads new tasks over the shards in turn. A unique task goes to the group's
  own keys (those of the group without shards), whatever the number of shards: its claim
  lives there in every layout, so uniqueness holds across the shards and across any
  change of their number (producers of two layouts side by side included). Priorities
  and FIFO hold within a shard, not across shards.
- ``run_email_worker --queues reports/pdf`` runs a worker loop per shard, each waiting on
  its own shard (none polls the others).
- Records and ``queue_stats`` speak of the logical queue (``"reports/pdf"``): a record's
  ``queue`` is it, and ``queue_stats`` adds the shards up.

On one Redis the shards only spread keys. Resharding (``N`` changing): see the docs'
"Sharded queues".
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from django_rcoord.conf import conf
from django_rcoord.keys import encode_name
from django_rcoord.queues.keys import DEFAULT_GROUP, group_of_task_id, one_group, split_queue_name

#: Most shards of one group: each shard is a worker loop per worker process.
MAX_SHARDS = 64
#: Between a sharded group's name and its shard's number.
SHARD_MARK = "~"
#: The message field of a task queued on a shard that names the queue it was queued to
#: ("reports/pdf"): what its record says, whatever the shard layout is when it is read.
QUEUED_AS = "queued_as"

#: The round-robin of each group (or other turn key, as ``route`` is given): one per group,
#: so a group's tasks spread evenly over its shards whatever else the process queues. Each
#: starts at a random shard: processes that queue one task each (a cron job's) spread too.
_turns: dict[str, Iterator[int]] = {}
_turns_lock = threading.Lock()


def _next_turn(key: str) -> int:
    """The next turn of round-robin ``key`` (``next()`` on a count is atomic; the lock only
    keeps two threads' first use from starting two counts)."""
    turns = _turns.get(key)
    if turns is None:
        with _turns_lock:
            turns = _turns.setdefault(key, itertools.count(int.from_bytes(os.urandom(2), "big")))
    return next(turns)


def shards_of(group: str) -> tuple[str, ...]:
    """The groups ``group``'s tasks live in: its shards, or ``(group,)`` when it has none."""
    count = conf.QUEUE_SHARDS.get(group, 1)
    return (group,) if count <= 1 else _shards(group, count)


@functools.lru_cache(maxsize=256)
def _shards(group: str, count: int) -> tuple[str, ...]:
    return _sequence(group)[:count]


#: Where the shards lie in the slot range, in order: the first ``n`` of these points lie
#: one in each ``n``-th of the 16,384 slots for every ``n`` up to 10 (found by a search),
#: so that a cluster whose slots are split evenly over up to 10 primaries holds one shard
#: of an ``n``-shard group on each. Past them, each next shard halves the widest gap left.
_SPREAD = (0, 8200, 12320, 4120, 14360, 6160, 10240, 2080, 14760, 6560)


@functools.lru_cache(maxsize=64)
def _sequence(group: str) -> tuple[str, ...]:
    """``group``'s shards in every layout, ``MAX_SHARDS`` of them: the shards of ``N`` are
    the first ``N``, so the shards of a layout are among those of every larger one (a
    worker of a larger layout serves what a producer of a smaller one queues). Shard ``i``
    is the first ``"<group>~<n>"`` not taken whose slot lies in ``i``'s window."""
    names: list[str] = []
    points = list(_SPREAD)
    for index in range(MAX_SHARDS):
        if index == len(points):
            points.append(_widest_gap_middle(points))
        low, high = _window(points, index)
        number = 0
        while f"{group}{SHARD_MARK}{number}" in names or not (
            low <= _slot(f"{group}{SHARD_MARK}{number}") < high
        ):
            number += 1
        names.append(f"{group}{SHARD_MARK}{number}")
    return tuple(names)


def _window(points: list[int], index: int) -> tuple[int, int]:
    """The slots shard ``index`` may lie in: within ``_SPREAD``, those in the same ``n``-th
    of the range as its point for every ``n`` from ``index + 1`` to ``len(_SPREAD)``; past
    it, a slot range around its point, a quarter of the mean gap each side."""
    point, slots = points[index], REDIS_CLUSTER_HASH_SLOTS
    if index >= len(_SPREAD):
        half = slots // (4 * (index + 1))
        return max(0, point - half), min(slots, point + half + 1)
    low, high = 0, slots
    for parts in range(index + 1, len(_SPREAD) + 1):
        cell = point * parts // slots
        low = max(low, -(-cell * slots // parts))
        high = min(high, -(-(cell + 1) * slots // parts))
    return low, high


def _widest_gap_middle(points: list[int]) -> int:
    """The middle of the widest gap between ``points`` (and the range's end)."""
    ends = [*sorted(points), REDIS_CLUSTER_HASH_SLOTS]
    gap, start = max((after - before, before) for before, after in itertools.pairwise(ends))
    return start + gap // 2


def _slot(group: str) -> int:
    """The hash slot of ``group``'s keys (their hash tag is its encoded name)."""
    return key_slot(encode_name(group).encode())


def every_layout(group: str) -> tuple[str, ...]:
    """The groups that may hold ``group``'s tasks in any layout of shards: its own keys and
    each of the ``MAX_SHARDS`` shards it can have (the shards of every layout are among
    them); only itself when it is a shard (``"<group>~<n>"``)."""
    base, mark, number = group.rpartition(SHARD_MARK)
    if base and mark and number.isdigit():
        return (group,)
    return (group, *_sequence(group))


def is_sharded(group: str) -> bool:
    shards = conf.QUEUE_SHARDS
    return bool(shards) and shards.get(group, 1) > 1


def shard_queue_names(name: str) -> list[str]:
    """The queues that hold queue ``name``'s tasks: one per shard of its group, then its own
    (the group's keys, which hold what was queued before the group had shards); ``[name]``
    when its group has no shards."""
    group, queue = split_queue_name(name)
    if not is_sharded(group):
        return [name]
    return [*(f"{shard}/{queue}" for shard in shards_of(group)), name]


def queues_holding(name: str, task_id: str | None = None, known: Iterable[str] = ()) -> list[str]:
    """The queues of queue ``name`` that may hold task ``task_id``: the one of the group its
    id names (whatever the shard layout is now) when that is ``name``'s group or a shard of
    it, else none. With no task named: its shards now and its group's own keys, then the
    groups of earlier layouts that ``known`` (the registry's groups) lists."""
    group, queue = split_queue_name(name)
    if task_id is not None:
        holder = group_of_task_id(task_id)
        if holder is None or not is_layout_of(group, holder):
            return []
        return [name] if holder == group else [f"{holder}/{queue}"]
    names = shard_queue_names(name)
    now = {split_queue_name(each)[0] for each in names}
    earlier = [other for other in sorted(known) if is_layout_of(group, other) and other not in now]
    return [*names, *(f"{other}/{queue}" for other in earlier)]


def one_shard(names: Sequence[str], *, as_named: bool = False) -> list[str]:
    """``names``, queue names one worker loop serves: ValueError for none, or for a queue of a
    group with shards (unless ``as_named``: that group's own keys, from before it had
    shards)."""
    if not names:
        raise ValueError("a worker needs at least one queue")
    sharded = [name for name in names if is_sharded(split_queue_name(name)[0])]
    if sharded and not as_named:
        raise ValueError(
            f"the group of queue {sharded[0]!r} has shards (RCOORD['QUEUE_SHARDS']) and a "
            "worker serves one group: give it one shard's queues (see "
            "django_rcoord.queues.shards.per_shard), or run manage.py run_email_worker, "
            "which runs a loop per shard"
        )
    return list(names)


def route(
    name: str, claim: str | None = None, *, near: str | None = None, turn: str | None = None
) -> str:
    """The queue a new task of queue ``name`` goes to: ``name`` itself unless its group has
    shards, or the task is unique (``claim``: its claim lives in the group's own keys in
    every layout, so that no change of the number of shards moves it); else shard ``near``
    when it is one (a follow-up queued by its task's finish script, in the same step), or
    the next shard in the round-robin ``turn`` (default: the group's)."""
    if not conf.QUEUE_SHARDS or claim:
        return name
    group, queue = split_queue_name(name)
    if not is_sharded(group):
        return name
    shards = shards_of(group)
    if near in shards:
        return f"{near}/{queue}"
    return f"{shards[_next_turn(turn or group) % len(shards)]}/{queue}"


def placed(
    name: str,
    extra: dict[str, Any] | None,
    claim: str | None = None,
    *,
    near: str | None = None,
    turn: str | None = None,
) -> tuple[str, dict[str, Any] | None]:
    """(the queue a new task of queue ``name`` goes to, as ``route`` says, and its message's
    extra fields ``extra``, with ``QUEUED_AS`` naming ``name`` when that is a shard's)."""
    shard = route(name, claim, near=near, turn=turn)
    if shard == name:
        return name, extra
    return shard, {**(extra or {}), QUEUED_AS: name}


def logical_group(group: str) -> str:
    """The group a shard is of ("reports" for "reports~7"); ``group`` itself when it is
    no shard."""
    base, mark, _ = group.rpartition(SHARD_MARK)
    if not mark or not is_sharded(base) or group not in shards_of(base):
        return group
    return base


def other_layout_of(group: str) -> str | None:
    """The group that ``group`` is a shard of in another layout than this process's
    ("main" for "main~16" while "main" has 3 shards here, or none), or None: what a
    status page marks as a layout mismatch (producers with another ``QUEUE_SHARDS``, or
    what an earlier layout left)."""
    base, mark, number = group.rpartition(SHARD_MARK)
    if not (base and mark and number.isdigit()) or logical_group(group) != group:
        return None
    return base


def logical_queue_name(name: str) -> str:
    """The queue name a user gave for queue ``name`` of a shard ("reports/pdf" for
    "reports~7/pdf"); ``name`` itself when it is no shard's."""
    if not conf.QUEUE_SHARDS:
        return name
    group, slash, queue = name.rpartition("/")
    base = logical_group(group)
    if base == group:
        return name
    return queue if base == DEFAULT_GROUP else f"{base}{slash}{queue}"


def per_shard(names: list[str]) -> list[list[str]]:
    """Queue names of one group, as the queue names of each of its shards (``[names]`` when
    the group has none): what one worker loop each serves."""
    found = _one_group(names)
    if found is None or not is_sharded(found[0]):
        return [names]
    return [_in_group(shard, found[1]) for shard in shards_of(found[0])]


def earlier_layouts(names: list[str], known: Iterable[str]) -> list[list[str]]:
    """``names`` (queues of one group) in each group beside the group's shards now: the
    group's own keys while it has shards (its unique tasks, and what was queued before it
    had shards), and each ``"<group>~<n>"`` that ``known`` (the registry's groups) lists and
    is not one of its shards now (an earlier layout's). Workers serve them too, so that
    tasks queued before resharding still run."""
    found = _one_group(names)
    if found is None:
        return []
    group, queues = found
    earlier = [names] if is_sharded(group) else []
    for other in sorted(set(known) - {group, *shards_of(group)}):
        if is_layout_of(group, other):
            earlier.append(_in_group(other, queues))
    return earlier


def is_layout_of(group: str, other: str) -> bool:
    """True when group ``other`` is group ``group`` or a shard of it in some layout
    (``"<group>~<n>"``): where a task of ``group``'s queues may have been queued."""
    base, mark, number = other.rpartition(SHARD_MARK)
    return other == group or (bool(mark) and base == group and number.isdigit())


def _one_group(names: list[str]) -> tuple[str, list[str]] | None:
    """(the group, the queues within it) of ``names``; None when there are none or they
    span several groups (a worker refuses them)."""
    try:
        group = one_group(names)
    except ValueError:
        return None
    return (group, [split_queue_name(name)[1] for name in names]) if names else None


def _in_group(group: str, queues: list[str]) -> list[str]:
    """The names of ``queues`` (names within a group) in group ``group``."""
    return [f"{group}/{queue}" for queue in queues]
