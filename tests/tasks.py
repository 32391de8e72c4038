"""Tasks the queue tests run (discovered by workers: "tests" is an installed app)."""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import signal
import time

from django_rcoord.connection import get_async_client, get_client
from django_rcoord.exceptions import TaskTimeLimitExceeded
from django_rcoord.keys import KeySpace
from django_rcoord.queues import PermanentFailure, task
from tests.procs import blpop_within

RAN = "test:ran"


@task(queue="default")
def record(marker: str) -> None:
    """Leave an observable effect: the marker, once per run."""
    get_client().rpush(RAN, marker)


@task(queue="default")
def record_slowly(marker: str, seconds: float) -> None:
    get_client().rpush("test:started", f"{marker}:{os.getpid()}")
    time.sleep(seconds)
    get_client().rpush(RAN, marker)


@task(queue="default")
def record_when_released(marker: str, timeout: float = 60) -> None:
    """Say it started, then run until the test pushes to ``test:release:<marker>``: a task
    that cannot end early however slow the machine is (``release`` ends it)."""
    client = get_client()
    client.rpush("test:started", f"{marker}:{os.getpid()}")
    blpop_within(f"test:release:{marker}", timeout, client)
    client.rpush(RAN, marker)


def release(marker: str) -> None:
    """Let ``record_when_released(marker)`` end."""
    get_client().rpush(f"test:release:{marker}", 1)


@task(queue="default", priority=50)
def record_urgent(marker: str) -> None:
    get_client().rpush(RAN, marker)


@task(queue="default", priority=-50)
def record_whenever(marker: str) -> None:
    get_client().rpush(RAN, marker)


@task(queue="default", max_retries=3)
def fail_then_succeed(marker: str, failures: int) -> None:
    client = get_client()
    attempt = client.incr(f"test:attempts:{marker}")
    client.rpush(f"test:attempt-times:{marker}", repr(time.time()))
    if attempt <= failures:
        raise RuntimeError(f"attempt {attempt} fails on purpose")
    client.rpush(RAN, marker)


@task(queue="default", max_retries=0)
def always_fail(marker: str) -> None:
    raise ValueError(f"{marker} always fails")


@task(queue="default")
def kill_own_worker() -> None:
    """A poison task: it kills the worker running it, as an OOM kill or a segfault would."""
    os.kill(os.getpid(), signal.SIGKILL)


@task(name="tests.noop", queue="bench")
def noop() -> None:
    pass


@task(queue="low")
def record_low(marker: str) -> None:
    get_client().rpush(RAN, marker)


@task(queue="high")
def record_high(marker: str) -> None:
    get_client().rpush(RAN, marker)


@task(queue="default")
def record_timing(marker: str, not_before: float) -> None:
    """Record the run and whether it came before its due time (same machine: same clock)."""
    client = get_client()
    client.rpush(RAN, marker)
    if time.time() < not_before:
        client.rpush("test:early", marker)


@task(queue="default")
async def record_async(marker: str) -> None:
    """An async task: its effect goes through the worker loop's async client."""
    await asyncio.sleep(0.001)
    await get_async_client().rpush(RAN, marker)


@task(queue="default")
def add_numbers(a: int, b: int) -> dict:
    """A return value with a date in it (DjangoJSONEncoder makes it a string)."""
    return {"sum": a + b, "on": datetime.date(2026, 11, 23)}


@task(queue="default", max_retries=3)
def return_unstorable() -> object:
    return object()


@task(queue="default", max_retries=0)
def exit_the_process() -> None:
    raise SystemExit(3)


@task(queue="reports/pdf")
def render_pdf(name: str) -> str:
    return f"{name}.pdf"


@task(queue="default")
def block_first_time(marker: str, seconds: float) -> None:
    """Sleep ``seconds`` on the first run only (a run that a test kills), then record."""
    client = get_client()
    client.rpush("test:started", f"{marker}:{os.getpid()}")
    if client.set(f"test:blocked:{marker}", 1, nx=True):
        time.sleep(seconds)
    client.rpush(RAN, marker)


@task(queue="default")
def sleep_then_record(marker: str, seconds: float) -> None:
    time.sleep(seconds)
    get_client().rpush(RAN, marker)


