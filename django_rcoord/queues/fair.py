"""Fair queues: tasks queued with a key are served round-robin across keys within their
queue, so a key with 500,000 tasks waiting delays a key with one by one round of the keys
at most.

A task's key is a field of its message (``"fair_key"``, encoded as a key part: no brace,
no space). The scripts that put a task on a ready ZSET (``_ready.lua``'s ``ready_add``)
keep one task of each key there, the key's head; the others wait in the key's own line, a
ZSET built from the ready ZSET's name (same hash slot). When a worker takes a head (or a
head is cancelled), the key's next task joins the ready ZSET behind the tasks already
ready at its priority. Priorities hold within a key: a task of a higher priority than its
key's head takes the head's place. A task without a key costs what it cost before: one
string search of its message in the scripts that queue and take it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django_rcoord.keys import encode_name

#: The message field holding a task's fair key (read by the Lua helper ``_ready``).
FAIR_KEY_FIELD = "fair_key"
#: The message field holding the most tasks of its key that may run at once
#: (``max_running_per_key``): the take holds the key's line while that many run.
FAIR_LIMIT_FIELD = "fair_limit"

#: What ``@task(fair_key=...)`` takes: a key for every run, or a function of a run's
#: arguments returning its key (None: that run has none).
FairKeySource = str | Callable[..., str | None]


@dataclass(frozen=True)
class FairKey:
    """How a task's runs are keyed: ``source`` is a str, or a function of the arguments;
    ``limit``: at most that many runs of one key at once, across every worker (None: no
    limit)."""

    source: FairKeySource
    limit: int | None = None

    def message_fields(
        self, task_name: str, args: Sequence[Any], kwargs: dict[str, Any]
    ) -> dict[str, Any] | None:
        """The message fields of a run with these arguments (None: it has no key).
        TypeError when the function returns something else than a str or None; InvalidName
        for an empty key or one over 200 characters."""
        key = self.source(*args, **kwargs) if callable(self.source) else self.source
        if key is None:
            return None
        if not isinstance(key, str):
            raise TypeError(
                f"the fair_key of task {task_name!r} must return a str or None, "
                f"not {type(key).__name__}"
            )
        fields: dict[str, Any] = {FAIR_KEY_FIELD: encode_name(key)}
        if self.limit is not None:
            fields[FAIR_LIMIT_FIELD] = self.limit
        return fields


def make_fair_key(
    source: FairKeySource | None,
    max_running_per_key: int | None = None,
    rate_per_key: str | None = None,
) -> FairKey | None:
    """``@task``'s ``fair_key`` and ``max_running_per_key``, checked at import: a non-empty
    str, a callable, or None; an int >= 1 or None, which needs a ``fair_key``, as
    ``rate_per_key`` does (``RunOptions`` checks its value)."""
    limit = max_running_per_key
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"max_running_per_key must be an int >= 1, or None, not {limit!r}")
    if source is None:
        for name, given in (("max_running_per_key", limit), ("rate_per_key", rate_per_key)):
            if given is not None:
                raise ValueError(f"{name} needs a fair_key")
        return None
    if isinstance(source, str):
        encode_name(source)  # InvalidName now for an empty or over-long key
    elif not callable(source):
        raise TypeError(
            f"fair_key takes a str or a function of the task's arguments, not {source!r}"
        )
    return FairKey(source, limit)


def with_fair_key(
    fair: FairKey | None,
    task_name: str,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    extra: dict[str, Any] | None,
) -> dict[str, Any] | None:
    """``extra`` (a new message's added fields) with ``fair``'s key (the fair key the
    registered ``@task`` named ``task_name`` declared) for these arguments, when it has
    one: every producer's run gets its key at the one door that builds messages
    (``producer``), by its task or by name."""
    fields = fair.message_fields(task_name, args, kwargs) if fair is not None else None
    return {**(extra or {}), **fields} if fields else extra


def finished_fields(message: dict[str, Any] | None) -> dict[str, str]:
    """What the finish script needs of a run's message to end it (see ``_ready.lua``): its
    fair key when its key has a limit of running tasks, so that its end lets the key's next
    task in; nothing for most runs."""
    if message is None or message.get(FAIR_LIMIT_FIELD) is None:
        return {}
    key = message.get(FAIR_KEY_FIELD)
    return {FAIR_KEY_FIELD: key} if isinstance(key, str) and key else {}
