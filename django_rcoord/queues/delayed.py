"""Delayed tasks and the delay queue.

- ``DueTaskPromoter`` (``manage.py poll_delayed``): moves delayed tasks that are
  due into their queues, one atomic script call per batch, sleeping until the
  next due time and woken early when a nearer one is scheduled. Many can run at
  once: a task is promoted exactly once and never lost between the delayed set
  and its queue. ``poll_queue()`` is one pass (the book's name).
- ``DelayQueue``: the seed article's queue of data that becomes available a
  while after it was pushed (``push(data)``, ``pop(num, previous)``).

Scheduling itself is ``<task>.schedule(delay=... | eta=...)`` and
``execute_later(queue, name, args, delay=...)`` in ``django_rcoord.queues``.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from django_rcoord.connection.clients import resolve_client
from django_rcoord.connection.errors import RECONNECT_BACKOFF, log_answering_again, log_waited_out
from django_rcoord.keys import KeySpace
from django_rcoord.queues.keys import GroupKeys, QueueKeys, registry_keys
from django_rcoord.queues.periodic import fire_due
from django_rcoord.queues.records import known_groups, known_queues, recover_and_promote
from django_rcoord.queues.schedules import schedules
from django_rcoord.scripts import run_script
from django_rcoord.validation import check_batch
from django_rcoord.waiting import wait_for_signal

logger = logging.getLogger(__name__)

#: Longest single BLPOP of a watcher thread, seconds (it checks for a stop between).
WATCH_BLOCK = 1.0
#: How often the list of queues is read again (new queues appear while a poller runs).
QUEUE_LIST_REFRESH = 5.0


class DueTaskPromoter:
    """Promotes due delayed tasks of every known queue until ``stop()``."""

    def __init__(
        self,
        *,
        interval: float = 1.0,
        batch: int = 500,
        client: Any = None,
        stop_event: threading.Event | None = None,
    ) -> None:
        if not interval > 0:
            raise ValueError("interval must be > 0")
        check_batch(batch, "batch")
        self.interval = interval
        self.batch = batch
        self._client = client
        self.stopping = stop_event or threading.Event()
        self.promoted = 0
        self.fired = 0
        #: The server's clock at this promoter's first pass: ticks due before it are
        #: catch-up fires, not lateness.
        self.started_ms: int | None = None
        # Read once: a changed schedule is picked up when the poller starts again.
        self._schedules = schedules()
        self._queues: list[QueueKeys] = []
        self._queues_read_at = -QUEUE_LIST_REFRESH
        # Set by a watcher thread when a wake-up arrives on a group's schedule list or on
        # the registry's (a new group): the loop then looks again at once.
        self._woken = threading.Event()
        self._watched: dict[str, threading.Thread] = {}  # (only while run() runs)
        self._groups: list[str] = []

    @property
    def client(self) -> Any:
        return resolve_client(self._client)

    def stop(self) -> None:
        self.stopping.set()

    def queues(self) -> list[QueueKeys]:
        # Read again after a while, and at once while there is none (nothing was ever queued).
        stale = time.monotonic() - self._queues_read_at >= QUEUE_LIST_REFRESH
        if stale or not self._queues:
            client = self.client
            groups = known_groups(client=client)
            self._queues = [
                QueueKeys.of(name)
                for group in groups
                for name in known_queues(group, client=client)
            ]
            self._queues_read_at = time.monotonic()
            self._groups = groups
        return self._queues

    def _sleep(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True when woken early by a wake-up (a stop ends it too)."""
        deadline = time.monotonic() + seconds
        while not self.stopping.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if self._woken.wait(min(remaining, 0.2)):
                self._woken.clear()
                return True
        return False

    def _watch(self, key: str) -> None:
        """Block on the wake-up list ``key`` in a thread of its own (one per queue group:
        on Redis Cluster each group's list lives in its own hash slot, and one BLPOP cannot
        span slots) and wake the loop when a token arrives."""
        if key in self._watched:
            return

        def watch() -> None:
            while not self.stopping.is_set():
                try:
                    if wait_for_signal(self.client, key, WATCH_BLOCK):
                        self._woken.set()
                # The loop meets the same error and logs it; a poller stops only when told.
                except Exception:  # noqa: BLE001
                    self.stopping.wait(1.0)

        thread = threading.Thread(target=watch, name=f"rcoord-poller-watch:{key}", daemon=True)
        self._watched[key] = thread
        thread.start()

    def run_once(self) -> tuple[int, float | None]:
        """One pass over every queue: (tasks promoted, seconds until the next is due)."""
        promoted_now = 0
        next_due: float | None = None
        for queue in self.queues():
            while True:
                recovered, promoted, due_in = recover_and_promote(
                    queue, batch=self.batch, client=self.client
                )
                promoted_now += promoted
                if recovered:
                    logger.warning(
                        "put back %d task(s) of %s whose worker died", recovered, queue.name
                    )
                if promoted < self.batch:  # a full batch means more may be due now
                    break
            if due_in is not None:
                next_due = due_in if next_due is None else min(next_due, due_in)
        if promoted_now:
            logger.info("promoted %d due task(s)", promoted_now)
        self.promoted += promoted_now
        if self._schedules:
            seconds, micros = self.client.time()
            now_ms = seconds * 1000 + micros // 1000
            if self.started_ms is None:
                self.started_ms = now_ms
            fired, next_tick = fire_due(
                self.client, now_ms, self._schedules, started_ms=self.started_ms
            )
            if fired:
                logger.info("fired %d periodic task(s)", fired)
            self.fired += fired
            if next_tick != math.inf:
                next_due = next_tick if next_due is None else min(next_due, next_tick)
        return promoted_now, next_due

    def run(self) -> int:
        """Promote until stopped; returns how many tasks were promoted."""
        logger.info("poller started (interval %ss, batch %d)", self.interval, self.batch)
        failures = 0  # tries in a row that found Redis out of reach
        last_error: Exception | None = None  # the last of them's (its log: "same error again")
        while not self.stopping.is_set():
            try:
                started = time.monotonic()
                _, next_due = self.run_once()
                if failures:
                    log_answering_again(logger, "poller", failures)
                    failures = 0
                sleep = self.interval if next_due is None else min(self.interval, next_due)
                # Due times were read during the pass: count the sleep from its start (a
                # little early at worst, which costs one more pass, never a late tick).
                sleep = max(0.0, sleep - (time.monotonic() - started))
                self.queues()
                self._watch(registry_keys()[1])
                for group in self._groups:
                    self._watch(GroupKeys.of(group).schedule)
                # Woken early when a task is scheduled sooner than we would look again, in
                # any group, or a new group appears.
                if self._sleep(sleep):
                    # The task may be in a queue or group new since the list was read.
                    self._queues_read_at = -QUEUE_LIST_REFRESH
                failures = 0
            # A poller stops only when told: Redis errors of every kind (READONLY during a
            # failover, OOM, NOREPLICAS) and the project's own (a schedule's settings) are
            # logged and waited out.
            except Exception as exc:  # noqa: BLE001 - logged by log_waited_out
                wait = RECONNECT_BACKOFF.compute(failures)
                log_waited_out(logger, "poller", exc, wait, last_error if failures else None)
                failures, last_error = failures + 1, exc
                self.stopping.wait(wait)
        for thread in self._watched.values():
            thread.join(WATCH_BLOCK + 1)
        logger.info("poller stopped after promoting %d task(s)", self.promoted)
        return self.promoted


