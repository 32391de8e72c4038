"""Unique tasks (``@task(unique_for=..., unique_key=...)``, ``RCOORD["TASK_OPTIONS"]``) and
``cancel``/``acancel``, against real Redis, with real processes for the concurrency claim."""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from django_rcoord.checks import check_settings
from django_rcoord.conf import conf
from django_rcoord.connection import get_client
from django_rcoord.exceptions import TaskCancelled
from django_rcoord.queues import (
    acancel,
    aexecute_later,
    cancel,
    current_task_id,
    dead_letters,
    enqueue_many,
    execute_later,
    get_result,
    queue_stats,
    recover_and_promote,
    requeue_dead,
    stop_requested,
    task,
)
from django_rcoord.queues.framework import TaskResultStatus, task_enqueued
from django_rcoord.queues.keys import QueueKeys
from django_rcoord.queues.metrics import read_metrics
from django_rcoord.queues.outcomes import Kind
from django_rcoord.queues.worker import Worker
from django_rcoord.queues.worker.jobs import Done, Outcome
from tests import framework_tasks, tasks
from tests.procs import run_in_processes, server_ms, wait_until, within_a_window
from tests.test_queues import log_of, output_of, start_worker, take

pytestmark = pytest.mark.django_db(transaction=True)

RAN = "test:unique-ran"
EMPTY = {"ready": 0, "in_flight": 0, "delayed": 0, "dead": 0}
KEYS = QueueKeys.of("default")


@task(name="tests.unique.record", unique_for=30)
def unique_record(marker: str, *, colour: str = "", size: int = 0) -> None:
    get_client().rpush(RAN, marker)


def user_of(user_id: int, note: str = "") -> str:
    return str(user_id)


@task(name="tests.unique.per_user", unique_for=30, unique_key=user_of)
def per_user(user_id: int, note: str = "") -> None:
    get_client().rpush(RAN, f"{user_id}:{note}")


@task(name="tests.unique.short", unique_for=2)
def unique_short(marker: str) -> None:
    get_client().rpush(RAN, marker)


@task(name="tests.unique.by_text", unique_for=30, unique_key=lambda text: text)
def by_text(text: str) -> None:
    pass


@task(name="tests.unique.plain")
def plain(marker: str) -> None:
    get_client().rpush(RAN, marker)


def ran() -> list[str]:
    return [marker.decode() for marker in get_client().lrange(RAN, 0, -1)]


def claim_ends_ms() -> int:
    """When the one unique claim of the default group ends, in ms of the server's clock."""
    (value,) = [
        value
        for field, value in get_client().hgetall(KEYS.results).items()
        if field.startswith(b"u:")
    ]
    return int(value.decode().split("|")[1])


def wait_for_the_claim_to_end() -> None:
    """Until the server's clock is past the claim's end (unique_for is a safety net that
    the server's clock ends, not a sleep of the test's)."""
    ends = claim_ends_ms()
    wait_until(lambda: server_ms() > ends, timeout=10)


def claims() -> dict[str, str]:
    """The unique claims of the default group: field -> holder's id."""
    fields = get_client().hgetall(KEYS.results)
    return {
        field.decode(): value.decode().split("|")[0]
        for field, value in fields.items()
        if field.startswith(b"u:")
    }


def finish(worker: Worker, job: Any, kind: Kind, delay_ms: int = 0) -> bool:
    outcome = Outcome(kind, "tests", "Boom", "builtins.ValueError", delay_ms=delay_ms)
    return worker.session.finish(Done(job, outcome, 0.0))


# -- uniqueness --------------------------------------------------------------------------
def test_queueing_a_unique_task_again_returns_the_queued_tasks_id() -> None:
    first = unique_record.delay("a", colour="red", size=1)
    assert unique_record.delay("a", size=1, colour="red") == first  # kwargs in any order
    assert unique_record.schedule("a", colour="red", size=1, delay=60) == first
    assert execute_later("default", "tests.unique.record", ["a"]) != first  # other kwargs
    other = unique_record.delay("b")
    ids = enqueue_many(
        [(unique_record, ("c",), {}), (unique_record, ("c",), {}), (unique_record, ("b",), {})]
    )
    assert ids[0] == ids[1] != other
    assert ids[2] == other
    assert execute_later("default", "tests.unique.record", ["c"]) == ids[0]
    assert queue_stats("default") == {**EMPTY, "ready": 4}
    # A plain task is never deduplicated.
    assert plain.delay("p") != plain.delay("p")
    assert len(claims()) == 4
    assert "unique_for=30" in repr(unique_record)


