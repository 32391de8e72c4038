"""A worker process's limits and a producer's turns on sharded queue groups
(``RCOORD["QUEUE_SHARDS"]``): ``--max-tasks`` and ``--burst`` hold for the whole process,
whatever loops (one per shard, one per earlier layout) it runs, and every group's (and every
periodic schedule's) tasks spread evenly over its shards whatever else the process queues.
On one Redis and, with RCOORD_TEST_CLUSTER=1, on a 3-primary cluster."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.test import override_settings

from django_rcoord.connection import get_client
from django_rcoord.queues import queue_stats
from django_rcoord.queues.keys import QueueKeys
from django_rcoord.queues.periodic import claim_key, fire_due
from django_rcoord.queues.schedules import Schedule
from django_rcoord.queues.shards import shards_of
from tests import tasks
from tests.procs import server_ms, wait_until
from tests.test_queues import log_of, output_of, ran, start_worker

pytestmark = pytest.mark.django_db(transaction=True)

#: The default group ("main", which queue "default" is in) in three shards.
SHARDED = {"main": 3}


@pytest.fixture(autouse=True)
def sharded() -> Iterator[None]:
    with override_settings(RCOORD={**settings.RCOORD, "QUEUE_SHARDS": SHARDED}):
        yield


def sharded_worker(*args: str) -> subprocess.Popen:
    return start_worker(*args, env={"RCOORD_TEST_QUEUE_SHARDS": json.dumps(SHARDED)})


def exit_of(worker: subprocess.Popen, timeout: float = 60) -> tuple[int | None, str]:
    """(the worker's exit status, its log) once it exits; (None, its log) when it is still
    running after ``timeout`` seconds (it is killed then: a test's failure, not a hang)."""
    try:
        output = output_of(worker, timeout)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait(30)
        return None, log_of(worker)
    return worker.returncode, output


def ready_by_shard(group: str, queue: str = "default") -> dict[str, int]:
    """What the server holds ready in each of ``group``'s shards' queue ``queue``."""
    client = get_client()
    return {
        shard: client.zcard(QueueKeys.of(f"{shard}/{queue}").ready) for shard in shards_of(group)
    }


def test_max_tasks_counts_the_tasks_of_the_whole_process_over_all_its_loops() -> None:
    # One task from before the group had shards: the worker serves the group's own keys
    # with a loop of their own too (an earlier layout), four loops in all.
    with override_settings(RCOORD={**settings.RCOORD, "QUEUE_SHARDS": {}}):
        tasks.record.delay("before")
    for n in range(6):
        tasks.record.delay(f"a{n}")
    status, output = exit_of(sharded_worker("--max-tasks", "2"))
    assert status == 0, output[-3000:]
    assert len(ran()) == 2, ran()
    assert queue_stats("default") == {"ready": 5, "in_flight": 0, "delayed": 0, "dead": 0}
    # Then three more: a worker started again (as a supervisor would) runs two, and exits.
    for n in range(3):
        tasks.record.delay(f"b{n}")
    status, output = exit_of(sharded_worker("--max-tasks", "2"))
    assert status == 0, output[-3000:]
    assert len(ran()) == 4, ran()
    assert queue_stats("default") == {"ready": 6, "in_flight": 0, "delayed": 0, "dead": 0}


def test_loops_that_take_several_at_once_take_no_more_than_the_budget_left() -> None:
    # Quick tasks: after the first, each loop asks for a batch (prefetch); the loops
    # together may hold no more than is left of the budget, and what was taken and not run
    # goes back (nothing in flight, nothing lost).
    for n in range(30):
        tasks.record.delay(f"p{n}")
    status, output = exit_of(sharded_worker("--max-tasks", "7"))
    assert status == 0, output[-3000:]
    assert len(ran()) == 7, ran()
    assert queue_stats("default") == {"ready": 23, "in_flight": 0, "delayed": 0, "dead": 0}


def test_a_burst_ends_when_no_loop_has_work_not_when_each_found_none_once() -> None:
    # One task on one shard, held running until the test releases it: the other shards'
    # loops find nothing meanwhile.
    tasks.record_when_released.delay("hold")
    worker = sharded_worker("--burst")
    try:
        wait_until(lambda: get_client().llen("test:started") == 1, timeout=60)
        # Time for the other loops to look (and, before this change, to exit: each on its
        # own found its queue empty); what is asserted below does not depend on it.
        time.sleep(1.5)
        for n in range(6):  # over every shard, in turns
            tasks.record.delay(f"n{n}")
        tasks.release("hold")
        status, output = exit_of(worker)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert status == 0, output[-3000:]
    assert sorted(ran()) == sorted(["hold", *(f"n{n}" for n in range(6))])
    assert queue_stats("default") == {"ready": 0, "in_flight": 0, "delayed": 0, "dead": 0}


TWO_GROUPS = {"main": 2, "elsewhere": 2}


@override_settings(RCOORD={**settings.RCOORD, "QUEUE_SHARDS": TWO_GROUPS})
def test_each_group_spreads_evenly_over_its_shards_whatever_else_is_queued() -> None:
    for n in range(20):  # one group, then the other: one round-robin would split them
        tasks.record.delay(f"m{n}")
        tasks.record_elsewhere.delay(f"e{n}")
    assert sorted(ready_by_shard("main").values()) == [10, 10]
    assert sorted(ready_by_shard("elsewhere").values()) == [10, 10]


@override_settings(RCOORD={**settings.RCOORD, "QUEUE_SHARDS": {"main": 2}})
def test_each_periodic_schedule_spreads_its_ticks_evenly_over_the_shards() -> None:
    beats = [Schedule(name, "tests.tasks.record", every=1, args=[name]) for name in "ab"]
    client = get_client()
    latest = beats[0].latest_tick(server_ms())
    for beat in beats:
        client.hset(claim_key(beat.name), "tick", latest - 4000)
    # Passes a second apart (each fires one tick of each schedule, one after the other).
    for tick in range(latest - 3000, latest + 1, 1000):
        assert fire_due(client, tick, beats, started_ms=tick - 60_000)[0] == 2
    for shard in shards_of("main"):
        keys = QueueKeys.of(f"{shard}/default")
        names = [
            json.loads(client.hget(keys.messages, task_id))["periodic"]["name"]
            for task_id in client.zrange(keys.ready, 0, -1)
        ]
        assert sorted(names) == ["a", "a", "b", "b"], (shard, names)
