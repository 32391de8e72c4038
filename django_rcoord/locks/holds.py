"""Who holds a ``Lock`` object: one hold per thread or asyncio task."""

from __future__ import annotations

import asyncio
import secrets
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from django_rcoord.exceptions import LockLost, RcoordError
from django_rcoord.renewal import Renewal


def new_identifier() -> str:
    """A holder's identifier: 128 bits from the OS's CSPRNG (as uuid4's, faster to make, and
    fork-safe without hooks). Nobody can release or extend a lock without it."""
    return secrets.token_hex(16)


def current_holder() -> Any:
    """Who holds what in this thread or task: the running asyncio task, else the thread."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running event loop: sync code
        task = None
    return task if task is not None else threading.current_thread()


@dataclass
class Hold:
    """One holder's grant of a lock."""

    identifier: str
    token: int
    lost: bool = False
    renewal: Renewal | None = None

    def stop_renewing(self) -> None:
        if self.renewal is not None:
            self.renewal.cancel()


class HoldTable:
    """The holds of one lock object, by holder. Weakly keyed: a thread or task that ends
    without releasing leaves no entry (its lock runs out in Redis)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._holds: weakref.WeakKeyDictionary[Any, Hold] = weakref.WeakKeyDictionary()

    def new_holder(self) -> Any:
        """The caller, about to acquire: it must not hold the lock already (it would wait
        for itself)."""
        holder = current_holder()
        if holder in self._holds:
            kind = "task" if isinstance(holder, asyncio.Task) else "thread"
            raise RcoordError(
                f"Lock {self.name!r} is already held by this {kind} (it is not re-entrant)."
            )
        return holder

    def add(self, holder: Any, identifier: str, token: int) -> Hold:
        hold = self._holds[holder] = Hold(identifier, token)
        return hold

    def __contains__(self, holder: Any) -> bool:
        return holder in self._holds

    def current(self) -> Hold | None:
        """The caller's hold, lost or not."""
        return self._holds.get(current_holder())

    def live(self) -> Hold | None:
        """The caller's hold unless it was found lost."""
        hold = self.current()
        return None if hold is None or hold.lost else hold

    def live_or_raise(self) -> Hold:
        hold = self.live()
        if hold is None:
            raise LockLost(f"Lock {self.name!r} is not held by this thread or task.")
        return hold

    def take(self) -> Hold:
        """Remove the caller's hold (it is releasing); ``LockLost`` when it has none."""
        hold = self._holds.pop(current_holder(), None)
        if hold is None:
            raise LockLost(f"Lock {self.name!r} is not held by this thread or task.")
        hold.stop_renewing()
        return hold

    def forget(self, holder: Any) -> None:
        hold = self._holds.pop(holder, None)
        if hold is not None:
            hold.stop_renewing()
