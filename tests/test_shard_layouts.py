"""A sharded queue's promises through changes of its layout (``RCOORD["QUEUE_SHARDS"]``
changing while tasks wait): unique tasks run once whatever the number of shards, and the
queue-level calls find a task on a shard of any layout. With real worker processes, on
one Redis and, with RCOORD_TEST_CLUSTER=1, on a 3-primary cluster."""

from __future__ import annotations

import io
import itertools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings
from django.urls import reverse
from redis.crc import key_slot

from django_rcoord.connection import get_client
from django_rcoord.ops.status import overview
from django_rcoord.queues import dead_letters, delete_dead, queue_stats, requeue_dead
from django_rcoord.queues.keys import GroupKeys, QueueKeys, group_of_task_id
from django_rcoord.queues.records import forget_gone_groups, known_groups
from django_rcoord.queues.shards import MAX_SHARDS, shards_of
from django_rcoord.queues.worker import Worker
from tests import tasks
from tests.procs import wait_until
from tests.test_queues import log_of, output_of, ran, start_worker

pytestmark = pytest.mark.django_db(transaction=True)

NONE: dict[str, int] = {}
THREE = {"main": 3}
TWO = {"main": 2}


@contextmanager
def layout(shards: dict[str, int]) -> Iterator[None]:
    """This process queues and reads with ``shards`` as its ``QUEUE_SHARDS``."""
    with override_settings(RCOORD={**settings.RCOORD, "QUEUE_SHARDS": shards}):
        yield


def shard_of(task_id: str) -> str:
    """The group a task id names."""
    group = group_of_task_id(task_id)
    assert group is not None
    return group


def drain(shards: dict[str, int]) -> str:
    """Run a ``--burst`` worker process on layout ``shards``; its log."""
    worker = start_worker("--burst", env={"RCOORD_TEST_QUEUE_SHARDS": json.dumps(shards)})
    output = output_of(worker, 120)
    assert worker.returncode == 0, output
    return output


def test_a_unique_task_runs_once_however_the_number_of_shards_changes() -> None:
    """Producers of three layouts side by side (a rolling deploy, a forgotten settings
    file): each finds the first run's claim; one run happens."""
    ids = []
    for shards in (NONE, THREE, TWO, THREE):
        with layout(shards):
            ids.append(tasks.unique_report.delay("same"))
    assert ids == [ids[0]] * 4
    with layout(TWO):
        drain(TWO)
        assert ran() == ["same"]
        # Its claim ended with its run: the next one runs.
        again = tasks.unique_report.delay("same")
        assert again != ids[0]


def test_a_unique_dead_letter_sent_back_under_another_layout_holds_its_claim() -> None:
    with layout(THREE):
        first = tasks.unique_failure.delay("once")
    with layout(NONE):  # the group's own keys: where unique tasks live in every layout
        Worker(["default"], burst=True).run()
    with layout(TWO):
        assert [letter["id"] for letter in dead_letters("default")] == [first]
        assert requeue_dead("default", first) == 1
        # Sent back, it holds its claim again: another run of the key queues nothing.
        assert tasks.unique_failure.delay("once") == first
        assert queue_stats("default")["ready"] == 1


def test_queue_calls_find_dead_letters_on_an_earlier_layouts_shards() -> None:
    """Three shards, then two: the dead letters left on the shards the new layout lacks are
    listed, sent back one by one (by id) or all, and deleted."""
    with layout(THREE):
        failed = [tasks.always_fail.delay(f"d{n}") for n in range(6)]
        for shard in shards_of("main"):
            Worker([f"{shard}/default"], burst=True).run()
    with layout(TWO):
        gone = [task_id for task_id in failed if group_of_task_id(task_id) not in shards_of("main")]
        assert gone, "some of the three shards are none of the two"
        assert sorted(letter["id"] for letter in dead_letters("default")) == sorted(failed)
        assert requeue_dead("default", gone[0]) == 1
        assert requeue_dead("default") == len(failed) - 1
        assert dead_letters("default") == []
        drain(TWO)  # every one fails again (no retries): dead letters again
        assert delete_dead("default", gone[0]) == 1
        assert delete_dead("default") == len(failed) - 1
        assert dead_letters("default") == []
    assert sorted(ran()) == []


