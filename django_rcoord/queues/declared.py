"""What each registered ``@task`` declared that a producer needs when it is given the task
by its name (``execute_later``, ``enqueue_many``, a schedule, a fan-in's child): its
uniqueness and its fair key. Kept here, below the registry (which imports the producer),
and written by the registry when it registers a task."""

from __future__ import annotations

from typing import NamedTuple

from django_rcoord.queues.fair import FairKey
from django_rcoord.queues.unique import Uniqueness


class Declared(NamedTuple):
    """A ``@task``'s ``unique_for`` (its ``Uniqueness``) and ``fair_key`` (its ``FairKey``),
    None for each it does not have."""

    unique: Uniqueness | None = None
    fair: FairKey | None = None


_NOTHING = Declared()
_by_task: dict[str, Declared] = {}


def remember(task_name: str, declared: Declared) -> None:
    """Record what ``@task`` declared for the task ``task_name`` (nothing: forget it)."""
    if declared == _NOTHING:
        _by_task.pop(task_name, None)
    else:
        _by_task[task_name] = declared


def declared_by(task_name: str) -> Declared:
    """What the registered ``@task`` named ``task_name`` declared (nothing, for a task that
    is not registered here)."""
    return _by_task.get(task_name, _NOTHING)
