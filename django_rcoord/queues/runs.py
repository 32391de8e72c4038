"""A run of a task, planned and not queued yet: ``task.s(*args, **kwargs)``, for a fan-in
(``django_rcoord.queues.fan_in``) to queue with the others."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

#: What a fan-in's child's failure (for good: its retries spent) does: ``fail`` the fan-in
#: (its callback never runs, the children not started yet are cancelled), ``continue``
#: (the callback runs, the failure in the child's place), ``ignore`` (the callback runs,
#: None in the child's place).
FAILURE_POLICIES = ("fail", "continue", "ignore")


@dataclass(frozen=True)
class TaskRun:
    """``task`` with these arguments (checked when a fan-in is made of it), and
    ``if_failed``: what its failure does to the fan-in it is a child of
    (``FAILURE_POLICIES``)."""

    task: Any  # a @task (registry.Task), or a Tasks framework task of a RedisTaskBackend
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    if_failed: str = "fail"

    def __post_init__(self) -> None:
        if self.if_failed not in FAILURE_POLICIES:
            raise ValueError(
                f"if_failed must be one of {', '.join(FAILURE_POLICIES)}, not {self.if_failed!r}"
            )

    def if_it_fails(self, policy: str) -> TaskRun:
        """This run, with failure policy ``policy`` as a fan-in's child."""
        return replace(self, if_failed=policy)