def poll_queue(*, client: Any = None) -> int:
    """The book's poll_queue: one promotion pass over every queue; returns tasks promoted."""
    return DueTaskPromoter(client=client).run_once()[0]


class DelayQueue:
    """Items that can be popped once they have waited ``previous`` seconds (server time)."""

    def __init__(self, name: str, *, client: Any = None) -> None:
        self.name = name
        space = KeySpace("delayqueue", name)
        self._items_key = space.key("items")
        self._data_key = space.key("data")
        self._sequence_key = space.key("sequence")
        self._client = client

    @property
    def client(self) -> Any:
        return resolve_client(self._client)

    def push(self, data: Any) -> str:
        """Store ``data`` (JSON-serializable) and return its id. One round trip."""
        try:
            body = json.dumps(data, cls=DjangoJSONEncoder, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise TypeError(f"DelayQueue data must be JSON-serializable: {exc}") from exc
        item_id = run_script(
            "delayqueue_push",
            self.client,
            keys=[self._items_key, self._data_key, self._sequence_key],
            args=[body],
        )
        return item_id.decode()

    def pop(self, num: int = 5, previous: float = 3) -> list[Any]:
        """Claim up to ``num`` items pushed at least ``previous`` seconds ago, oldest first.

        Claimed items are deleted in the same step: two consumers never get the same one.
        """
        check_batch(num, "num")
        if previous < 0:
            raise ValueError("previous must be >= 0")
        bodies = run_script(
            "delayqueue_pop",
            self.client,
            keys=[self._items_key, self._data_key],
            args=[num, int(previous * 1000)],
        )
        return [json.loads(body) for body in bodies]

    def __len__(self) -> int:
        return int(self.client.zcard(self._items_key))
