"""The core of ``Lock``, with no I/O: its settings, keys and holds, and its acquire as steps.

``Acquisition`` is the one acquire both faces run (``django_rcoord.steps``): the
sync face (``sync``) sends its steps with redis-py, the async face (``aio``) with
redis.asyncio, and neither decides anything the core does not.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django_rcoord.conf import conf
from django_rcoord.keys import encoded_instance_keys
from django_rcoord.locks import protocol
from django_rcoord.locks.holds import Hold, HoldTable, new_identifier
from django_rcoord.steps import Attempt, Steps, Wait
from django_rcoord.validation import check_timeout_and_wait

if TYPE_CHECKING:
    from django_rcoord.locks.lock import Lock

logger = logging.getLogger(__name__)


class LockCore:
    """A lock's name, TTL, default wait, renewal and fairness choices, keys and holds."""

    def __init__(
        self,
        name: str,
        *,
        timeout: float = 10,
        wait: float = 10,
        auto_renew: bool = False,
        on_lost: Callable[[Lock], None] | None = None,
        fair: bool = True,
        client: Any = None,
    ) -> None:
        check_timeout_and_wait(timeout, wait)
        self.name = name
        self.timeout = timeout
        self.wait = wait
        self.auto_renew = auto_renew
        self.on_lost = on_lost
        self.fair = fair
        self._client = client
        self._keys = encoded_instance_keys("lock", name, protocol.KEY_PARTS)
        #: After a failed ``acquire``: the holder's remaining TTL in seconds (None if unknown).
        self.holder_ttl: float | None = None
        self._holds = HoldTable(name)

    # The keys as str, for the few commands outside the scripts.
    @property
    def _owner_key(self) -> str:
        return self._keys[0].decode()

    @property
    def _fence_key(self) -> str:
        return self._keys[1].decode()

    @property
    def _signal_key(self) -> str:
        return self._keys[2].decode()

    @property
    def _ttl_ms(self) -> int:
        return protocol.ttl_ms(self.timeout)

    @property
    def identifier(self) -> str | None:
        """The calling thread's or task's identifier while it holds the lock, else None."""
        hold = self._holds.current()
        return None if hold is None else hold.identifier

    @property
    def token(self) -> int | None:
        """The fencing token of the calling thread's or task's hold, else None."""
        hold = self._holds.current()
        return None if hold is None else hold.token

    def _acquisition(self, wait: float | None, clock: Callable[[], float]) -> Acquisition:
        """A new acquire by the calling thread or task, which must not hold the lock."""
        wait = self.wait if wait is None else wait
        return Acquisition(self, self._holds.new_holder(), wait, clock)

    def _release_args(self, identifier: str) -> tuple[str, int, int]:
        return protocol.release_args(identifier, self._ttl_ms, conf.LOCK_REPLICAS, self.fair)

    def _extend_ms(self, seconds: float | None) -> int:
        return self._ttl_ms if seconds is None else protocol.ttl_ms(seconds)

    def _not_replicated(self, acknowledged: int) -> Exception:
        return protocol.not_replicated(
            self.name, acknowledged, conf.LOCK_REPLICAS, conf.LOCK_REPLICA_TIMEOUT
        )

    def _lost_now(self, hold: Hold) -> Exception:
        hold.lost = True
        return protocol.lost(self.name)

    def _renewal_lost(self, hold: Hold) -> None:
        hold.lost = True
        logger.warning("Lock %r was lost while held (auto_renew)", self.name)
        if self.on_lost is not None:
            try:
                self.on_lost(self)  # type: ignore[arg-type]  # self is a Lock
            except Exception:
                logger.exception("on_lost callback of lock %r failed", self.name)

    def _lost_before_raise(self) -> None:
        # Do not hide the body's own exception behind this one.
        logger.warning("Lock %r was lost before the block that held it raised", self.name)

    def __repr__(self) -> str:
        hold = self._holds.current()
        state = f"held here, token {hold.token}" if hold else "not held here"
        return f"<Lock {self.name!r} ({state})>"


class Acquisition:
    """One acquire: its steps (``steps``), and which identifier, if any, the lock may have
    been granted to without the caller holding it yet (``in_doubt``: an attempt in flight,
    a hand-over not yet confirmed). A face whose step raises (a reply cut after the server
    ran the call, a cancellation, a KeyboardInterrupt) gives that identifier back
    (compare-and-release: if it was not granted, nothing happens) instead of leaving the
    lock held by nobody until its TTL."""

    __slots__ = ("holder", "in_doubt", "steps")

    def __init__(self, lock: LockCore, holder: Any, wait: float, clock: Callable[[], float]):
        self.holder = holder
        self.in_doubt: str | None = None
        self.steps = self._steps(lock, new_identifier(), wait, clock)

    def _steps(
        self, lock: LockCore, identifier: str, wait: float, clock: Callable[[], float]
    ) -> Steps[Hold | None]:
        """The caller's hold once granted; None when ``wait`` ran out."""
        now = clock()
        deadline = now + wait
        woken = False
        backoff = pause = 0.0
        while True:
            args = protocol.acquire_args(
                identifier, lock._ttl_ms, protocol.block_ms(deadline, now), woken
            )
            self.in_doubt = identifier
            result = yield Attempt(args, pause)
            self.in_doubt = None
            if result > 0:
                return lock._holds.add(self.holder, identifier, result)
            if woken and not lock.fair:
                backoff = protocol.race_backoff(backoff)
            lock.holder_ttl = protocol.holder_ttl(result)
            block = protocol.wait_after_refusal(lock.holder_ttl, deadline, clock())
            if block is None:
                return None
            token = yield Wait(block)
            grant = None if token is None else protocol.handover(token)
            if grant is not None:
                self.in_doubt = grant[0]
                confirmed = yield Attempt(protocol.confirm_args(grant[0], lock._ttl_ms, identifier))
                if confirmed > 0:
                    return lock._holds.add(self.holder, grant[0], confirmed)
                # The grant lapsed before this waiter confirmed it: ask again.
                self.in_doubt = None
            woken = token is not None
            now = clock()
            pause = min(backoff, max(0.0, deadline - now)) if woken else 0.0
