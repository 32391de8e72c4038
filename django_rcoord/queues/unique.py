"""Unique tasks: while a task with the same name and arguments (or the same key) is ready,
delayed or running, queueing it again returns the queued task's id and queues nothing.

The claim is a field of the queue group's results HASH (a key every script that queues,
finishes, recovers or cancels a task already has): ``u:<sha256>`` -> ``<task id>|<until,
ms>``. The digest is of the task name and its JSON arguments (or the ``unique_key``
function's text), so nothing a user passes reaches a key name. The task's message
carries the field's name (``"unique"``): the scripts that end a task (acknowledged, dead
letter, cancelled) read it there and drop the claim if it is still that task's. A claim
also ends ``unique_for`` seconds after it was made, by the Redis server's clock. A dead
letter sent back to its queue (``requeue_dead``) takes its claim back for ``unique_for``
seconds (``"unique_ms"`` in its message), unless another run of the task holds it then:
that run keeps it, and both run.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

#: The message field naming a task's claim (read by the Lua helper ``_unique``).
UNIQUE_FIELD = "unique"
#: The message field saying how long the claim lasts, ms (``unique_for``): a dead letter
#: sent back by ``requeue_dead`` claims again for that long.
UNIQUE_MS_FIELD = "unique_ms"

#: Keys sorted: the same keyword arguments in any order are the same task.
_CANONICAL = DjangoJSONEncoder(separators=(",", ":"), sort_keys=True)


@dataclass(frozen=True)
class Uniqueness:
    """How a task is unique: for at most ``seconds``, per name and arguments, or per the
    text ``key(*args, **kwargs)`` returns."""

    seconds: float
    key: Callable[..., str] | None = None

    @property
    def ms(self) -> int:
        return max(1, int(self.seconds * 1000))

    def claim(self, task_name: str, args: Sequence[Any], kwargs: dict[str, Any]) -> str:
        """The claim's field for a run of ``task_name`` with these arguments: ``u:`` and a
        hex SHA-256, whatever the arguments or the key function's text hold."""
        if self.key is None:
            identity = _CANONICAL.encode([list(args), kwargs])
        else:
            identity = self.key(*args, **kwargs)
            if not isinstance(identity, str):
                raise TypeError(
                    f"the unique_key of task {task_name!r} must return a str, "
                    f"not {type(identity).__name__}"
                )
        digest = hashlib.sha256(json.dumps([task_name, identity]).encode()).hexdigest()
        return f"u:{digest}"


def make_uniqueness(unique_for: Any, unique_key: Any = None) -> Uniqueness | None:
    """The ``Uniqueness`` of ``@task(unique_for=..., unique_key=...)`` (None without
    ``unique_for``); ValueError or TypeError for values that cannot be one."""
    if unique_for is None:
        if unique_key is not None:
            raise ValueError(
                "unique_key needs unique_for (the longest a task stays unique, in seconds)"
            )
        return None
    problem = unique_for_problem(unique_for)
    if problem:
        raise ValueError(f"unique_for {problem}")
    if unique_key is not None and not callable(unique_key):
        raise TypeError("unique_key must be a callable taking the task's arguments")
    return Uniqueness(float(unique_for), unique_key)


def unique_for_problem(value: Any) -> str | None:
    """Why ``value`` cannot be a ``unique_for``, or None when it can."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        return f"must be a positive number of seconds, not {value!r}"
    if value > 366 * 24 * 3600:
        return f"must be at most a year (366 days), not {value!r}"
    return None
