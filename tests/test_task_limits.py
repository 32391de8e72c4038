"""A task's rate and concurrency hold across every worker process."""

from __future__ import annotations

import pytest
from django.urls import reverse

from benchmarks.task_controls import shortest_span
from django_rcoord.connection import get_client
from django_rcoord.queues import enqueue_many, get_result, queue_stats, recover_and_promote, task
from django_rcoord.queues.keys import QueueKeys
from django_rcoord.queues.metrics import read_metrics
from django_rcoord.queues.options import parse_rate
from django_rcoord.queues.outcomes import Kind
from django_rcoord.queues.worker.jobs import Outcome
from django_rcoord.queues.worker.resolve import resolve
from tests import tasks
from tests.procs import wait_until
from tests.test_queues import output_of, start_worker

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_rate_holds_in_every_window_across_worker_processes() -> None:
    enqueue_many([(tasks.rate_limited_start, (f"r{n}",), {}) for n in range(10)])
    workers = [start_worker("--concurrency", "2") for _ in range(2)]  # four loops
    try:
        wait_until(lambda: get_client().llen("test:starts") == 10, timeout=30)
    finally:
        for worker in workers:
            worker.terminate()
            worker.wait(20)
    starts = tasks.rate_decided_starts()
    assert len(starts) >= 4  # each start copied the log; see rate_decided_starts
    # At most three starts in any second, as the server decided them: the fourth start after
    # any start is a second later.
    assert shortest_span(starts, 4) >= 1.0, starts
    # And no slower than it must be: 10 starts take 3 s; a worker that sat out a recheck
    # per window would take twice that, and the bound leaves 3 s for a busy machine.
    assert starts[-1] - starts[0] < 6, starts
    assert queue_stats("default") == {"ready": 0, "in_flight": 0, "delayed": 0, "dead": 0}


def test_a_concurrency_limit_holds_across_worker_processes() -> None:
    ids = [tasks.at_most_two.delay(0.3, 2) for _ in range(6)]
    workers = [start_worker("--concurrency", "3") for _ in range(2)]  # six loops, two permits
    try:
        wait_until(
            lambda: all(getattr(get_result(i), "status", "") == "SUCCESSFUL" for i in ids),
            timeout=40,
        )
    finally:
        for worker in workers:
            worker.terminate()
            worker.wait(20)
    peaks = [int(peak) for peak in get_client().lrange("test:peaks", 0, -1)]
    assert len(peaks) == 6  # each ran once: held-back runs did not count as runs
    assert max(peaks) == 2


def test_burst_workers_exit_only_once_the_runs_they_held_back_have_run() -> None:
    """Twelve runs, two permits, three burst workers: before, two ran and the workers exited
    0 with ten held back in the delayed set. A burst worker now waits for the runs it held
    back for a limit before it calls its queues done."""
    ids = [tasks.at_most_two.delay(0.2) for _ in range(12)]
    workers = [start_worker("--burst") for _ in range(3)]
    outputs = [output_of(worker, 120) for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0, 0], outputs
    assert all(getattr(get_result(i), "status", "") == "SUCCESSFUL" for i in ids)
    peaks = [int(peak) for peak in get_client().lrange("test:peaks", 0, -1)]
    assert len(peaks) == 12
    assert max(peaks) <= 2
    assert queue_stats("default")["delayed"] == 0


def test_held_back_deliveries_are_not_attempts_in_the_records() -> None:
    # Six 0.3 s runs, two permits, six worker loops in two processes: most deliveries are
    # held back (some several times) before their run.
    ids = [tasks.at_most_two.delay(0.3, 2) for _ in range(6)]
    workers = [start_worker("--concurrency", "3") for _ in range(2)]
    try:
        wait_until(
            lambda: all(getattr(get_result(i), "status", "") == "SUCCESSFUL" for i in ids),
            timeout=40,
        )
    finally:
        for worker in workers:
            worker.terminate()
            worker.wait(20)
    held_back = get_client().hgetall(QueueKeys.of("default").metrics)
    assert any(field.startswith(b"h\x1f") for field in held_back)  # some were held back
    for task_id in ids:
        record = get_result(task_id)
        assert record is not None
        assert record.attempts == 1, record.worker_ids  # the one real run
        assert record.errors == []  # "waiting for its concurrency" is no error
        assert record.started_at is not None
        assert record.finished_at is not None
        assert record.started_at <= record.finished_at


