"""A worker process's loops for the groups beside its own shard layout: a sharded group's
own keys (its unique tasks), and the shards of other layouts that the registry lists (an
earlier layout's, or those of producers whose ``QUEUE_SHARDS`` differs: a rolling deploy,
a forgotten settings file). ``run_email_worker`` finds them at start and, every
``RCOORD["WORKER_DISCOVERY"]`` seconds while it runs, looks again: a group that appeared
gets a loop, and a group that left the registry (it holds no task, see
``records.forget_gone_groups``) has its loop ended."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from django_rcoord.conf import conf
from django_rcoord.connection.errors import REDIS_ERRORS
from django_rcoord.queues.keys import split_queue_name
from django_rcoord.queues.records import forget_gone_groups, holding_nothing, known_groups
from django_rcoord.queues.shards import earlier_layouts, is_sharded, shards_of
from django_rcoord.queues.worker.loop import Worker

logger = logging.getLogger("django_rcoord.queues.worker")


class LayoutLoops:
    """The loops, one per group, that serve ``named`` (lists of queues of one group each)
    beside the process's own layout. ``start(queues, stop)`` starts a loop for ``queues``
    (as named), stopped by the event ``stop``, and returns it."""

    def __init__(
        self,
        named: list[list[str]],
        start: Callable[[list[str], threading.Event], Worker],
    ) -> None:
        self.named = named
        self._start = start
        self._loops: dict[str, tuple[Worker, threading.Event]] = {}

    def wanted(self) -> dict[str, list[str]]:
        """The groups beside the layout, by name, with their queues: those the registry
        lists that hold something (the group's own keys always, while it has shards).
        Groups gone (nothing held, no worker) leave the registry first. Redis errors
        propagate."""
        known = known_groups()
        empty = holding_nothing(known)
        forget_gone_groups(empty)  # one read of the registry and the groups for both
        known = [group for group in known if group not in empty]
        return {
            split_queue_name(queues[0])[0]: queues
            for names in self.named
            for queues in earlier_layouts(names, known)
        }

    def refresh(self, wanted: dict[str, list[str]]) -> None:
        """Start a loop for each group of ``wanted`` that has none, and end the loop of
        each group that is no longer in it."""
        for group, queues in wanted.items():
            if group not in self._loops:
                _say_why(group)
                stop = threading.Event()
                self._loops[group] = (self._start(queues, stop), stop)
        for group in [group for group in self._loops if group not in wanted]:
            logger.info("queue group %s holds no task any more: its loop ends", group)
            self._loops.pop(group)[1].set()

    def watch(self, stop: threading.Event, *, refresh: bool = True) -> None:
        """Refresh every ``RCOORD["WORKER_DISCOVERY"]`` seconds (never when that is None, or
        not ``refresh``) until ``stop`` is set, then end every loop. A refresh that meets
        a Redis error is skipped: the loops report an unusable Redis."""
        interval = conf.WORKER_DISCOVERY if refresh else None
        while not stop.wait(interval):
            try:
                self.refresh(self.wanted())
            except REDIS_ERRORS:
                continue
        for _, own_stop in self._loops.values():
            own_stop.set()


def _say_why(group: str) -> None:
    """Log why a loop serves ``group``: a warning for a shard that is not one of the
    layout's (tasks queued by a producer of another layout, or left from an earlier one)."""
    base, _, _ = group.rpartition("~")
    if not base or (is_sharded(base) and group in shards_of(base)):
        return
    count = len(shards_of(base)) if is_sharded(base) else 1
    logger.warning(
        "queue group %s holds tasks of group %s, and this process's RCOORD['QUEUE_SHARDS'] "
        "gives %s %d shard(s), %s not among them: producers with another layout (a rolling "
        "deploy, another settings file) or tasks left from an earlier one; serving it too, "
        "until it holds nothing",
        group,
        base,
        base,
        count,
        group,
    )