def test_a_delayed_unique_task_is_unique_too_and_its_key_function_decides_sameness() -> None:
    later = per_user.schedule(7, "first", delay=60)
    assert per_user.delay(7, "second") == later  # same user: same task
    assert per_user.delay(8, "other") != later
    assert queue_stats("default") == {**EMPTY, "ready": 1, "delayed": 1}
    with pytest.raises(TypeError, match="must return a str"):
        task(name="tests.unique.bad_key", unique_for=5, unique_key=lambda x: x)(
            plain.function
        ).delay(3)
    bad_values: tuple[Any, ...] = (0, -1, True, "5", float("nan"), 10**9)
    for bad in bad_values:
        with pytest.raises(ValueError, match="unique_for"):
            task(unique_for=bad)
    with pytest.raises(ValueError, match="unique_key needs unique_for"):
        task(unique_key=user_of)
    with pytest.raises(TypeError, match="callable"):
        task(unique_for=1, unique_key="tests.x")  # type: ignore[arg-type]


def _enqueue_together(process: int, processes: int, markers: int) -> list[tuple[str, str]]:
    """In its own process: wait until ``processes`` processes are here, then queue the unique
    task for every marker, in an order of its own; (marker, id) pairs."""
    client = get_client()
    client.incr("test:unique-arrived")
    while int(client.get("test:unique-arrived")) < processes:
        time.sleep(0.001)
    order = [f"m{index}" for index in range(markers)] * 3
    random.Random(process).shuffle(order)
    return [(marker, unique_record.delay(marker)) for marker in order]


def test_exactly_one_is_queued_when_many_processes_queue_the_same_tasks_at_once() -> None:
    processes, markers = 4, 40
    results = run_in_processes(
        _enqueue_together, [(process, processes, markers) for process in range(processes)]
    )
    by_marker: dict[str, set[str]] = {}
    for pairs in results:
        for marker, task_id in pairs:
            by_marker.setdefault(marker, set()).add(task_id)
    assert len(by_marker) == markers
    assert all(len(ids) == 1 for ids in by_marker.values()), by_marker
    assert queue_stats("default") == {**EMPTY, "ready": markers}
    assert get_client().hlen(KEYS.messages) == markers
    Worker(["default"], burst=True).run()
    assert sorted(ran()) == sorted(by_marker)


async def test_hundreds_of_concurrent_adelay_in_one_loop_queue_one_task() -> None:
    ids = await asyncio.gather(*(unique_record.adelay("same") for _ in range(300)))
    assert len(set(ids)) == 1
    assert (
        len(set(await asyncio.gather(*(unique_record.adelay(f"m{n % 7}") for n in range(300)))))
        == 7
    )
    assert await unique_record.aschedule("same", delay=30) == ids[0]
    assert await aexecute_later("default", "tests.unique.record", ["same"]) == ids[0]
    assert queue_stats("default") == {**EMPTY, "ready": 8}
    assert await acancel(ids[0])
    assert not await acancel(ids[0])
    assert await unique_record.adelay("same") != ids[0]


def test_the_claim_is_dropped_when_the_task_is_acknowledged() -> None:
    first = unique_record.delay("a")
    worker = Worker(["default"])
    job = take(worker)
    assert unique_record.delay("a") == first  # running: still unique
    assert finish(worker, job, Kind.ACK)
    assert claims() == {}
    again = unique_record.delay("a")
    assert again != first
    Worker(["default"], burst=True).run()
    assert ran() == ["a"]


def test_a_retried_task_stays_unique_and_its_dead_letter_drops_the_claim() -> None:
    first = unique_record.delay("r")
    worker = Worker(["default"])
    assert finish(worker, take(worker), Kind.RETRY, delay_ms=60_000)
    assert queue_stats("default") == {**EMPTY, "delayed": 1}
    assert unique_record.delay("r") == first
    get_client().zadd(KEYS.delayed, {first: 0})  # due now
    recover_and_promote(KEYS)
    assert finish(worker, take(worker), Kind.DEAD)
    assert [letter["id"] for letter in dead_letters("default")] == [first]
    assert claims() == {}
    assert unique_record.delay("r") != first