def test_a_held_back_delivery_leaves_the_record_as_it_was() -> None:
    from django_rcoord.queues.worker import Worker
    from django_rcoord.queues.worker.jobs import Done, later
    from tests.test_queues import take

    task_id = tasks.at_most_two.delay(0)
    worker = Worker(["default"])
    job = take(worker)
    assert get_result(task_id).attempts == 1  # type: ignore[union-attr]
    assert worker.session.finish(Done(job, later(job, 60_000, "its concurrency of 2"), 0.0))
    record = get_result(task_id)
    assert record is not None
    assert (record.status, record.worker_ids, record.errors) == ("READY", [], [])
    assert record.started_at is None
    assert record.last_attempted_at is None
    assert queue_stats("default")["delayed"] == 1
    # After a real failed attempt, a held-back delivery keeps that attempt, and only it.
    retried = tasks.at_most_two.delay(0)
    job = take(worker)
    assert job.id == retried
    failed = Outcome(Kind.RETRY, job.task_name, "Boom", "builtins.ValueError", delay_ms=0)
    assert worker.session.finish(Done(job, failed, 1.0))
    recover_and_promote(QueueKeys.of("default"))
    job = take(worker)
    assert job.id == retried
    assert worker.session.finish(Done(job, later(job, 60_000, "its rate 3/s"), 0.0))
    record = get_result(retried)
    assert record is not None
    assert record.status == "READY"
    assert record.worker_ids == [worker.id]
    assert [error["traceback"] for error in record.errors] == ["Boom"]
    assert record.started_at is not None
    # Held back: counted as such, not as a finished run (nor in the minute's finished).
    metrics = read_metrics("main")
    assert metrics.held_back == {("default", "tests.tasks.at_most_two"): 2}
    assert metrics.tasks[("default", "tests.tasks.at_most_two")].finished == {"retried": 1}


def test_limits_are_checked_when_the_task_is_defined() -> None:
    assert parse_rate("100/m") == (100, 60.0)
    assert parse_rate("5/10s") == (5, 10.0)
    with pytest.raises(ValueError, match="rate must look like"):
        task(name="tests.limits.bad_rate", rate="fast")
    with pytest.raises(ValueError, match="concurrency"):
        task(name="tests.limits.bad_concurrency", concurrency=0)


def test_the_dashboard_stats_and_metrics_show_the_task_controls(admin_client) -> None:
    from django_rcoord.ops.status import overview

    rows = {row["task"]: row for row in overview()["task_controls"]}
    assert rows["tests.tasks.at_most_two"]["concurrency"] == 2
    assert rows["tests.tasks.at_most_two"]["running"] == 0
    assert rows["tests.tasks.rate_limited_start"]["rate"] == "3/s"
    assert rows["tests.tasks.sleep_past_the_limit"]["timeout"] == 2
    assert rows["tests.tasks.followed"]["on_success"] == "tests.tasks.note_finished"
    assert "tests.tasks.record" not in rows  # sets nothing
    page = admin_client.get(reverse("rcoord:dashboard")).content.decode()
    assert 'id="rcoord-task-controls"' in page
    assert "0 / 2" in page


def test_task_options_give_framework_tasks_their_run_options(settings) -> None:
    from django_rcoord.queues.framework import task_backends
    from django_rcoord.task_backend import RedisTaskBackend
    from tests import framework_tasks

    backend = task_backends["default"]
    assert isinstance(backend, RedisTaskBackend)
    assert backend.run_options(framework_tasks.add).max_retries == backend.max_retries
    settings.RCOORD = {
        **settings.RCOORD,
        "TASK_OPTIONS": {
            "tests.framework_tasks.add": {"timeout": 5, "max_retries": 2, "rate": "10/m"}
        },
    }
    options = backend.run_options(framework_tasks.add)
    assert (options.time_limit, options.max_retries, options.rate) == (5.0, 2, "10/m")
    settings.RCOORD = {
        **settings.RCOORD,
        "TASK_OPTIONS": {"tests.framework_tasks.add": {"timeout": -1}},
    }
    from django_rcoord.checks import check_settings

    assert "rcoord.E033" in [message.id for message in check_settings()]


# -- a task with both limits ----------------------------------------------------------------
@task(name="tests.limits.rated_and_limited", queue="limits", rate="2/m", concurrency=1)
def rated_and_limited(number: int) -> None:
    pass


def test_a_run_held_back_by_its_concurrency_does_not_use_up_its_rate() -> None:
    from django_rcoord.queues.worker import Worker
    from django_rcoord.queues.worker.gates import Pass, Wait
    from django_rcoord.semaphores import Semaphore
    from tests.test_queues import take

    worker = Worker(["limits"])
    rated_and_limited.delay(1)
    job = take(worker)
    # Another run holds the one permit: this one is held back (it does not start).
    other_run = Semaphore(f"task:{rated_and_limited.name}", 1, timeout=60)
    permit = other_run.acquire()
    assert permit is not None
    held_back = worker.gates.enter(job, resolve(job).options)
    assert isinstance(held_back, Wait)
    assert "concurrency" in held_back.why
    other_run.release(permit)
    # Two a minute, none started yet (the other run took its permit by hand): two start.
    for _ in range(2):
        entry = worker.gates.enter(job, resolve(job).options)
        assert isinstance(entry, Pass), entry
        worker.gates.leave(entry)
    # The third is over the rate, and gives back the permit it took meanwhile.
    over = worker.gates.enter(job, resolve(job).options)
    assert isinstance(over, Wait)
    assert "rate" in over.why
    assert other_run.acquire() is not None