def run_counted(seconds: float, together: int = 0) -> None:
    """A run of ``seconds`` counted in ``test:running`` (the count when it started pushed to
    ``test:peaks``). With ``together``, it first waits (10 s at most) until that many runs
    have overlapped once: however late a busy machine starts the other loops, as many run
    at once as a limit lets, and a test can require it."""
    client = get_client()
    client.rpush("test:peaks", client.incr("test:running"))
    deadline = time.monotonic() + 10
    while together and not client.exists("test:together") and time.monotonic() < deadline:
        if int(client.get("test:running") or 0) >= together:
            client.set("test:together", 1)
        time.sleep(0.005)
    time.sleep(seconds)
    client.decr("test:running")


@task(queue="default")
def overlap(seconds: float, together: int = 0) -> None:
    """Record how many runs of it overlap (``run_counted``)."""
    run_counted(seconds, together)


if os.environ.get("RCOORD_TEST_NEW_RELEASE"):
    # A task only the next release of the project defines (a rolling deploy's test).

    @task(queue="default")
    def added_in_new_release(marker: str) -> None:
        get_client().rpush(RAN, marker)


@task(queue="default")
def record_run(marker: str, seconds: float = 0.0) -> None:
    """Append the marker to the file ``RCOORD_TEST_RUN_LOG`` names, once per run: an effect
    that no Redis fault can repeat or lose (tests/test_faults.py)."""
    time.sleep(seconds)
    with open(os.environ["RCOORD_TEST_RUN_LOG"], "a") as log:
        log.write(f"{marker}\n")


@task(queue="elsewhere/default")
def record_elsewhere(marker: str) -> None:
    """``record`` in another queue group (another Redis Cluster slot)."""
    get_client().rpush(RAN, marker)


# A task whose queue a release may move: RCOORD_TEST_MOVED_QUEUE is a poller's release.
@task(name="tests.tasks.moved", queue=os.environ.get("RCOORD_TEST_MOVED_QUEUE", "default"))
def moved(marker: str) -> None:
    get_client().rpush(RAN, marker)


@task(queue="default")
def record_then_block(marker: str, seconds: float) -> None:
    """Record, then (on the first run only) block ``seconds``: a task whose effect is done
    when its worker is killed."""
    client = get_client()
    client.rpush(RAN, marker)
    if client.set(f"test:blocked:{marker}", 1, nx=True):
        time.sleep(seconds)


# Their limit (2 s) leaves time for a child stalled on a busy machine to say it started
# before the limit comes: they sleep far past it all the same.
@task(queue="default", timeout=2, max_retries=0)
def sleep_past_the_limit(marker: str) -> None:
    """Stopped at its time limit: TaskTimeLimitExceeded interrupts the sleep."""
    get_client().rpush("test:started", marker)
    time.sleep(10)
    get_client().rpush(RAN, marker)


@task(queue="default", timeout=2, max_retries=0)
def ignore_the_limit(marker: str) -> None:
    """Catches TaskTimeLimitExceeded and goes on: only killing its process stops it."""
    get_client().rpush("test:started", f"{marker}:{os.getpid()}")
    try:
        time.sleep(10)
    except TaskTimeLimitExceeded:
        time.sleep(10)
    get_client().rpush(RAN, marker)


@task(queue="default")
def record_pid(marker: str) -> int:
    get_client().rpush(RAN, marker)
    return os.getpid()


#: Where ``rate_limited_start`` copies the rate's log: each start as the server decided it
#: (member: the start, value: the server's time in microseconds).
RATE_DECIDED = "test:rate-decided"


@task(queue="default", rate="3/s", max_retries=0)
def rate_limited_start(marker: str) -> None:
    """At most three starts in any second, across every worker. Each start copies the rate's
    log (its own start is in it, for a second) to ``RATE_DECIDED``, so a test reads the times
    the server decided, not a clock read late by a stalled worker."""
    get_client().rpush("test:starts", f"{time.time()!r}:{marker}")
    copy_rate_log(rate_limited_start.name, RATE_DECIDED)