def test_the_shards_of_a_layout_are_among_those_of_every_larger_one() -> None:
    """A worker with more shards than a producer serves every shard the producer uses; and
    each layout up to 10 shards holds one shard in each n-th of the slot range."""
    for group in ("main", "reports", "mail"):
        layouts = []
        for count in range(1, MAX_SHARDS + 1):
            with layout({group: count}):
                layouts.append(shards_of(group) if count > 1 else ())
        for smaller, larger in itertools.pairwise(layouts[1:]):
            assert set(smaller) < set(larger)
        for shards in layouts[1:10]:
            slots = [key_slot(QueueKeys.of(f"{shard}/q").ready.encode()) for shard in shards]
            cells = sorted(slot * len(shards) // 16384 for slot in slots)
            assert cells == list(range(len(shards)))
        assert len(set(layouts[-1])) == MAX_SHARDS


def test_groups_that_hold_nothing_leave_the_registry() -> None:
    """A group of an earlier layout leaves the registry once it holds no task and none was
    queued for 30 days (its list of queues expired); one with a dead letter, or whose
    list of queues lives, stays."""
    with layout(THREE):
        shards = shards_of("main")
        failed = [tasks.always_fail.delay(f"d{n}") for n in range(6)]
        for shard in shards:
            Worker([f"{shard}/default"], burst=True).run()
    assert set(shards) <= set(known_groups())
    emptied, dead_kept, queued_kept = shards
    for task_id in failed:
        if group_of_task_id(task_id) == emptied:
            assert delete_dead("default", task_id) == 1
    client = get_client()
    # 30 days pass with no task queued: the lists of queues expire (but one's, queued to).
    client.delete(GroupKeys.of(emptied).queues, GroupKeys.of(dead_kept).queues)
    with layout(NONE):
        for task_id in failed:
            if group_of_task_id(task_id) == queued_kept:
                assert delete_dead("default", task_id) == 1
    assert forget_gone_groups() == [emptied]
    assert emptied not in known_groups()
    assert {dead_kept, queued_kept} <= set(known_groups())
    assert forget_gone_groups() == []  # nothing more to forget
    with layout(THREE):  # used again (a task on each shard, in turn): recorded again
        for n in range(3):
            tasks.record.delay(f"back{n}")
    assert emptied in known_groups()


@pytest.mark.parametrize("worker_layout", [NONE, TWO], ids=["unsharded", "two shards"])
def test_a_running_worker_serves_the_shards_another_layout_starts_using(
    worker_layout: dict[str, int],
) -> None:
    """Producers on three shards, a worker on none or two (a rolling deploy, a forgotten
    settings file): the worker finds the shards it lacks while it runs, says so, serves
    them, and ends their loops once they hold nothing (none queued for 30 days); then they
    leave the registry."""

    env = {"RCOORD_TEST_QUEUE_SHARDS": json.dumps(worker_layout), "RCOORD_TEST_DISCOVERY": "0.3"}
    worker = start_worker(env=env)
    try:
        wait_until(lambda: "watching" in log_of(worker), timeout=60)
        with layout(THREE):
            ids = [tasks.record.delay(f"t{n}") for n in range(9)]
        with layout(worker_layout):
            lacking = sorted({shard_of(t) for t in ids} - set(shards_of("main")))
        assert lacking  # some shards of three are none of the worker's
        wait_until(lambda: len(ran()) == 9, timeout=60, why=lambda: (ran(), log_of(worker)))
        for group in lacking:
            assert f"queue group {group} holds tasks of group main" in log_of(worker)
        # Thirty days on, with nothing queued: their lists of queues expire, and their loops end.
        client = get_client()
        for group in lacking:
            client.delete(GroupKeys.of(group).queues)
        wait_until(
            lambda: all(
                f"queue group {g} holds no task any more" in log_of(worker) for g in lacking
            ),
            timeout=60,
            why=lambda: log_of(worker),
        )
    finally:
        worker.terminate()
        output = output_of(worker, 60)
    assert worker.returncode == 0, output
    assert sorted(ran()) == sorted(f"t{n}" for n in range(9))
    forget_gone_groups()  # the worker has signed off from them
    assert not set(lacking) & set(known_groups())


def test_status_and_the_dashboard_show_shards_of_another_layout(
    client: Any, django_user_model: Any
) -> None:
    """Producers on three shards, this process on two: the shard the two lack keeps a row
    of its own, marked as another layout's, in rcoord_status and on the dashboard."""
    with layout(THREE):
        ids = [tasks.record.delay(f"t{n}") for n in range(6)]
    with layout(TWO):
        lacking = sorted({shard_of(t) for t in ids} - set(shards_of("main")))
        assert lacking
        rows = {row["name"]: row for row in overview()["queues"]}
        for group in lacking:
            assert rows[f"{group}/default"]["other_layout"] == "main"
        assert rows["default"]["other_layout"] is None
        assert rows["default"]["shards"] == 2
        printed = io.StringIO()
        call_command("rcoord_status", stdout=printed)
        assert "not in this process's QUEUE_SHARDS layout" in printed.getvalue()
        assert f"{lacking[0]}/default (a shard of main)" in printed.getvalue()
        staff = django_user_model.objects.create_user("olga", password="pw", is_staff=True)
        client.force_login(staff)
        page = client.get(reverse("rcoord:dashboard")).content.decode()
        assert "(a shard of main, not in this layout)" in page
