"""Celery's own worker (``celery worker``, solo or prefork pool) as a process of the queue
benchmark.

Celery has no burst mode, so one worker serves every round and is held at the
start gate in between: a consumer bootstep blocks the worker's event loop at
the gate (nothing is fetched while it waits), then a 1 ms timer on the same
loop watches the worker's own counters (``celery.worker.state``, kept in the
main process for either pool). When the counters have been still for a few
milliseconds the worker reports how many tasks it finished and when the last
one finished; the parent sums the reports and, once every task is done, writes
a line to the worker's stdin, which holds it at the gate again (or, after the
last round, stops it). The watching costs no Redis command.
"""

from __future__ import annotations

import os
import selectors
import signal
import sys
import time

import redis

from benchmarks.common import Gate, report

#: Still counters for this long mean the worker is idle (a report, not the end of the round).
SETTLE_SECONDS = 0.005


def serve(pool: str, url: str, rounds: int, gate_name: str, *, acks_late: bool = False) -> None:
    from celery import bootsteps  # type: ignore[import-not-found, import-untyped, unused-ignore]

    from benchmarks import queue_tasks

    os.environ["BENCH_REDIS_URL"] = url
    app = queue_tasks.celery_app(acks_late=acks_late)
    gate = Gate(redis.Redis.from_url(url), gate_name)

    class RoundGate(bootsteps.StartStopStep):
        requires = ("celery.worker.consumer.tasks:Tasks",)

        def start(self, consumer) -> None:
            self.rounds_left = rounds
            self.stdin = selectors.DefaultSelector()
            self.stdin.register(sys.stdin, selectors.EVENT_READ)
            # The event loop has not run yet: nothing is fetched before the gate opens.
            self.hold()
            consumer.timer.call_repeatedly(0.001, self.watch)

        def hold(self) -> None:
            from celery.worker import state  # type: ignore[import-not-found, import-untyped, unused-ignore]

            gate.pass_through()
            self.started = time.time()
            self.finished = self.started
            self.base = self.counted = sum(state.total_count.values())
            self.changed = self.started
            self.reported = False  # every worker reports at least once a round

        def watch(self) -> None:
            from celery.worker import state  # type: ignore[import-not-found, import-untyped, unused-ignore]

            now = time.time()
            counted = sum(state.total_count.values())
            if counted != self.counted or state.active_requests or state.reserved_requests:
                if counted != self.counted:
                    self.counted = counted
                    self.finished = now
                self.changed = now
                self.reported = False
                return
            if not self.reported and now - self.changed >= SETTLE_SECONDS:
                self.reported = True
                done = counted - self.base
                report({"started": self.started, "finished": self.finished, "done": done})
            if self.stdin.select(0):
                # The parent's "every task is done" (or, at the end of its stdin, its end).
                self.rounds_left = self.rounds_left - 1 if sys.stdin.readline() else 0
                if self.rounds_left:
                    self.hold()
                else:
                    os.kill(os.getpid(), signal.SIGTERM)  # Celery's warm shutdown

    app.steps["consumer"].add(RoundGate)
    app.worker_main(
        [
            "--quiet",  # no banner on stdout, which carries the reports
            "worker",
            "--pool",
            pool,
            "--concurrency",
            "1",
            "--queues",
            "bench",
            "--hostname",
            f"bench{os.getpid()}@%h",
            "--loglevel",
            "WARNING",
        ]
    )