def copy_rate_log(task_name: str, into: str) -> None:
    """Copy the sliding log of task ``task_name``'s rate (member: a start, score: the
    server's time in us) to the HASH ``into``: called by a start, it copies itself."""
    client = get_client()
    log_key = KeySpace("ratelimit", f"task:{task_name}").key("log")
    entries = client.zrange(log_key, 0, -1, withscores=True)
    if entries:
        client.hset(into, mapping=dict(entries))


def rate_decided_starts() -> list[float]:
    """The starts of ``rate_limited_start`` as the server decided them (seconds, sorted).
    A start is in the log for a second, and every start copies the whole log, so one is
    missed only if each start's copy came more than a second after it; a missed start can
    hide a crowded window, never make one."""
    return sorted(float(score) / 1e6 for score in get_client().hvals(RATE_DECIDED))


@task(queue="default", concurrency=2, max_retries=0)
def at_most_two(seconds: float, together: int = 0) -> None:
    """At most two runs at once, across every worker (counted as ``overlap``)."""
    run_counted(seconds, together)


@task(queue="default")
def note_finished(task_id: str) -> None:
    """A follow-up: records which task it follows, and that task's status and return value
    as the follow-up reads them (final when the finish script queued it)."""
    from django_rcoord.queues import get_result

    record = get_result(task_id)
    seen = f"{record.status}:{record.return_value}" if record is not None else "none"
    get_client().rpush("test:followed", f"{task_id} {seen}")


@task(queue="reports/followers")
def note_finished_elsewhere(task_id: str) -> None:
    """A follow-up in another queue group (another hash slot)."""
    get_client().rpush("test:followed", f"{task_id} elsewhere")


@task(queue="default", on_success=note_finished_elsewhere)
def followed_elsewhere() -> None:
    pass


@task(queue="default", unique_for=60, unique_key=lambda task_id: "one at a time")
def unique_note(task_id: str) -> None:
    get_client().rpush("test:followed", f"{task_id} unique")


@task(queue="default", unique_for=60)
def unique_report(marker: str) -> None:
    """A report that should not pile up (a periodic task slower than its schedule)."""
    get_client().rpush(RAN, marker)


@task(queue="default", max_retries=0, unique_for=60)
def unique_failure(marker: str) -> None:
    """A unique task that fails for good at once (a dead letter holding a claim)."""
    raise ValueError(f"{marker} always fails")


@task(queue="default", on_success="tests.tasks.unique_note")
def followed_by_a_unique_task() -> None:
    pass


@task(queue="default", on_success=note_finished, on_failure="tests.tasks.note_finished")
def followed(fail: bool) -> str:
    if fail:
        raise PermanentFailure("failing on purpose")
    return "made"


@task(queue="default", max_retries=1, on_success="tests.tasks.not_a_task")
def follow_up_missing() -> None:
    get_client().rpush(RAN, "follow_up_missing")


@task(queue="default", max_retries=0)
def stop_when_asked(marker: str) -> str:
    """Works in steps until cancel() asks it to stop (or 20 s pass)."""
    from django_rcoord.queues import current_task_id, stop_requested

    get_client().rpush("test:started", f"{marker}:{current_task_id()}")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if stop_requested():
            return "stopped early"
        time.sleep(0.05)
    return "ran to the end"


@task(queue="default", max_retries=3, on_failure="tests.tasks.note_finished")
async def sleep_until_cancelled(marker: str, seconds: float = 30) -> None:
    """Sleeps ``seconds`` unless cancelled (then its ``finally`` still runs)."""
    from django_rcoord.queues import current_task_id

    get_client().rpush("test:started", f"{marker}:{current_task_id()}")
    try:
        await asyncio.sleep(seconds)
        get_client().rpush(RAN, marker)
    finally:
        get_client().rpush("test:cleaned", marker)


@task(queue="default", max_retries=3, on_failure="tests.tasks.note_finished")
def sleep_long(marker: str, seconds: float = 30) -> None:
    """A sync task that never checks stop_requested(): only killing its process stops it."""
    from django_rcoord.queues import current_task_id

    get_client().rpush("test:started", f"{marker}:{current_task_id()}:{os.getpid()}")
    time.sleep(seconds)
    get_client().rpush(RAN, marker)


