"""A worker that stops only when told: errors injected into a real worker on a real Redis.

Each test here failed before the fix it names (issue "Production's faults"): the error is
injected where production meets it (a receiver of the project's that raises, a heartbeat
that fails mid-batch, a reply lost after its script ran, a final exchange refused with OOM).
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from typing import Any

import pytest
import redis
from django.conf import settings
from django.test import override_settings

from django_rcoord.connection import get_client
from django_rcoord.embedded.server import free_port
from django_rcoord.queues import (
    dead_letters,
    enqueue_many,
    execute_later,
    queue_stats,
    recover_and_promote,
    task,
)
from django_rcoord.queues.keys import QueueKeys
from django_rcoord.queues.worker import Worker
from django_rcoord.queues.worker import session as worker_module
from django_rcoord.renewal import keep_alive, schedule
from tests import framework_tasks, tasks
from tests.procs import wait_until
from tests.test_queues import output_of, ran, result_of, start_worker

pytestmark = pytest.mark.django_db(transaction=True)


@task(queue="default")
def interrupt() -> None:
    raise KeyboardInterrupt


def lost_deliveries(queue: str = "default") -> list[bytes]:
    return [field for field in get_client().hkeys(QueueKeys.of(queue).failures) if b":" in field]


def taking(args: list[Any]) -> bool:
    """Whether a task_finish call asks for tasks (its first argument: the call, JSON)."""
    return bool(json.loads(args[0])["take"])


def keeper_alive(worker: Worker) -> bool:
    """Whether the worker's keeper is still a job of the process's renewer."""
    return worker.keeper.alive


# -- errors of the project's code --------------------------------------------------------
def test_receivers_that_raise_fail_nothing_and_stop_no_worker() -> None:
    added = framework_tasks.add.enqueue(1, 2)
    failing = framework_tasks.boom.enqueue("r1")
    own = tasks.record.delay("own")
    worker = start_worker("--burst", env={"RCOORD_TEST_BROKEN_RECEIVERS": "1"})
    output = output_of(worker, 60)
    assert worker.returncode == 0, output
    added.refresh()
    assert added.status.name == "SUCCESSFUL"
    assert added.return_value == 3
    failing.refresh()
    assert failing.status.name == "FAILED"
    assert result_of(own).status == "SUCCESSFUL"
    # Each ran once: acknowledged although the task_finished receiver raised.
    assert get_client().lrange(framework_tasks.RAN, 0, -1) == [b"add:1+2"]
    assert ran() == ["own"]
    assert "a receiver of task_started" in output
    assert "a receiver of task_finished" in output
    assert queue_stats("default") == {"ready": 0, "in_flight": 0, "delayed": 0, "dead": 1}


def test_a_task_only_a_newer_release_knows_waits_for_it() -> None:
    task_id = execute_later("default", "tests.tasks.added_in_new_release", ["new"])
    old = start_worker("--burst")
    output = output_of(old, 60)
    assert old.returncode == 0, output
    assert f"task {task_id} tests.tasks.added_in_new_release cannot run here" in output
    assert "delivery 1 of 5" in output
    assert queue_stats("default") == {"ready": 0, "in_flight": 0, "delayed": 1, "dead": 0}
    time.sleep(0.2)  # its delay (TASK_RETRY_BACKOFF in the test settings: 0.05 s)
    new = start_worker("--burst", env={"RCOORD_TEST_NEW_RELEASE": "1"})
    output = output_of(new, 60)
    assert new.returncode == 0, output
    assert ran() == ["new"]
    assert result_of(task_id).status == "SUCCESSFUL"
    assert dead_letters("default") == []


def test_a_task_nobody_knows_is_dead_after_max_deliveries() -> None:
    task_id = execute_later("default", "no.release.has.it", [])
    with override_settings(RCOORD={**settings.RCOORD, "TASK_MAX_DELIVERIES": 3}):
        for _ in range(50):
            Worker(["default"], burst=True).run()
            if dead_letters("default"):
                break
            time.sleep(0.05)
    (letter,) = dead_letters("default")
    assert "no worker could run it in 3 deliveries" in letter["error"]
    assert len(result_of(task_id).worker_ids) == 3
    # The deferrals were not failed attempts: only the last delivery, which made it dead.
    assert get_client().hget(QueueKeys.of("default").failures, task_id) == b"1"


# -- Redis errors mid-batch ----------------------------------------------------------------
@pytest.mark.parametrize(
    "error",
    [
        redis.ConnectionError("connection reset by peer"),
        redis.exceptions.ReadOnlyError("You can't write against a read only replica."),
        redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'."),
    ],
    ids=["reset", "READONLY", "OOM"],
)
def test_a_heartbeat_error_mid_batch_loses_and_repeats_nothing(
    error: Exception, monkeypatch: pytest.MonkeyPatch
) -> None:
    tasks.record.delay("warm")
    markers = [f"h{n}" for n in range(20)]
    enqueue_many([(tasks.record, (marker,), {}) for marker in markers])
    worker = Worker(["default"], burst=True)
    real_heartbeat = worker.session.heartbeat
    failed: list[int] = []

    def failing_once(processed: int, started_at: float) -> None:
        if processed >= 3 and not failed:
            failed.append(processed)
            raise error
        real_heartbeat(processed, started_at)

    monkeypatch.setattr(worker.session, "heartbeat", failing_once)
    with override_settings(RCOORD={**settings.RCOORD, "TASK_RETRY_BACKOFF": 0.01}):
        assert worker.run() == 21
    assert failed
    assert sorted(ran()) == sorted(["warm", *markers])  # each once
    assert queue_stats("default") == {"ready": 0, "in_flight": 0, "delayed": 0, "dead": 0}
    assert lost_deliveries() == []


def lose_a_reply(monkeypatch: pytest.MonkeyPatch, after: float = 0) -> list[Any]:
    """Make the worker's first call that finishes and takes tasks lose its reply ``after``
    seconds once its script ran (a connection reset); the list gets that reply."""
    real = worker_module.run_script
    lost: list[Any] = []

    def reply_lost_once(name: str, client: Any, *, keys: Any, args: Any) -> Any:
        reply = real(name, client, keys=keys, args=args)
        finishing_and_taking = name == "task_finish" and len(args) > 1 and taking(args)
        if finishing_and_taking and not lost:
            lost.append(reply)
            time.sleep(after)
            raise redis.ConnectionError("connection reset after the script ran")
        return reply

    monkeypatch.setattr(worker_module, "run_script", reply_lost_once)
    return lost


def test_an_exchange_whose_reply_was_lost_is_answered_as_it_ran(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    lost = lose_a_reply(monkeypatch)
    markers = [f"r{n}" for n in range(30)]
    enqueue_many([(tasks.record, (marker,), {}) for marker in markers])
    worker = Worker(["default"], burst=True)
    with caplog.at_level(logging.WARNING, logger="django_rcoord.queues.worker"):
        assert worker.run() == 30
    assert lost, "no reply was lost"
    assert lost[0][1], "the lost call took no task"
    assert sorted(ran()) == sorted(markers)
    assert queue_stats("default") == {"ready": 0, "in_flight": 0, "delayed": 0, "dead": 0}
    assert lost_deliveries() == []
    assert "lease had run out" not in caplog.text


def test_an_exchange_retried_after_twice_a_short_lease_is_still_answered_as_it_ran(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client's own retries (its socket timeout, times its retries) can outlast twice a
    short lease: the record of the exchange outlives them, or the retry would take anew
    and what the lost call took would come back only when its lease ran out, as a lost
    delivery (which counts towards TASK_MAX_DELIVERIES)."""
    # Lost 1 s on: past twice the lease (0.2 s) as the server counts, since a sleep after
    # the reply always outlasts a TTL set before it.
    lost = lose_a_reply(monkeypatch, after=1.0)
    markers = [f"s{n}" for n in range(30)]
    ids = enqueue_many([(tasks.record, (marker,), {}) for marker in markers])
    worker = Worker(["default"], burst=True, lease=0.2)
    assert worker.run() == 30
    assert lost, "no reply was lost"
    assert lost[0][1], "the lost call took no task"
    assert sorted(ran()) == sorted(markers)
    assert queue_stats("default") == {"ready": 0, "in_flight": 0, "delayed": 0, "dead": 0}
    # Each delivered once: none put back as lost and taken again.
    assert [result_of(task_id).attempts for task_id in ids] == [1] * 30
    # The record goes when the worker signs off: no call of its is retried after that.
    assert not get_client().exists(QueueKeys.of("default").exchange(worker.id))


