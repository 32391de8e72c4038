"""Result records of the project's own tasks: ``queues.get_result(task_id)``."""

from __future__ import annotations

import dataclasses
import datetime
import signal
import time
from typing import Any

import pytest
import redis
import redis.asyncio
from asgiref.sync import async_to_sync, sync_to_async
from django.conf import settings
from django.test import override_settings

from django_rcoord.connection import get_client, slot_pipeline
from django_rcoord.connection.features import SCRIPT_FLAGS
from django_rcoord.queues import (
    enqueue_many,
    execute_later,
    get_result,
    queue_stats,
    requeue_dead,
)
from django_rcoord.queues.keys import QueueKeys, group_of_task_id
from django_rcoord.queues.messages import decode_message
from django_rcoord.queues.results import TaskRecord, aget_result, record_from
from django_rcoord.queues.worker import Worker
from tests import cluster, tasks
from tests.procs import wait_until
from tests.test_queues import output_of, ran, result_of, start_worker

pytestmark = pytest.mark.django_db(transaction=True)


def run_all(*queues: str) -> int:
    return Worker(list(queues or ["default"]), burst=True).run()


def test_a_queued_task_is_ready_with_its_arguments() -> None:
    before = datetime.datetime.now(datetime.timezone.utc)
    task_id = tasks.record.delay("r1")
    record = result_of(task_id)
    assert record.status == "READY"
    assert record.task == "tests.tasks.record"
    assert record.queue == "default"
    assert record.args == ["r1"]
    assert record.kwargs == {}
    assert record.enqueued_at is not None
    assert before - datetime.timedelta(seconds=1) <= record.enqueued_at
    assert record.started_at is record.finished_at is None
    assert record.attempts == 0
    assert record.errors == []
    assert not record.is_finished


def test_a_finished_task_is_successful_with_its_return_value() -> None:
    task_id = tasks.add_numbers.delay(2, b=3)
    assert run_all() == 1
    record = result_of(task_id)
    assert record.status == "SUCCESSFUL"
    assert record.return_value == {"sum": 5, "on": "2026-11-23"}
    assert record.args == [2]
    assert record.kwargs == {"b": 3}
    assert record.enqueued_at is not None
    assert record.started_at is not None
    assert record.finished_at is not None
    # One precision for all: the producer's time, finer than the server's milliseconds,
    # could read as after the start.
    assert {t.microsecond % 1000 for t in (record.enqueued_at, record.started_at)} == {0}
    assert record.enqueued_at <= record.started_at <= record.finished_at
    assert record.last_attempted_at == record.started_at
    assert record.attempts == 1
    assert len(record.worker_ids[0]) > 10
    assert record.errors == []


def test_running_is_seen_from_another_process() -> None:
    task_id = tasks.record_when_released.delay("slow")
    worker = start_worker("--burst")
    try:
        wait_until(lambda: result_of(task_id).status == "RUNNING", timeout=60)
        record = result_of(task_id)
        assert record.started_at is not None
        assert record.finished_at is None
        assert record.worker_ids[0].split(":")[1] == str(worker.pid)
        tasks.release("slow")
        wait_until(lambda: result_of(task_id).status == "SUCCESSFUL", timeout=60)
    finally:
        output = output_of(worker, 60)
    assert worker.returncode == 0, output


def test_a_failed_task_keeps_its_error_and_traceback() -> None:
    task_id = tasks.always_fail.delay("f1")
    run_all()
    record = result_of(task_id)
    assert record.status == "FAILED"
    assert record.finished_at is not None
    (error,) = record.errors
    assert error["exception_class_path"] == "builtins.ValueError"
    assert "f1 always fails" in error["traceback"]
    assert "Traceback" in error["traceback"]
    assert record.return_value is None


def test_retries_count_as_attempts_and_keep_each_error() -> None:
    task_id = tasks.fail_then_succeed.delay("r2", 2)
    deadline = time.monotonic() + 30
    while result_of(task_id).status != "SUCCESSFUL" and time.monotonic() < deadline:
        run_all()
        time.sleep(0.05)
    record = result_of(task_id)
    assert record.status == "SUCCESSFUL"
    assert record.attempts == 3
    assert [error["exception_class_path"] for error in record.errors] == [
        "builtins.RuntimeError",
        "builtins.RuntimeError",
    ]
    assert record.started_at is not None
    assert record.last_attempted_at is not None
    assert record.finished_at is not None
    assert record.started_at < record.last_attempted_at <= record.finished_at


