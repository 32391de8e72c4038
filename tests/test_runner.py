"""The worker's task runner knows no Redis: every outcome, with Redis unreachable."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from django_rcoord.embedded.server import free_port
from django_rcoord.queues import task
from django_rcoord.queues.keys import QueueKeys
from django_rcoord.queues.messages import encode_message
from django_rcoord.queues.worker.isolation import ProcessTaskRunner
from django_rcoord.queues.worker.jobs import Done, Job
from django_rcoord.queues.worker.resolve import resolve
from django_rcoord.queues.worker.runner import TaskRunner
from tests import tasks as project_tasks
from tests.conftest import use_redis_at

pytestmark = pytest.mark.django_db
assert project_tasks.add_numbers.name == "tests.tasks.add_numbers"  # registered by the import


@task(name="tests.runner.double")
async def double(number: int) -> int:
    return number * 2


@task(name="tests.runner.fail", max_retries=2)
def fail(message: str) -> None:
    raise ValueError(message)


@pytest.fixture(autouse=True)
def _no_redis() -> Iterator[None]:
    """Every Redis call would fail: nothing may connect while a runner runs a task."""
    with use_redis_at(f"redis://127.0.0.1:{free_port()}/0"):
        yield


def job(name: str, *args: object, failures: int = 0, raw: bytes | None = None) -> Job:
    body = raw if raw is not None else encode_message(name, "default", args, {})[1].encode()
    return Job("t-1", body, QueueKeys.of("default"), failures, "RUNNING|1|1||w-1")


def message(name: str, **fields: object) -> bytes:
    return json.dumps({"task": name, "queue": "default", **fields}).encode()


def run_job(runner: TaskRunner | ProcessTaskRunner, job: Job) -> Done:
    """What the worker does with a job it took: resolve it once, then run it."""
    return runner.run(job, resolve(job))


@pytest.fixture
def runner() -> Iterator[TaskRunner]:
    runner = TaskRunner("w-1")
    yield runner
    runner.close()


def test_a_task_that_returns_is_acknowledged_with_its_value_as_json(runner: TaskRunner) -> None:
    done = run_job(runner, job("tests.tasks.add_numbers", 2, 3))
    assert done.outcome.kind == "ack"
    assert json.loads(done.outcome.value_json) == {"sum": 5, "on": "2026-11-23"}
    assert done.took_ms >= 0


def test_an_async_task_is_awaited_on_the_runners_own_loop(runner: TaskRunner) -> None:
    assert run_job(runner, job("tests.runner.double", 21)).outcome.value_json == "42"
    assert run_job(runner, job("tests.runner.double", 4)).outcome.value_json == "8"  # same loop


def test_a_failure_is_retried_with_backoff_until_its_retries_are_spent(
    runner: TaskRunner,
) -> None:
    first = run_job(runner, job("tests.runner.fail", "boom")).outcome
    assert (first.kind, first.error_class) == ("retry", "builtins.ValueError")
    assert "ValueError: boom" in first.error
    assert isinstance(first.exception, ValueError)
    later = run_job(runner, job("tests.runner.fail", "boom", failures=1)).outcome
    assert later.kind == "retry"
    assert later.delay_ms == 2 * first.delay_ms > 0
    assert run_job(runner, job("tests.runner.fail", "boom", failures=2)).outcome.kind == "dead"


def test_system_exit_fails_the_task_not_the_runner(runner: TaskRunner) -> None:
    outcome = run_job(runner, job("tests.tasks.exit_the_process")).outcome
    assert (outcome.kind, outcome.error_class) == ("dead", "builtins.SystemExit")


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"not json", "undecodable message"),
        (message("tests.tasks.add_numbers", args=[1]), "does not accept"),
        (message("tests.tasks.add_numbers", args={}), "JSON list"),
        (message("tests.tasks.return_unstorable"), "cannot be stored as JSON"),
    ],
    ids=["undecodable", "wrong arguments", "args not a list", "unstorable return value"],
)
def test_what_cannot_run_anywhere_is_dead_at_once(
    runner: TaskRunner, body: bytes, reason: str
) -> None:
    outcome = run_job(runner, job("", raw=body)).outcome
    assert outcome.kind == "dead"
    assert reason in outcome.error


def test_an_unknown_task_is_deferred_for_a_worker_that_knows_it(runner: TaskRunner) -> None:
    outcome = run_job(runner, job("tests.runner.not_in_this_release")).outcome
    assert outcome.kind == "defer"
    assert "not registered here" in outcome.error
    assert "worker w-1" in outcome.error
    assert outcome.delay_ms > 0


# -- per-task options: time limits, retry waits ---------------------------------------------
@task(name="tests.runner.slow_async", timeout=0.2, max_retries=1)
async def slow_async() -> None:
    await asyncio.sleep(5)


@task(name="tests.runner.slow_sync", timeout=0.2, max_retries=0)
def slow_sync() -> None:
    time.sleep(5)


@task(name="tests.runner.sleepy")
def sleepy(seconds: float) -> str:
    """No time limit of its own: the default applies."""
    time.sleep(seconds)
    return "done"


@task(name="tests.runner.slow_unlimited", timeout=0)
def slow_unlimited(seconds: float) -> str:
    time.sleep(seconds)
    return "done"


@task(name="tests.runner.shaped", max_retries=5, retry_backoff=2, retry_backoff_max=5)
def shaped() -> None:
    raise ValueError("always")


@task(name="tests.runner.jittered", max_retries=5, retry_backoff=10, retry_jitter=0.5)
def jittered() -> None:
    raise ValueError("always")


def test_an_async_task_is_cancelled_at_its_time_limit_and_retried(runner: TaskRunner) -> None:
    started = time.monotonic()
    outcome = run_job(runner, job("tests.runner.slow_async")).outcome
    assert time.monotonic() - started < 4.5  # its 0.2 s limit, not its 5 s sleep
    assert (outcome.kind, outcome.error_class) == (
        "retry",
        "django_rcoord.exceptions.TaskTimeLimitExceeded",
    )
    assert "time limit of 0.2 s" in outcome.error


def test_a_sync_task_in_the_main_thread_is_stopped_at_its_time_limit(
    runner: TaskRunner,
) -> None:
    started = time.monotonic()
    outcome = run_job(runner, job("tests.runner.slow_sync")).outcome
    assert time.monotonic() - started < 4.5  # its 0.2 s limit, not its 5 s sleep
    assert (outcome.kind, outcome.error_class) == (
        "dead",
        "django_rcoord.exceptions.TaskTimeLimitExceeded",
    )
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # the timer is disarmed


def test_the_default_time_limit_applies_unless_a_task_says_none(
    runner: TaskRunner, settings: Any
) -> None:
    settings.RCOORD = {**settings.RCOORD, "TASK_TIMEOUT": 1}
    assert run_job(runner, job("tests.tasks.add_numbers", 1, 2)).outcome.kind == "ack"
    # A task with no limit of its own is stopped at the default (well before its 10 s)...
    limited = run_job(runner, job("tests.runner.sleepy", 10)).outcome
    assert limited.error_class == "django_rcoord.exceptions.TaskTimeLimitExceeded"
    assert "time limit of 1 s" in limited.error
    # ...and one that says it has none runs past it.
    assert run_job(runner, job("tests.runner.slow_unlimited", 1.5)).outcome.value_json == '"done"'


def test_retry_waits_follow_the_tasks_own_backoff(runner: TaskRunner) -> None:
    delays = [
        run_job(runner, job("tests.runner.shaped", failures=n)).outcome.delay_ms for n in range(4)
    ]
    assert delays == [2000, 4000, 5000, 5000]  # doubling from 2 s, capped at 5 s


def test_jitter_shortens_each_wait_by_a_random_share(runner: TaskRunner) -> None:
    delays = {run_job(runner, job("tests.runner.jittered")).outcome.delay_ms for _ in range(20)}
    assert all(5000 <= delay <= 10000 for delay in delays)
    assert len(delays) > 1


def test_bad_options_fail_at_import_time() -> None:
    with pytest.raises(ValueError, match="timeout"):
        task(name="tests.runner.bad_timeout", timeout=-1)
    with pytest.raises(ValueError, match="retry_jitter"):
        task(name="tests.runner.bad_jitter", retry_jitter=2)
    with pytest.raises(ValueError, match="max_retries"):
        task(name="tests.runner.bad_retries", max_retries=-1)
