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

#: What ``@task(fair_key=...)`` takes: a key for every run, or a function of a run's
#: arguments returning its key (None: that run has none).
FairKeySource = str | Callable[..., str | None]


@dataclass(frozen=True)
class FairKey:
    """How a task's runs are keyed: ``source`` is a str, or a function of the arguments."""

    source: FairKeySource

    def message_fields(
        self, task_name: str, args: Sequence[Any], kwargs: dict[str, Any]
    ) -> dict[str, str] | None:
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
        return {FAIR_KEY_FIELD: encode_name(key)}


def make_fair_key(source: FairKeySource | None) -> FairKey | None:
    """``@task``'s ``fair_key``, checked at import: a non-empty str, a callable, or None."""
    if source is None:
        return None
    if isinstance(source, str):
        encode_name(source)  # InvalidName now for an empty or over-long key
    elif not callable(source):
        raise TypeError(
            f"fair_key takes a str or a function of the task's arguments, not {source!r}"
        )
    return FairKey(source)
