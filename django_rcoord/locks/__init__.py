"""Distributed locks: the names users import (the code is in ``lock``).

Redis in Action 6.2 done right: fencing tokens, compare-and-act release and
extend, wake-on-release waiting with hand-over, auto-renewal, sync and async.
"""

from __future__ import annotations

from django_rcoord.exceptions import LockLost, LockNotReplicated, LockTimeout
from django_rcoord.locks.holds import new_identifier
from django_rcoord.locks.lock import Lock, acquire_lock, lock_status, release_lock

__all__ = [
    "Lock",
    "LockLost",
    "LockNotReplicated",
    "LockTimeout",
    "acquire_lock",
    "lock_status",
    "new_identifier",
    "release_lock",
]