def dead_unique(marker: str, task: Any = None) -> str:
    """A unique task's run made a dead letter (its claim dropped); its id."""
    task_id = (task or unique_record).delay(marker)
    worker = Worker(["default"])
    job = take(worker)
    assert job.id == task_id
    assert finish(worker, job, Kind.DEAD)
    assert task_id not in claims().values()
    return task_id


def test_a_requeued_dead_letter_takes_its_claim_back() -> None:
    first = dead_unique("d")
    assert requeue_dead("default") == 1
    assert claims() == {next(iter(claims())): first}
    # Ready again: queueing it again queues nothing and answers its id, from any producer.
    assert unique_record.delay("d") == first
    assert execute_later("default", "tests.unique.record", ["d"]) == first
    worker = Worker(["default"])
    job = take(worker)
    assert job.id == first
    assert unique_record.delay("d") == first  # running
    assert finish(worker, job, Kind.ACK)
    assert claims() == {}
    again = unique_record.delay("d")
    assert again != first  # it ended: a new run is queued
    assert cancel(again)
    # One dead letter requeued by id takes its claim back too.
    other = dead_unique("e")
    assert requeue_dead("default", other) == 1
    assert unique_record.delay("e") == other


def test_a_requeued_dead_letters_claim_lasts_unique_for_from_the_requeue() -> None:
    # The claim stands for unique_for (2 s): a try stalled past it is run again.
    within_a_window(requeued_claim, "s", window_ms=2000)


def requeued_claim(marker: str) -> None:
    get_client().flushdb()  # a try from scratch
    first = dead_unique(marker, unique_short)
    asked = server_ms()
    assert requeue_dead("default", first) == 1
    answered = server_ms()
    # The claim is taken back for unique_for counted from the requeue (not from the first
    # enqueue, which came before ``asked``), on the server's clock.
    assert asked + 2000 <= claim_ends_ms() <= answered + 2000
    assert unique_short.delay(marker) == first
    wait_for_the_claim_to_end()
    assert unique_short.delay(marker) != first  # the safety net ends the new claim too


def test_a_requeued_dead_letter_leaves_the_claim_to_a_run_that_holds_it() -> None:
    first = dead_unique("h")
    second = unique_record.delay("h")  # queued while the first was dead: it holds the claim
    assert second != first
    assert requeue_dead("default") == 1  # requeued all the same: an operator asked for it
    assert set(claims().values()) == {second}
    assert unique_record.delay("h") == second
    worker = Worker(["default"])
    runs = [take(worker), take(worker)]
    assert {job.id for job in runs} == {first, second}
    # The requeued run ending leaves the other's claim alone.
    (requeued,) = [job for job in runs if job.id == first]
    assert finish(worker, requeued, Kind.ACK)
    assert set(claims().values()) == {second}
    assert unique_record.delay("h") == second
    (holder,) = [job for job in runs if job.id == second]
    assert finish(worker, holder, Kind.ACK)
    assert claims() == {}


def test_a_task_made_a_dead_letter_by_recovery_drops_its_claim() -> None:
    with override_settings(RCOORD={**settings.RCOORD, "TASK_MAX_DELIVERIES": 1}):
        first = unique_record.delay("k")
        take(Worker(["default"], lease=0.05))  # its worker dies
        time.sleep(0.1)
        assert recover_and_promote(KEYS) == (0, 0, None)
    assert queue_stats("default") == {**EMPTY, "dead": 1}
    assert claims() == {}
    assert unique_record.delay("k") != first


def test_a_claim_ends_after_unique_for_and_a_later_task_keeps_its_own() -> None:
    # Each claim stands for unique_for (2 s): a try stalled past it is run again.
    within_a_window(claims_end_on_time, "t", window_ms=2000)


