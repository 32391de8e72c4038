"""The sync face of ``Lock``: acquire, release, extend, owned and ``with``, on redis-py."""

from __future__ import annotations

import logging
import time
from types import TracebackType
from typing import Any, TypeVar

from redis.exceptions import ResponseError

from django_rcoord import tracing
from django_rcoord.conf import conf
from django_rcoord.connection import resolve_client, slot_pipeline
from django_rcoord.connection.features import SET_IFEQ
from django_rcoord.exceptions import LockLost
from django_rcoord.locks import protocol
from django_rcoord.locks.base import LockBase
from django_rcoord.locks.holds import Hold
from django_rcoord.renewal import keep_alive
from django_rcoord.scripts import run_script
from django_rcoord.waiting import pop_signal

_Held = TypeVar("_Held", bound="SyncLock")

logger = logging.getLogger(__name__)


class SyncLock(LockBase):
    @property
    def client(self) -> Any:
        return resolve_client(self._client)

    # -- acquiring -----------------------------------------------------------
    @tracing.traced_wait("lock", lambda lock, _: {"rcoord.lock.token": lock.token})
    def acquire(self, wait: float | None = None) -> bool:
        """Take the lock, waiting up to ``wait`` seconds (default: the lock's ``wait``).

        Returns True when taken (``token`` then holds its fencing token), False
        when ``wait`` ran out.
        """
        holder, identifier, wait = self._start(wait)
        client = self.client
        # Identifiers a grant may have been made to that the caller does not hold yet: given
        # back if the caller raises (a reply cut after the server ran the call, an alarm, a
        # KeyboardInterrupt), instead of holding the lock for nobody until its TTL.
        pending = [identifier]
        try:
            return self._acquire_until(holder, client, identifier, wait, pending)
        except BaseException:
            self._give_back(client, pending)
            raise

    def _acquire_until(
        self, holder: Any, client: Any, identifier: str, wait: float, pending: list[str]
    ) -> bool:
        now = time.monotonic()
        deadline = now + wait
        woken = False
        backoff = 0.0
        while True:
            result = self._try_acquire(client, identifier, protocol.block_ms(deadline, now), woken)
            if result > 0:
                self._granted(holder, identifier, result)
                return True
            if woken and not self.fair:
                backoff = protocol.race_backoff(backoff)
            block = self._after_refusal(result, deadline, time.monotonic())
            if block is None:
                return False
            token = pop_signal(client, self._signal_key, block)
            handover = None if token is None else protocol.handover(token)
            if handover is not None:
                pending.append(handover[0])
                if self._extend_identifier(client, handover[0], self._ttl_ms):
                    self._granted(holder, handover[0], handover[1])
                    return True
                # The grant lapsed before this waiter confirmed it: ask again.
            woken = token is not None
            if woken and backoff:
                time.sleep(min(backoff, max(0.0, deadline - time.monotonic())))
            now = time.monotonic()

    def _give_back(self, client: Any, identifiers: list[str]) -> None:
        """Release whatever of ``identifiers`` holds the lock (compare-and-release: one
        that does not is left alone), as well as the connection allows."""
        for identifier in identifiers:
            try:
                self._release_identifier(client, identifier)
            except Exception as exc:  # noqa: BLE001 (the caller's own error is raised)
                logger.warning("Could not give back lock %r: %s", self.name, exc)

    def _try_acquire(self, client: Any, identifier: str, block_ms: int, woken: bool = False) -> int:
        """One attempt: the fencing token (> 0), or minus the holder's remaining TTL in ms.
        ``woken``: a plain wake-up woke the caller since its last attempt."""
        args = self._acquire_args(identifier, block_ms, woken)
        replicas = conf.LOCK_REPLICAS
        if not replicas:
            return int(run_script("lock_acquire", client, keys=self._keys, args=args))
        # WAIT counts the writes of its own connection: send it in the same pipeline.
        with slot_pipeline(client, self._owner_key, transaction=False) as pipe:
            run_script("lock_acquire", pipe, keys=self._keys, args=args)
            pipe.wait(replicas, max(1, int(conf.LOCK_REPLICA_TIMEOUT * 1000)))
            result, acknowledged = pipe.execute()
        result = int(result)
        if result > 0 and acknowledged < replicas:
            self._release_identifier(client, identifier)
            raise self._not_replicated(acknowledged)
        return result

    def _granted(self, holder: Any, identifier: str, token: int) -> Hold:
        hold = self._holds.add(holder, identifier, token)
        if self.auto_renew:
            client = self.client

            def renew() -> bool:
                if self._extend_identifier(client, hold.identifier, self._ttl_ms):
                    return True
                self._renewal_lost(hold)
                return False

            hold.renewal = keep_alive(self.timeout / 3, renew, f"renewing lock {self.name!r}")
        return hold

    # -- holding -----------------------------------------------------------
    def owned(self) -> bool:
        """True while the calling thread or task holds the lock (asks Redis)."""
        hold = self._holds.live()
        if hold is None:
            return False
        return protocol.is_identifier(self.client.get(self._owner_key), hold.identifier)

    def extend(self, seconds: float | None = None) -> None:
        """Reset the TTL to ``seconds`` from now (default: the lock's ``timeout``).

        Raises ``LockLost`` when the lock is no longer held by the calling thread or task.
        """
        hold = self._holds.live_or_raise()
        if not self._extend_identifier(self.client, hold.identifier, self._extend_ms(seconds)):
            raise self._lost_now(hold)

    def _extend_identifier(self, client: Any, identifier: str, ttl_ms: int) -> bool:
        if SET_IFEQ.usable(client):
            try:
                command = protocol.extend_command(self._keys[0], identifier, ttl_ms)
                return client.execute_command(*command) is not None
            except ResponseError as error:
                if not SET_IFEQ.refused(client, error):
                    raise
        return bool(
            run_script("lock_extend", client, keys=self._keys[:1], args=(identifier, ttl_ms))
        )

    # -- releasing ---------------------------------------------------------
    def release(self) -> None:
        """Release the lock and wake one waiter.

        Raises ``LockLost`` when the calling thread or task did not hold it (or
        its TTL ran out); the current holder's lock is left alone.
        """
        hold = self._holds.take()
        if not self._release_identifier(self.client, hold.identifier):
            raise protocol.lost(self.name)

    def _release_identifier(self, client: Any, identifier: str) -> bool:
        args = self._release_args(identifier)
        return bool(run_script("lock_release", client, keys=self._keys, args=args))

    # -- with --------------------------------------------------------------
    def __enter__(self: _Held) -> _Held:
        if not self.acquire():
            raise protocol.timed_out(self.name, self.wait)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            self.release()
        except LockLost:
            if exc_type is None:
                raise
            self._lost_before_raise()
