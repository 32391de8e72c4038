"""Found while measuring issue 29's task controls: a task with both a rate and a
concurrency limit. Marked xfail (strict) until the worker's gates are fixed: the test then
passes and the mark must go."""

from __future__ import annotations

import pytest

from django_rcoord.queues import task
from django_rcoord.queues.worker import Worker
from django_rcoord.queues.worker.gates import Pass, Wait
from django_rcoord.semaphores import Semaphore
from tests.test_queues import take

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "findings"


@task(name="tests.findings.rated_and_limited", queue=QUEUE, rate="2/m", concurrency=1)
def rated_and_limited(number: int) -> None:
    pass


@pytest.mark.xfail(
    strict=True,
    reason="TaskGates.enter counts a start in the rate's window before it tries the "
    "concurrency permit, and a run held back by a full concurrency keeps that start: the "
    "task runs fewer times than its rate allows",
)
def test_a_run_held_back_by_its_concurrency_does_not_use_up_its_rate() -> None:
    worker = Worker([QUEUE])
    rated_and_limited.delay(1)
    job = take(worker)
    # Another run holds the one permit: this one is held back (it does not start).
    other_run = Semaphore(f"task:{rated_and_limited.name}", 1, timeout=60)
    permit = other_run.acquire()
    assert permit is not None
    held_back = worker.gates.enter(job)
    assert isinstance(held_back, Wait)
    assert "concurrency" in held_back.why
    other_run.release(permit)
    # No run of it has started in this minute (the other run's start is not in this
    # window: it took its permit by hand), and its rate is two a minute: two may start now.
    for _ in range(2):
        entry = worker.gates.enter(job)
        assert isinstance(entry, Pass), entry
        worker.gates.leave(entry)
