"""RedisTaskBackend: Django's Tasks framework on django-rcoord's queues, with real workers."""

from __future__ import annotations

import asyncio
import datetime
import json
import signal
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.conf import settings
from django.test import override_settings

from django_rcoord.connection import get_client
from django_rcoord.queues import queue_stats
from django_rcoord.queues.backend import RedisTaskBackend
from django_rcoord.queues.checks import check_queue_settings
from django_rcoord.queues.framework import (
    BUILTIN_TASKS,
    DECORATOR_OPTIONS,
    InvalidTaskError,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from django_rcoord.queues.keys import QueueKeys
from django_rcoord.queues.messages import decode_message
from django_rcoord.queues.results import TaskRecord
from django_rcoord.queues.task_class import RedisTask
from django_rcoord.queues.worker import Worker
from tests import framework_tasks, tasks
from tests.procs import wait_until
from tests.test_queues import output_of, result_of, start_worker

pytestmark = pytest.mark.django_db(transaction=True)


def run_all(*queues: str) -> int:
    """A worker in this process, until the queues are empty (for settings overridden here
    and for signals, which are sent in the worker's process)."""
    return Worker(list(queues or ["default"]), burst=True).run()


def run_worker_process(*queues: str) -> str:
    """``manage.py run_email_worker --burst`` in its own process; returns its output."""
    worker = start_worker("--burst", queues=queues or ("default",))
    output = output_of(worker, 60)
    assert worker.returncode == 0, output
    return output


def test_the_backend_says_what_it_supports() -> None:
    backend = task_backends["default"]
    assert isinstance(backend, RedisTaskBackend)
    assert backend.supports_defer
    assert backend.supports_async_task
    assert backend.supports_get_result
    assert backend.supports_priority


def test_a_higher_priority_runs_first_and_equal_priorities_keep_their_order() -> None:
    priorities = [0, -5, 10, 0, 10, 100, -100, -5]
    results = [
        framework_tasks.add.using(priority=priority).enqueue(index, 0)
        for index, priority in enumerate(priorities)
    ]
    run_worker_process()
    by_priority = sorted(range(len(priorities)), key=lambda index: -priorities[index])
    ran = [marker.decode() for marker in get_client().lrange(framework_tasks.RAN, 0, -1)]
    assert ran == [f"add:{index}+0" for index in by_priority]
    for result, priority in zip(results, priorities, strict=True):
        fetched = framework_tasks.add.get_result(result.id)
        assert fetched.status == TaskResultStatus.SUCCESSFUL
        assert fetched.task.priority == priority


def test_a_priority_out_of_range_is_refused_before_anything_is_stored() -> None:
    for bad in (101, -101):
        with pytest.raises(InvalidTaskError):
            framework_tasks.add.using(priority=bad)
    assert queue_stats("default")["ready"] == 0


def test_enqueue_is_ready_then_a_worker_process_makes_it_successful() -> None:
    result = framework_tasks.add.enqueue(2, b=3)
    assert result.status == TaskResultStatus.READY
    assert result.args == [2]
    assert result.kwargs == {"b": 3}
    fetched = framework_tasks.add.get_result(result.id)
    assert fetched.status == TaskResultStatus.READY
    assert fetched.task == framework_tasks.add
    worker = start_worker("--burst")
    output = output_of(worker, 60)
    assert worker.returncode == 0, output
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.attempts == 1
    assert result.worker_ids[0].split(":")[1] == str(worker.pid)
    assert result.enqueued_at is not None
    assert result.started_at is not None
    assert result.finished_at is not None
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.errors == []


def test_a_task_that_raises_is_failed_at_once_with_its_traceback() -> None:
    result = framework_tasks.boom.enqueue("b1")
    run_worker_process()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 1  # no retries unless OPTIONS asks for them
    (error,) = result.errors
    assert error.exception_class_path == "builtins.ValueError"
    assert error.exception_class is ValueError
    assert "b1 went boom" in error.traceback
    assert queue_stats("default")["dead"] == 1


FOLLOWED = {
    "tests.framework_tasks.add": {"on_success": "tests.framework_tasks.note_finished"},
    "tests.framework_tasks.boom": {"on_failure": "tests.tasks.note_finished"},
}


def test_task_options_give_framework_tasks_follow_ups_queued_with_their_end() -> None:
    with override_settings(RCOORD={**settings.RCOORD, "TASK_OPTIONS": FOLLOWED}):
        added = framework_tasks.add.enqueue(2, 3)
        failed = framework_tasks.boom.enqueue("f")
        assert run_all() == 4  # the two, then their follow-ups
    seen = sorted(get_client().lrange("test:followed", 0, -1))
    # A framework follow-up (on its backend, with a result of its own) and a @task one.
    assert seen == sorted([f"{added.id} SUCCESSFUL".encode(), f"{failed.id} FAILED:None".encode()])
    prefix = QueueKeys.of("default").records
    (follow_up_id,) = [
        task_id
        for task_id in (
            key.decode().removeprefix(prefix)
            for key in get_client().scan_iter(match=f"{prefix}*", count=1000)
        )
        if task_id not in (added.id, failed.id)
        and result_of(task_id).task == "tests.framework_tasks.note_finished"
    ]
    result = framework_tasks.note_finished.get_result(follow_up_id)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == f"{added.id} SUCCESSFUL"


def test_a_framework_follow_up_that_names_no_task_fails_the_run() -> None:
    options = {"tests.framework_tasks.add": {"on_success": "tests.nowhere.nothing"}}
    with override_settings(RCOORD={**settings.RCOORD, "TASK_OPTIONS": options}):
        result = framework_tasks.add.enqueue(1, 1)
        run_all()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert "on_success follow-up could not be queued" in result.errors[-1].traceback


def test_options_can_ask_for_retries() -> None:
    tasks_setting = {
        "default": {**settings.TASKS["default"], "OPTIONS": {"MAX_RETRIES": 2}},
    }
    with override_settings(
        TASKS=tasks_setting, RCOORD={**settings.RCOORD, "TASK_RETRY_BACKOFF": 0.01}
    ):
        result = framework_tasks.boom.enqueue("b2")

        def finished_after_a_burst() -> bool:
            # A burst worker returns while the retry waits out its backoff: run it again
            # until then, however long a loaded machine takes (not a fixed number of times).
            run_all()
            return task_backends["default"].get_result(result.id).is_finished

        wait_until(finished_after_a_burst, timeout=30)
        result = task_backends["default"].get_result(result.id)
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 3
    assert len(result.errors) == 3


def test_context_gives_the_result_and_the_attempt() -> None:
    result = framework_tasks.attempt_number.enqueue("c1")
    run_worker_process()
    result.refresh()
    assert result.return_value == {"attempt": 1, "id": result.id, "marker": "c1"}


def test_async_task_functions_are_awaited() -> None:
    result = framework_tasks.add_later.enqueue(20, 22)
    run_worker_process()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    # django-stubs types an async task's return value as its coroutine; it is the awaited value.
    assert result.return_value == 42  # type: ignore[comparison-overlap]


def test_a_worker_killed_mid_task_runs_it_again() -> None:
    result = framework_tasks.sleep_then_return.enqueue(30)  # its first run is killed
    victim = start_worker(lease=1.5, queues=("slow",))
    wait_until(lambda: get_client().llen("test:framework-started") >= 1, timeout=60)
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    rescuer = start_worker(lease=1.5, queues=("slow",))
    try:
        wait_until(lambda: task_backends["default"].get_result(result.id).is_finished, timeout=60)
    finally:
        rescuer.send_signal(signal.SIGTERM)
        output_of(rescuer, 30)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.attempts == 2
    assert result.return_value == "woke"


def test_run_after_waits_in_the_delayed_set_until_the_servers_clock_reaches_it() -> None:
    now_seconds, now_micros = get_client().time()
    server_now = datetime.datetime.fromtimestamp(
        now_seconds + now_micros / 1e6, tz=datetime.timezone.utc
    )
    later = server_now + datetime.timedelta(seconds=60)
    result = framework_tasks.add.using(run_after=later).enqueue(1, 1)
    assert queue_stats("default")["delayed"] == 1
    run_worker_process()
    assert task_backends["default"].get_result(result.id).status == TaskResultStatus.READY
    assert queue_stats("default")["delayed"] == 1
    due_ms = get_client().zscore(QueueKeys.of("default").delayed, result.id)
    assert due_ms == int(later.timestamp() * 1000)  # the due time itself, not a delay
    soon = framework_tasks.add.using(run_after=server_now + datetime.timedelta(seconds=0.3))
    quick = soon.enqueue(2, 2)

    def ran_when_due() -> bool:
        run_worker_process()
        return task_backends["default"].get_result(quick.id).is_finished

    wait_until(ran_when_due, timeout=30)
    assert task_backends["default"].get_result(quick.id).return_value == 4


def test_the_framework_signals_are_sent() -> None:
    seen: list[tuple[str, str]] = []

    def receiver(name: str):
        def receive(sender, task_result, **kwargs):
            seen.append((name, str(task_result.status)))

        return receive

    receivers = {signal: receiver(name) for name, signal in (
        ("enqueued", task_enqueued), ("started", task_started), ("finished", task_finished)
    )}  # fmt: skip
    for signal_, function in receivers.items():
        signal_.connect(function)
    try:
        framework_tasks.add.enqueue(1, 2)
        run_all()
    finally:
        for signal_, function in receivers.items():
            signal_.disconnect(function)
    assert seen == [("enqueued", "READY"), ("started", "RUNNING"), ("finished", "SUCCESSFUL")]


def test_missing_and_foreign_ids_do_not_exist() -> None:
    backend = task_backends["default"]
    own_task_id = tasks.record.delay("not-framework")
    for result_id in ("0" * 32, "nope", "", own_task_id):
        with pytest.raises(TaskResultDoesNotExist):
            backend.get_result(result_id)


def test_queues_are_validated() -> None:
    with pytest.raises(InvalidTaskError):
        framework_tasks.add.using(queue_name="nowhere")


def test_a_worker_runs_only_the_queues_it_watches() -> None:
    slow = framework_tasks.sleep_then_return.enqueue(0)
    quick = framework_tasks.add.enqueue(1, 1)
    run_worker_process("default")
    assert task_backends["default"].get_result(slow.id).status == TaskResultStatus.READY
    assert task_backends["default"].get_result(quick.id).status == TaskResultStatus.SUCCESSFUL
    run_worker_process("slow")
    slow.refresh()
    assert slow.status == TaskResultStatus.SUCCESSFUL
    assert slow.return_value == "woke"
    assert slow.task.queue_name == "slow"


def test_one_worker_runs_both_kinds_of_task() -> None:
    own = tasks.record.delay("own")
    framework = framework_tasks.add.enqueue(3, 4)
    output = run_worker_process()
    assert "stopped after 2 tasks" in output, output
    framework.refresh()
    assert framework.return_value == 7

    assert result_of(own).status == "SUCCESSFUL"


async def test_async_enqueue_and_results() -> None:
    result = await framework_tasks.add.aenqueue(5, 6)
    fetched = await framework_tasks.add.aget_result(result.id)
    assert fetched.status == TaskResultStatus.READY
    with pytest.raises(TaskResultDoesNotExist):
        await task_backends["default"].aget_result("0" * 32)
    await result.arefresh()
    assert result.status == TaskResultStatus.READY


async def test_hundreds_of_async_enqueues_and_reads_in_one_loop() -> None:
    results = await asyncio.gather(*(framework_tasks.add.aenqueue(n, 1) for n in range(300)))
    assert len({result.id for result in results}) == 300
    await sync_to_async(run_all, thread_sensitive=False)()
    fetched = await asyncio.gather(*(framework_tasks.add.aget_result(r.id) for r in results))
    assert [result.status for result in fetched] == [TaskResultStatus.SUCCESSFUL] * 300
    assert [result.return_value for result in fetched] == [n + 1 for n in range(300)]


@pytest.mark.parametrize(
    ("params", "check_id"),
    [
        ({"OPTIONS": {"RETRIES": 1}}, "rcoord.E018"),
        ({"OPTIONS": {"MAX_RETRIES": -1}}, "rcoord.E018"),
        ({"QUEUES": ["bad{name}/", "default"]}, "rcoord.E019"),
        ({"QUEUES": ["reports/pdf", "default"]}, "rcoord.W003"),
    ],
)
def test_backend_checks(params: dict, check_id: str) -> None:
    backend = RedisTaskBackend("checked", {"QUEUES": ["default"], **params})
    assert check_id in [message.id for message in backend.check()]


# -- our options on Django's own decorator --------------------------------------------------
DECORATED = pytest.mark.skipif(
    not DECORATOR_OPTIONS, reason="Django 6.0's task decorator takes no backend options"
)


@DECORATED
def test_a_time_limit_on_djangos_decorator_fails_the_run_in_a_real_worker() -> None:
    from tests import framework_task_options as decorated

    assert isinstance(decorated.sleeps, RedisTask)
    assert dict(decorated.sleeps.options) == {"timeout": 1}
    result = decorated.sleeps.enqueue(5)
    run_worker_process()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert "time limit of 1 s" in result.errors[-1].traceback
    assert get_client().lrange(decorated.RAN, 0, -1) == []  # it never finished


@DECORATED
def test_unique_for_on_djangos_decorator_queues_once_and_runs_once() -> None:
    from tests import framework_task_options as decorated

    first = decorated.once.enqueue("u")
    second = decorated.once.enqueue("u")
    assert second.id == first.id  # the run already queued
    assert run_all() == 1
    assert get_client().lrange(decorated.RAN, 0, -1) == [b"u"]


@DECORATED
def test_retries_on_djangos_decorator_and_settings_over_them() -> None:
    from tests import framework_task_options as decorated

    result = decorated.fails.enqueue("r")
    wait_until(lambda: run_all() >= 0 and decorated.fails.get_result(result.id).is_finished)
    assert decorated.fails.get_result(result.id).attempts == 3  # max_retries=2
    # RCOORD["TASK_OPTIONS"] wins over the decorator, and the check says so.
    options = {"tests.framework_task_options.fails": {"max_retries": 0}}
    with override_settings(RCOORD={**settings.RCOORD, "TASK_OPTIONS": options}):
        again = decorated.fails.enqueue("s")
        run_all()
        assert decorated.fails.get_result(again.id).attempts == 1
        warnings = [m for m in check_queue_settings(settings.RCOORD) if m.id == "rcoord.W005"]
    assert len(warnings) == 1
    assert "max_retries" in warnings[0].msg


@DECORATED
def test_a_misspelt_or_bad_option_on_djangos_decorator_is_an_error_at_definition() -> None:
    with pytest.raises(TypeError, match=r"'timout' is not an option .*known: .*timeout"):

        @task(timout=1)  # type: ignore[call-overload, unused-ignore]
        def misspelt() -> None: ...

    with pytest.raises(ValueError, match="unique_for"):

        @task(unique_for=-5)  # type: ignore[call-overload, unused-ignore]
        def negative() -> None: ...


@DECORATED
def test_a_decorated_task_keeps_its_options_through_using_and_pickling() -> None:
    import pickle

    from tests import framework_task_options as decorated

    moved = decorated.once.using(priority=5, queue_name="email")
    assert isinstance(moved, RedisTask)
    assert (moved.priority, moved.queue_name, dict(moved.options)) == (
        5,
        "email",
        {"unique_for": 60},
    )
    if BUILTIN_TASKS:  # Django's Task pickles by reference; the backport's does not
        assert pickle.loads(pickle.dumps(decorated.once)) == decorated.once


def test_a_finished_result_is_read_with_its_record_parsed_once(monkeypatch) -> None:
    """What a finished task's read through the framework is bound by, its Python (see the
    benchmarks page, Django's Tasks framework): its message decoded once, without
    ``json.loads`` (``JSONDecoder.raw_decode`` reads a compact message), and its
    ``TaskRecord`` made without the frozen dataclass's ``__init__``."""
    task_id = framework_tasks.add.enqueue(2, b=3).id
    run_all()
    calls: list[str] = []

    def counted(name: str, function: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return function(*args, **kwargs)

        return call

    where = "django_rcoord.queues.results.decode_message"
    monkeypatch.setattr(where, counted("decode", decode_message))
    monkeypatch.setattr(json, "loads", counted("json.loads", json.loads))
    monkeypatch.setattr(TaskRecord, "__init__", counted("TaskRecord()", TaskRecord.__init__))
    for read in (framework_tasks.add.get_result, async_to_sync(framework_tasks.add.aget_result)):
        calls.clear()
        result = read(task_id)
        assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 5)
        assert calls == ["decode", "json.loads"]  # json.loads: its return value, 5
