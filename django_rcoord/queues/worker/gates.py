"""A task's limits across every worker: how often it may start, and how many may run at once.

``@task(rate="100/m")`` is an exact sliding window (``ratelimit``'s ``"sliding"``: at most
100 starts in any minute, decided on the Redis server's clock): a run over the rate goes
back to the delayed set until the earliest moment it is allowed. ``@task(concurrency=3)``
is a fair semaphore whose permits are leased like the task itself (a dead worker's permit
comes back when its lease ends, and the process's renewer keeps it while the task runs):
a run that finds every permit taken goes back for about ``CONCURRENCY_RECHECK`` seconds.
Neither costs a busy loop nor holds the worker: the task waits in the delayed set while
the worker runs the tasks behind it. Tasks that give the same ``limit_key`` share their limits.
"""

from __future__ import annotations

import hashlib
import logging
import random
from dataclasses import dataclass
from typing import Any

from django_rcoord.connection.errors import REDIS_ERRORS
from django_rcoord.keys import MAX_NAME_LENGTH
from django_rcoord.queues.fair import FAIR_KEY_FIELD
from django_rcoord.queues.options import RunOptions, parse_rate
from django_rcoord.queues.worker.jobs import Job
from django_rcoord.ratelimit import hit
from django_rcoord.renewal import Renewal
from django_rcoord.semaphores import Semaphore

logger = logging.getLogger(__name__)

#: Seconds (at most; at least half of it, at random) before a run that found its task's
#: concurrency full is looked at again.
CONCURRENCY_RECHECK = 1.0
#: Seconds before a run whose limits could not be read (a Redis error) is looked at again.
LIMITS_UNREADABLE_RECHECK = 1.0


@dataclass
class Pass:
    """What a run took to start: nothing, or a permit (kept alive while it runs)."""

    semaphore: Semaphore | None = None
    identifier: str | None = None
    renewal: Renewal | None = None


@dataclass
class Wait:
    """A run that may not start yet: back in the delayed set for ``delay_ms``."""

    delay_ms: int
    why: str


class TaskGates:
    """The limits of the tasks a worker runs, with ``lease`` as the permits' lease."""

    def __init__(self, lease: float, *, client: Any = None) -> None:
        self.lease = lease
        self._client = client

    def enter(self, job: Job, options: RunOptions) -> Pass | Wait:
        """A ``Pass`` when ``job``, with its task's ``options``, may run now, else a
        ``Wait``. Never raises."""
        if options.rate is None and options.concurrency is None and options.rate_per_key is None:
            return Pass()
        key = f"task:{options.limit_key or job.task_name}"
        try:
            per_key = _per_key(key, job.message) if options.rate_per_key else None
            return self._enter(key, options, per_key)
        except REDIS_ERRORS as exc:
            return Wait(
                int(LIMITS_UNREADABLE_RECHECK * 1000), f"its limits could not be read ({exc})"
            )

    def _enter(self, key: str, options: RunOptions, key_of_run: str | None) -> Pass | Wait:
        # The permit first: a run held back by its concurrency must not use up a start of
        # its rate (the sliding window counts every allowed hit).
        taken = Pass()
        if options.concurrency is not None:
            semaphore = Semaphore(key, options.concurrency, timeout=self.lease, client=self._client)
            identifier = semaphore.acquire(wait=0)
            if identifier is None:
                recheck = CONCURRENCY_RECHECK * (0.5 + random.random() / 2)
                return Wait(int(recheck * 1000), f"its concurrency of {options.concurrency}")
            taken = Pass(semaphore, identifier)
        rates = [(key, options.rate)]
        if key_of_run is not None:  # its fair key's own window
            rates.append((key_of_run, options.rate_per_key))
        for bucket, rate in rates:
            if rate is None:
                continue
            runs, seconds = parse_rate(rate)
            try:
                result = hit(bucket, runs, seconds, algorithm="sliding", client=self._client)
            except BaseException:
                # A Redis error, or anything else (the time limit's alarm, a KeyboardInterrupt):
                # the permit goes back now, not at its lease's end.
                self.leave(taken)
                raise
            if not result.allowed:
                self.leave(taken)
                return Wait(max(1, round(result.retry_after * 1000)), f"its rate {rate}")
        if taken.semaphore is not None and taken.identifier is not None:
            taken.renewal = taken.semaphore.keep(taken.identifier)
        return taken

    def leave(self, taken: Pass) -> None:
        """Give back what the run took; never raises (a permit not given back ends with its
        lease)."""
        if taken.semaphore is None or taken.identifier is None:
            return
        if taken.renewal is not None:
            taken.renewal.cancel()
        try:
            taken.semaphore.release(taken.identifier)
        except REDIS_ERRORS as exc:
            logger.warning(
                "could not give back a permit of %r (%s); its lease ends it",
                taken.semaphore.name,
                exc,
            )


def _per_key(key: str, message: dict[str, Any] | None) -> str | None:
    """The name of the window of a run's fair key under the task's ``key`` (its
    ``rate_per_key``), or None for a run without a fair key. The key is hashed: any
    text, any length, stays one short name."""
    fair = (message or {}).get(FAIR_KEY_FIELD)
    if not isinstance(fair, str) or not fair:
        return None
    digest = hashlib.sha256(fair.encode("utf-8", "surrogatepass")).hexdigest()[:24]
    return f"{key[: MAX_NAME_LENGTH - 30]}:key:{digest}"
