"""A plain task queued now is one RPUSH to its group's incoming list while a worker of this
release serves the group (``queues.incoming``); a worker's take places what the list holds,
and every reader that must see a queued task (get_result, cancel, the counts) places it
first. Idle workers wait on the list without taking from it."""

from __future__ import annotations

import threading
import time

import pytest

from django_rcoord.connection import get_client
from django_rcoord.keys import KeySpace
from django_rcoord.queues import cancel, queue_stats
from django_rcoord.queues.incoming import pushes
from django_rcoord.queues.keys import GROUP_KEYS_MS, WAKE_TOKEN_MS, QueueKeys
from django_rcoord.queues.worker import Worker
from django_rcoord.scripts import run_script
from django_rcoord.waiting import wait_for_entry
from tests import cluster, tasks
from tests.procs import wait_until
from tests.test_locks import blocked_clients
from tests.test_queue_pause import stop
from tests.test_queue_upgrade import PREVIOUS, previous_exchange
from tests.test_queues import ran, result_of, start_worker

pytestmark = pytest.mark.django_db(transaction=True)  # a Worker runs in this process

KEYS = QueueKeys.of("default")


def served() -> Worker:
    """A worker of this release whose heartbeat says it serves the group, and a first task
    queued (by the script, which reads that) so that this process pushes the next ones."""
    worker = Worker(["default"])
    worker.session.heartbeat(0, time.time())
    tasks.record.delay("first")
    assert pushes(KEYS.group)
    return worker


def test_a_plain_task_is_one_rpush_while_a_worker_of_this_release_serves_the_group() -> None:
    client = get_client()
    alone = tasks.record.delay("alone")  # no worker serves the group: the script queues it
    assert client.hexists(KEYS.messages, alone)
    assert client.llen(KEYS.incoming) == 0
    assert not pushes(KEYS.group)
    served()
    cluster.reset_stats_of_node(client, KEYS.incoming)
    pushed = tasks.record.delay("pushed")
    commands = cluster.info_of_node(client, KEYS.incoming, "commandstats")
    assert "cmdstat_evalsha" not in commands
    assert commands["cmdstat_rpush"]["calls"] == 1
    assert not client.hexists(KEYS.messages, pushed)  # on the incoming list, not placed
    assert client.llen(KEYS.incoming) == 1
    # Read where it is: get_result places what the list holds first.
    assert result_of(pushed).status == "READY"
    assert client.llen(KEYS.incoming) == 0
    assert client.hexists(KEYS.messages, pushed)


def test_delayed_and_unique_tasks_keep_the_script() -> None:
    served()
    tasks.record.schedule("later", delay=60)
    tasks.unique_report.delay("u")
    assert get_client().llen(KEYS.incoming) == 0
    assert queue_stats("default")["delayed"] == 1


def test_pushed_tasks_keep_their_priorities_and_their_order() -> None:
    served()
    tasks.record_whenever.delay("low 1")
    tasks.record.delay("middle")
    tasks.record_urgent.delay("high")
    tasks.record_whenever.delay("low 2")
    assert get_client().llen(KEYS.incoming) == 4
    assert Worker(["default"], burst=True).run() == 5
    assert ran() == ["high", "first", "middle", "low 1", "low 2"]


def test_cancel_and_the_counts_see_a_task_pushed_and_not_placed() -> None:
    served()
    kept = tasks.record.delay("kept")
    dropped = tasks.record.delay("dropped")
    assert get_client().llen(KEYS.incoming) == 2
    assert cancel(dropped) is True
    assert result_of(dropped).status == "CANCELLED"
    assert result_of(kept).status == "READY"
    tasks.record.delay("counted")
    assert queue_stats("default")["ready"] == 3  # first, kept, counted
    assert Worker(["default"], burst=True).run() == 3
    assert sorted(ran()) == ["counted", "first", "kept"]


def test_enqueue_many_pushes_the_plain_ones_in_one_pipeline() -> None:
    from django_rcoord.queues import enqueue_many

    served()
    ids = enqueue_many([(tasks.record, [f"m{n}"], {}) for n in range(5)])
    assert get_client().llen(KEYS.incoming) == 5
    assert [result_of(task_id).status for task_id in ids] == ["READY"] * 5


