"""Sharded queue groups (``RCOORD["QUEUE_SHARDS"]``): one logical queue over several hash
slots, with the queue's guarantees: every task run at least once (a worker SIGKILLed),
priorities within a shard, unique tasks, concurrency and rate limits, cancel and results
across the shards. On one Redis and, with RCOORD_TEST_CLUSTER=1, on a 3-primary cluster
where each shard is on a primary of its own."""

from __future__ import annotations

import io
import json
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.core.checks import run_checks
from django.core.management import call_command
from django.test import override_settings
from django.urls import reverse
from redis.crc import key_slot

from benchmarks.task_controls import shortest_span
from django_rcoord.connection import get_client
from django_rcoord.ops.prometheus import prometheus_exposition
from django_rcoord.ops.status import overview
from django_rcoord.queues import (
    cancel,
    dead_letters,
    delete_dead,
    enqueue_many,
    get_result,
    queue_stats,
    requeue_dead,
)
from django_rcoord.queues.keys import QueueKeys, group_of_task_id, split_queue_name
from django_rcoord.queues.shards import per_shard, shard_queue_names, shards_of
from django_rcoord.queues.worker import Worker
from tests import cluster, tasks
from tests.procs import wait_until
from tests.test_queues import log_of, output_of, ran, result_of, start_worker

pytestmark = pytest.mark.django_db(transaction=True)

SHARDS = 3
#: The default group ("main", which queue "default" is in) in three shards.
SHARDED = {"main": SHARDS}
WORKER_ENV = {"RCOORD_TEST_QUEUE_SHARDS": json.dumps(SHARDED)}


@pytest.fixture(autouse=True)
def sharded() -> Iterator[None]:
    with override_settings(RCOORD={**settings.RCOORD, "QUEUE_SHARDS": SHARDED}):
        yield


def sharded_worker(*args: str, **options: Any) -> Any:
    return start_worker(*args, env=WORKER_ENV, **options)


def shard_of(task_id: str) -> str:
    group = group_of_task_id(task_id)
    assert group is not None
    return group


