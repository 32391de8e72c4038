from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_rcoord.connection import get_client
from django_rcoord.queues import enqueue_many, execute_later, queue_stats, recover_and_promote
from django_rcoord.queues.delayed import DelayQueue, DueTaskPromoter, poll_queue
from django_rcoord.queues.keys import QueueKeys
from tests import tasks
from tests.procs import blpop_within, run_in_processes, server_ms, server_now, wait_until
from tests.test_queues import output_of, ran, start_logged, start_worker

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.django_db(transaction=True)


def start_poller(*args: str) -> subprocess.Popen:
    return start_logged(
        [sys.executable, "manage.py", "poll_delayed", *args],
        {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"},
    )


def schedule_spread(count: int, within: float, prefix: str) -> None:
    """Schedule ``count`` tasks due evenly within ``within`` seconds from now."""
    now = server_now()
    for index in range(count):
        delay = within * index / count
        tasks.record_timing.schedule(f"{prefix}{index}", now + delay, delay=delay)


def lateness_ms() -> list[int]:
    return sorted(int(ms) for ms in get_client().lrange(QueueKeys.of("default").lateness, 0, -1))


def test_schedule_waits_for_the_servers_clock() -> None:
    before = server_now()
    tasks.record.schedule("soon", delay=2)
    after = server_now()
    keys = QueueKeys.of("default")
    ((_, due_ms),) = get_client().zrange(keys.delayed, 0, -1, withscores=True)
    due = due_ms / 1000
    assert before + 2 - 0.001 <= due <= after + 2 + 0.001  # (due is kept in ms)
    # Polled until promoted, which must not come before its due time on the server's clock.
    polls = []

    def promoted() -> bool:
        polls.append(poll_queue())
        return polls[-1] == 1

    wait_until(promoted, timeout=10)
    assert server_now() >= due  # read after the promoting poll: an early one fails here
    assert queue_stats("default")["ready"] == 1


def test_schedule_with_eta_and_bad_arguments() -> None:
    import datetime

    eta = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=60)
    tasks.record.schedule("eta", eta=eta)
    assert queue_stats("default")["delayed"] == 1
    with pytest.raises(ValueError, match="not both"):
        tasks.record.schedule("both", delay=1, eta=eta)
    with pytest.raises(ValueError, match="aware datetime"):
        tasks.record.schedule("naive", eta=datetime.datetime.now())
    execute_later("default", "tests.tasks.record", ["now"], delay=0)
    assert queue_stats("default")["ready"] == 1


def test_two_thousand_due_tasks_two_pollers_and_a_worker_each_run_once_none_early() -> None:
    worker = start_worker()
    pollers = [start_poller(), start_poller()]
    try:
        time.sleep(2)  # let them start
        schedule_spread(2000, 1.0, "d")
        wait_until(lambda: len(ran()) >= 2000, timeout=120)
        time.sleep(0.5)  # a duplicate would show up now
    finally:
        for process in [worker, *pollers]:
            process.send_signal(signal.SIGTERM)
        for process in [worker, *pollers]:
            output = output_of(process, 30)
            assert process.returncode == 0, output
    effects = ran()
    assert len(effects) == 2000
    assert len(set(effects)) == 2000  # exactly once
    assert get_client().llen("test:early") == 0  # none early
    samples = lateness_ms()
    p99 = samples[int(len(samples) * 0.99) - 1]
    print(
        f"\npromotion lateness over {len(samples)} samples: median {statistics.median(samples)} "
        f"ms, p99 {p99} ms, max {samples[-1]} ms (interval 1000 ms)"
    )


def test_a_poller_killed_mid_run_loses_nothing() -> None:
    victim = start_poller()
    time.sleep(2)
    schedule_spread(2000, 1.5, "k")
    time.sleep(0.7)
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    rescuer = start_poller()
    try:
        wait_until(lambda: queue_stats("default")["ready"] == 2000, timeout=60)
    finally:
        rescuer.send_signal(signal.SIGTERM)
        output_of(rescuer, 30)
    stats = queue_stats("default")
    assert stats == {"ready": 2000, "in_flight": 0, "delayed": 0, "dead": 0}
    keys = QueueKeys.of("default")
    # The queue's counter counts every task put on it: none was promoted twice.
    assert int(get_client().hget(keys.queues, keys.queue)) == 2000


#: A woken poller promotes a 0.2 s task within this; one that slept on would take its 20 s
#: interval. The rest is room for a poller stalled on a busy machine.
WOKEN_WITHIN = 5


def test_poller_wakes_early_for_a_nearer_task() -> None:
    tasks.record.schedule("far", delay=30)
    promoter = DueTaskPromoter(interval=20)
    import threading

    thread = threading.Thread(target=promoter.run, daemon=True)
    thread.start()
    time.sleep(0.5)  # it sleeps toward the far task, or the 20 s interval
    tasks.record.schedule("near", delay=0.2)
    started = time.monotonic()
    wait_until(lambda: queue_stats("default")["ready"] == 1, timeout=10)
    assert time.monotonic() - started < WOKEN_WITHIN
    # A queue that did not exist when the poller read the list of queues.
    execute_later("fresh", "tests.tasks.record", ["new queue"], delay=0.2)
    started = time.monotonic()
    wait_until(lambda: queue_stats("fresh")["ready"] == 1, timeout=10)
    assert time.monotonic() - started < WOKEN_WITHIN
    # A queue group that did not exist either: the registry wakes the poller, which then
    # watches that group's wake-ups too (a second task there is also on time).
    for marker in ("new group", "same group"):
        execute_later("reports/fresh", "tests.tasks.record", [marker], delay=0.2)
        started = time.monotonic()
        wait_until(lambda: queue_stats("reports/fresh")["delayed"] == 0, timeout=10)
        assert time.monotonic() - started < WOKEN_WITHIN
    assert queue_stats("reports/fresh")["ready"] == 2
    promoter.stop()
    thread.join(25)
    assert not thread.is_alive()


