"""Periodic-task benchmark: fires per tick and lateness with several pollers.

    python -m benchmarks.periodic [--quick]

Three poller processes (each a ``DueTaskPromoter``, what ``manage.py poll_delayed``
runs) share one schedule ``every: 1`` for 60 s (10 s with --quick): how many times each
tick was queued (exactly 1 is right), ticks missed, and each fire's lateness (tick ->
queued, on the Redis server's clock, as the firing scripts record it); then the same
with one poller SIGKILLed halfway. No worker runs: the fired tasks stay in their queue,
where they are counted.

Celery beat and Huey are not run: both document that their schedulers must not run more
than once (docs/explanation/benchmarks.md, "Periodic tasks").
"""

from __future__ import annotations

import signal
import sys
import time

from benchmarks.common import (
    Bench,
    Measurement,
    ScenarioResult,
    Table,
    percentile,
    read_result,
    report,
    spawn_workers,
    stop_workers,
)
from benchmarks.runner import run_benchmark

NAME = "periodic"
POLLERS = 3
SCHEDULE = {"name": "beat", "task": "bench.noop", "every": 1}


def run(bench: Bench) -> ScenarioResult:
    import json

    from django_rcoord.queues.keys import QueueKeys
    from django_rcoord.queues.periodic import claim_key, lateness_key

    client = bench.client
    seconds = bench.pick(quick=10, full=60)
    keys = QueueKeys.of("bench")

    def server_seconds() -> float:
        now, micros = client.time()
        return now + micros / 1e6

    def one_run(kill_one: bool) -> Measurement:
        client.flushdb()
        pollers = spawn_workers("benchmarks.periodic", [bench.url], POLLERS)
        try:
            for poller in pollers:
                read_result(poller, timeout=120)  # started
            started = server_seconds()
            if kill_one:
                time.sleep(seconds / 2)
                pollers[0].send_signal(signal.SIGKILL)
                time.sleep(seconds / 2)
            else:
                time.sleep(seconds)
            stopped = server_seconds()
        finally:
            stop_workers(pollers)
        messages = [json.loads(body) for body in client.hvals(keys.messages)]
        ticks = [round(message["periodic"]["tick"]) for message in messages]
        inside = [tick for tick in ticks if started <= tick <= stopped]
        expected = range(int(started) + 1, int(stopped) + 1)
        # Newest first, one per fire: paired with the ticks in order. The first fire of a
        # new schedule is the tick before the pollers started (up to 1 s late by design):
        # only the ticks that fell due while the pollers ran count.
        # A catch-up fire (due before its poller started: the first fire, as a rule) is
        # counted in the claim instead of sampled; catch-ups come first.
        samples = [int(ms) for ms in client.lrange(lateness_key("beat"), 0, -1)][::-1]
        catch_ups = int(client.hget(claim_key("beat"), "catch_ups") or 0)
        if len(samples) + catch_ups != len(ticks):
            raise RuntimeError(
                f"{len(samples)} lateness samples and {catch_ups} catch-ups for {len(ticks)} fires"
            )
        lateness = [
            late
            for tick, late in zip(sorted(ticks)[catch_ups:], samples, strict=True)
            if started <= tick <= stopped
        ]
        row = Measurement(
            f"django-rcoord, {POLLERS} pollers" + (", one SIGKILLed halfway" if kill_one else ""),
            "3 scripts per tick (claim, queue, confirm)",
            [len(inside) / len(set(inside))],
            note=f"{len(ticks)} ticks queued in all, {stopped - started:.1f} s",
        )
        row.extra["ticks"] = len(expected)
        row.extra["missed"] = len(set(expected) - set(inside))
        row.extra["doubled"] = len(ticks) - len(set(ticks))
        row.extra["p50 ms"] = percentile(lateness, 0.5)
        row.extra["p99 ms"] = percentile(lateness, 0.99)
        row.extra["max ms"] = max(lateness)
        return row

    rows = [one_run(kill_one=False), one_run(kill_one=True)]
    table = Table(
        f"A schedule every 1 s, {POLLERS} poller processes, {seconds} s",
        "fires per tick",
        rows,
        lower_is_better=True,
        extra_columns=("ticks", "missed", "doubled", "p50 ms", "p99 ms", "max ms"),
        note="fires per tick must be exactly 1; lateness is tick -> queued on the Redis "
        "server's clock, recorded by the firing scripts for every fire",
    )
    return ScenarioResult(
        NAME,
        "Periodic tasks",
        [table],
        params={"seconds": seconds, "pollers": POLLERS},
        repeats=1,
    )


def poller(url: str) -> None:
    """In a poller process: fire the schedule until SIGTERM (or SIGKILL)."""
    from benchmarks.common import configure_django

    configure_django(url, rcoord={"PERIODIC_TASKS": [SCHEDULE]})
    from benchmarks import queue_tasks
    from django_rcoord.queues import task
    from django_rcoord.queues.delayed import DueTaskPromoter

    task(name="bench.noop", queue="bench")(queue_tasks.noop)
    promoter = DueTaskPromoter()
    signal.signal(signal.SIGTERM, lambda signum, frame: promoter.stop())
    report({"started": True})
    promoter.run()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        poller(sys.argv[2])
    else:
        run_benchmark(NAME, __doc__.splitlines()[0])
