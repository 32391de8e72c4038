"""How many tasks a worker takes at once, and when the ones taken must go back."""

from __future__ import annotations

#: A worker takes as many tasks at once as it expects to run in this many ms (by the
#: recent average run time), at most its ``prefetch``; once a task has run longer than
#: this, the tasks taken with it go back for any worker while it runs.
PREFETCH_BUDGET_MS = 50.0


class PrefetchPolicy:
    """Takes one task until a run was measured, then as many as fit in
    ``PREFETCH_BUDGET_MS`` by the recent average run time, at most ``prefetch``."""

    def __init__(self, prefetch: int) -> None:
        self.prefetch = prefetch
        self.average_ms: float | None = None  # recent run time per task

    def observe(self, took_ms: float) -> None:
        """A task ran for ``took_ms``: fold it into the recent average."""
        average = self.average_ms
        self.average_ms = took_ms if average is None else average * 0.8 + took_ms * 0.2

    def take_count(self, left: int | None = None) -> int:
        """How many tasks the next take asks for; never more than ``left`` (what a worker
        with ``max_tasks`` may still run)."""
        count = 1
        if self.average_ms is not None:
            count = self.prefetch
            if self.average_ms > 0:
                count = max(1, min(count, int(PREFETCH_BUDGET_MS / self.average_ms)))
        if left is not None:
            count = min(count, left)
        return max(0, count)

    @staticmethod
    def give_back_at(running_since: float) -> float:
        """When the tasks waiting behind one that started at ``running_since``
        (time.monotonic()) go back for other workers."""
        return running_since + PREFETCH_BUDGET_MS / 1000
