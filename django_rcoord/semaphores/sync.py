"""The sync face of ``Semaphore``: acquire, release, refresh, keep, holders and ``with``."""

from __future__ import annotations

import logging
import time
from typing import Any

from django_rcoord import steps, tracing
from django_rcoord.connection import outage
from django_rcoord.connection.clients import resolve_client
from django_rcoord.locks import new_identifier
from django_rcoord.renewal import Renewal, keep_alive
from django_rcoord.scripts import run_script
from django_rcoord.semaphores.core import SemaphoreCore, count_after
from django_rcoord.steps import Attempt, Wait
from django_rcoord.waiting import pop_signal

logger = logging.getLogger(__name__)


class SyncSemaphore(SemaphoreCore):
    @property
    def client(self) -> Any:
        return resolve_client(self._client)

    @tracing.traced_wait("semaphore", lambda _, permit: {"rcoord.semaphore.permit": permit})
    def acquire(self, wait: float | None = None) -> str | None:
        """A permit's identifier, or None when none was free within ``wait`` seconds (by
        default the instance's ``wait``, as for ``Lock.acquire``). Raises
        ``RedisUnavailable`` when Redis cannot be reached."""
        wait = self.wait if wait is None else wait
        client = self.client
        with outage.unavailable_as_one_error(f"semaphore {self.name!r}"):
            outage.connect(client)  # if this raises, nothing was sent: nothing to give back
            return self._steps(client, new_identifier(), wait)

    def _steps(self, client: Any, identifier: str, wait: float) -> str | None:
        try:
            return steps.run(
                self._acquisition(identifier, wait, time.monotonic),
                lambda step: self._perform(client, step),
            )
        except BaseException:
            # A reply cut after the server granted it, an alarm, a KeyboardInterrupt: the
            # permit (or place in line) goes back now, not at its lease's end.
            try:
                self._release(client, identifier)
            except Exception as exc:  # noqa: BLE001 (the caller's own error is raised)
                logger.warning("Could not give back a permit of %r: %s", self.name, exc)
            raise

    def _perform(self, client: Any, step: Any) -> Any:
        if isinstance(step, Attempt):
            return run_script("semaphore_acquire", client, keys=self._keys, args=step.args)
        if isinstance(step, Wait):
            return pop_signal(client, self._signal_key, step.seconds)
        return self._release(client, step.identifier)  # a waiter leaves the line as a holder

    def release(self, identifier: str) -> bool:
        """Give back a permit; False when it was not held (its lease had ended)."""
        return self._release(self.client, identifier)

    def _release(self, client: Any, identifier: str) -> bool:
        args = self._release_args(identifier)
        return bool(run_script("semaphore_release", client, keys=self._release_keys, args=args))

    def refresh(self, identifier: str) -> bool:
        """Restart a held permit's lease; False (and nothing re-added) when it had ended."""
        args = self._refresh_args(identifier)
        return bool(run_script("semaphore_refresh", self.client, keys=self._keys[:1], args=args))

    def keep(self, identifier: str, *, max_hold: float | None = None) -> Renewal:
        """Refresh a held permit every third of its lease, on the process's renewer, until
        the returned renewal is cancelled or the permit is found lapsed. For holders that
        may outlive a lease (the concurrency-limit middleware's requests). ``max_hold``:
        seconds after which it is no longer refreshed (the permit then ends within its
        lease), whatever its holder is doing."""
        overdue = self._overdue(max_hold)

        def refresh() -> bool:
            return not overdue() and self._refreshed(self.refresh(identifier))

        return keep_alive(self.timeout / 3, refresh, self._keeping)

    def holders(self) -> int:
        """How many permits are held now (expired leases not counted)."""
        client = self.client
        return int(client.zcount(self._holders_key, count_after(client.time()), "+inf"))

    def __enter__(self) -> str:
        return self._enter(self.acquire(self.wait))

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        self._exited(self.release(self._pop_entered()), exc_type)
