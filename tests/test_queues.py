from __future__ import annotations

import datetime
import decimal
import itertools
import json
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core import mail
from django.db import transaction
from django.test import override_settings

from django_rcoord.connection import get_client, slot_pipeline
from django_rcoord.exceptions import MessageTooLarge
from django_rcoord.queues import (
    Task,
    TaskRecord,
    dead_letters,
    enqueue_many,
    execute_later,
    get_result,
    queue_stats,
    recover_and_promote,
    requeue_dead,
    send_sold_email_via_queue,
    task,
)
from django_rcoord.queues.keys import QueueKeys
from django_rcoord.queues.outcomes import Kind
from django_rcoord.queues.records import REQUEUE_BATCH
from django_rcoord.queues.worker import Worker
from django_rcoord.queues.worker.jobs import Done, Job, Outcome
from django_rcoord.scripts import run_script
from tests import tasks
from tests.procs import server_now, started, wait_until
from tests.test_runner import run_job

ROOT = Path(__file__).resolve().parent.parent

# Workers close database connections around each task, as in production.
pytestmark = pytest.mark.django_db(transaction=True)


def ran() -> list[str]:
    return [marker.decode() for marker in get_client().lrange(tasks.RAN, 0, -1)]


def take(worker: Worker) -> Job:
    """One task taken by ``worker``, which must find one."""
    job = worker.session.take()
    assert job is not None, "no task to take"
    return job


def result_of(task_id: str) -> TaskRecord:
    """The result record of a task that has one."""
    record = get_result(task_id)
    assert record is not None, f"no result record for {task_id}"
    return record


