"""How a task's run ends, in the words the finish script reads (``_finish.lua``,
``_follow_ups.lua``, ``_metrics.lua``): the one vocabulary of the worker, the scripts, the
metrics and the traces."""

from __future__ import annotations

import enum

__all__ = ["Kind"]


class Kind(str, enum.Enum):
    """An ``Outcome``'s kind. A member is its value wherever a ``str`` is (JSON, a dict
    key, a comparison), so the record sent to the finish script carries the Lua string."""

    ACK = "ack"  # it succeeded: acknowledged, its result kept
    RETRY = "retry"  # it failed and another attempt is due (after the retry delay)
    DEFER = "defer"  # it cannot run here (a worker that lacks it): again later, no attempt
    LATER = "later"  # its limits say not yet: it did not run, it waits its turn
    STOPPED = "stopped"  # cancel() asked it to stop and it did (task_stopped finishes it)
    DEAD = "dead"  # it failed for good: a dead letter

    def __str__(self) -> str:
        return self.value

    @property
    def is_final(self) -> bool:
        """It will not run again: its follow-up (on_success / on_failure) is due."""
        return self in (Kind.ACK, Kind.DEAD)

    @property
    def failed(self) -> bool:
        """A failed run, logged and traced as an error."""
        return self in (Kind.RETRY, Kind.DEAD, Kind.STOPPED)

    @property
    def comes_back(self) -> bool:
        """Back in its queue's delayed set, to run when due."""
        return self in (Kind.RETRY, Kind.DEFER, Kind.LATER)