def test_poll_delayed_once(capsys) -> None:
    execute_later("default", "tests.tasks.record", ["x"], delay=0.1)
    time.sleep(0.15)
    call_command("poll_delayed", "--once")
    assert "promoted 1 task(s)" in capsys.readouterr().out
    assert queue_stats("default")["ready"] == 1


def test_rcoord_status_shows_due_times_and_lateness(capsys) -> None:
    import json

    tasks.record.schedule("later", delay=60)
    execute_later("default", "tests.tasks.record", ["due"], delay=0.05)
    time.sleep(0.1)
    poll_queue()
    call_command("rcoord_status", "--json")
    state = json.loads(capsys.readouterr().out)
    (queue,) = state["queues"]
    assert queue["delayed"] == 1
    assert 50 < queue["next_due_in"] <= 60
    assert state["promotion_lateness"]["main"]["samples"] == 1


# -- DelayQueue: the seed article's example ---------------------------------------------
def test_delay_queue_seed_example() -> None:
    queue = DelayQueue("article")
    pushed = server_ms()
    for index in range(20):
        queue.push({"n": index})
    early = queue.pop(num=10)
    if server_ms() - pushed < 3000:
        assert early == []  # nothing has waited 3 s on the server's clock
    # Else this process stalled 3 s between the first push and the pop (a busy machine):
    # the pop may have taken the first items, in order, and the rest follows them.
    assert early == [{"n": i} for i in range(len(early))]
    time.sleep(3.05)  # every item has waited 3 s now
    rest = [{"n": i} for i in range(len(early), 20)]
    first, second = queue.pop(num=10), queue.pop(num=10)
    assert first == rest[:10]
    assert second == rest[10:]
    assert queue.pop(num=10) == []
    assert len(queue) == 0


def test_delay_queue_refuses_data_json_cannot_carry() -> None:
    with pytest.raises(TypeError, match="JSON"):
        DelayQueue("bad").push({"when": object()})
    assert len(DelayQueue("bad")) == 0


def drain_delay_queue(name: str) -> list[int]:
    queue = DelayQueue(name)
    client = get_client()
    client.incr("test:ready")
    assert blpop_within("test:go", 60, client)  # start together with the other consumer
    got: list[int] = []
    while True:
        items = queue.pop(num=7, previous=0)
        if not items:
            return got
        if not got:
            # Each has its first items before either goes on: however late the other
            # process wakes, both consume (2,000 items take one of them a few ms).
            client.incr("test:popped")
            deadline = time.monotonic() + 60
            while int(client.get("test:popped") or 0) < 2 and time.monotonic() < deadline:
                time.sleep(0.001)
        got.extend(item["n"] for item in items)


def test_two_consumers_never_share_an_item() -> None:
    queue = DelayQueue("shared")
    enqueue_count = 2000
    for index in range(enqueue_count):
        queue.push({"n": index})

    def start_both() -> None:
        wait_until(lambda: int(get_client().get("test:ready") or 0) == 2, timeout=60)
        get_client().rpush("test:go", 1, 1)

    starter = threading.Thread(target=start_both, daemon=True)
    starter.start()
    first, second = run_in_processes(drain_delay_queue, [("shared",), ("shared",)])
    starter.join(5)
    assert not set(first) & set(second)
    assert sorted(first + second) == list(range(enqueue_count))
    # both consumed, concurrently
    assert first
    assert second
    assert len(queue) == 0


def test_the_worker_alone_also_promotes_due_tasks() -> None:
    execute_later("default", "tests.tasks.record", ["solo"], delay=0.2)
    worker = start_worker()
    try:
        wait_until(lambda: ran() == ["solo"], timeout=30)
    finally:
        worker.send_signal(signal.SIGTERM)
        output_of(worker, 30)


def test_enqueue_many_of_scheduled_and_plain() -> None:
    enqueue_many([(tasks.record, ("a",), {})])
    assert queue_stats("default")["ready"] == 1


# -- bounded script calls -------------------------------------------------------------
def test_batches_past_one_script_calls_bound_are_a_clear_error() -> None:
    queue = DelayQueue("big")
    with pytest.raises(ValueError, match="num must be an int from 1 to 1000"):
        queue.pop(num=20_000, previous=0)
    for bad in (0, 20_000):
        with pytest.raises(CommandError, match="batch must be an int from 1 to 1000"):
            call_command("poll_delayed", "--once", "--batch", str(bad))
    with pytest.raises(ValueError, match="batch"):
        recover_and_promote(QueueKeys.of("default"), batch=20_000)


def test_a_full_batch_pops_at_most_its_size_and_leaves_the_rest() -> None:
    queue = DelayQueue("big")
    for number in range(1500):
        queue.push({"n": number})
    assert [item["n"] for item in queue.pop(num=1000, previous=0)] == list(range(1000))
    assert len(queue) == 500
