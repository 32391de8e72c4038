"""A worker meets lasting trouble: it waits it out until told how long to wait, and says
when it serves nothing (issue "When things go wrong"). Real worker processes on the
suite's Redis; the trouble is real too (a database that refuses every connection, tasks
queued where the worker does not look)."""

from __future__ import annotations

import io
import json
import logging
import re
import signal
import time

import pytest
import redis
from django.core.management import call_command

from django_rcoord.connection.errors import log_waited_out
from django_rcoord.queues import queue_stats
from tests import framework_tasks, tasks
from tests.procs import wait_until
from tests.test_queues import log_of, output_of, start_worker

pytestmark = pytest.mark.django_db(transaction=True)

#: The worker's --max-outage in these tests, seconds.
MAX_OUTAGE = 2.0


@pytest.mark.parametrize("burst", [True, False], ids=["burst", "serving"])
def test_a_loop_that_keeps_failing_ends_after_max_outage_whatever_the_error(burst: bool) -> None:
    """The database refuses connections: the check Django runs around each batch fails on
    every turn of the worker's loop (not in a task). A burst run, or a worker given
    --max-outage, ends with one clear line once it has failed that long; before, only
    Redis's errors were bounded and this worker retried for ever."""
    for _ in range(3):
        tasks.read_database.delay()
    worker = start_worker(
        *(["--burst"] if burst else []),
        "--max-outage",
        f"{MAX_OUTAGE:g}",
        env={"RCOORD_TEST_REFUSING_DATABASE": "1"},
    )
    wait_until(lambda: "unexpected error" in log_of(worker), why=lambda: log_of(worker))
    first_failure = time.monotonic()
    output = output_of(worker, 60)
    waited = time.monotonic() - first_failure
    assert worker.returncode == 1, output
    last = output.strip().splitlines()[-1]
    assert last.startswith("CommandError: worker "), output
    assert re.search(rf"its loop kept failing for \d s \(max_outage {MAX_OUTAGE:g} s\)", last)
    assert "OperationalError: connection to server" in last
    # Bounded by max_outage from its first failure (seen here up to 10 ms late), plus its
    # exit (giving back what it held, signing off, the interpreter's end: well under a
    # second alone; 5 s leaves room for a busy machine).
    assert waited < MAX_OUTAGE + 5, waited
    # What it held was given back on the way out, for a worker whose database answers.
    assert queue_stats("default")["in_flight"] == 0


def test_a_lasting_error_has_its_traceback_logged_once_then_a_line_a_retry() -> None:
    """The database refuses every connection, turn after turn: the first failure is logged
    with its traceback, each retry of the same error after it in one line naming it (a
    traceback a retry buried the log: one every 0.5-10 s for as long as it lasted)."""
    tasks.read_database.delay()
    # --max-outage 6: the loop retries at least three times first (its first three waits
    # add up to 3.5 s at most), which leaves 2.5 s for its turns on a busy machine.
    worker = start_worker("--max-outage", "6", env={"RCOORD_TEST_REFUSING_DATABASE": "1"})
    output = output_of(worker, 60)
    assert worker.returncode == 1, output  # it gave up, as max_outage says
    retries = [line for line in output.splitlines() if "; retrying in " in line]
    assert len(retries) >= 3, output
    assert "unexpected error" in retries[0]
    error = 'OperationalError: connection to server at "db.internal"'
    assert all(f"same error again: {error}" in line for line in retries[1:]), output
    assert output.count("Traceback (most recent call last)") == 1, output


def test_an_error_that_changes_or_comes_back_after_a_success_has_its_traceback_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The worker's and the poller's log of the errors they wait out: a traceback for each
    new error (another class or message, or the first after a try that went through),
    "same error again" for a repeat, and Redis's in one line whatever came before."""
    log = logging.getLogger("tests.outage")
    refused, full = OSError("refused"), OSError("disk full")
    tries: list[tuple[Exception, Exception | None]] = [
        (refused, None),
        (OSError("refused"), refused),  # another instance, the same error
        (full, refused),  # it changed
        (refused, None),  # after a try that went through
        (redis.ConnectionError("gone"), refused),
    ]
    for exc, previous in tries:
        log_waited_out(log, "worker w", exc, 0.5, previous)
    logged = [(record.getMessage(), record.exc_info is not None) for record in caplog.records]
    assert logged == [
        ("worker w: unexpected error; retrying in 0.5s", True),
        ("worker w: same error again: OSError: refused; retrying in 0.5s", False),
        ("worker w: unexpected error; retrying in 0.5s", True),
        ("worker w: unexpected error; retrying in 0.5s", True),
        ("worker w: Redis error (ConnectionError: gone); retrying in 0.5s", False),
    ]


def status_text() -> str:
    out = io.StringIO()
    call_command("rcoord_status", stdout=out)
    return out.getvalue()


def status_json() -> dict:
    out = io.StringIO()
    call_command("rcoord_status", "--json", stdout=out)
    return json.loads(out.getvalue())


def test_a_worker_that_serves_nothing_says_so_while_it_runs_and_status_counts_it() -> None:
    """The deploy how-to's worker on a group no task uses (shop/default) while the tasks
    go to the default group: nothing waits when it starts, so its start says nothing;
    while it runs it says, every RCOORD["WORKER_IDLE_WARNING"] seconds (1 here), which
    queues fill and how to serve them. rcoord_status counts it in its group, which no task
    ever used (before: "workers: 0", its group unknown)."""
    worker = start_worker(queues=("shop/default",), env={"RCOORD_TEST_IDLE_WARNING": "1"})
    try:
        wait_until(
            lambda: status_json()["worker_counts"].get("shop") == 1,
            why=lambda: (status_json()["worker_counts"], log_of(worker)),
        )
        assert "tasks are waiting in queues" not in log_of(worker)
        for n in range(2):
            tasks.record.delay(f"m{n}")
        tasks.render_pdf.delay("invoice")

        def warnings() -> list[str]:
            return [line for line in log_of(worker).splitlines() if "serves nothing" in line]

        # Said again while it runs: at most once a second here, so two lines in a few.
        wait_until(lambda: len(warnings()) >= 2, why=lambda: log_of(worker))
        line = warnings()[-1]
        assert "no task in shop/default for 1 s" in line
        assert "default (2), reports/pdf (1)" in line
        assert "--queues default; --queues reports/pdf" in line
        assert status_json()["worker_counts"] == {"main": 0, "reports": 0, "shop": 1}
        assert "workers: 1 (by group: main 0, reports 0, shop 1)" in status_text()
    finally:
        worker.send_signal(signal.SIGTERM)
        output = output_of(worker, 30)
    assert worker.returncode == 0, output
    assert queue_stats("default")["ready"] == 2  # it took none of them


def test_a_failed_framework_task_has_its_traceback_logged_once() -> None:
    """The Tasks framework's task_finished receiver logs a failed task with its traceback
    (logger.exception, for error monitoring); the worker's line for the run says how it
    ended without a second copy. Before, the worker's output held it twice."""
    failing = framework_tasks.boom.enqueue("once")
    worker = start_worker("--burst")
    output = output_of(worker, 60)
    assert worker.returncode == 0, output
    failing.refresh()
    assert failing.status.name == "FAILED"
    assert output.count("Traceback (most recent call last)") == 1, output
    assert output.count("ValueError: once went boom") == 2, output  # the traceback, our line
    assert f"task {failing.id} tests.framework_tasks.boom failed on attempt 1" in output