def claims_end_on_time(marker: str) -> None:
    get_client().flushdb()  # a try from scratch
    first = unique_short.delay(marker)
    assert unique_short.delay(marker) == first
    wait_for_the_claim_to_end()
    second = unique_short.delay(marker)
    assert second != first
    assert queue_stats("default") == {**EMPTY, "ready": 2}
    worker = Worker(["default"])
    job = take(worker)
    assert job.id == first
    assert finish(worker, job, Kind.ACK)  # the first task ends: the second's claim stays
    assert unique_short.delay(marker) == second


def test_claims_are_hashed_so_user_data_cannot_reach_other_keys() -> None:
    before = set(get_client().scan_iter(count=1000))
    hostile = ["}{rcoord:lock:{x}:owner", "u:" + "0" * 64, "a|b", "\x00\xff" * 500, ""]
    ids = [by_text.delay(text) for text in hostile]
    ids += [unique_record.delay(text) for text in hostile]
    assert len(set(ids)) == len(ids)
    fields = claims()
    assert len(fields) == len(ids)
    assert all(len(field) == 66 and set(field[2:]) <= set("0123456789abcdef") for field in fields)
    # Only the default group's own keys exist (one hash tag), none named by the data.
    new_keys = {key.decode() for key in set(get_client().scan_iter(count=1000)) - before}
    queue_keys = {key for key in new_keys if not key.startswith("rcoord:queues:{registry}:")}
    assert queue_keys == {KEYS.messages, KEYS.queues, KEYS.ready, KEYS.results}
    # The same text in two tasks is two claims.
    assert len({json.loads(get_client().hget(KEYS.messages, i))["unique"] for i in ids}) == len(ids)


# -- cancel ------------------------------------------------------------------------------
def test_cancel_a_queued_task() -> None:
    first = unique_record.delay("c", colour="blue")
    assert cancel(first) is True
    assert queue_stats("default") == EMPTY
    record = get_result(first)
    assert record is not None
    assert record.status == "CANCELLED"
    assert record.is_finished
    assert record.args == ["c"]
    assert record.kwargs == {"colour": "blue"}
    assert record.finished_at is not None
    assert cancel(first) is False  # already cancelled
    assert claims() == {}
    assert unique_record.delay("c", colour="blue") != first
    Worker(["default"], burst=True).run()
    assert ran() == ["c"]  # only the second


def test_cancel_a_delayed_task_and_a_retry_waiting_for_its_time() -> None:
    later = plain.schedule("later", delay=60)
    retried = plain.delay("retried")
    worker = Worker(["default"])
    assert finish(worker, take(worker), Kind.RETRY, delay_ms=60_000)
    assert queue_stats("default") == {**EMPTY, "delayed": 2}
    assert cancel(later)
    assert cancel(retried)
    assert queue_stats("default") == EMPTY
    record = get_result(retried)
    assert record is not None
    assert record.status == "CANCELLED"
    assert record.attempts == 1
    assert len(record.errors) == 1


def test_a_running_finished_dead_or_unknown_task_is_not_cancelled() -> None:
    running = unique_record.delay("run")
    worker = Worker(["default"])
    job = take(worker)
    assert cancel(running) is False
    assert get_result(running).status == "RUNNING"  # type: ignore[union-attr]
    assert finish(worker, job, Kind.ACK)
    assert cancel(running) is False
    assert get_result(running).status == "SUCCESSFUL"  # type: ignore[union-attr]
    dead = plain.delay("dead")
    assert finish(worker, take(worker), Kind.DEAD)
    assert cancel(dead) is False
    assert queue_stats("default") == {**EMPTY, "dead": 1}
    for unknown in ("0" * 32, "not an id", "reports/" + "f" * 32):
        assert cancel(unknown) is False


async def test_acancel_leaves_a_running_task_alone() -> None:
    queued = await plain.adelay("q")
    assert await acancel(queued)
    record = get_result(queued)
    assert record is not None
    assert record.status == "CANCELLED"
    assert not await acancel("no such task")


# -- Django's Tasks framework -------------------------------------------------------------
UNIQUE_ADD = {
    "tests.framework_tasks.add": {"unique_for": 30},
    "tests.framework_tasks.attempt_number": {
        "unique_for": 30,
        "unique_key": "tests.test_unique_cancel.user_of",
    },
}