def test_a_lost_task_ends_the_take_before_lower_priority_queues() -> None:
    high = [execute_later("prio/high", "tests.tasks.record", [f"h{n}"]) for n in range(3)]
    low = [execute_later("prio/low", "tests.tasks.record", [f"l{n}"]) for n in range(2)]
    get_client().hset(QueueKeys.of("prio/high").failures, f"{high[1]}:lost", 1)
    worker = Worker(["prio/high", "prio/low"])
    assert [job.id for job in worker.session.exchange([], 10)] == [high[0]]
    assert [job.id for job in worker.session.exchange([], 10)] == [high[1]]  # alone
    assert [job.id for job in worker.session.exchange([], 10)] == [high[2], *low]


# -- prefetch and threads ---------------------------------------------------------------------
def test_a_worker_killed_mid_batch_repeats_only_the_task_it_was_running() -> None:
    tasks.record.delay("warm")  # measured: the next take is a batch
    worker = start_worker(lease=1)
    try:
        wait_until(lambda: ran() == ["warm"])
        first = tasks.record.delay("t1")
        tasks.record_then_block.delay("t2", 30)  # taken with t1, its effect done, then blocks
        wait_until(lambda: ran() == ["warm", "t1", "t2"])
        # t1 was acknowledged while t2 ran (it blocks for 30 s), not with the take after it.
        wait_until(lambda: result_of(first).status == "SUCCESSFUL", timeout=10)
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
    finally:
        if worker.poll() is None:
            worker.kill()
    time.sleep(1.2)  # t2's lease runs out
    Worker(["default"], burst=True).run()
    assert ran() == ["warm", "t1", "t2", "t2"]  # only the task it was running, again


