"""A fan-in's HASH, read: where a fan-in stands (``django_rcoord.queues.fan_in`` writes it
and says how; ``get_result`` reads it for a callback not queued yet)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from django_rcoord.queues.keys import GroupKeys, group_of_task_id


@dataclass(frozen=True)
class FanInStatus:
    """Where fan-in ``id`` stands: ``state`` is ``waiting`` (for children), ``fired`` (its
    callback is queued), ``failed`` (a child with ``if_failed="fail"`` failed: the callback
    will not run) or ``cancelled``."""

    id: str
    state: str
    total: int
    ended: int
    failed: int
    children: list[str]


#: The fields of a fan-in's HASH that say where it stands (``status_of``), and its
#: callback's message.
STATUS_FIELDS = ("state", "total", "ended", "failed", "ids", "message")


def fan_in_key(fan_in_id: str) -> str | None:
    """The key of fan-in ``fan_in_id``'s HASH, or None when that is no task id."""
    group = group_of_task_id(fan_in_id)
    return GroupKeys.of(group).fan_in(fan_in_id) if group is not None else None


def status_of(fan_in_id: str, fields: Sequence[bytes | None]) -> FanInStatus | None:
    """Fan-in ``fan_in_id``'s status from its ``STATUS_FIELDS`` (None: no such fan-in)."""
    if fields[0] is None:
        return None
    state, total, ended, failed, ids = (bytes(field or b"").decode() for field in fields[:5])
    return FanInStatus(fan_in_id, state, int(total), int(ended), int(failed), json.loads(ids))
