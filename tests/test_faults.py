"""The fault suite: workers in their own processes on a Redis of the test's own, while the
test resets their connections, restarts the server or turns it into a read-only replica.

Each run's effects are lines in a file (``tasks.record_run``), so a fault can neither repeat
nor hide them. With ``RCOORD_TEST_CLUSTER=1`` the connection resets run on a 3-master cluster
of the test's own; a restart and READONLY are single-server cases (a cluster node refuses
REPLICAOF, and a node's restart is a failover: docs, "What a failover can cost").
"""

from __future__ import annotations

import collections
import os
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from django_rcoord.embedded import EmbeddedCluster, EmbeddedRedis
from django_rcoord.embedded.server import free_port
from django_rcoord.queues import dead_letters, enqueue_many, execute_later, queue_stats
from django_rcoord.queues.worker.prefetch import PREFETCH_BUDGET_MS
from tests import cluster, tasks
from tests.procs import wait_until
from tests.test_periodic import start_poller
from tests.test_queues import log_of, output_of, start_worker

pytestmark = pytest.mark.slow
single_server = pytest.mark.skipif(cluster.ENABLED, reason="a single server's fault")

TASKS = 600


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[Any]:
    """A redis-server of this test's own (AOF on, as the embedded server always has it), or
    a cluster of its own when the suite runs on Redis Cluster."""
    server: Any = (EmbeddedCluster if cluster.ENABLED else EmbeddedRedis)(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()


class Run:
    """``TASKS`` tasks and ``workers`` worker processes on ``server``."""

    def __init__(self, server: Any, tmp_path: Path, workers: int, seconds: float):
        self.server = server
        self.client = server.client()
        self.log = tmp_path / "runs.log"
        self.log.touch()
        self.markers = [f"t{n}" for n in range(TASKS)]
        enqueue_many(
            [(tasks.record_run, (marker, seconds), {}) for marker in self.markers],
            client=self.client,
        )
        env = {"RCOORD_TEST_REDIS_URL": server.url, "RCOORD_TEST_RUN_LOG": str(self.log)}
        self.workers = [start_worker(env=env) for _ in range(workers)]
        # A delayed-task poller beside them, which must outlive the faults too.
        self.workers.append(
            start_poller({**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", **env})
        )

    def runs(self) -> collections.Counter[str]:
        return collections.Counter(self.log.read_text().split())

    def all_ran(self) -> bool:
        return len(self.runs()) == len(self.markers)

    def recovered(self) -> bool:
        """Whether each process that logged a Redis error has since logged that Redis
        answers again (one still backing off says so on its next try)."""
        logs = [log_of(worker) for worker in self.workers]
        return all("Redis answers again after" in log for log in logs if "Redis error" in log)

    def alive(self) -> bool:
        return all(worker.poll() is None for worker in self.workers)

    def stop(self) -> list[str]:
        """SIGTERM every worker and the poller; their outputs (each must exit 0)."""
        for worker in self.workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
        outputs = []
        for worker in self.workers:
            try:
                outputs.append(output_of(worker, 60))
            except subprocess.TimeoutExpired:
                worker.kill()
                raise
            assert worker.returncode == 0, outputs[-1]
        return outputs

    def report(self, what: str, started: float) -> collections.Counter[str]:
        runs = self.runs()
        repeated = sum(count - 1 for count in runs.values())
        print(
            f"\n{what}: {TASKS} tasks, {len(self.workers) - 1} workers and a poller, "
            f"{time.monotonic() - started:.1f} s, {len(runs)} ran, {repeated} repeated, "
            f"{len(dead_letters('default', client=self.client))} dead letters"
        )
        return runs


def test_connection_resets_repeat_nothing_and_stop_no_worker(
    own_redis: Any, tmp_path: Path
) -> None:
    run = Run(own_redis, tmp_path, workers=2, seconds=0.01)
    nodes = own_redis.nodes if cluster.ENABLED else [own_redis]
    killers = [node.client() for node in nodes]
    started, kills, killed = time.monotonic(), 0, 0
    try:
        while not run.all_ran() and time.monotonic() - started < 180:
            time.sleep(random.uniform(0.1, 0.3))
            for killer in killers:  # every connection to every node, but this one
                killed += killer.client_kill_filter(_type="normal", skipme=True)
            kills += 1
            assert run.alive()
    finally:
        run.stop()
    runs = run.report(f"connection resets ({kills} rounds, {killed} connections)", started)
    assert killed > 0
    assert set(runs) == set(run.markers)
    assert max(runs.values()) == 1, [marker for marker, count in runs.items() if count > 1]
    assert dead_letters("default", client=run.client) == []
    assert queue_stats("default", client=run.client) == {
        "ready": 0,
        "in_flight": 0,
        "delayed": 0,
        "dead": 0,
    }


@single_server
def test_a_redis_restart_mid_run_loses_nothing(own_redis: EmbeddedRedis, tmp_path: Path) -> None:
    run = Run(own_redis, tmp_path, workers=3, seconds=0.01)
    started = time.monotonic()
    try:
        wait_until(lambda: len(run.runs()) >= TASKS // 4, timeout=60)
        own_redis.stop()  # SHUTDOWN: the AOF has every write
        time.sleep(1.0)
        own_redis.start()
        wait_until(run.all_ran, timeout=120)
        wait_until(run.recovered, timeout=60)
        assert run.alive()
    finally:
        outputs = run.stop()
    runs = run.report("redis restart", started)
    # Each process that logged the outage says, once Redis answers, that it is over.
    waited = [output for output in outputs if "Redis error" in output]
    assert waited
    assert all("Redis answers again after" in output for output in waited), waited
    assert set(runs) == set(run.markers)
    assert dead_letters("default", client=run.client) == []
    assert queue_stats("default", client=run.client)["ready"] == 0


@single_server
def test_readonly_replies_are_waited_out(own_redis: EmbeddedRedis, tmp_path: Path) -> None:
    run = Run(own_redis, tmp_path, workers=2, seconds=0.01)
    started = time.monotonic()
    admin = own_redis.client()
    try:
        wait_until(lambda: len(run.runs()) >= TASKS // 4, timeout=60)
        # Tasks that fall due while the server refuses writes: the poller promotes them.
        for n in range(20):
            marker = f"d{n}"
            execute_later(
                "default", "tests.tasks.record_run", [marker], 0.3 + n * 0.1, client=run.client
            )
            run.markers.append(marker)
        # A replica of a primary that is not there: it keeps its data and answers every
        # write with READONLY, as a demoted primary does during a failover.
        admin.replicaof("127.0.0.1", free_port())
        readonly_from = len(run.runs())
        with pytest.raises(redis.exceptions.ReadOnlyError):
            admin.set("rcoord:test:write", 1)
        time.sleep(3)
        # Until every worker and the poller has met READONLY (a process stalled through
        # the 3 s has not yet).
        wait_until(
            lambda: all("read only replica" in log_of(worker) for worker in run.workers),
            timeout=60,
        )
        during = len(run.runs()) - readonly_from
        admin.replicaof("NO", "ONE")
        wait_until(run.all_ran, timeout=120)
        wait_until(run.recovered, timeout=60)
        assert run.alive()
    finally:
        outputs = run.stop()
    runs = run.report(f"READONLY for 3 s ({during} finished meanwhile)", started)
    # At most what each worker was running or had taken when it began.
    assert during <= 2 * (PREFETCH_BUDGET_MS / 10 + 2)
    assert set(runs) == set(run.markers)
    assert max(runs.values()) == 1
    assert dead_letters("default", client=run.client) == []
    # Redis 6.2 words it "-READONLY You can't write...", 7 and newer without the code.
    assert all("read only replica" in output for output in outputs)
    assert "poller: Redis error" in outputs[-1]  # it met READONLY too, and went on
    assert "poller: Redis answers again after" in outputs[-1]


@single_server
def test_the_keeper_waits_out_a_failing_give_back_with_backoff(
    own_redis: EmbeddedRedis, tmp_path: Path
) -> None:
    """A long task runs with tasks taken behind it, and the server answers READONLY while
    it runs: the keeper's give-back of those tasks fails, and is tried again after a backoff
    (before: at once, every turn, thousands of tries and warnings a second). Nothing is
    lost or run twice."""
    client = own_redis.client()
    log = tmp_path / "runs.log"
    # One quick task first (after it, the worker takes several at once); then the read-only
    # spell, first of the next batch (nothing run waits to be acknowledged), more behind it.
    quick: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = [
        (tasks.record_run, (f"t{n}",), {}) for n in range(30)
    ]
    spell: tuple[Any, tuple[Any, ...], dict[str, Any]] = (
        tasks.read_only_for,
        (2.0, free_port()),
        {},
    )
    env = {"RCOORD_TEST_REDIS_URL": own_redis.url, "RCOORD_TEST_RUN_LOG": str(log)}
    # The give-back meets READONLY only where the worker took the spell in a batch and the
    # spell began before the give-back (a worker stalled on a busy machine may do neither:
    # then nothing failed and there was no backoff to see). Each try is checked in full;
    # the scenario is set up again, at most three times, until the give-back met READONLY.
    for _ in range(3):
        client.flushall()
        log.write_text("")
        enqueue_many([quick[0], spell, *quick[1:]], client=client)
        worker = start_worker("--burst", env=env)
        output = output_of(worker, 120)
        assert worker.returncode == 0, output
        failed_turns = output.count("lease keeper failed") + output.count("could not give back")
        print(f"\nREADONLY for 2 s: the keeper failed {failed_turns} turn(s)")
        # Backoff of 0.5 s, growing: a handful of turns in 2 s. Without it: thousands.
        assert failed_turns <= 20, output[-3000:]
        assert collections.Counter(log.read_text().split()) == {f"t{n}": 1 for n in range(30)}
        if failed_turns:
            break
    assert failed_turns >= 1, output[-3000:]
