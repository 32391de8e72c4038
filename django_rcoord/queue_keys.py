"""Where task queues live: the keys of a queue and of its group.

Queue names: ``"email"`` lives in the queue group ``main``; ``"reports/pdf"``
is the queue ``pdf`` of the group ``reports``. All keys of one group share a
hash tag, so the queues one worker watches together must be in one group;
spread load over Redis Cluster with several groups served by separate workers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django_rcoord.exceptions import InvalidName
from django_rcoord.keys import KeySpace

DEFAULT_GROUP = "main"
#: Lifetime of unconsumed wake-up tokens (workers' and pollers' lists), ms.
WAKE_TOKEN_MS = 60_000


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
