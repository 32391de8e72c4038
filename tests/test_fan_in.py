"""Fan-in: ``group(...).then(callback)`` runs its callback once, after every child ended,
with their results; each child's failure policy; cancel; crashes of real worker processes."""

from __future__ import annotations

import functools
import json
import re
import signal

import pytest
from django.conf import settings
from django.test import override_settings
from django.urls import reverse

from django_rcoord.connection import get_client
from django_rcoord.queues import (
    cancel_fan_in,
    fan_in_status,
    get_result,
    group,
    task_run,
)
from django_rcoord.queues.fan_in import child_ended
from django_rcoord.queues.framework import TaskResultStatus
from django_rcoord.queues.keys import group_of_task_id
from django_rcoord.queues.worker import Worker
from tests import framework_tasks, tasks
from tests.procs import wait_until
from tests.test_queues import output_of, start_worker

pytestmark = pytest.mark.django_db(transaction=True)


def collected(label: str) -> list[list]:
    """Every run of ``collect`` for ``label``: the results each was called with."""
    return [json.loads(entry) for entry in get_client().lrange(f"{tasks.FAN_IN}:{label}", 0, -1)]


def drain(*queues: str) -> int:
    """``manage.py run_email_worker --burst`` in a process of its own, one after another,
    for each queue named (each its own group): how many tasks they ran."""
    ran = 0
    for queue in queues or ["default"]:
        worker = start_worker("--burst", queues=(queue,))
        output = output_of(worker, 60)
        assert worker.returncode == 0, output[-3000:]
        ran += sum(int(count) for count in re.findall(r"stopped after (\d+) task", output))
    return ran


def test_the_callback_runs_once_with_every_result_in_the_childrens_order() -> None:
    job = group(*(tasks.square.s(n) for n in range(12))).then(tasks.collect.s("squares"))
    status = fan_in_status(job.id)
    assert status is not None
    assert (status.state, status.total, status.ended, status.children) == (
        "waiting",
        12,
        0,
        job.children,
    )
    # The callback is not queued yet: its record reads READY, with the fan-in's progress.
    waiting = get_result(job.id)
    assert waiting is not None
    assert (waiting.status, waiting.task, waiting.args) == (
        "READY",
        "tests.tasks.collect",
        ["squares"],
    )
    assert (waiting.fan_in.state, waiting.fan_in.total, waiting.fan_in.ended) == ("waiting", 12, 0)
    drain()
    assert collected("squares") == [[n * n for n in range(12)]]
    status = fan_in_status(job.id)
    assert status is not None
    assert (status.state, status.ended, status.failed) == ("fired", 12, 0)
    record = get_result(job.id)
    assert record is not None
    assert (record.task, record.status) == ("tests.tasks.collect", "SUCCESSFUL")
    assert record.fan_in is None  # its own record now


def test_children_on_other_queues_and_groups_are_counted_in_the_callbacks_slot() -> None:
    job = group(tasks.square.s(2), tasks.square_elsewhere.s(3), tasks.square_later.s(4)).then(
        tasks.collect.s("spread")
    )
    drain("default")
    assert collected("spread") == []
    drain("elsewhere/default", "fan-in/later")
    # Each child was counted by a task on its own queue; the last count queued the
    # callback on its own queue, in the callback's group.
    status = fan_in_status(job.id)
    assert status is not None
    assert (status.state, status.ended) == ("fired", 3)
    queued = get_result(job.id)
    assert queued is not None
    assert (queued.status, queued.queue) == ("READY", "default")
    assert collected("spread") == []
    drain("default")
    assert collected("spread") == [[4, 9, 16]]


def test_a_child_in_its_callbacks_group_is_counted_by_the_step_that_records_its_end() -> None:
    """No task runs between the child and its callback: the finish call that records the
    child's end counts it and queues the callback, a backlog of its queue notwithstanding."""
    for n in range(30):
        tasks.record.delay(f"backlog {n}")
    job = group(tasks.square_urgently.s(3)).then(tasks.collect_urgently.s("urgent"))
    # One task a take: the call that records a task's end takes the next one.
    assert Worker(["default"], burst=True, max_tasks=2, prefetch=1).run() == 2
    assert collected("urgent") == [[9]]
    assert get_client().llen(tasks.RAN) == 0
    status = fan_in_status(job.id)
    assert status is not None
    assert status.state == "fired"


