"""Time limits, enforced: tasks in a child process the worker kills and starts again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile

import pytest
from django.conf import settings
from django.test import override_settings

from django_rcoord.connection import get_client
from django_rcoord.queues import dead_letters, get_result, queue_stats
from django_rcoord.queues.worker import Worker, isolation
from tests import tasks
from tests.procs import wait_until
from tests.test_queues import ROOT, output_of, ran, start_worker

pytestmark = pytest.mark.django_db(transaction=True)


def started() -> list[str]:
    return [entry.decode() for entry in get_client().lrange("test:started", 0, -1)]


def test_a_task_that_ignores_its_time_limit_is_killed_and_the_worker_goes_on() -> None:
    stubborn = tasks.ignore_the_limit.delay("stubborn")
    after = tasks.record_pid.delay("after")
    worker = Worker(["default"], burst=True, isolation="process")
    with override_settings(RCOORD={**settings.RCOORD, "TASK_LEASE": 5}):
        assert worker.run() == 2
    (letter,) = dead_letters("default")
    assert letter["id"] == stubborn
    assert "TaskTimeLimitExceeded" in letter["error"]
    assert "killed after its time limit of 2 s" in letter["error"]
    assert ran() == ["after"]  # the stubborn task never finished; the next one ran
    killed_pid = int(started()[0].split(":")[1])
    record = get_result(after)
    assert record is not None
    assert record.status == "SUCCESSFUL"
    assert record.return_value not in (killed_pid, os.getpid())  # a new child ran it


def test_a_task_is_stopped_inside_its_process_at_its_limit_first(monkeypatch) -> None:
    # The parent's kill comes HARD_LIMIT_GRACE after the limit: 10 s here, so a child
    # stalled on a busy machine is still stopped from inside (what this test is about).
    monkeypatch.setattr(isolation, "HARD_LIMIT_GRACE", 10.0)
    task_id = tasks.sleep_past_the_limit.delay("soft")
    worker = Worker(["default"], burst=True, isolation="process")
    assert worker.run() == 1
    record = get_result(task_id)
    assert record is not None
    assert record.status == "FAILED"
    assert "stopped after its time limit of 2 s" in record.errors[-1]["traceback"]
    assert started() == ["soft"]
    assert ran() == []


def test_follow_ups_of_tasks_run_in_a_child_process_are_queued_and_run() -> None:
    succeeded = tasks.followed.delay(False)
    failed = tasks.followed.delay(True)
    assert Worker(["default"], burst=True, isolation="process").run() == 4
    seen = sorted(get_client().lrange("test:followed", 0, -1))
    assert seen == sorted(
        [f"{succeeded} SUCCESSFUL:made".encode(), f"{failed} FAILED:None".encode()]
    )


def test_a_task_that_kills_its_process_fails_instead_of_the_worker() -> None:
    poison = tasks.kill_own_worker.delay()
    fine = tasks.record.delay("fine")
    # The poison task: four attempts (three retries, each in a new child); and the fine one.
    worker = Worker(["default"], max_tasks=5, isolation="process")
    with override_settings(RCOORD={**settings.RCOORD, "TASK_RETRY_BACKOFF": 0.01}):
        assert worker.run() == 5
    (letter,) = dead_letters("default")
    assert letter["id"] == poison
    assert "ChildProcessError: the task's process died (killed by signal 9)" in letter["error"]
    assert ran() == ["fine"]
    assert get_result(fine).status == "SUCCESSFUL"  # type: ignore[union-attr]


def test_run_email_worker_isolation_process_from_the_command_line() -> None:
    ids = [tasks.record_pid.delay(f"c{n}") for n in range(3)]
    worker = start_worker("--burst", "--isolation", "process")
    output = output_of(worker, 60)
    assert worker.returncode == 0, output
    assert "each task in a child process" in output
    assert sorted(ran()) == ["c0", "c1", "c2"]
    pids = {json.dumps(get_result(task_id).return_value) for task_id in ids}  # type: ignore[union-attr]
    assert len(pids) == 1  # one child ran them all
    assert str(worker.pid) not in pids
    assert queue_stats("default") == {"ready": 0, "in_flight": 0, "delayed": 0, "dead": 0}


def test_ctrl_c_to_the_process_group_lets_the_running_task_finish() -> None:
    task_id = tasks.record_slowly.delay("slow", 1.5)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    with tempfile.TemporaryFile() as log:
        worker = subprocess.Popen(
            [sys.executable, "manage.py", "run_email_worker", "--isolation", "process"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, as a terminal's job
        )
        wait_until(lambda: get_client().llen("test:started") == 1, timeout=30)
        os.killpg(worker.pid, signal.SIGINT)  # what Ctrl-C sends: the worker and its child
        assert worker.wait(30) == 0
        log.seek(0)
        output = log.read().decode()
    assert started()[0].split(":")[1] != str(worker.pid)  # it ran in the child
    assert ran() == ["slow"], output
    assert get_result(task_id).status == "SUCCESSFUL"  # type: ignore[union-attr]