def test_a_return_value_json_cannot_carry_fails_the_task_and_the_worker_goes_on() -> None:
    bad = tasks.return_unstorable.delay()
    good = tasks.record.delay("after")
    assert run_all() == 2
    record = result_of(bad)
    assert record.status == "FAILED"
    assert record.attempts == 1  # not retried: it would return the same
    assert "cannot be stored as JSON" in record.errors[0]["traceback"]
    assert result_of(good).status == "SUCCESSFUL"
    assert ran() == ["after"]


def test_system_exit_fails_the_task_not_the_worker() -> None:
    exiting = tasks.exit_the_process.delay()
    after = tasks.record.delay("still-here")
    worker = start_worker("--burst")
    output = output_of(worker, 60)
    assert worker.returncode == 0, output
    assert result_of(exiting).status == "FAILED"
    assert result_of(exiting).errors[0]["exception_class_path"] == "builtins.SystemExit"
    assert result_of(after).status == "SUCCESSFUL"


def test_a_task_that_cannot_run_here_is_failed_with_the_reason() -> None:
    task_id = execute_later("default", "tests.tasks.no_such_task", [1])
    run_all()
    record = result_of(task_id)
    assert record.status == "READY"  # waiting for a worker that knows it
    assert "unknown task" in record.errors[0]["traceback"]
    time.sleep(0.1)  # due again (TASK_RETRY_BACKOFF 0.05 s)
    with override_settings(RCOORD={**settings.RCOORD, "TASK_MAX_DELIVERIES": 2}):
        run_all()
    record = result_of(task_id)
    assert record.status == "FAILED"
    assert record.errors[0]["exception_class_path"] == "django_rcoord.exceptions.TaskNotRunnable"
    assert "unknown task" in record.errors[0]["traceback"]


def test_a_requeued_dead_letter_is_ready_again() -> None:
    task_id = tasks.always_fail.delay("again")
    run_all()
    assert result_of(task_id).status == "FAILED"
    assert requeue_dead("default") == 1
    assert result_of(task_id).status == "READY"
    assert len(result_of(task_id).errors) == 1  # its history is kept


def test_ids_name_their_group_and_unknown_ids_have_no_record() -> None:
    task_id = tasks.render_pdf.delay("invoice")
    assert task_id.startswith("reports/")
    run_all("reports/pdf")
    assert result_of(task_id).return_value == "invoice.pdf"
    assert get_result("0" * 32) is None
    for malformed in ("", "nope", "reports/", "x" * 32, "{bad}/" + "0" * 32, 42, None):
        assert get_result(malformed) is None  # type: ignore[arg-type]


def test_a_worker_killed_mid_task_runs_it_again_and_counts_both_attempts() -> None:
    task_id = tasks.block_first_time.delay("k1", 30)  # its first run is killed
    victim = start_worker(lease=1.5)
    wait_until(lambda: result_of(task_id).status == "RUNNING", timeout=60)
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    rescuer = start_worker(lease=1.5)  # takes it again once the dead worker's lease ends
    try:
        wait_until(lambda: result_of(task_id).status == "SUCCESSFUL", timeout=60)
    finally:
        rescuer.send_signal(signal.SIGTERM)
        output_of(rescuer, 30)
    record = result_of(task_id)
    assert record.status == "SUCCESSFUL"
    assert record.attempts == 2
    assert record.worker_ids[0] != record.worker_ids[1]


def test_finished_records_expire(redis_client) -> None:
    with override_settings(RCOORD={**settings.RCOORD, "TASK_RESULT_TTL": 3}):
        first = tasks.record.delay("e1")
        run_all()
        # What the finish wrote, read raw: through get_result the record reads as gone 3 s
        # on, which a machine paused for a moment could spend before the read.
        record = QueueKeys.of("default").record(first)
        assert redis_client.hget(record, "s").startswith(b"SUCCESSFUL|")
        # Its expiry is the server's: the record goes when the result TTL has passed.
        assert 0 < redis_client.pttl(record) <= 3000
        wait_until(lambda: not redis_client.exists(record), timeout=10)
        assert get_result(first) is None
    assert not redis_client.hexists(results_key(), first)


def test_finished_records_expire_by_themselves(redis_client) -> None:
    """Each finished record carries its own expiry (nothing to sweep): three hundred of them
    finished in calls of a hundred leave no field in the group's results HASH and no record
    without an expiry, and are gone once their TTL passed."""
    keys = QueueKeys.of("default")
    with override_settings(RCOORD={**settings.RCOORD, "TASK_RESULT_TTL": 2}):
        old = enqueue_many([(tasks.add_numbers, (index, 1), {}) for index in range(300)])
        assert Worker(["default"], burst=True, prefetch=100).run() == 300
        ttls = [redis_client.pttl(keys.record(task_id)) for task_id in old]
        assert all(0 < ttl <= 2000 for ttl in ttls)
        assert redis_client.hlen(keys.results) == 0
        wait_until(lambda: not any(redis_client.exists(keys.record(i)) for i in old), timeout=30)


