"""What the sync and async faces of ``Lock`` share: its settings, keys and holds."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django_rcoord.conf import conf
from django_rcoord.keys import encoded_instance_keys
from django_rcoord.locks import protocol
from django_rcoord.locks.holds import Hold, HoldTable, new_identifier
from django_rcoord.validation import check_timeout_and_wait

if TYPE_CHECKING:
    from django_rcoord.locks.lock import Lock

logger = logging.getLogger(__name__)


class LockBase:
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

    def _start(self, wait: float | None) -> tuple[Any, str, float]:
        """(holder, new identifier, wait) for an acquire by the caller, who must not hold it."""
        return self._holds.new_holder(), new_identifier(), self.wait if wait is None else wait

    def _after_refusal(self, result: int, deadline: float, now: float) -> float | None:
        """Note the holder's TTL; seconds to wait for a wake-up, or None when out of time."""
        self.holder_ttl = protocol.holder_ttl(result)
        return protocol.wait_after_refusal(self.holder_ttl, deadline, now)

    def _acquire_args(
        self, identifier: str, block_ms: int, woken: bool
    ) -> tuple[str, int, int, int]:
        return protocol.acquire_args(identifier, self._ttl_ms, block_ms, woken)

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