def test_tasks_that_ended_before_a_long_one_are_acknowledged_while_it_runs() -> None:
    worker = Worker(["default"])
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        tasks.record.delay("warm")
        wait_until(lambda: ran() == ["warm"])
        quick = [tasks.record.delay(f"q{n}") for n in range(3)]
        tasks.record_when_released.delay("long")
        wait_until(lambda: get_client().llen("test:started") == 1)
        # Acknowledged while "long" runs (until released), not when it ends.
        wait_until(
            lambda: {result_of(task_id).status for task_id in quick} == {"SUCCESSFUL"},
            timeout=10,
        )
        assert "long" not in ran()
    finally:
        tasks.release("long")
        worker.stop()
        thread.join(30)
    assert ran() == ["warm", "q0", "q1", "q2", "long"]


def test_concurrency_threads_run_side_by_side() -> None:
    enqueue_many([(tasks.overlap, (1.0, 4), {}) for _ in range(8)])
    started = time.monotonic()
    worker = start_worker("--burst", "--concurrency", "4")
    output = output_of(worker, 60)
    took = time.monotonic() - started
    assert worker.returncode == 0, output
    peaks = [int(peak) for peak in get_client().lrange("test:peaks", 0, -1)]
    assert len(peaks) == 8
    assert max(peaks) == 4  # four ran at once, never one thread holding them all
    print(f"\n--concurrency 4, 8 tasks of 1 s: {took:.2f} s (process start included)")


# -- how run() ends --------------------------------------------------------------------------
def test_the_keeper_stops_when_run_raises() -> None:
    interrupt.delay()
    worker = Worker(["default"], burst=True)
    with pytest.raises(KeyboardInterrupt):
        worker.run()
    assert not keeper_alive(worker)


def test_the_keeper_stops_when_the_last_exchange_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = worker_module.run_script

    def refuse_acknowledgements(name: str, client: Any, *, keys: Any, args: Any) -> Any:
        if name == "task_finish" and not taking(args) and len(args) > 1:
            raise redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'.")
        return real(name, client, keys=keys, args=args)

    monkeypatch.setattr(worker_module, "run_script", refuse_acknowledgements)
    task_id = tasks.record.delay("once")
    worker = Worker(["default"], max_tasks=1, lease=0.5)
    assert worker.run() == 1
    assert not keeper_alive(worker)
    # Nobody renews its lease any more: it comes back when the lease runs out.
    time.sleep(0.7)
    assert recover_and_promote(QueueKeys.of("default"))[0] == 1
    assert result_of(task_id).status == "READY"


# -- what a newcomer meets (issue "What a newcomer trips over now") -------------------------
def test_a_burst_run_against_a_dead_redis_fails_within_its_bound() -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    started = time.monotonic()
    worker = start_worker("--burst", "--max-outage", "2", env={"RCOORD_TEST_REDIS_URL": dead})
    output = output_of(worker, 60)
    took = time.monotonic() - started
    assert worker.returncode == 1, output
    assert "CommandError: worker" in output
    assert "Redis unusable for" in output
    assert "max_outage 2 s" in output
    assert "Traceback" not in output
    print(f"\n--burst --max-outage 2 against a dead Redis: exit 1 after {took:.1f} s")