def test_one_entry_wakes_every_waiter_and_stays_for_the_take() -> None:
    client = get_client()
    woke: list[bool] = []

    def waiter() -> None:
        # The client's socket timeout caps one wait; a waiter not woken returns False.
        woke.append(wait_for_entry(get_client(), KEYS.incoming, 30))

    waiters = [threading.Thread(target=waiter) for _ in range(2)]
    for thread in waiters:
        thread.start()
    # Both blocked on the list before anything is pushed (the server counts them).
    wait_until(lambda: blocked_clients(KEYS.incoming) == 2, timeout=30)
    served()  # its first task by the script, with no worker registered idle: no token
    tasks.record.delay("pushed")
    for thread in waiters:
        thread.join(timeout=60)
    assert woke == [True, True]
    assert client.llen(KEYS.incoming) == 1  # nothing taken by the waits
    assert Worker(["default"], burst=True).run() == 2


def test_an_idle_worker_process_runs_a_pushed_task() -> None:
    client = get_client()
    worker = start_worker()
    try:
        # It serves the group (heartbeat) and waits idle (registered in the same take).
        wait_until(lambda: client.exists(KEYS.serving) and client.zcard(KEYS.idle), timeout=60)
        tasks.record.delay("first")  # the script: it reads that a worker serves the group
        assert pushes(KEYS.group)
        pushed = tasks.record.delay("pushed")
        wait_until(lambda: "pushed" in ran(), timeout=60)
        assert result_of(pushed).status == "SUCCESSFUL"
    finally:
        stop(worker)


def test_the_previous_releases_producer_and_worker_beside_this_releases() -> None:
    """The previous release's producer queues with its own script (the ready ZSET: this
    release's worker takes from it); this release's producer pushes only while this
    release's worker serves the group, whose take places the tasks where the previous
    release's worker takes them too."""
    client = get_client()
    old_wake = KeySpace("queue", KEYS.group).key("wake")
    for n in range(3):
        task_id, body = f"{'0' * 31}{n}", f'{{"id":"{"0" * 31}{n}","task":"{tasks.record.name}",'
        body += f'"queue":"default","args":["old {n}"],"kwargs":{{}}}}'
        keys = [KEYS.messages, KEYS.ready, KEYS.queues, old_wake, KEYS.idle]
        args = [task_id, body, KEYS.queue, 0, WAKE_TOKEN_MS, GROUP_KEYS_MS]
        run_script("task_enqueue", client, keys=keys, args=args, package=PREVIOUS)
    # No worker of this release serves the group yet: this release's producer uses the script.
    tasks.record.delay("new 0")
    assert client.llen(KEYS.incoming) == 0
    worker = served()
    pushed = [tasks.record.delay(f"new {n}") for n in range(1, 4)]
    assert client.llen(KEYS.incoming) == 3
    # This release's worker takes one, placing what was pushed; the previous one takes the rest.
    job = worker.session.take()
    assert job is not None
    _, taken = previous_exchange("old-worker", [], 10, "0")
    held = [entry[0].decode() for entry in taken]
    assert len(held) == 7
    assert set(pushed) <= {job.id, *held}
    finished, _ = previous_exchange("old-worker", [(task_id, "1") for task_id in held], 0, "1")
    assert finished == [1] * 7
    assert all(result_of(task_id).status == "SUCCESSFUL" for task_id in pushed if task_id in held)


async def test_the_async_twins_push_and_read_a_pushed_task() -> None:
    from asgiref.sync import sync_to_async

    from django_rcoord.queues import acancel
    from django_rcoord.queues.results import aget_result

    await sync_to_async(served)()
    kept, dropped = [await tasks.record.adelay(marker) for marker in ("kept", "dropped")]
    client = get_client()
    assert client.llen(KEYS.incoming) == 2
    assert not client.hexists(KEYS.messages, kept)
    record = await aget_result(kept)  # placed to read it
    assert record is not None
    assert record.status == "READY"
    assert client.llen(KEYS.incoming) == 0
    tasks.record.delay("pushed after")
    assert await acancel(dropped) is True
    assert await acancel(tasks.record.delay("cancelled unplaced")) is True
    assert await sync_to_async(Worker(["default"], burst=True).run)() == 3
    assert sorted(ran()) == ["first", "kept", "pushed after"]


def test_a_long_message_goes_through_the_script() -> None:
    """A take places up to 1,000 entries at once: messages over MAX_PUSHED_BYTES are stored
    by the script, so that one take never copies more than 1,000 of that size."""
    from django_rcoord.queues.incoming import MAX_PUSHED_BYTES

    served()
    long = tasks.record.delay("x" * MAX_PUSHED_BYTES)
    assert get_client().llen(KEYS.incoming) == 0
    assert get_client().hexists(KEYS.messages, long)