def test_a_childs_count_task_waits_behind_no_other_task_of_its_queue() -> None:
    """A child whose callback is in another group is counted by a task on its own queue,
    at the top priority: a backlog in that queue does not hold the callback back."""
    for n in range(30):
        tasks.record.delay(f"backlog {n}")
    job = group(tasks.square_urgently.s(3)).then(tasks.collect_elsewhere.s("elsewhere"))
    # The child, then its count; nothing of the backlog between them.
    assert Worker(["default"], burst=True, max_tasks=2, prefetch=1).run() == 2
    assert get_client().llen(tasks.RAN) == 0
    status = fan_in_status(job.id)
    assert status is not None
    assert status.state == "fired"
    drain("elsewhere/default")
    assert collected("elsewhere") == [[9]]


def test_counting_a_child_again_changes_nothing() -> None:
    """The task that counts a child runs at least once: a second run is ``seen``."""
    job = group(tasks.square.s(5), tasks.square_later.s(6)).then(tasks.collect.s("again"))
    drain("default")  # the first child and its count
    first = job.children[0]
    assert child_ended(job.id, 1, first, "fail", "default", "25") == "seen"
    status = fan_in_status(job.id)
    assert status is not None
    assert (status.ended, status.state) == (1, "waiting")
    drain("fan-in/later")
    drain("fan-in/later", "default")
    assert collected("again") == [[25, 36]]
    assert child_ended(job.id, 2, job.children[1], "fail", "default", "36") == "seen"
    assert collected("again") == [[25, 36]]


@pytest.mark.parametrize(("policy", "in_its_place"), [("continue", "failure"), ("ignore", None)])
def test_a_failed_child_that_may_fail_leaves_its_failure_or_nothing(
    policy: str, in_its_place: str | None
) -> None:
    failing = tasks.fail_to_square.s(2).if_it_fails(policy)
    job = group(tasks.square.s(1), failing, tasks.square.s(3)).then(tasks.collect.s(policy))
    drain()
    (results,) = collected(policy)
    assert (results[0], results[2]) == (1, 9)
    if in_its_place is None:
        assert results[1] is None
    else:
        assert results[1] == {
            "failed": job.children[1],
            "error": "ValueError: no square of 2 today",
        }
    status = fan_in_status(job.id)
    assert status is not None
    assert (status.state, status.failed) == ("fired", 1)


def test_a_failed_child_fails_the_fan_in_and_cancels_the_children_not_started() -> None:
    job = group(tasks.fail_to_square.s(2), tasks.square_later.s(3), tasks.square_later.s(4)).then(
        tasks.collect.s("failed")
    )
    drain()
    status = fan_in_status(job.id)
    assert status is not None
    assert (status.state, status.ended, status.failed) == ("failed", 1, 1)
    for child in job.children[1:]:
        record = get_result(child)
        assert record is not None
        assert record.status == "CANCELLED"
    assert drain("fan-in/later", "default") == 0
    assert collected("failed") == []
    never = get_result(job.id)  # the callback's record: it will not run
    assert never is not None
    assert (never.status, never.fan_in.state) == ("CANCELLED", "failed")


def test_cancel_fan_in_cancels_its_children_and_its_callback() -> None:
    job = group(tasks.square.s(1), tasks.square_later.s(2)).then(tasks.collect.s("cancel"))
    drain()  # the first child ran and was counted
    assert cancel_fan_in(job.id) is True
    assert cancel_fan_in(job.id) is False  # over already
    record = get_result(job.children[1])
    assert record is not None
    assert record.status == "CANCELLED"
    drain("fan-in/later", "default")
    assert collected("cancel") == []
    status = fan_in_status(job.id)
    assert status is not None
    assert status.state == "cancelled"