def test_the_shards_spread_over_the_slot_range() -> None:
    shards = shards_of("main")
    assert len(set(shards)) == SHARDS
    # Of the keys as named (a cluster's server says; redis-py's CRC16 on one Redis).
    keys = [QueueKeys.of(f"{shard}/q").ready for shard in shards]
    if cluster.ENABLED:
        slots = [get_client().execute_command("CLUSTER KEYSLOT", key) for key in keys]
    else:
        slots = [key_slot(key.encode()) for key in keys]
    # One shard in each third of the 16,384 slots.
    assert sorted(slot * SHARDS // 16384 for slot in slots) == list(range(SHARDS))
    if cluster.ENABLED:  # the test cluster splits its slots evenly over three primaries
        client = get_client()
        primaries = {client.get_node_from_key(QueueKeys.of(f"{s}/q").ready).name for s in shards}
        assert len(primaries) == SHARDS


def test_tasks_are_spread_over_the_shards_and_read_as_their_queue() -> None:
    ids = [tasks.record.delay(f"t{n}") for n in range(30)] + enqueue_many(
        [(tasks.record, (f"m{n}",), {}) for n in range(30)]
    )
    by_shard: dict[str, int] = {}
    for task_id in ids:
        by_shard[shard_of(task_id)] = by_shard.get(shard_of(task_id), 0) + 1
    assert sorted(by_shard) == sorted(shards_of("main"))
    assert sorted(by_shard.values()) == [20, 20, 20]  # in turns
    assert queue_stats("default") == {"ready": 60, "in_flight": 0, "delayed": 0, "dead": 0}
    record = result_of(ids[0])
    assert (record.status, record.queue, record.args) == ("READY", "default", ["t0"])


def test_a_worker_runs_a_loop_per_shard_and_drains_them_all() -> None:
    ids = enqueue_many([(tasks.add_numbers, (n, 1), {}) for n in range(30)])
    worker = sharded_worker("--burst")
    output = output_of(worker, 120)
    assert worker.returncode == 0, output
    assert queue_stats("default") == {"ready": 0, "in_flight": 0, "delayed": 0, "dead": 0}
    for n, task_id in enumerate(ids):
        record = result_of(task_id)
        assert (record.status, record.queue) == ("SUCCESSFUL", "default")
        assert record.return_value["sum"] == n + 1
    # One loop per shard, each on its own shard's queue.
    for shard in shards_of("main"):
        assert f"{shard}/default" in output


def test_retries_come_back_on_their_shard() -> None:
    ids = [tasks.fail_then_succeed.delay(f"f{n}", 1) for n in range(6)]
    worker = sharded_worker()  # each loop promotes its shard's due retries
    try:
        wait_until(lambda: all(result_of(i).status == "SUCCESSFUL" for i in ids), timeout=60)
    finally:
        worker.terminate()
        output_of(worker, 30)
    for task_id in ids:
        record = result_of(task_id)
        assert (record.status, record.attempts) == ("SUCCESSFUL", 2)
    assert sorted(ran()) == sorted([f"f{n}" for n in range(6)])


def told(ids: list[str], *workers: Any) -> str:
    """What a failed wait or assertion says: the tasks' records, what started and ran, and
    the end of each worker's log."""
    records = [(record.status, record.attempts) for record in map(result_of, ids)]
    started = get_client().lrange("test:started", 0, -1)
    logs = [log_of(worker)[-3000:] for worker in workers]
    return f"records {records}, started {started}, ran {ran()}, logs {logs}"


def test_every_task_runs_though_a_worker_is_killed_mid_run() -> None:
    markers = [f"k{n}" for n in range(SHARDS * 2)]
    ids = enqueue_many([(tasks.record_when_released, (marker,), {}) for marker in markers])
    victim = sharded_worker(lease=1.5)
    # Each of its loops (one per shard) runs a task that waits to be released: killed so.
    started = lambda: get_client().llen("test:started") >= SHARDS  # noqa: E731
    wait_until(started, timeout=60, why=lambda: told(ids, victim))
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    assert get_client().llen("test:started") == SHARDS, told(ids, victim)  # one a loop
    for marker in markers:
        tasks.release(marker)
    rescuer = sharded_worker(lease=1.5)  # takes them again once the victim's leases end
    try:
        finished = lambda: all(result_of(i).status == "SUCCESSFUL" for i in ids)  # noqa: E731
        wait_until(finished, timeout=90, why=lambda: told(ids, victim, rescuer))
    finally:
        rescuer.send_signal(signal.SIGTERM)
        output_of(rescuer, 30)
    # The killed runs never got to record; the three killed were run again, the rest once.
    assert sorted(ran()) == sorted(markers), told(ids, victim, rescuer)
    attempts = sorted(result_of(i).attempts for i in ids)
    assert attempts == [1] * SHARDS + [2] * SHARDS, told(ids, victim, rescuer)
    assert queue_stats("default") == {"ready": 0, "in_flight": 0, "delayed": 0, "dead": 0}


def test_priorities_hold_within_each_shard() -> None:
    for n in range(SHARDS):
        tasks.record_whenever.delay(f"low{n}")
    for n in range(SHARDS):
        tasks.record_urgent.delay(f"high{n}")
    for queues in per_shard(["default"]):
        get_client().delete(tasks.RAN)
        assert Worker(queues, burst=True).run() == 2
        first, second = ran()
        assert first.startswith("high")
        assert second.startswith("low")


def test_a_unique_task_is_queued_once_across_the_shards() -> None:
    first = tasks.unique_report.delay("same")
    again = [tasks.unique_report.delay("same") for _ in range(SHARDS * 2)]
    assert again == [first] * (SHARDS * 2)
    other = tasks.unique_report.delay("other")
    assert other != first
    assert queue_stats("default")["ready"] == 2


def test_a_concurrency_limit_holds_across_the_shards() -> None:
    ids = [tasks.at_most_two.delay(0.3, 2) for _ in range(6)]
    assert len({shard_of(task_id) for task_id in ids}) == SHARDS
    worker = sharded_worker("--concurrency", "2")  # six loops, two permits
    try:
        wait_until(lambda: all(result_of(i).status == "SUCCESSFUL" for i in ids), timeout=60)
    finally:
        worker.terminate()
        output_of(worker, 30)
    peaks = [int(peak) for peak in get_client().lrange("test:peaks", 0, -1)]
    assert len(peaks) == 6
    assert max(peaks) == 2


def test_a_rate_holds_across_the_shards() -> None:
    enqueue_many([(tasks.rate_limited_start, (f"r{n}",), {}) for n in range(7)])
    worker = sharded_worker()  # three loops
    try:
        wait_until(lambda: get_client().llen("test:starts") == 7, timeout=60)
    finally:
        worker.terminate()
        output_of(worker, 30)
    starts = tasks.rate_decided_starts()
    assert len(starts) >= 4  # each start copied the log; see rate_decided_starts
    # At most three starts in any second, as the server decided them.
    assert shortest_span(starts, 4) >= 1.0, starts


def test_cancel_and_results_find_a_task_on_its_shard() -> None:
    kept, cancelled = tasks.record.delay("kept"), tasks.record.delay("cancelled")
    assert shard_of(kept) != shard_of(cancelled)
    assert cancel(cancelled) is True
    assert result_of(cancelled).status == "CANCELLED"
    for queues in per_shard(["default"]):
        Worker(queues, burst=True).run()
    assert ran() == ["kept"]
    assert result_of(kept).status == "SUCCESSFUL"
    assert get_result(cancelled) is not None


def test_a_worker_object_serves_one_shard() -> None:
    with pytest.raises(ValueError, match="has shards"):
        Worker(["default"])
    assert per_shard(["default", "other"]) == [
        [f"{shard}/default", f"{shard}/other"] for shard in shards_of("main")
    ]
    assert shard_queue_names("elsewhere/q") == ["elsewhere/q"]  # a group without shards


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ([("main", 3)], "must be a dict"),
        ({"main": 0}, "not an int from 1 to 64"),
        ({"main": 65}, "not an int from 1 to 64"),
        ({"main": 2.5}, "not an int from 1 to 64"),
        ({"": 2}, "not a queue group name"),
    ],
)
def test_bad_shard_settings_are_a_system_check_error(value: object, problem: str) -> None:
    with override_settings(RCOORD={**settings.RCOORD, "QUEUE_SHARDS": value}):
        messages = [m for m in run_checks() if m.id == "rcoord.E035"]
    assert len(messages) == 1
    assert problem in messages[0].msg