def results_key() -> str:
    from django_rcoord.queues.keys import QueueKeys

    return QueueKeys.of("default").results


def test_thirty_finished_tasks_leave_no_key_without_an_expiry(redis_client) -> None:
    enqueue_many([(tasks.add_numbers, (index, 1), {}) for index in range(30)])
    assert run_all() == 30
    keys = list(redis_client.scan_iter(count=1000))  # every primary's, on a cluster
    assert keys
    lasting = [key for key in keys if redis_client.pttl(key) == -1]
    assert lasting == []
    assert queue_stats("default") == {"ready": 0, "in_flight": 0, "delayed": 0, "dead": 0}
    assert get_client().hlen(results_key()) == 0  # each record is a HASH of its own:
    records = [key for key in keys if key.startswith(QueueKeys.of("default").records.encode())]
    assert len(records) == 30
    assert {get_client().hlen(key) for key in records} == {3}  # state, value, message


# -- one round trip, the same records ------------------------------------------------------
class CountingRedis(redis.Redis):
    """A real client on the suite's connection pool that counts the commands it sends."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.commands: list[str] = []

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.commands.append(str(args[0]))
        return super().execute_command(*args, **options)


class CountingAsyncRedis(redis.asyncio.Redis):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.commands: list[str] = []

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        self.commands.append(str(args[0]))
        return await super().execute_command(*args, **options)


def reference_record(task_id: str) -> TaskRecord | None:
    """The record as ``get_result`` reads it, read with plain commands in a pipeline on the
    slot's primary: the task's message, its state while queued or running (a field of the
    group's results HASH), its record HASH and its last error."""
    group = group_of_task_id(task_id)
    if group is None:
        return None
    keys = QueueKeys.of(f"{group}/q")
    with slot_pipeline(get_client(), keys.messages, transaction=False) as pipe:
        pipe.hget(keys.messages, task_id)
        pipe.hget(keys.results, task_id)
        pipe.hmget(keys.record(task_id), ["s", "v", "e", "m", "x"])
        pipe.hget(keys.errors, task_id)
        pipe.time()
        message, live, fields, last_error, now = pipe.execute()
    if live is not None:
        fields[0], fields[4] = live, None
    return record_from(task_id, message, fields[:4], None, fields[4] or last_error, now)


def records_in_every_status() -> dict[str, str]:
    """Task ids, by what became of each: successful, failed (a dead letter), retried,
    requeued from the dead letters, unknown to the worker, in another group, delayed, ready,
    and an id no task has."""
    ids = {
        "successful": tasks.add_numbers.delay(2, b=3),
        "failed": tasks.always_fail.delay("dead"),
        "retried": tasks.fail_then_succeed.delay("twice", 2),
        "requeued": tasks.always_fail.delay("requeued"),
        "unknown task": execute_later("default", "tests.tasks.no_such_task", [1]),
        "other group": tasks.render_pdf.delay("invoice"),
    }
    run_all()
    run_all("reports/pdf")
    deadline = time.monotonic() + 30
    while result_of(ids["retried"]).status != "SUCCESSFUL" and time.monotonic() < deadline:
        time.sleep(0.05)
        Worker(["default"], burst=True).run()
    requeue_dead("default", ids["requeued"])
    ids["delayed"] = tasks.record.schedule("later", delay=3600)
    ids["ready"] = tasks.record.delay("still-queued")
    ids["unknown id"] = "0" * 32
    return ids


def test_get_result_reads_what_the_five_command_pipeline_read_in_every_status() -> None:
    ids = records_in_every_status()
    statuses = {
        name: result_of(task_id).status for name, task_id in ids.items() if name != "unknown id"
    }
    assert statuses["ready"] == statuses["unknown task"] == statuses["delayed"] == "READY"
    assert statuses["successful"] == statuses["other group"] == "SUCCESSFUL"
    assert statuses["failed"] == "FAILED"
    assert statuses["retried"] == "SUCCESSFUL"
    assert statuses["requeued"] == "READY"
    for name, task_id in ids.items():
        assert get_result(task_id) == reference_record(task_id), name
        assert async_to_sync(aget_result)(task_id) == reference_record(task_id), name
    assert get_result(ids["unknown id"]) is None


def test_expired_records_read_as_before() -> None:
    with override_settings(RCOORD={**settings.RCOORD, "TASK_RESULT_TTL": 1}):
        finished = tasks.record.delay("expires")
        dead = tasks.always_fail.delay("expires-dead")
        run_all()
        assert result_of(dead).status == "FAILED"
        time.sleep(1.2)
    assert get_result(finished) is None is reference_record(finished)
    # A dead letter outlives its record: FAILED, with the last error kept beside it.
    record = get_result(dead)
    assert record == reference_record(dead)
    assert record is not None
    assert record.status == "FAILED"
    assert "expires-dead always fails" in record.errors[0]["traceback"]


@pytest.mark.skipif(cluster.ENABLED, reason="counts the commands of one plain client")
def test_get_result_is_one_command_for_a_finished_task() -> None:
    """A finished record is one HGETALL, no script; any other is read by the script after;
    an id the script does not know is looked for as a fan-in's callback not queued yet."""
    ids = records_in_every_status()
    client = CountingRedis(connection_pool=get_client().connection_pool)
    get_result(ids["ready"], client=client)  # the script's first call may load it
    finished = {"successful", "failed", "retried", "other group"}
    for name, task_id in ids.items():
        client.commands.clear()
        get_result(task_id, client=client)
        expected = ["HGETALL"] if name in finished else ["HGETALL", "EVALSHA"]
        if name == "unknown id":
            expected.append("HMGET")
        assert client.commands == expected, name


@pytest.mark.skipif(cluster.ENABLED, reason="counts the commands of one plain client")
async def test_aget_result_is_one_command(redis_url: str) -> None:
    task_id = await tasks.add_numbers.adelay(1, b=2)
    client = CountingAsyncRedis.from_url(redis_url)
    assert isinstance(client, CountingAsyncRedis)
    try:
        await aget_result(task_id, client=client)
        client.commands.clear()
        await aget_result(task_id, client=client)
        assert client.commands == ["HGETALL", "EVALSHA"]  # not finished: the script
        client.commands.clear()
        await aget_result("0" * 32, client=client)  # unknown: a fan-in's callback, maybe
        assert client.commands == ["HGETALL", "EVALSHA", "HMGET"]
        await sync_to_async(run_all)()  # ...and once it finished, its record alone
        client.commands.clear()
        record = await aget_result(task_id, client=client)
        assert record is not None
        assert record.status == "SUCCESSFUL"
        assert client.commands == ["HGETALL"]
    finally:
        await client.aclose()


def test_the_read_only_script_is_used_where_the_server_knows_shebangs() -> None:
    task_id = tasks.record.delay("ro")
    assert result_of(task_id).status == "READY"
    major = int(get_client().info("server")["redis_version"].split(".")[0])
    assert SCRIPT_FLAGS.usable(get_client()) is (major >= 7)


@pytest.mark.parametrize(
    ("raw", "parts"),
    [
        ("RUNNING|1|2||w1,w2", ["RUNNING", "1", "2", "", "w1,w2"]),
        ("SUCCESSFUL|1|2|3|w1", ["SUCCESSFUL", "1", "2", "3", "w1"]),
        # States the scripts did not write whole: each missing part reads ''.
        ("READY|1", ["READY", "1", "", "", ""]),
        ("", ["", "", "", "", ""]),
        (None, ["", "", "", "", ""]),
    ],
)
def test_the_scripts_read_a_record_state_as_its_five_parts(
    raw: str | None, parts: list[str]
) -> None:
    """``parse_state`` (``_records.lua``), which the take, finish, recover and cancel
    scripts share, run by the server itself."""
    from django_rcoord.scripts import get_script

    helper = get_script("_records").script
    assert isinstance(helper, bytes)  # read from the package's file
    source = helper + b"\nreturn parse_state(ARGV[1] ~= '-' and ARGV[1] or nil)"
    reply = get_client().eval(source, 0, "-" if raw is None else raw)
    assert [part.decode() for part in reply] == parts


def test_a_record_read_has_every_field_its_constructor_sets() -> None:
    """Records are made without ``TaskRecord.__init__`` (``results._new_record``, for speed):
    each record read has every field, and equals the one its constructor makes of them."""
    names = {field.name for field in dataclasses.fields(TaskRecord)}
    for name, task_id in records_in_every_status().items():
        record = get_result(task_id)
        if record is None:
            continue
        assert set(vars(record)) == names, name
        assert record == TaskRecord(**vars(record)), name


def test_a_message_is_read_as_json_loads_reads_it() -> None:
    """``decode_message`` skips ``json.loads``' whitespace scans for a compact message; what
    has whitespace around it or more after it is still read as ``json.loads`` reads it."""
    assert decode_message(b'{"a":1}') == {"a": 1}
    assert decode_message(' {"a": [1]}\n') == {"a": [1]}
    for bad in (b'{"a":1} x', b'{"a":1}{}', b"[1]", b"\xff", b"", b"1 2", b"\xef\xbb\xbf{}"):
        assert decode_message(bad) is None, bad
