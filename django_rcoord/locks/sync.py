"""The sync face of ``Lock``: acquire, release, extend, owned and ``with``, on redis-py."""

from __future__ import annotations

import logging
import time
from typing import Any, TypeVar

from redis.exceptions import ResponseError

from django_rcoord import steps, tracing
from django_rcoord.conf import conf
from django_rcoord.connection import outage, slot_pipeline
from django_rcoord.connection.clients import resolve_client
from django_rcoord.connection.features import SET_IFEQ
from django_rcoord.exceptions import LockLost
from django_rcoord.locks import protocol
from django_rcoord.locks.core import LockCore
from django_rcoord.locks.holds import Hold
from django_rcoord.renewal import keep_alive
from django_rcoord.scripts import run_script
from django_rcoord.steps import Attempt
from django_rcoord.waiting import pop_signal

_Held = TypeVar("_Held", bound="SyncLock")

logger = logging.getLogger(__name__)


class SyncLock(LockCore):
    @property
    def client(self) -> Any:
        return resolve_client(self._client)

    # -- acquiring -----------------------------------------------------------
    @tracing.traced_wait("lock", lambda lock, _: {"rcoord.lock.token": lock.token})
    def acquire(self, wait: float | None = None) -> bool:
        """Take the lock, waiting up to ``wait`` seconds (default: the lock's ``wait``).

        Returns True when taken (``token`` then holds its fencing token), False
        when ``wait`` ran out. Raises ``RedisUnavailable`` when Redis cannot be reached.
        """
        acquisition = self._acquisition(wait, time.monotonic)
        client = self.client
        with outage.unavailable_as_one_error(f"lock {self.name!r}"):
            outage.connect(client)  # if this raises, nothing was sent: nothing to give back
            try:
                hold = steps.run(acquisition.steps, lambda step: self._perform(client, step))
            except BaseException:
                if acquisition.in_doubt is not None:
                    self._give_back(client, acquisition.in_doubt)
                raise
        if hold is None:
            return False
        if self.auto_renew:
            self._keep(client, hold)
        return True

    def _perform(self, client: Any, step: Any) -> Any:
        if isinstance(step, Attempt):
            if step.pause:
                time.sleep(step.pause)
            return self._try_acquire(client, step.args)
        # A Wait, the only other step (a hand-over is confirmed by an Attempt under it).
        return pop_signal(client, self._signal_key, step.seconds)

    def _give_back(self, client: Any, identifier: str) -> None:
        """Release ``identifier`` if it holds the lock, as well as the connection allows."""
        try:
            self._release_identifier(client, identifier)
        except Exception as exc:  # noqa: BLE001 (the caller's own error is raised)
            logger.warning("Could not give back lock %r: %s", self.name, exc)

    def _try_acquire(self, client: Any, args: tuple[Any, ...]) -> int:
        """One attempt: the fencing token (> 0), or minus the holder's remaining TTL in ms."""
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
            self._release_identifier(client, args[0])
            raise self._not_replicated(acknowledged)
        return result

    def _keep(self, client: Any, hold: Hold) -> None:
        def renew() -> bool:
            if self._extend_identifier(client, hold.identifier, self._ttl_ms):
                return True
            self._renewal_lost(hold)
            return False

        hold.renewal = keep_alive(self.timeout / 3, renew, f"renewing lock {self.name!r}")

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

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        try:
            self.release()
        except LockLost:
            if exc_type is None:
                raise
            self._lost_before_raise()