def test_framework_tasks_are_unique_by_task_options() -> None:
    sent: list[str] = []

    def on_enqueued(sender: Any, task_result: Any, **kwargs: Any) -> None:
        sent.append(task_result.id)

    task_enqueued.connect(on_enqueued)
    try:
        with override_settings(RCOORD={**settings.RCOORD, "TASK_OPTIONS": UNIQUE_ADD}):
            first = framework_tasks.add.enqueue(1, 2)
            assert framework_tasks.add.enqueue(1, 2).id == first.id
            assert framework_tasks.add.enqueue(2, 2).id != first.id
            keyed = framework_tasks.attempt_number.enqueue("5")
            assert framework_tasks.attempt_number.enqueue("5").id == keyed.id
            assert sent == [first.id, sent[1], keyed.id]  # no signal for a duplicate
            Worker(["default"], burst=True).run()
            assert framework_tasks.add.get_result(first.id).status == TaskResultStatus.SUCCESSFUL
            assert framework_tasks.add.enqueue(1, 2).id != first.id
        # Without the option, the same call queues again.
        assert framework_tasks.add.enqueue(9, 9).id != framework_tasks.add.enqueue(9, 9).id
    finally:
        task_enqueued.disconnect(on_enqueued)


async def test_a_cancelled_framework_task_reads_failed_with_a_taskcancelled_error() -> None:
    with override_settings(RCOORD={**settings.RCOORD, "TASK_OPTIONS": UNIQUE_ADD}):
        result = await framework_tasks.add.aenqueue(3, 4)
        assert (await framework_tasks.add.aenqueue(3, 4)).id == result.id
        assert await acancel(result.id)
        fetched = await framework_tasks.add.aget_result(result.id)
        assert fetched.status == TaskResultStatus.FAILED
        assert fetched.errors[-1].exception_class is TaskCancelled
        assert (await framework_tasks.add.aenqueue(3, 4)).id != result.id


@pytest.mark.parametrize(
    "options",
    [
        ["tests.framework_tasks.add"],
        {"tests.framework_tasks.add": 30},
        {"": {"unique_for": 30}},
        {"tests.framework_tasks.add": {"unique_fr": 30}},
        {"tests.framework_tasks.add": {"unique_for": 0}},
        {"tests.framework_tasks.add": {"unique_for": "300"}},
        {"tests.framework_tasks.add": {"unique_for": 30, "unique_key": "tests.nowhere.key"}},
        {"tests.framework_tasks.add": {"unique_key": "tests.test_unique_cancel.user_of"}},
        {"tests.framework_tasks.add": {"on_success": 3}},
        {"tests.framework_tasks.add": {"on_failure": ""}},
    ],
)
def test_bad_task_options_are_check_errors(options: Any) -> None:
    with override_settings(RCOORD={**settings.RCOORD, "TASK_OPTIONS": options}):
        messages = check_settings()
    assert [message.id for message in messages] == ["rcoord.E033"], messages
    assert "TASK_OPTIONS" in messages[0].msg
    assert messages[0].hint


def test_good_task_options_pass_the_checks() -> None:
    good = {
        **UNIQUE_ADD,
        "tests.framework_tasks.boom": {"unique_for": 1, "unique_key": user_of},
        "tests.framework_tasks.add_later": {"on_success": "tests.tasks.note_finished"},
    }
    with override_settings(RCOORD={**settings.RCOORD, "TASK_OPTIONS": good}):
        assert check_settings() == []


def test_cancel_asks_a_running_task_to_stop_and_its_code_sees_it() -> None:
    task_id = tasks.stop_when_asked.delay("long")
    worker = start_worker("--burst")
    wait_until(lambda: get_client().llen("test:started") == 1, timeout=30)
    assert get_client().lindex("test:started", 0) == f"long:{task_id}".encode()
    assert not stop_requested(task_id)
    assert cancel(task_id) is False  # running: not cancelled, asked to stop
    assert stop_requested(task_id)
    output = output_of(worker, 60)
    assert worker.returncode == 0, output
    record = get_result(task_id)
    assert record is not None
    assert (record.status, record.return_value) == ("SUCCESSFUL", "stopped early")
    assert current_task_id() is None  # outside a task


# -- stopping a running task --------------------------------------------------------------
def stop_check() -> float:
    """Seconds between a worker's checks for stop requests (the settings' default here)."""
    value = conf.TASK_STOP_CHECK
    assert value is not None
    return float(value)


