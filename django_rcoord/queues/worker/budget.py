"""What the worker loops of one process share: how many tasks they may still run
(``--max-tasks``) and, for ``--burst``, whether every one of them is out of work.

``run_email_worker`` runs a loop per shard (and per earlier shard layout, and per
``--concurrency`` thread); its limits are the process's, not each loop's: ``--max-tasks 2``
runs two tasks in all, then every loop stops, and a burst process exits once no loop has
work. A ``Worker`` alone gets its own of each.
"""

from __future__ import annotations

import threading


class TaskBudget:
    """How many tasks the loops sharing it may still run (``limit``; None: no limit).

    A loop reserves what it asks for before it takes (prefetch takes several at once), so
    the loops together never hold more than the budget has left; what it reserved and did
    not run (a take that found fewer, a batch given back, a run held back for a limit) it
    releases. Once ``limit`` tasks ran, ``spent`` is true and ``stop`` (when given) is set.
    """

    def __init__(self, limit: int | None, *, stop: threading.Event | None = None) -> None:
        self.limit = limit
        self.stop = stop
        self.ran = 0
        self._reserved = 0
        self._lock = threading.Lock()

    def left(self) -> int | None:
        """How many tasks a loop may still reserve (None: any number)."""
        if self.limit is None:
            return None
        with self._lock:
            return max(0, self.limit - self.ran - self._reserved)

    def reserve(self, wanted: int) -> int:
        """Reserve up to ``wanted`` tasks; returns how many were reserved."""
        if self.limit is None:
            return wanted
        with self._lock:
            granted = max(0, min(wanted, self.limit - self.ran - self._reserved))
            self._reserved += granted
            return granted

    def release(self, count: int) -> None:
        """``count`` reserved tasks will not run (not taken, or given back)."""
        if self.limit is None or count <= 0:
            return
        with self._lock:
            self._reserved = max(0, self._reserved - count)

    def ran_one(self) -> None:
        """A reserved task ran."""
        if self.limit is None:
            return
        with self._lock:
            self._reserved = max(0, self._reserved - 1)
            self.ran += 1
            spent = self.ran >= self.limit
        if spent and self.stop is not None:
            self.stop.set()

    @property
    def spent(self) -> bool:
        return self.limit is not None and self.ran >= self.limit


class BurstQuorum:
    """When the burst loops sharing it are done: once each of the ``loops`` found nothing to
    take in a take begun after the last change any of them made (a task taken or finished:
    a finish may queue a follow-up, a task may queue more, on any loop's queues). A loop
    that finds nothing waits and looks again until then, rather than leave behind work
    that another loop's task queues for it."""

    def __init__(self, loops: int) -> None:
        self.loops = loops
        self.done = False
        self._changes = 0
        self._idle: dict[str, int] = {}  # loop -> the change its empty take began after
        self._lock = threading.Lock()

    def seen(self) -> int:
        """The last change: a loop notes it before it takes."""
        with self._lock:
            return self._changes

    def changed(self) -> int:
        """A loop took or finished tasks: every loop must look again. Returns the change's
        number (what ``seen`` returns after it)."""
        with self._lock:
            self._changes += 1
            return self._changes

    def found_nothing(self, loop: str, seen: int) -> bool:
        """Loop ``loop`` found nothing in a take begun at change ``seen``: True once every
        loop is done (this one the last to find nothing since the last change, or another
        was)."""
        with self._lock:
            self._idle[loop] = seen
            if len(self._idle) >= self.loops and all(
                idle == self._changes for idle in self._idle.values()
            ):
                self.done = True
            return self.done
