"""A worker's conversation with Redis: every script and command the worker sends.

One ``QueueSession`` per worker. ``exchange`` finishes the tasks run since the last
call and takes the next ones in one ``task_finish`` script call (idempotent under
retries: each call carries a nonce, and the script answers a repeated one as it
ran); ``renew`` and ``give_back`` act on what the worker holds; ``recover_if_due``
puts back expired leases and promotes due retries; ``heartbeat`` and ``sign_off``
keep the worker visible to ``rcoord_status``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from typing import Any

from django_rcoord.connection.clients import resolve_client
from django_rcoord.connection.errors import RECONNECT_BACKOFF, REDIS_ERRORS
from django_rcoord.queues.keys import HEARTBEAT_TTL, QueueKeys
from django_rcoord.queues.producer import register_group
from django_rcoord.queues.records import forget_gone_workers, recover_and_promote
from django_rcoord.queues.worker.calls import give_back_call, renew_call, stopped_call
from django_rcoord.queues.worker.finish import FinishProtocol
from django_rcoord.queues.worker.jobs import Done, Job
from django_rcoord.queues.worker.runner import log_outcome
from django_rcoord.scripts import run_script
from django_rcoord.waiting import wait_for_entry

logger = logging.getLogger(__name__)

#: Longest an idle worker blocks before it looks for expired leases and due retries.
IDLE_CHECK = 1.0
#: How long a worker that found nothing stays registered idle (it takes again within
#: IDLE_CHECK, renewing it), ms.
IDLE_REGISTRATION_MS = int((IDLE_CHECK + 2) * 1000)
RECOVER_BATCH = 500
#: What task_renew answers for a task held that cancel() asked to stop.
STOP_REQUESTED = 2


class QueueSession:
    """The scripts of worker ``worker_id`` over ``queues`` (one group, priority order)."""

    def __init__(
        self,
        worker_id: str,
        queues: Sequence[QueueKeys],
        *,
        lease: float,
        burst: bool = False,
        client: Any = None,
    ) -> None:
        self.worker_id = worker_id
        self.queues = list(queues)
        self.lease = lease
        self.burst = burst
        self._client = client
        first = self.queues[0]
        self._workers_key = first.workers
        self._heartbeat_key = first.heartbeat(worker_id)
        self._serving_key = first.serving
        self.protocol = FinishProtocol(worker_id, self.queues)
        self._exchanges = 0  # successful exchanges: the next one's nonce
        self._idle_registered = False  # in the group's idle set (see exchange)
        self._next_check = 0.0  # when to look for expired leases and due retries
        self._last_heartbeat = 0.0

    @property
    def client(self) -> Any:
        return resolve_client(self._client)

    @property
    def lease_ms(self) -> int:
        return max(1, int(self.lease * 1000))

    # -- taking and finishing ----------------------------------------------------
    def exchange(
        self, done: Sequence[Done], take: int, *, patience: float | None = None
    ) -> list[Job]:
        """One script call: finish the tasks in ``done`` (and log how each ended), take up
        to ``take`` more. Finding nothing, a worker that will wait for a wake-up registers
        idle in the same call: producers push wake-ups only while a worker is registered.
        With tasks to finish, it keeps trying through a Redis outage for up to a lease
        (until they are recorded, their leases would make them run again), or ``patience``
        seconds. A retried call carries the same nonce, so one whose reply was lost is
        answered as it ran, not run twice."""
        idle_ms = 0 if self.burst else IDLE_REGISTRATION_MS
        keys, args = self.protocol.call(
            done,
            take,
            lease_ms=self.lease_ms,
            idle_ms=idle_ms,
            registered=self._idle_registered,
            nonce=f"{self._exchanges}",
        )
        deadline = time.monotonic() + (self.lease if patience is None else patience)
        failures = 0
        while True:
            try:
                finished, taken = run_script("task_finish", self.client, keys=keys, args=args)
                break
            except REDIS_ERRORS as exc:
                if not done or time.monotonic() > deadline:
                    raise
                logger.error(
                    "finishing %d task(s) failed (%s: %s); retrying",
                    len(done),
                    type(exc).__name__,
                    exc,
                )
                time.sleep(RECONNECT_BACKOFF.compute(failures))
                failures += 1
        self._exchanges += 1
        for item, held in zip(done, finished, strict=True):
            if item.outcome.kind.comes_back:  # look for it when due
                due = time.monotonic() + item.outcome.delay_ms / 1000
                self._next_check = min(self._next_check, due)
            log_outcome(item, bool(held))
        jobs = self.protocol.jobs(taken)
        if take:
            self._idle_registered = not jobs and idle_ms > 0
        return jobs

    def take(self, count: int = 1) -> Job | None:
        """Take one task (or ``count``, returning the first)."""
        jobs = self.exchange([], count)
        return jobs[0] if jobs else None

    def finish(self, done: Done) -> bool:
        """Finish one task on its own, taking nothing; True when this worker still held it."""
        keys, args = self.protocol.call([done], 0, lease_ms=self.lease_ms)
        (finished,), _ = run_script("task_finish", self.client, keys=keys, args=args)
        return bool(finished)

    # -- what the worker holds ---------------------------------------------------
    def renew(self, jobs: Sequence[Job]) -> tuple[list[Job], list[Job]]:
        """Extend the leases of ``jobs`` (one call per queue); returns those no longer held,
        and those held that ``cancel()`` asked to stop (read in the same call)."""
        lost: list[Job] = []
        stop: list[Job] = []
        for queue, queue_jobs in _by_queue(jobs):
            ids = [job.id for job in queue_jobs]
            keys, args = renew_call(queue, self.worker_id, self.lease_ms, ids)
            flags = run_script("task_renew", self.client, keys=keys, args=args)
            for job, flag in zip(queue_jobs, flags, strict=True):
                if not flag:
                    lost.append(job)
                elif flag == STOP_REQUESTED:
                    stop.append(job)
        return lost, stop

    def finish_stopped(self, done: Done) -> bool:
        """Finish a run stopped because ``cancel()`` asked (its outcome 'stopped'): FAILED
        with its TaskCancelled error, not retried, not a dead letter, no follow-up (see
        task_stopped.lua), and log it. True when this worker still held it."""
        keys, args = stopped_call(done, self.worker_id)
        held = run_script("task_stopped", self.client, keys=keys, args=args)
        log_outcome(done, bool(held))
        return bool(held)

    def give_back(self, jobs: Sequence[Job]) -> None:
        """Tasks taken but not run (the worker is stopping, or they waited behind a long
        task): back to the front of their queue at once, for any worker (one call per
        queue)."""
        for queue, queue_jobs in _by_queue(jobs):
            keys, args = give_back_call(queue, self.worker_id, [job.id for job in queue_jobs])
            run_script("task_give_back", self.client, keys=keys, args=args)

    # -- idle --------------------------------------------------------------------
    def wait_for_work(self) -> None:
        """Block until the group's incoming list holds something (a task a producer pushed,
        or a wake-up token), or the next recovery check is due."""
        timeout = max(0.01, min(IDLE_CHECK, self._next_check - time.monotonic()))
        if wait_for_entry(self.client, self.queues[0].incoming, timeout):
            return
        self.recover_if_due(force=True)

    def recover_if_due(self, *, force: bool = False) -> None:
        """Put back expired leases and promote due retries, for every watched queue."""
        if not force and time.monotonic() < self._next_check:
            return
        next_due = IDLE_CHECK
        for queue in self.queues:
            recovered, _, due_in = recover_and_promote(
                queue, batch=RECOVER_BATCH, client=self.client
            )
            if recovered:
                logger.warning("put back %d task(s) of %s whose worker died", recovered, queue.name)
            if due_in is not None:
                next_due = min(next_due, due_in)
        self._next_check = time.monotonic() + next_due

    # -- presence (for rcoord_status) ----------------------------------------------
    def heartbeat(self, processed: int, started_at: float) -> None:
        """Say this worker is alive (at most every third of the heartbeat's TTL)."""
        now = time.monotonic()
        if now - self._last_heartbeat < HEARTBEAT_TTL / 3:
            return
        self._last_heartbeat = now
        with self.client.pipeline(transaction=False) as pipe:
            pipe.sadd(self._workers_key, self.worker_id)
            pipe.expire(self._workers_key, HEARTBEAT_TTL * 4)  # gone once every worker is
            pipe.set(
                self._heartbeat_key,
                json.dumps(
                    {
                        "queues": [queue.name for queue in self.queues],
                        "done": processed,
                        "started": started_at,
                    }
                ),
                ex=HEARTBEAT_TTL,
            )
            # Producers push the group's plain tasks to its incoming list while this lives:
            # this worker's takes place them (see queues.incoming).
            pipe.set(self._serving_key, 1, ex=HEARTBEAT_TTL)
            pipe.execute()
        # In the registry of groups too (once an hour), as producers put theirs: a worker on
        # a group no task was ever queued on is seen by rcoord_status and the warnings of
        # workers that serve nothing.
        register_group(self.client, self.queues[0].group)

    def sign_off(self) -> None:
        """Leave the group's worker list and drop the record of the last exchange (no call
        is retried after this); never raises (both keys expire anyway)."""
        try:
            with self.client.pipeline(transaction=False) as pipe:
                pipe.srem(self._workers_key, self.worker_id)
                # One key a DEL: a cluster pipeline refuses a DEL of several keys.
                pipe.delete(self._heartbeat_key)
                pipe.delete(self.queues[0].exchange(self.worker_id))
                pipe.zrem(self.queues[0].idle, self.worker_id)
                pipe.execute()
            # Workers of the group that died without signing off (status pages only read).
            forget_gone_workers(self.queues[0].group, client=self.client)
        except REDIS_ERRORS as exc:
            logger.warning("worker %s could not sign off (%s)", self.worker_id, exc)


def _by_queue(jobs: Sequence[Job]) -> list[tuple[QueueKeys, list[Job]]]:
    """``jobs`` by queue, each queue's in the order given."""
    grouped: dict[str, tuple[QueueKeys, list[Job]]] = {}
    for job in jobs:
        grouped.setdefault(job.queue.name, (job.queue, []))[1].append(job)
    return list(grouped.values())