@task(queue="default", max_retries=0)
def read_only_for(seconds: float, port: int) -> None:
    """Turns the server into a replica of a primary that is not there (every write answers
    READONLY) for ``seconds`` while it runs, then back into a primary."""
    client = get_client()
    client.replicaof("127.0.0.1", port)
    try:
        time.sleep(seconds)
    finally:
        client.replicaof("NO", "ONE")


@task(queue="default", max_retries=0)
def returns_quotes(count: int) -> str:
    """A return value whose JSON is twice as long again inside a JSON record."""
    return '"' * count


@task(queue="default", max_retries=0)
def raises_at_length(count: int) -> None:
    """An error whose text is ``count`` control characters (six bytes each as JSON)."""
    raise ValueError("\x01" * count)


@task(queue="default")
def read_database() -> None:
    """A task that reads the database (which may refuse connections: tests/refusing_database)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


#: Where ``collect`` leaves a fan-in's results: one JSON entry per run, per label.
FAN_IN = "test:fan-in"


@task(queue="default", max_retries=0)
def square(number: int) -> int:
    return number * number


@task(queue="elsewhere/default", max_retries=0)
def square_elsewhere(number: int) -> int:
    return number * number


@task(queue="fan-in/later", max_retries=0)
def square_later(number: int) -> int:
    """On a queue no worker of the tests serves unless asked: children that wait."""
    return number * number


@task(queue="default", max_retries=0)
def fail_to_square(number: int) -> int:
    raise ValueError(f"no square of {number} today")


@task(queue="default")
def square_slowly(number: int, seconds: float) -> int:
    get_client().rpush("test:started", f"{number}:{os.getpid()}")
    time.sleep(seconds)
    return number * number


@task(queue="default")
def collect(results: list, label: str) -> None:
    get_client().rpush(f"{FAN_IN}:{label}", json.dumps(results))


@task(queue="default", priority=50, max_retries=0)
def square_urgently(number: int) -> int:
    return number * number


@task(queue="default", priority=50)
def collect_urgently(results: list, label: str) -> None:
    get_client().rpush(f"{FAN_IN}:{label}", json.dumps(results))


@task(queue="elsewhere/default")
def collect_elsewhere(results: list, label: str) -> None:
    get_client().rpush(f"{FAN_IN}:{label}", json.dumps(results))


#: The order fair tasks started in, as the server recorded it (tests/test_fair_queues.py).
FAIR_STARTED = "test:fair-started"


@task(queue="fair", fair_key=lambda tenant, marker: tenant)
def record_tenant(tenant: str, marker: str) -> None:
    get_client().rpush(FAIR_STARTED, f"{tenant}:{marker}")


@task(queue="fair", priority=50, fair_key=lambda tenant, marker: tenant)
def record_tenant_urgently(tenant: str, marker: str) -> None:
    get_client().rpush(FAIR_STARTED, f"{tenant}:{marker}")


@task(queue="fair", max_retries=3, retry_backoff=0.1, fair_key=lambda tenant, marker: tenant)
def tenant_fails_once(tenant: str, marker: str) -> None:
    client = get_client()
    client.rpush(FAIR_STARTED, f"{tenant}:{marker}")
    if client.incr(f"test:attempts:{marker}") == 1:
        raise RuntimeError("the first attempt fails on purpose")


@task(queue="fair", fair_key=lambda tenant, marker: tenant, max_running_per_key=1)
def tenant_one_at_a_time(tenant: str, marker: str) -> None:
    """Records how many of its key run as it starts (the server counts), then works a little."""
    client = get_client()
    running = client.incr(f"test:running:{tenant}")
    client.rpush(f"test:running-seen:{tenant}", running)
    client.rpush(FAIR_STARTED, f"{tenant}:{marker}")
    time.sleep(0.05)
    client.decr(f"test:running:{tenant}")


@task(queue="default", fair_key=lambda key, n: key, rate_per_key="2/h", max_retries=0)
def keyed_rate_start(key: str, n: int) -> None:
    """At most two starts of one key an hour (so a test reads the limit's decision, not a
    clock): each start is recorded in RAN as '<key><n>'."""
    get_client().rpush(RAN, f"{key}{n}")