def test_tasks_in_queues_a_worker_does_not_watch_are_named() -> None:
    execute_later("default", "tests.tasks.record", ["watched"])
    execute_later("elsewhere/other", "tests.tasks.record", ["not watched"])
    worker = start_worker("--burst", queues=("default",))
    output = output_of(worker, 60)
    assert worker.returncode == 0, output
    assert ran() == ["watched"]
    assert "tasks are waiting in queues these workers do not watch: elsewhere/other (1)" in output


@pytest.mark.parametrize("command", ["run_email_worker", "rcoord_worker"])
def test_a_worker_watches_every_queue_a_task_uses_by_default(command: str) -> None:
    """``rcoord_worker`` is ``run_email_worker`` under a general name: the same runs."""
    from django.core.management import call_command

    own = tasks.record_elsewhere.delay("own")  # queue elsewhere/default: a group of its own
    framework = framework_tasks.add.enqueue(2, 2)
    email = execute_later("email", "tests.tasks.record", ["email"])
    call_command(command, "--burst")
    assert sorted(ran()) == ["email", "own"]
    framework.refresh()
    assert framework.return_value == 4
    assert {result_of(task_id).status for task_id in (own, email)} == {"SUCCESSFUL"}


def test_a_failed_framework_task_is_logged_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    result = framework_tasks.boom.enqueue("tb")
    with caplog.at_level(logging.INFO):
        Worker(["default"], burst=True).run()
    result.refresh()
    assert result.status.name == "FAILED"
    (record,) = [
        record
        for record in caplog.records
        if record.name in ("django.tasks", "django_tasks") and record.levelno == logging.ERROR
    ]
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], ValueError)
    assert "tb went boom" in str(record.exc_info[1])


def test_the_keeper_never_blocks_the_processs_other_renewals(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While the worker's loop holds what the worker holds (an exchange retrying through a
    Redis outage, up to a lease), the keeper's turn comes due on the process's renewer:
    it must not wait there, or every auto-renewing lock and permit of the process stops
    renewing meanwhile."""
    worker = Worker(["default"], burst=True)
    renewed: list[float] = []
    holding = threading.Event()
    done = threading.Event()
    real = worker_module.run_script

    def stalled(name: str, client: Any, *, keys: Any, args: Any) -> Any:
        if name == "task_finish":  # the loop's take, sent while it holds what it holds
            holding.set()
            done.wait(10)
        return real(name, client, keys=keys, args=args)

    def other_lease() -> bool:
        renewed.append(time.monotonic())
        return True

    monkeypatch.setattr(worker_module, "run_script", stalled)
    other = keep_alive(0.02, other_lease, "another lease of the process")
    keeper = schedule(worker.keeper.turn, 0.0, "the worker's keeper", retry=1.0)
    thread = threading.Thread(
        target=worker.holdings.next_job,
        args=(worker.take_count,),
        kwargs={"burst": True, "batch_begins": lambda: None},
    )
    thread.start()
    try:
        assert holding.wait(10)
        before = len(renewed)
        keeper.wake(0.0)  # due now, while the loop holds
        wait_until(lambda: len(renewed) >= before + 10, timeout=10)
    finally:
        done.set()
        thread.join(10)
        keeper.cancel()
        other.cancel()


@pytest.mark.parametrize("where", ["error", "task name"])
def test_text_that_cannot_be_utf8_is_finished_not_stuck(where: str) -> None:
    """A lone surrogate (what ``surrogateescape`` decoding leaves) in a failure's text or in
    a task's name reaches the finish call replaced: the task is finished, and the worker
    goes on to the next."""
    if where == "error":
        task_id = tasks.always_fail.delay("bad \udcff byte")
    else:
        task_id = execute_later("default", "no.release.\udcff.has.it", [])
    tasks.record.delay("after")
    with override_settings(RCOORD={**settings.RCOORD, "TASK_MAX_DELIVERIES": 1}):
        assert Worker(["default"], burst=True, max_outage=5).run() == 2
    assert ran() == ["after"]
    record = result_of(task_id)
    assert record.status == "FAILED"
    expected = "always fails" if where == "error" else "no worker could run it"
    assert expected in record.errors[-1]["traceback"]
