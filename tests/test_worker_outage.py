"""A worker meets lasting trouble: it waits it out until told how long to wait, and says
when it serves nothing (issue "When things go wrong"). Real worker processes on the
suite's Redis; the trouble is real too (a database that refuses every connection, tasks
queued where the worker does not look)."""

from __future__ import annotations

import re
import time

import pytest

from django_rcoord.queues import queue_stats
from tests import tasks
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