def started_ids() -> list[str]:
    return [entry.decode() for entry in get_client().lrange("test:started", 0, -1)]


def cancel_when_started(task_id: str) -> float:
    """Cancel ``task_id`` once it runs; how many seconds its record then took to read
    FAILED (the latency from cancel() to the stop)."""
    wait_until(lambda: get_client().llen("test:started") == 1, timeout=30)
    assert task_id in started_ids()[0]
    asked = time.monotonic()
    assert cancel(task_id) is False  # running: asked to stop
    wait_until(lambda: get_result(task_id).status == "FAILED", timeout=15)  # type: ignore[union-attr]
    return time.monotonic() - asked


def assert_stopped_and_finished(task_id: str, latency: float) -> None:
    # Seen at the worker's next check: within stop_check(), with 5 s for a stalled worker
    # (a request left unseen would end with the task, 30 s on).
    assert latency < stop_check() + 5, latency
    record = get_result(task_id)
    assert record is not None
    assert record.status == "FAILED"
    assert record.is_finished
    assert record.attempts == 1  # not retried (max_retries=3)
    assert record.errors[-1]["exception_class_path"] == "django_rcoord.exceptions.TaskCancelled"
    assert "cancel() asked it to stop" in record.errors[-1]["traceback"]
    assert dead_letters("default") == []  # finished, not a dead letter
    assert not stop_requested(task_id)  # the request is done with
    metrics = read_metrics(KEYS.group)
    assert metrics.cancelled == {("default", record.task): 1}


def test_cancel_stops_a_running_async_task_and_the_worker_runs_the_next() -> None:
    task_id = tasks.sleep_until_cancelled.delay("async")
    after = tasks.record.delay("after")
    worker = start_worker("--burst")
    latency = cancel_when_started(task_id)
    output = output_of(worker, 60)
    assert worker.returncode == 0, output
    assert_stopped_and_finished(task_id, latency)
    assert [m.decode() for m in get_client().lrange("test:cleaned", 0, -1)] == ["async"]
    assert tasks_ran() == ["after"]  # the next task ran; the sleeper did not end
    assert get_result(after).status == "SUCCESSFUL"  # type: ignore[union-attr]
    assert get_client().lrange("test:followed", 0, -1) == []  # no on_failure follow-up
    assert queue_stats("default") == EMPTY
    assert f"task {task_id} tests.tasks.sleep_until_cancelled was stopped" in output


def test_cancel_kills_a_running_sync_task_in_its_child_process() -> None:
    task_id = tasks.sleep_long.delay("sync")
    after = tasks.record_pid.delay("after")
    worker = start_worker("--burst", "--isolation", "process")
    latency = cancel_when_started(task_id)
    output = output_of(worker, 60)
    assert worker.returncode == 0, output
    assert_stopped_and_finished(task_id, latency)
    killed_pid = int(started_ids()[0].rsplit(":", 1)[1])
    assert tasks_ran() == ["after"]
    record = get_result(after)
    assert record is not None
    assert record.status == "SUCCESSFUL"
    assert record.return_value not in (killed_pid, worker.pid)  # a new child ran it
    assert get_client().lrange("test:followed", 0, -1) == []
    assert queue_stats("default") == EMPTY


def test_a_sync_task_run_inline_is_not_interrupted_and_only_sees_the_flag() -> None:
    # It runs until released: the worker sees the request (TASK_STOP_CHECK) while it runs.
    task_id = tasks.record_when_released.delay("inline")
    worker = start_worker("--burst")
    wait_until(lambda: get_client().llen("test:started") == 1, timeout=30)
    assert cancel(task_id) is False
    assert stop_requested(task_id)
    wait_until(lambda: "cannot be interrupted" in log_of(worker), timeout=30)
    tasks.release("inline")
    output = output_of(worker, 60)
    assert worker.returncode == 0, output
    assert "a sync task run inline cannot be interrupted" in output
    assert tasks_ran() == ["inline"]  # it ran to its end
    assert get_result(task_id).status == "SUCCESSFUL"  # type: ignore[union-attr]


def tasks_ran() -> list[str]:
    return [marker.decode() for marker in get_client().lrange(tasks.RAN, 0, -1)]