def test_status_metrics_and_dead_letters_add_the_shards_up() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    failed = [tasks.always_fail.delay(f"d{n}") for n in range(6)]
    done = [tasks.record.delay(f"r{n}") for n in range(3)]
    for queues in per_shard(["default"]):
        Worker(queues, burst=True).run()
    assert {shard_of(task_id) for task_id in failed} == set(shards_of("main"))
    assert queue_stats("default") == {"ready": 0, "in_flight": 0, "delayed": 0, "dead": 6}

    # The overview (rcoord_status, the dashboard, the JSON stats): one row for the queue.
    rows = [row for row in overview()["queues"] if "default" in row["name"]]
    assert len(rows) == 1
    row = rows[0]
    assert (row["name"], row["group"], row["shards"]) == ("default", "main", SHARDS)
    assert (row["dead"], row["finished_last_hour"]) == (6, 9)
    printed = io.StringIO()
    call_command("rcoord_status", stdout=printed)
    assert "default (3 shards)" in printed.getvalue()

    # Prometheus: one series per queue and task, the shards' counts added up.
    body, _ = prometheus_exposition()
    families = {family.name: family for family in text_string_to_metric_families(body.decode())}
    finished = {
        (sample.labels["queue"], sample.labels["task"], sample.labels["outcome"]): sample.value
        for sample in families["rcoord_tasks_finished"].samples
        if sample.name == "rcoord_tasks_finished_total"
    }
    assert finished == {
        ("default", "tests.tasks.always_fail", "failed"): 6,
        ("default", "tests.tasks.record", "succeeded"): 3,
    }
    dead = [
        sample.value
        for sample in families["rcoord_queue_tasks"].samples
        if sample.labels["state"] == "dead"
    ]
    assert dead == [6]

    # Dead letters: listed shard after shard, paged across them; requeued and deleted.
    first, rest = dead_letters("default", limit=4), dead_letters("default", limit=4, offset=4)
    assert (len(first), len(rest)) == (4, 2)
    assert {letter["id"] for letter in first + rest} == set(failed)
    assert requeue_dead("default", failed[0]) == 1
    assert delete_dead("default") == 5
    assert queue_stats("default") == {"ready": 1, "in_flight": 0, "delayed": 0, "dead": 0}
    assert result_of(done[0]).queue == "default"


def test_framework_tasks_on_a_sharded_queue_read_as_their_queue() -> None:
    from tests import framework_tasks

    results = [framework_tasks.add.enqueue(n, 1) for n in range(SHARDS)]
    assert {shard_of(result.id) for result in results} == set(shards_of("main"))
    worker = sharded_worker("--burst")
    assert worker.wait(120) == 0, output_of(worker)
    for n, result in enumerate(results):
        read = framework_tasks.add.get_result(result.id)
        assert (read.status, read.return_value) == ("SUCCESSFUL", n + 1)
        assert read.task.queue_name == "default"