def test_the_dashboards_look_up_shows_a_fan_ins_progress(client, django_user_model) -> None:
    staff = django_user_model.objects.create_user("olga", password="pw", is_staff=True)
    client.force_login(staff)
    job = group(tasks.square.s(1), tasks.square_later.s(2)).then(tasks.collect.s("shown"))
    drain()
    lookup = reverse("rcoord:dashboard-lookup")
    page = client.get(lookup, {"task": job.id}).content.decode()
    assert "The callback of a fan-in of 2 tasks" in page
    assert '<span class="state">waiting</span>, 1 ended (0 failed)' in page
    assert "No record" not in page  # not queued yet, and not unknown either
    drain("fan-in/later")
    page = client.get(lookup, {"task": job.id}).content.decode()
    assert '<span class="state">fired</span>, 2 ended (0 failed)' in page
    assert 'id="rcoord-task-record"' in page  # the callback's own record


def test_tasks_framework_tasks_can_be_children_and_the_callback() -> None:
    job = group(task_run(framework_tasks.add, 1, b=2), tasks.square.s(3)).then(
        task_run(framework_tasks.gather, "both")
    )
    drain()
    result = framework_tasks.gather.get_result(job.id)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"label": "both", "results": [3, 9]}
    child = framework_tasks.add.get_result(job.children[0])
    assert child.return_value == 3
    with pytest.raises(TypeError, match="does not accept"):
        group(task_run(framework_tasks.add, 1))
    with pytest.raises(TypeError, match="RedisTaskBackend"):
        group(task_run(len, [1]))


def test_bad_groups_are_refused_before_anything_is_queued() -> None:
    client = get_client()
    before = client.dbsize()
    with pytest.raises(ValueError, match="at least one"):
        group()
    with pytest.raises(TypeError, match="does not accept"):
        group(tasks.square.s(1, 2))
    with pytest.raises(TypeError, match="does not accept"):
        group(tasks.square.s(1)).then(tasks.collect.s())  # its label is missing
    with pytest.raises(ValueError, match="unique"):
        group(tasks.square.s(1)).then(tasks.unique_note.s())
    with pytest.raises(TypeError, match=r"task\.s"):
        group(tasks.square)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="if_failed"):
        tasks.square.s(1).if_it_fails("retry")
    with pytest.raises(TypeError, match="JSON-serializable"):
        group(tasks.square.s(1), tasks.square.s(object())).then(tasks.collect.s("bad"))
    assert client.dbsize() == before


def test_children_spread_over_shards_are_counted_and_the_callback_runs_once() -> None:
    shards = {"main": 3}  # the group of queue "default"
    with override_settings(RCOORD={**settings.RCOORD, "QUEUE_SHARDS": shards}):
        job = group(*(tasks.square.s(n) for n in range(9))).then(tasks.collect.s("shards"))
    assert len({group_of_task_id(child) for child in job.children}) == 3
    worker = start_worker("--burst", env={"RCOORD_TEST_QUEUE_SHARDS": json.dumps(shards)})
    output = output_of(worker, 60)
    assert worker.returncode == 0, output[-3000:]
    assert collected("shards") == [[n * n for n in range(9)]]
    status = fan_in_status(job.id)
    assert status is not None
    assert (status.state, status.ended) == ("fired", 9)


@pytest.mark.once
def test_workers_killed_mid_child_still_fire_the_callback_once_with_every_result() -> None:
    """100 children on two worker processes; one is SIGKILLed while it runs a child (its
    children run again after their leases), then the other: the callback runs once."""
    count = 100
    job = group(*(tasks.square_slowly.s(n, 0.05) for n in range(count))).then(
        tasks.collect.s("killed")
    )
    client = get_client()

    def started(at_least: int) -> bool:
        return client.llen("test:started") >= at_least

    workers = [start_worker(lease=1.5), start_worker(lease=1.5)]
    try:
        for victim, runs in ((0, 10), (1, 40)):
            wait_until(functools.partial(started, runs), timeout=60)
            workers[victim].send_signal(signal.SIGKILL)
            workers[victim].wait(10)
            workers[victim] = start_worker(lease=1.5)
        wait_until(lambda: collected("killed"), timeout=120)
        status = fan_in_status(job.id)
        assert status is not None
        assert (status.state, status.ended, status.failed) == ("fired", count, 0)
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
            output_of(worker, 30)
    assert collected("killed") == [[n * n for n in range(count)]]
    runs = client.lrange("test:started", 0, -1)
    assert len(runs) >= count  # some ran twice: their worker was killed under them