def start_worker(
    *args: str,
    lease: float | None = None,
    queues: tuple[str, ...] = ("default",),
    max_deliveries: int | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen:
    """``manage.py run_email_worker`` in its own process, on the test settings and Redis
    (``env``: more environment variables)."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", **(env or {})}
    if lease is not None:
        env["RCOORD_TEST_TASK_LEASE"] = str(lease)
    if max_deliveries is not None:
        env["RCOORD_TEST_MAX_DELIVERIES"] = str(max_deliveries)
    return start_logged(
        [sys.executable, "manage.py", "run_email_worker", "--queues", *queues, *args], env
    )


def start_logged(command: list[str], env: dict[str, str]) -> subprocess.Popen:
    """Start ``command`` with its output in a file (a pipe nobody reads would fill up and
    block it); ``output_of`` waits for it and returns that output."""
    with tempfile.NamedTemporaryFile(prefix="rcoord-test-", suffix=".log", delete=False) as log:
        process = started(
            subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        )
    process.log_path = log.name  # type: ignore[attr-defined]
    return process


def output_of(process: subprocess.Popen, timeout: float = 60) -> str:
    process.wait(timeout)
    return log_of(process)


def log_of(process: subprocess.Popen) -> str:
    """What a process started by ``start_logged`` has logged so far."""
    return Path(process.log_path).read_text()  # type: ignore[attr-defined]


def run_in_thread(worker: Worker) -> threading.Thread:
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    return thread


# -- producing ----------------------------------------------------------------------
def test_delay_stores_a_json_message_in_one_queue() -> None:
    task_id = tasks.record.delay("a")
    keys = QueueKeys.of("default")
    client = get_client()
    assert client.zrange(keys.ready, 0, -1) == [task_id.encode()]
    message = json.loads(client.hget(keys.messages, task_id))
    assert message["task"] == "tests.tasks.record"
    assert message["args"] == ["a"]
    assert message["kwargs"] == {}
    assert message["id"] == task_id
    assert message["queue"] == "default"
    assert abs(message["enqueued_at"] - time.time()) < 60


def test_arguments_json_cannot_carry_are_a_type_error_at_enqueue() -> None:
    with pytest.raises(TypeError, match="JSON-serializable"):
        tasks.record.delay(object())
    assert queue_stats("default")["ready"] == 0
    # Dates and decimals travel as strings (DjangoJSONEncoder).
    tasks.add_numbers.delay(datetime.date(2026, 1, 2), b=decimal.Decimal("1.50"))
    body = json.loads(get_client().hvals(QueueKeys.of("default").messages)[0])
    assert body["args"] == ["2026-01-02"]
    assert body["kwargs"] == {"b": "1.50"}


def test_a_message_is_the_json_djangos_encoder_writes_of_it() -> None:
    from django.core.serializers.json import DjangoJSONEncoder

    from django_rcoord.queues import messages

    encoder = DjangoJSONEncoder(separators=(",", ":"))
    calls: list[tuple[str, str, Any, dict[str, Any], dict[str, Any] | None]] = [
        ("t", "q", (1, 1.5, None, True), {}, None),
        (
            'odd "name" \u00e9',
            'gr"oup/q\n',
            ["\u00e9", datetime.date(2026, 1, 2)],
            {"b": decimal.Decimal("1.50")},
            {"priority": 3, "unique": "u:x"},
        ),
        ("t", "q", [], {"nested": {"list": [[], {}]}}, {}),
    ]
    for name, queue, args, kwargs, extra in calls:
        task_id, body = messages.encode_message(name, queue, args, kwargs, extra)
        message = json.loads(body)
        assert body == encoder.encode(
            {
                "id": task_id,
                "task": name,
                "queue": queue,
                "args": args,
                "kwargs": kwargs,
                "enqueued_at": message["enqueued_at"],
                **(extra or {}),
            }
        )
    circular: list[Any] = []
    circular.append(circular)
    with pytest.raises(TypeError, match="Circular reference"):
        messages.encode_message("t", "q", circular, {})
    with pytest.raises(TypeError, match="JSON-serializable"):
        messages.encode_message("t", "q", [], {"a": object()})


async def test_arguments_the_task_does_not_accept_are_a_type_error_at_enqueue() -> None:
    for call in (
        tasks.record.delay,
        lambda: tasks.record.delay("a", "b"),
        lambda: tasks.record.schedule("a", delay=5, colour="red"),
        lambda: enqueue_many([(tasks.record, ["fine"], {}), (tasks.record, [], {"x": 1})]),
    ):
        with pytest.raises(TypeError, match=r"'tests\.tasks\.record' does not accept"):
            call()  # refused before anything is sent
    with pytest.raises(TypeError, match="does not accept"):
        await tasks.record.adelay("a", "b")
    with pytest.raises(TypeError, match="does not accept"):
        await tasks.record.aschedule(delay=1)
    assert queue_stats("default") == {"ready": 0, "in_flight": 0, "delayed": 0, "dead": 0}


def test_enqueue_many_and_execute_later() -> None:
    ids = enqueue_many([(tasks.record, (f"m{i}",), {}) for i in range(50)])
    assert len(set(ids)) == 50
    other = execute_later("default", "tests.tasks.record", ["late"])
    assert queue_stats("default")["ready"] == 51
    Worker(["default"], burst=True).run()
    assert sorted(ran()) == sorted([f"m{i}" for i in range(50)] + ["late"])
    assert other not in ids


def test_enqueue_many_across_groups_returns_the_ids_in_call_order(redis_client) -> None:
    # Tasks of two groups, interleaved: one pipeline per group, ids still in order.
    other = Task(tasks.record.function, "tests.tasks.record", "reports/pdf", max_retries=0)
    calls: list[tuple[Task, tuple[str], dict[str, Any]]] = [
        ((tasks.record if i % 2 else other), (f"m{i}",), {}) for i in range(6)
    ]
    ids = enqueue_many(calls)
    for i, task_id in enumerate(ids):
        keys = QueueKeys.of("default" if i % 2 else "reports/pdf")
        assert json.loads(redis_client.hget(keys.messages, task_id))["args"] == [f"m{i}"]
    assert queue_stats("default")["ready"] == 3
    assert queue_stats("reports/pdf")["ready"] == 3


def test_execute_later_with_delay_waits_for_its_time() -> None:
    # The task itself says whether it ran before its time, on the server's (same) clock.
    due = server_now() + 0.5
    execute_later("default", "tests.tasks.record_timing", ["later", due], delay=0.5)
    assert queue_stats("default") == {"ready": 0, "in_flight": 0, "delayed": 1, "dead": 0}
    worker = Worker(["default"])
    thread = run_in_thread(worker)
    wait_until(lambda: ran() == ["later"], timeout=10)
    worker.stop()
    thread.join(5)
    assert get_client().llen("test:early") == 0


def test_delay_on_commit_waits_for_the_transaction() -> None:
    with transaction.atomic():
        tasks.record.delay_on_commit("committed")
        assert queue_stats("default")["ready"] == 0
    assert queue_stats("default")["ready"] == 1
    with pytest.raises(TypeError):
        tasks.record.delay_on_commit(object())


def test_task_decorator_needs_parentheses_and_usable_names() -> None:
    with pytest.raises(TypeError):
        task(lambda: None)  # type: ignore[arg-type]
    for bad in ("", "reports/", "/x"):
        with pytest.raises(ValueError, match="is not a queue name"):
            task(queue=bad)
    # Any other text is a usable name: the key layer encodes it.
    odd = QueueKeys.of("a}b/x{")
    assert odd.group == "a}b"
    assert odd.ready.endswith(":ready:x%7B")


# -- consuming ------------------------------------------------------------------------
def test_tasks_in_flight_are_kept_in_the_large_encodings() -> None:
    """A listpack answers each lookup by a scan: with one task in flight already, its
    queue's in-flight ZSET and the group's owners HASH are a skiplist and a hashtable. The
    counts leave out the member that keeps them so, and they have no expiry: they go with
    their last task, whichever way it leaves (finished, given back, recovered, stopped)."""
    keys, client = QueueKeys.of("default"), get_client()

    def gone() -> bool:
        return client.exists(keys.in_flight, keys.owners) == 0

    tasks.record.delay("enc")
    worker = Worker(["default"])
    job = take(worker)
    assert client.object("encoding", keys.in_flight) == b"skiplist"
    assert client.object("encoding", keys.owners) == b"hashtable"
    assert client.pttl(keys.in_flight) == client.pttl(keys.owners) == -1  # never expire
    assert queue_stats("default")["in_flight"] == 1
    assert worker.session.renew([job]) == ([], [])  # held, and not asked to stop
    assert worker.session.finish(Done(job, Outcome(Kind.ACK, "tests.tasks.record"), 1.0))
    assert queue_stats("default")["in_flight"] == 0
    assert gone()
    tasks.record.delay("back")
    worker.session.give_back([take(worker)])
    assert gone()
    stopped = Outcome(Kind.STOPPED, "tests.tasks.record", error="stopped", error_class="x.Stop")
    assert worker.session.finish_stopped(Done(take(worker), stopped, 1.0))
    assert gone()
    # A worker that died: its task is put back when its lease runs out, and the keys go.
    tasks.record.delay("lost")
    lost = take(worker)
    client.zadd(keys.in_flight, {lost.id: 0}, xx=True)  # its lease ran out
    assert recover_and_promote(keys)[0] == 1
    assert gone()
    # A task a previous release's take left beside the long member is no long member: the
    # keys stay while it is in flight.
    client.zadd(keys.in_flight, {"previous": 2**52})
    client.hset(keys.owners, "previous", "old-worker")
    assert worker.session.finish(Done(take(worker), Outcome(Kind.ACK, "tests.tasks.record"), 1.0))
    assert client.zscore(keys.in_flight, "previous") == 2**52
    assert client.hget(keys.owners, "previous") == b"old-worker"
    assert queue_stats("default")["in_flight"] == 1


def test_priorities_are_respected() -> None:
    for index in range(5):
        tasks.record_low.delay(f"low{index}")
    for index in range(5):
        tasks.record_high.delay(f"high{index}")
    worker = start_worker("--burst", queues=("high", "low"))
    output = output_of(worker, 60)
    assert worker.returncode == 0, output
    assert ran() == [f"high{i}" for i in range(5)] + [f"low{i}" for i in range(5)]


def test_failures_retry_with_backoff_then_succeed(caplog) -> None:
    caplog.set_level("DEBUG", logger="django_rcoord")
    tasks.fail_then_succeed.delay("flaky", 2)
    worker = Worker(["default"])
    thread = run_in_thread(worker)
    wait_until(lambda: ran() == ["flaky"], timeout=20)
    worker.stop()
    thread.join(5)
    times = [float(t) for t in get_client().lrange("test:attempt-times:flaky", 0, -1)]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # TASK_RETRY_BACKOFF is 0.05 s in the test settings: 0.05 s, then 0.1 s.
    assert len(times) == 3
    # (Lower bounds only: a stalled worker may stretch either gap; that the backoff grows
    # is in the log lines below, which carry what the worker decided.)
    assert gaps[0] >= 0.045
    assert gaps[1] >= 0.095
    assert queue_stats("default") == {"ready": 0, "in_flight": 0, "delayed": 0, "dead": 0}
    # Each failure is one line with the exception and when the task runs again, and carries
    # the task's traceback (exc_info: in the log's text and for error trackers).
    lines = [record.getMessage() for record in caplog.records]
    assert any(
        "failed on attempt 1 (ran " in line
        and line.endswith("RuntimeError: attempt 1 fails on purpose; next attempt in 0.05 s")
        for line in lines
    ), lines
    assert any("next attempt in 0.1 s" in line for line in lines)
    failures = [record for record in caplog.records if "failed on attempt" in record.getMessage()]
    assert len(failures) == 2
    for record in failures:
        assert record.exc_info is not None
        assert isinstance(record.exc_info[1], RuntimeError)
        assert "in fail_then_succeed" in logging.Formatter().formatException(record.exc_info)
    assert "Traceback (most recent call last)" in caplog.text
    assert any("succeeded (ran " in line for line in lines)


def test_retries_run_out_into_dead_letters_and_can_be_requeued() -> None:
    tasks.fail_then_succeed.delay("hopeless", 10)  # max_retries=3: four attempts
    worker = Worker(["default"])
    thread = run_in_thread(worker)
    wait_until(lambda: queue_stats("default")["dead"] == 1, timeout=20)
    worker.stop()
    thread.join(5)
    assert int(get_client().get("test:attempts:hopeless")) == 4
    (letter,) = dead_letters("default")
    assert letter["task"] == "tests.tasks.fail_then_succeed"
    assert letter["failures"] == 4
    assert "attempt 4 fails on purpose" in letter["error"]
    assert requeue_dead("default") == 1
    assert queue_stats("default")["ready"] == 1
    assert dead_letters("default") == []


def test_twenty_thousand_dead_letters_are_requeued_in_bounded_script_calls() -> None:
    keys = QueueKeys.of("default")
    ids = enqueue_many([(tasks.record, [str(n)], {}) for n in range(20_000)])
    client = get_client()
    # As if every one had failed for good: out of the queue, into the dead letters.
    with slot_pipeline(client, keys.messages, transaction=False) as pipe:
        pipe.delete(keys.ready)
        for start in range(0, len(ids), 1000):
            pipe.rpush(keys.dead, *ids[start : start + 1000])
        pipe.execute()
    script_keys = [
        keys.dead, keys.ready, keys.failures, keys.errors, keys.incoming, keys.results,
        keys.records, keys.messages, keys.queues, keys.results_expiry,
    ]  # fmt: skip
    call = {"queue": keys.queue, "keep_ms": 60_000, "batch": REQUEUE_BATCH, "id": ""}
    args = [json.dumps(call)]
    # One call moves one batch, the oldest letters first, and leaves the rest.
    assert run_script("task_requeue_dead", client, keys=script_keys, args=args) == REQUEUE_BATCH
    assert client.zrange(keys.ready, 0, -1) == [task_id.encode() for task_id in ids[:REQUEUE_BATCH]]
    assert requeue_dead("default") == 20_000 - REQUEUE_BATCH
    assert queue_stats("default") == {"ready": 20_000, "in_flight": 0, "delayed": 0, "dead": 0}


def test_poison_messages_become_dead_letters_and_the_worker_goes_on() -> None:
    keys = QueueKeys.of("default")
    client = get_client()
    client.hset(keys.messages, "garbage", b"\x80not json")
    client.zadd(keys.ready, {"garbage": 0})  # the front of the queue
    unknown = execute_later("default", "no.such.task", [1])
    # Arguments the task does not accept: refused at delay(), dead-lettered when they
    # arrive by name (execute_later cannot check them).
    with pytest.raises(TypeError, match="does not accept these arguments"):
        tasks.record.delay("a", "surplus argument")
    # A misspelt keyword is named, not reported as the parameter it left missing.
    with pytest.raises(TypeError, match="unexpected keyword argument\\(s\\) 'c'"):
        tasks.add_numbers.delay(1, c=2)
    execute_later("default", "tests.tasks.record", ["a", "surplus argument"])
    tasks.always_fail.delay("boom")
    tasks.record.delay("fine")
    worker = start_worker("--burst")
    output = output_of(worker, 60)
    assert worker.returncode == 0, output
    assert ran() == ["fine"]
    errors = [letter["error"] for letter in dead_letters("default")]
    assert len(errors) == 3
    assert "undecodable" in errors[0]
    assert "does not accept these arguments" in errors[1]
    assert "ValueError: boom always fails" in errors[2]
    # The log says why each failed, in one line, and that it is not coming back.
    assert "failed on attempt 1" in output
    assert "ValueError: boom always fails; it is a dead letter now" in output
    # A task this worker does not know waits for one that does (a rolling deploy).
    assert f"task {unknown} no.such.task cannot run here: unknown task" in output
    assert queue_stats("default")["delayed"] == 1
    assert result_of(unknown).status == "READY"
    # Its record says why it waits; the deferral is not a failed attempt.
    assert "unknown task 'no.such.task'" in result_of(unknown).errors[-1]["traceback"]
    assert get_client().hget(keys.failures, unknown) is None


def test_task_priorities_order_one_queue_and_equal_ones_keep_their_order() -> None:
    tasks.record.delay("a0")
    tasks.record_whenever.delay("w0")
    tasks.record_urgent.delay("u0")
    tasks.record.delay("a1")
    tasks.record_urgent.schedule("u-delayed", delay=0.2)
    enqueue_many([(tasks.record_urgent, ["u1"], {}), (tasks.record, ["a2"], {})])
    keys = QueueKeys.of("default")
    # Promoted when due: it joins the back of its priority, behind u0 and u1.
    wait_until(lambda: recover_and_promote(keys)[1] == 1, timeout=10)
    Worker(["default"], burst=True).run()
    assert ran() == ["u0", "u1", "u-delayed", "a0", "a1", "a2", "w0"]


def test_a_task_whose_lease_ran_out_goes_back_to_the_front_of_its_priority() -> None:
    tasks.record.delay("first")
    tasks.record.delay("second")
    tasks.record_urgent.delay("urgent")
    tasks.record_whenever.delay("whenever")
    dying = Worker(["default"], lease=0.1)
    taken = [take(dying), take(dying)]  # urgent, then first; then the worker dies
    assert [json.loads(job.body)["args"] for job in taken] == [["urgent"], ["first"]]
    time.sleep(0.2)
    assert recover_and_promote(QueueKeys.of("default"))[0] == 2
    tasks.record_urgent.delay("urgent-later")
    tasks.record.delay("third")
    Worker(["default"], burst=True).run()
    assert ran() == ["urgent", "urgent-later", "first", "second", "third", "whenever"]
    for job in taken:
        assert result_of(job.id).attempts == 2


def test_priorities_out_of_range_are_refused() -> None:
    for bad in (101, -101, 1.5, True, "1"):
        with pytest.raises(ValueError, match="priority"):
            task(priority=bad)  # type: ignore[arg-type]


def test_producers_push_a_wake_up_only_while_a_worker_waits_for_one() -> None:
    keys = QueueKeys.of("default")
    client = get_client()
    tasks.record.delay("a")
    assert client.llen(keys.incoming) == 0  # no worker waits: no wake-up
    worker = Worker(["default"])
    assert worker.session.take() is not None  # busy: not registered idle
    assert worker.session.take() is None  # nothing left: registered idle in the same call
    assert client.zscore(keys.idle, worker.id) is not None
    tasks.record.delay("b")
    tasks.record.delay("b2")
    # One token on the incoming list idle workers wait on, however many tasks came.
    assert client.lrange(keys.incoming, 0, -1) == [b""]
    assert worker.session.take() is not None  # taking unregisters it, and drops the token
    assert client.zscore(keys.idle, worker.id) is None
    assert client.llen(keys.incoming) == 0
    tasks.record.delay("c")
    assert client.llen(keys.incoming) == 0


def test_a_worker_whose_lease_ran_out_cannot_finish_the_task_twice() -> None:
    tasks.record.delay("once")
    slow = Worker(["default"], lease=0.2)
    job = take(slow)
    time.sleep(0.3)
    other = Worker(["default"])
    other.session.recover_if_due(force=True)
    second = take(other)
    assert second.id == job.id
    finished = slow.session.finish(Done(job, Outcome(Kind.ACK, "tests.tasks.record"), 0.0))
    assert not finished  # the lease was lost: the other worker owns the task now
    finished = other.session.finish(Done(second, Outcome(Kind.ACK, "tests.tasks.record"), 0.0))
    assert finished
    assert queue_stats("default") == {"ready": 0, "in_flight": 0, "delayed": 0, "dead": 0}


# -- the sold-item e-mail -----------------------------------------------------------------
def test_sold_email_reaches_the_seller(django_user_model) -> None:
    django_user_model.objects.create_user("seller", email="seller@example.com")
    send_sold_email_via_queue("seller", "ItemL", 97, "buyer")
    Worker(["email"], burst=True).run()
    (message,) = mail.outbox
    assert message.to == ["seller@example.com"]
    assert message.subject == 'Your item "ItemL" sold for 97'
    assert 'buyer bought your item "ItemL" for 97.' in message.body


def test_sold_email_without_an_address_is_a_dead_letter(django_user_model) -> None:
    django_user_model.objects.create_user("mute", email="")
    send_sold_email_via_queue("mute", "ItemM", 5, "buyer")
    send_sold_email_via_queue("ghost", "ItemN", 5, "buyer")
    Worker(["email"], burst=True).run()
    assert mail.outbox == []
    errors = [letter["error"] for letter in dead_letters("email")]
    assert errors == [
        "PermanentFailure: the seller 'mute' has no e-mail address",
        "PermanentFailure: no user is named 'ghost'",
    ]


# -- real worker processes through manage.py ----------------------------------------------
def test_a_thousand_tasks_all_run_with_two_worker_processes() -> None:
    enqueue_many([(tasks.record, (f"t{i}",), {}) for i in range(1000)])
    workers = [start_worker("--burst"), start_worker("--burst")]
    for worker in workers:
        output = output_of(worker, 120)
        assert worker.returncode == 0, output
    assert sorted(ran()) == sorted(f"t{i}" for i in range(1000))
    assert queue_stats("default") == {"ready": 0, "in_flight": 0, "delayed": 0, "dead": 0}


def test_sigkill_mid_task_loses_nothing() -> None:
    markers = [f"k{i}" for i in range(5)]
    enqueue_many([(tasks.record_when_released, (marker,), {}) for marker in markers])
    victim = start_worker(lease=1.5)
    # Killed mid-task however slow the machine: its task runs until released.
    wait_until(lambda: get_client().llen("test:started") >= 1, timeout=60)
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    assert queue_stats("default")["in_flight"] >= 1
    for marker in markers:
        tasks.release(marker)
    rescuer = start_worker(lease=1.5)
    try:
        wait_until(lambda: sorted(set(ran())) == [f"k{i}" for i in range(5)], timeout=60)
    finally:
        rescuer.send_signal(signal.SIGTERM)
        output_of(rescuer, 30)
    assert queue_stats("default") == {"ready": 0, "in_flight": 0, "delayed": 0, "dead": 0}


def test_a_task_that_kills_its_worker_every_time_becomes_a_dead_letter() -> None:
    poison = tasks.kill_own_worker.delay()
    tasks.record.delay("after")
    exits = []
    for _ in range(20):
        worker = start_worker("--burst", lease=0.5, max_deliveries=3)
        output = output_of(worker, 60)
        exits.append(worker.returncode)
        if queue_stats("default") == {"ready": 0, "in_flight": 0, "delayed": 0, "dead": 1}:
            break
        time.sleep(0.6)  # the dead worker's lease runs out
    assert exits.count(-signal.SIGKILL) == 3, exits
    assert exits[-1] == 0, output  # the workers that follow are unharmed
    assert ran() == ["after"]
    (letter,) = dead_letters("default")
    assert letter["id"] == poison
    assert "its worker died (or lost Redis) while running it, 3 times" in letter["error"]
    record = result_of(poison)
    assert record.status == "FAILED"
    assert record.attempts == 3
    assert record.finished_at
    assert record.errors[-1]["exception_class_path"] == "django_rcoord.exceptions.WorkerLost"
    assert "TASK_MAX_DELIVERIES" in output


def test_a_task_given_back_by_a_stopping_worker_is_not_a_lost_delivery() -> None:
    given_back = tasks.record.delay("given-back")
    keys = QueueKeys.of("default")
    stopping = Worker(["default"], lease=5)
    stopping.session.give_back([take(stopping)])
    assert get_client().hget(keys.failures, f"{given_back}:lost") is None
    assert get_client().zrange(keys.ready, 0, -1) == [given_back.encode()]
    dying = Worker(["default"], lease=0.05)
    dying.session.take()
    time.sleep(0.1)
    assert recover_and_promote(keys)[0] == 1
    assert get_client().hget(keys.failures, f"{given_back}:lost") == b"1"
    Worker(["default"], burst=True).run()
    assert ran() == ["given-back"]
    assert get_client().hget(keys.failures, f"{given_back}:lost") is None  # gone with the task


def test_sigterm_mid_task_finishes_that_task_and_exits_cleanly() -> None:
    enqueue_many([(tasks.record_when_released, (f"s{i}",), {}) for i in range(3)])
    worker = start_worker()
    wait_until(lambda: get_client().llen("test:started") >= 1, timeout=60)
    worker.send_signal(signal.SIGTERM)
    # Released once the worker has said it is stopping: however late, s0 runs to its end
    # and s1 never starts.
    wait_until(lambda: "SIGTERM received" in log_of(worker), timeout=30)
    tasks.release("s0")
    output = output_of(worker, 30)
    assert worker.returncode == 0, output
    assert ran() == ["s0"]
    # one log line per task
    assert "task " in output
    assert " succeeded (ran " in output
    assert queue_stats("default") == {"ready": 2, "in_flight": 0, "delayed": 0, "dead": 0}


def test_redis_restarted_mid_run_loses_no_task(redis_server) -> None:
    if redis_server is None:
        pytest.skip("needs the suite's own redis-server to restart (REDIS_URL is set)")
    enqueue_many([(tasks.record_slowly, (f"r{i}", 0.01), {}) for i in range(300)])
    worker = start_worker(lease=3)
    try:
        wait_until(lambda: len(ran()) >= 20, timeout=60)
        errors_before = log_of(worker).count(" ERROR ")
        redis_server.stop()
        # Down until the worker has met the outage (however late a busy machine lets it).
        wait_until(lambda: log_of(worker).count(" ERROR ") > errors_before, timeout=60)
        redis_server.start()
        wait_until(lambda: set(ran()) >= {f"r{i}" for i in range(300)}, timeout=120)
    finally:
        worker.send_signal(signal.SIGTERM)
        output = output_of(worker, 30)
    assert worker.returncode == 0, output
    # The outage was noticed, logged and waited out (between tasks or while finishing one).
    assert any(
        " ERROR " in line and ("lost Redis" in line or "retrying" in line)
        for line in output.splitlines()
    ), output


@pytest.mark.slow
def test_chaos_workers_killed_at_random_every_half_second() -> None:
    total = 3000
    enqueue_many([(tasks.record, (f"c{i}",), {}) for i in range(total)])
    workers = [start_worker(lease=1) for _ in range(3)]
    serving_since: list[float | None] = [None] * len(workers)
    kills = 0
    deadline = time.monotonic() + 300
    try:
        while len(set(ran())) < total:
            assert time.monotonic() < deadline, f"only {len(set(ran()))} of {total} ran"
            time.sleep(0.5)
            now = time.monotonic()
            for index, worker in enumerate(workers):
                if serving_since[index] is None and "watching" in log_of(worker):
                    serving_since[index] = now
            # Killed at random among those that have served for half a second: however
            # slowly a busy machine starts a worker, each life drains tasks, so the test
            # ends (killing on a fixed beat could kill every worker before it serves).
            served = [i for i, since in enumerate(serving_since) if since and now - since >= 0.5]
            if not served:
                continue
            index = random.choice(served)
            workers[index].send_signal(signal.SIGKILL)
            workers[index].wait(10)
            kills += 1
            workers[index] = start_worker(lease=1)
            serving_since[index] = None
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGKILL)
            worker.wait(10)
    effects = ran()
    assert set(effects) == {f"c{i}" for i in range(total)}
    print(f"\nchaos: {total} tasks, {kills} workers killed, {len(effects) - total} duplicate runs")


def test_rcoord_status_shows_queues_and_workers(capsys) -> None:
    from django.core.management import call_command

    for index in range(3):
        tasks.record.delay(f"st{index}")
    execute_later("reports/pdf", "tests.tasks.record", ["grouped"])
    worker = Worker(["default"])
    worker.session.heartbeat(0, time.time())
    job = take(worker)
    call_command("rcoord_status", "--json")
    state = json.loads(capsys.readouterr().out)
    queues = {queue["name"]: queue for queue in state["queues"]}
    assert queues["default"]["ready"] == 2
    assert queues["default"]["in_flight"] == 1
    assert queues["default"]["oldest_ready_age"] >= 0
    assert queues["reports/pdf"]["ready"] == 1
    (seen,) = state["workers"]
    assert seen["id"] == worker.id
    assert seen["queues"] == ["default"]
    assert seen["running"] == [{"id": job.id, "task": "tests.tasks.record"}]
    call_command("rcoord_status")
    text = capsys.readouterr().out
    assert "default" in text
    assert "reports/pdf" in text
    assert f"running tests.tasks.record {job.id}" in text
    worker.session.sign_off()
    call_command("rcoord_status", "--json")
    assert json.loads(capsys.readouterr().out)["workers"] == []


def test_max_tasks_and_concurrency_options() -> None:
    enqueue_many([(tasks.record, (f"x{i}",), {}) for i in range(10)])
    worker = start_worker("--max-tasks", "3")
    output = output_of(worker, 60)
    assert worker.returncode == 0, output
    assert len(ran()) == 3
    assert queue_stats("default")["ready"] == 7
    threaded = start_worker("--burst", "--concurrency", "3")
    output = output_of(threaded, 60)
    assert threaded.returncode == 0, output
    assert sorted(ran()) == sorted(f"x{i}" for i in range(10))
    # Three worker loops, each with its own identity, ran in the one process.
    assert len({line.split()[4] for line in output.splitlines() if "watching" in line}) == 3


# -- a task queued by a project's own script (the example market's purchase) --------------
STEP = "queue_in_step"  # tests/lua: a project's own script


def test_enqueue_in_script_gives_the_enqueue_helpers_keys_and_arguments(redis_client) -> None:
    from django_rcoord.queues import enqueue_in_script

    with pytest.raises(TypeError, match="does not accept"):
        enqueue_in_script(tasks.record, ("a", "b"))  # checked as delay() checks
    with pytest.raises(ValueError, match="queue="):
        enqueue_in_script("tests.tasks.record", ["a"])
    later = enqueue_in_script(tasks.record, ["later"], delay=60, queue="scripted/q")
    assert later.group == "scripted"
    assert later.hash_tag == "scripted"
    # Its keys and arguments are the enqueue helper's, in order: tests/lua/queue_in_step.lua
    # passes its KEYS and ARGV straight on to it.
    assert run_script(STEP, redis_client, keys=later.keys, args=later.args, package="tests") == 2
    later.registered(redis_client, 2)
    assert queue_stats("scripted/q")["delayed"] == 1
    now = enqueue_in_script(tasks.record, ["now"])
    assert run_script(STEP, redis_client, keys=now.keys, args=now.args, package="tests") in (1, 2)
    Worker(["default"], burst=True).run()
    assert redis_client.lrange(tasks.RAN, 0, -1) == [b"now"]


# -- prefetch -----------------------------------------------------------------------
def test_a_worker_takes_a_batch_and_finishes_it_with_its_next_take() -> None:
    ids = [tasks.record.delay(f"b{n}") for n in range(10)]
    worker = Worker(["default"], prefetch=4)
    jobs = worker.session.exchange([], 4)
    assert [job.id for job in jobs] == ids[:4]  # in queue order, all leased to it
    assert queue_stats("default") == {"ready": 6, "in_flight": 4, "delayed": 0, "dead": 0}
    assert {result_of(job.id).status for job in jobs} == {"RUNNING"}
    done = [run_job(worker.runner, job) for job in jobs]
    following = worker.session.exchange(done, 4)  # one call: four finished, four more taken
    assert [job.id for job in following] == ids[4:8]
    assert [result_of(task_id).status for task_id in ids[:4]] == ["SUCCESSFUL"] * 4
    assert ran() == ["b0", "b1", "b2", "b3"]
    worker.session.exchange([run_job(worker.runner, job) for job in following], 0)
    Worker(["default"], burst=True).run()
    assert ran() == [f"b{n}" for n in range(10)]
    assert {result_of(task_id).attempts for task_id in ids} == {1}


def test_sigkill_of_a_worker_holding_a_prefetched_batch_loses_nothing() -> None:
    tasks.record.delay("warm")  # a measured run: then it takes batches
    markers = [f"p{n}" for n in range(300)]
    enqueue_many([(tasks.record_slowly, (marker, 0.01), {}) for marker in markers])
    worker = start_worker(lease=1)
    try:
        # Killed the moment it is seen with a batch in hand (300 tasks: it is mid-way).
        wait_until(
            lambda: get_client().llen(tasks.RAN) >= 12 and queue_stats("default")["in_flight"] > 1,
            timeout=60,
        )
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
    finally:
        if worker.poll() is None:
            worker.kill()
    time.sleep(1.2)  # the leases run out
    Worker(["default"], burst=True).run()
    assert set(ran()) == {"warm", *markers}
    assert queue_stats("default") == {"ready": 0, "in_flight": 0, "delayed": 0, "dead": 0}


def test_a_fresh_worker_takes_one_task_until_it_has_measured_one() -> None:
    ids = [tasks.record.delay(f"m{n}") for n in range(40)]
    worker = Worker(["default"], prefetch=32)
    assert worker.take_count() == 1
    job = take(worker)
    assert job.id == ids[0]
    assert queue_stats("default")["in_flight"] == 1
    done = run_job(worker.runner, job)
    # A quick run, as record's is (observed here rather than timed: a stalled test would
    # time it slow, and a slow task is rightly taken alone).
    worker.prefetch.observe(1.0)
    worker.session.exchange([done], worker.take_count())
    assert queue_stats("default")["in_flight"] == worker.take_count() == 32


def test_the_tasks_behind_a_long_task_go_back_while_it_runs() -> None:
    tasks.record.delay("warm")  # measured: the next take is a batch
    first = tasks.record_when_released.delay("first")
    rest = [tasks.record.delay(f"p{n}") for n in range(9)]
    worker = start_worker()  # a 60 s lease: only a give-back brings them back before it ends
    try:
        wait_until(lambda: get_client().llen("test:started") == 1, timeout=60)
        # Given back while the long task still runs (it runs until released).
        wait_until(lambda: queue_stats("default")["ready"] == 9, timeout=30)
        assert get_client().llen(tasks.RAN) == 1  # "first" has not ended
        assert queue_stats("default")["in_flight"] == 1
        keys = QueueKeys.of("default")
        assert get_client().zrange(keys.ready, 0, -1) == [task_id.encode() for task_id in rest]
        for task_id in rest:  # not a lost delivery, not an attempt
            assert get_client().hget(keys.failures, f"{task_id}:lost") is None
            record = result_of(task_id)
            assert record.status == "READY"
            assert record.attempts == 0
            assert record.started_at is None
        worker.send_signal(signal.SIGTERM)
        wait_until(lambda: "SIGTERM received" in log_of(worker), timeout=30)
        tasks.release("first")
        output = output_of(worker, 30)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 0, output
    assert ran() == ["warm", "first"]  # it finished what it had started, and nothing more
    assert queue_stats("default") == {"ready": 9, "in_flight": 0, "delayed": 0, "dead": 0}
    assert result_of(first).status == "SUCCESSFUL"


def test_tasks_taken_with_a_long_task_go_back_for_other_workers() -> None:
    first = Worker(["default"])
    first_thread = run_in_thread(first)
    tasks.record.delay("warm")  # it measures a run: its next take is a batch
    wait_until(lambda: ran() == ["warm"])
    enqueue_many(
        [
            (tasks.record_when_released, ("long",), {}),
            *((tasks.sleep_then_record, (f"f{n}", 0.02), {}) for n in range(6)),
        ]
    )
    wait_until(lambda: get_client().llen("test:started") == 1)
    # Given back while the long task runs (it runs until released), not when it ends.
    wait_until(lambda: queue_stats("default")["ready"] == 6, timeout=30)
    assert "long" not in ran()
    other = Worker(["default"], burst=True)
    assert other.run() == 6
    tasks.release("long")
    first.stop()
    first_thread.join(30)
    assert sorted(ran()) == sorted(["warm", "long", *(f"f{n}" for n in range(6))])
    keys = QueueKeys.of("default")
    assert not get_client().hkeys(keys.failures)  # no lost delivery counted


def test_a_task_that_lost_a_worker_is_taken_alone() -> None:
    keys = QueueKeys.of("default")
    ids = [tasks.record.delay(f"l{n}") for n in range(5)]
    get_client().hset(keys.failures, f"{ids[2]}:lost", 1)  # its last worker died
    worker = Worker(["default"], prefetch=10)
    assert [job.id for job in worker.session.exchange([], 10)] == ids[:2]  # stops before it
    worker = Worker(["default"], prefetch=10)
    assert [job.id for job in worker.session.exchange([], 10)] == [ids[2]]  # then it, alone
    assert [job.id for job in worker.session.exchange([], 10)] == ids[3:]


# -- follow-up tasks ------------------------------------------------------------------------
def _queued(task_name: str, queue: str = "default") -> list[dict]:
    """The messages of ``task_name`` ready on ``queue``."""
    from django_rcoord.queues.messages import decode_message

    keys = QueueKeys.of(queue)
    client = get_client()
    messages = [
        decode_message(client.hget(keys.messages, i)) for i in client.zrange(keys.ready, 0, -1)
    ]
    return [m for m in messages if m and m["task"] == task_name]


def test_follow_ups_are_queued_with_the_end_they_follow_and_a_missing_one_fails_the_run() -> None:
    from django_rcoord.queues.worker.runner import TaskRunner

    runner = TaskRunner("w-1")
    try:
        succeeded_id = tasks.followed.delay(False)
        failed_id = tasks.followed.delay(True)
        missing_id = tasks.follow_up_missing.delay()
        worker = Worker(["default"])
        jobs = {job.id: job for job in worker.session.exchange([], 10)}
        done = [run_job(runner, jobs[succeeded_id]), run_job(runner, jobs[failed_id])]
        assert [item.outcome.kind for item in done] == ["ack", "dead"]
        # Not queued by the run: by the step that records how it ended.
        assert _queued("tests.tasks.note_finished") == []
        worker.session.exchange(done, 0)
        followers = _queued("tests.tasks.note_finished")
        assert sorted(m["args"][0] for m in followers) == sorted([succeeded_id, failed_id])
        missing = run_job(runner, jobs[missing_id]).outcome
        assert missing.kind == "retry"
        assert "on_success follow-up could not be queued" in missing.error
        assert "not_a_task" in missing.error
    finally:
        runner.close()


def test_a_follow_up_reads_the_final_record_of_the_task_it_follows() -> None:
    succeeded_id = tasks.followed.delay(False)
    failed_id = tasks.followed.delay(True)
    assert Worker(["default"], burst=True).run() == 4  # the two, then their follow-ups
    seen = sorted(get_client().lrange("test:followed", 0, -1))
    assert seen == sorted(
        [f"{succeeded_id} SUCCESSFUL:made".encode(), f"{failed_id} FAILED:None".encode()]
    )


def test_a_run_whose_lease_was_lost_queues_no_follow_up() -> None:
    from django_rcoord.queues.worker.runner import TaskRunner

    runner = TaskRunner("w-1")
    try:
        task_id = tasks.followed.delay(False)
        worker = Worker(["default"])
        (job,) = worker.session.exchange([], 1)
        done = run_job(runner, job)
        keys = QueueKeys.of("default")
        get_client().hset(keys.owners, task_id, "another-worker")  # its lease went elsewhere
        worker.session.exchange([done], 0)
        assert _queued("tests.tasks.note_finished") == []  # the other run's end queues it
    finally:
        runner.close()


def test_a_follow_up_in_another_group_is_queued_before_the_end_and_a_unique_one_once() -> None:
    first = tasks.followed_elsewhere.delay()
    assert Worker(["default"], burst=True).run() == 1
    assert [
        m["args"] for m in _queued("tests.tasks.note_finished_elsewhere", "reports/followers")
    ] == [[first]]
    # A unique follow-up keeps its claim in the finish script's step too.
    ids = [tasks.followed_by_a_unique_task.delay() for _ in range(3)]
    worker = Worker(["default"], burst=True, max_tasks=3)
    assert worker.run() == 3
    assert [m["args"] for m in _queued("tests.tasks.unique_note")] == [[ids[0]]]


def test_a_message_over_max_message_bytes_is_refused_at_enqueue() -> None:
    """A clear error where the task is queued, and nothing queued: one 100 MB argument made
    every metrics scrape and the dashboard's look-up page carry it."""
    with override_settings(RCOORD={**settings.RCOORD, "MAX_MESSAGE_BYTES": 1000}):
        with pytest.raises(MessageTooLarge, match="MAX_MESSAGE_BYTES"):
            tasks.record.delay("x" * 1000)
        with pytest.raises(ValueError, match="over RCOORD"):  # a ValueError too
            execute_later("default", "tests.tasks.record", ["x" * 1000], 5)
        assert queue_stats("default") == {"ready": 0, "in_flight": 0, "delayed": 0, "dead": 0}
        assert tasks.record.delay("x" * 100)  # a small one goes
    with override_settings(RCOORD={**settings.RCOORD, "MAX_MESSAGE_BYTES": None}):
        assert tasks.record.delay("x" * 20_000)