def test_resharding_strands_no_task() -> None:
    """Tasks queued before the group had shards, and on shards it no longer has, still run:
    a worker serves the groups of the earlier layouts the registry lists."""
    from tests import framework_tasks

    markers, framework = [], []
    for layout in ({}, SHARDED, {"main": 2}):
        with override_settings(RCOORD={**settings.RCOORD, "QUEUE_SHARDS": layout}):
            batch = [f"{len(layout) and layout['main']}-{n}" for n in range(5)]
            enqueue_many([(tasks.record, (marker,), {}) for marker in batch])
            markers += batch
            framework += [framework_tasks.add.enqueue(n, 1).id for n in range(SHARDS)]
    two_shards = {"main": 2}
    with override_settings(RCOORD={**settings.RCOORD, "QUEUE_SHARDS": two_shards}):
        rows = [row for row in overview()["queues"] if row["name"].endswith("default")]
    # One row for the queue (its shards now and its rows from before it had shards), and
    # one per shard of the earlier layout that is not one now; every task counted once.
    assert [row["name"] for row in rows].count("default") == 1
    assert sum(row["ready"] for row in rows) == len(markers) + len(framework)
    # queue_stats counts the queue's shards now and its group's own keys.
    with override_settings(RCOORD={**settings.RCOORD, "QUEUE_SHARDS": two_shards}):
        (row,) = [row for row in rows if row["name"] == "default"]
        assert queue_stats("default")["ready"] == row["ready"]
    worker = start_worker("--burst", env={"RCOORD_TEST_QUEUE_SHARDS": json.dumps(two_shards)})
    output = output_of(worker, 120)
    assert worker.returncode == 0, output
    assert sorted(ran()) == sorted(markers)
    # Framework tasks of every layout ran, and read as their queue under the new one (a
    # shard no longer in the layout included: its messages say what they were queued to).
    with override_settings(RCOORD={**settings.RCOORD, "QUEUE_SHARDS": two_shards}):
        assert queue_stats("default") == {"ready": 0, "in_flight": 0, "delayed": 0, "dead": 0}
        assert {shard_of(task_id) for task_id in framework} - {"main", *shards_of("main")}
        for task_id in framework:
            result = framework_tasks.add.get_result(task_id)
            assert (result.status, result.task.queue_name) == ("SUCCESSFUL", "default")
    for group in ["main", *shards_of("main")]:
        keys = QueueKeys.of(f"{group}/default")
        assert get_client().zcard(keys.ready) == 0


def test_the_dashboard_pages_and_acts_on_a_sharded_queues_dead_letters(
    client: Any, django_user_model: Any
) -> None:
    failed = [tasks.always_fail.delay(f"d{n}") for n in range(SHARDS)]
    for queues in per_shard(["default"]):
        Worker(queues, burst=True).run()
    client.force_login(django_user_model.objects.create_user("olga", password="pw", is_staff=True))
    page = client.get(reverse("rcoord:dashboard-dead", args=["default"]))
    assert page.status_code == 200
    assert all(task_id in page.content.decode() for task_id in failed)
    action = reverse("rcoord:dashboard-dead-action", args=["default"])
    assert client.post(action, {"action": "requeue", "task_id": failed[1]}).status_code == 302
    assert queue_stats("default") == {"ready": 1, "in_flight": 0, "delayed": 0, "dead": 2}
    overview_page = client.get(reverse("rcoord:dashboard"))
    assert overview_page.status_code == 200
    assert "(3 shards)" in overview_page.content.decode()


def test_a_follow_up_is_queued_on_its_tasks_shard_in_the_same_step() -> None:
    """A follow-up of the same group goes to its task's shard, so the finish script that
    records the task's end queues it in that step (it reads the end as final), and the
    shard's own worker runs it."""
    ids = [tasks.followed.delay(False) for _ in range(SHARDS * 2)]
    for queues in per_shard(["default"]):
        shard = split_queue_name(queues[0])[0]
        Worker(queues, burst=True).run()
        followed = {entry.decode() for entry in get_client().lrange("test:followed", 0, -1)}
        mine = {f"{task_id} SUCCESSFUL:made" for task_id in ids if shard_of(task_id) == shard}
        assert mine
        assert mine <= followed
    assert len(get_client().lrange("test:followed", 0, -1)) == len(ids)
