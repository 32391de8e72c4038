"""This release's workers beside the previous release's on one queue group (a rolling
deploy): the previous release's finish script (``tests/previous_release/lua``), sent the
positional arguments its worker sent, takes and finishes tasks of the same group as this
release's ``Worker``. Each release's worker sends its own script (they run by their SHA1,
side by side), and they share the keys and records: nothing is lost or run twice, and
the records and metrics read alike whoever finished."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from django_rcoord.connection import get_client
from django_rcoord.queues import pause_queue, resume_queue
from django_rcoord.queues.keys import QueueKeys
from django_rcoord.queues.metrics import duration_bucket, metric_labels, read_metrics
from django_rcoord.queues.records import (
    queue_stats,
    recover_and_promote,
    requeue_dead,
    result_ttl_ms,
)
from django_rcoord.queues.results import get_result
from django_rcoord.queues.worker import Worker
from django_rcoord.queues.worker.finish import FinishProtocol
from django_rcoord.scripts import run_script
from tests import tasks
from tests.procs import server_ms, wait_until
from tests.test_queues import ran, result_of

pytestmark = pytest.mark.django_db(transaction=True)  # a Worker runs in this process

PREVIOUS = "tests.previous_release"
TASK = "tests.tasks.record"


def previous_exchange(
    worker_id: str,
    finished: list[tuple[str, str]],
    take: int,
    nonce: str,
    *,
    retried: tuple[str, str] | None = None,
    outcome: str = "retry",
) -> list[Any]:
    """One call of the previous release's finish script, as its worker made it: the group's
    keys, its exchange, the queue's four; eight settings, then ten values per finished task
    (each acknowledged here, with ``value``; ``retried``: (id, error entry JSON) of one
    failed attempt, to retry at once, or with ``outcome="dead"`` a dead letter)."""
    queue = QueueKeys.of("default")
    keys = [
        queue.messages,
        queue.owners,
        queue.failures,
        queue.errors,
        queue.results,
        queue.results_expiry,
        queue.idle,
        queue.metrics,
        queue.exchange(worker_id),
        queue.ready,
        queue.in_flight,
        queue.delayed,
        queue.dead,
    ]
    count = len(finished) + (retried is not None)
    args: list[Any] = [worker_id, 30_000, result_ttl_ms(), 0, "0", take, count, nonce]
    labels = metric_labels("default", TASK)
    for task_id, value in finished:
        args += [task_id, 1, "ack", "", 0, value, "", labels, duration_bucket(0.001), 1000]
    if retried is not None:
        task_id, entry = retried
        args += [task_id, 1, outcome, "boom", 0, "", entry, labels, duration_bucket(0.001), 1000]
    return run_script("task_finish", get_client(), keys=keys, args=args, package=PREVIOUS)


def test_workers_of_both_releases_drain_one_group_together() -> None:
    markers = [f"m{n}" for n in range(20)]
    ids = [tasks.record.delay(marker) for marker in markers]
    # The previous release's worker takes five...
    _, taken = previous_exchange("old-worker", [], 5, "0")
    held = [entry[0].decode() for entry in taken]
    assert len(held) == 5
    assert all(result_of(task_id).status == "RUNNING" for task_id in held)
    # ...this release's worker drains the other fifteen meanwhile...
    worker = Worker(["default"], burst=True)
    assert worker.run() == 15
    # ...and the previous one acknowledges its five, each with a value.
    finished, more = previous_exchange("old-worker", [(task_id, "42") for task_id in held], 0, "1")
    assert finished == [1] * 5
    assert more == []
    records = {task_id: result_of(task_id) for task_id in ids}
    assert {record.status for record in records.values()} == {"SUCCESSFUL"}
    assert [records[task_id].return_value for task_id in held] == [42] * 5
    assert sorted(ran()) == sorted(
        marker for marker, task_id in zip(markers, ids, strict=True) if task_id not in held
    )
    assert queue_stats("default") == {"ready": 0, "in_flight": 0, "delayed": 0, "dead": 0}
    counted = read_metrics("main").tasks[("default", TASK)]
    assert counted.finished == {"succeeded": 20}


def test_a_previous_releases_retried_call_is_answered_as_it_ran() -> None:
    """Its exchange record, written by its own script, answers its repeated nonce: the same
    tasks, still held, not taken twice."""
    ids = [tasks.record.delay(f"r{n}") for n in range(3)]
    _, first = previous_exchange("old-worker", [], 2, "7")
    _, again = previous_exchange("old-worker", [], 2, "7")
    assert [entry[0] for entry in again] == [entry[0] for entry in first]
    assert Worker(["default"], burst=True).run() == 1
    left = set(ids) - {entry[0].decode() for entry in first}
    assert all(result_of(task_id).status == "SUCCESSFUL" for task_id in left)


def test_a_previous_release_worker_does_not_honour_a_pause() -> None:
    """Its take script predates the paused SET: it takes from a paused queue, which this
    release's worker leaves alone (what the upgrade page says to plan for)."""
    ids = [tasks.record.delay(f"p{n}") for n in range(3)]
    pause_queue("default")
    assert Worker(["default"], burst=True).run() == 0
    _, taken = previous_exchange("old-worker", [], 1, "0")
    assert [entry[0].decode() for entry in taken] == ids[:1]
    resume_queue("default")
    assert Worker(["default"], burst=True).run() == 2


def test_a_record_the_previous_release_wrote_is_read_and_carried_over() -> None:
    """A task first run by a previous-release worker has its record in the group's results
    HASH: this release's get_result reads it there, and this release's worker, taking the
    task again, carries its history (attempts, workers, errors) into the task's own record
    and leaves nothing in the HASH."""
    task_id = tasks.record.delay("carried")
    _, taken = previous_exchange("old-worker", [], 1, "0")
    assert [entry[0].decode() for entry in taken] == [task_id]
    entry = json.dumps({"exception_class_path": "builtins.ValueError", "traceback": "boom"})
    previous_exchange("old-worker", [], 0, "1", retried=(task_id, entry))
    keys = QueueKeys.of("default")
    assert get_client().hget(keys.results, task_id).startswith(b"READY|")
    assert not get_client().exists(keys.record(task_id))
    # Read where the previous release wrote it.
    before = result_of(task_id)
    assert (before.status, before.worker_ids) == ("READY", ["old-worker"])
    assert before.errors == [json.loads(entry)]
    # This release's worker runs it (its retry is due at once) and finishes it.
    recover_and_promote(keys)
    assert Worker(["default"], burst=True).run() == 1
    after = result_of(task_id)
    assert after.status == "SUCCESSFUL"
    assert after.worker_ids[0] == "old-worker"
    assert after.attempts == 2
    assert after.errors == before.errors
    assert after.started_at == before.started_at
    fields = [field.decode() for field in get_client().hkeys(keys.results)]
    assert not [field for field in fields if field.startswith(task_id)]
    assert 0 < get_client().pttl(keys.record(task_id)) <= result_ttl_ms()


def test_a_finished_record_of_the_previous_release_is_read_until_it_expires() -> None:
    """Finished by a previous-release worker: this release's get_result reads its record in
    the results HASH (its value included), through the script, as that release did."""
    task_id = tasks.record.delay("old-finish")
    previous_exchange("old-worker", [], 1, "0")
    previous_exchange("old-worker", [(task_id, "42")], 0, "1")
    record = get_result(task_id)
    assert record is not None
    assert (record.status, record.return_value, record.worker_ids) == (
        "SUCCESSFUL",
        42,
        ["old-worker"],
    )
    assert not get_client().exists(QueueKeys.of("default").record(task_id))


def test_the_previous_releases_expired_records_are_dropped_by_this_release() -> None:
    """Its workers swept the records they finished; once only this release's run, its
    recovery pass drops those past their expiry (read as gone meanwhile)."""
    keys = QueueKeys.of("default")
    with override_settings(RCOORD={**settings.RCOORD, "TASK_RESULT_TTL": 1}):
        task_id = tasks.record.delay("old-expiry")
        previous_exchange("old-worker", [], 1, "0")
        previous_exchange("old-worker", [(task_id, "7")], 0, "1")
    expires_ms = get_client().zscore(keys.results_expiry, task_id)
    assert expires_ms is not None
    wait_until(lambda: server_ms() > expires_ms, timeout=10)
    assert get_result(task_id) is None
    assert get_client().hexists(keys.results, task_id)
    recover_and_promote(keys)
    fields = [field.decode() for field in get_client().hkeys(keys.results)]
    assert not [field for field in fields if field.startswith(task_id)]
    assert get_client().zscore(keys.results_expiry, task_id) is None


def test_a_record_the_previous_release_wrote_last_is_the_one_read() -> None:
    """A task this release's worker took, lost (its lease ran out) and the previous
    release's worker then ran: a queued task's state is where that release kept it (a field
    of the results HASH), so that worker carries its history, and wrote its finished record
    there. get_result reads that later record."""
    keys = QueueKeys.of("default")
    task_id = tasks.record.delay("mixed")
    protocol = FinishProtocol("new-worker", [keys])
    _, taken = run_script("task_finish", get_client(), *protocol.call([], 1, lease_ms=1))
    assert [entry[0].decode() for entry in taken] == [task_id]
    started = server_ms()
    wait_until(lambda: server_ms() > started + 5, timeout=10)
    recover_and_promote(keys)  # its lease ran out: READY again, where both releases read it
    assert get_client().hget(keys.results, task_id).startswith(b"READY|")
    assert not get_client().exists(keys.record(task_id))
    previous_exchange("old-worker", [], 1, "0")
    previous_exchange("old-worker", [(task_id, "42")], 0, "1")
    record = result_of(task_id)
    assert (record.status, record.return_value, record.worker_ids) == (
        "SUCCESSFUL",
        42,
        ["new-worker", "old-worker"],
    )


def test_a_dead_letter_of_the_previous_release_is_requeued_with_its_history() -> None:
    """Made a dead letter by a previous-release worker (its record FAILED in the results
    HASH, its expiry in that release's ZSET): requeued by this release, its state is READY
    where it was, its errors move into its own record, which does not expire, nothing
    expires any more, and it runs with its history."""
    keys = QueueKeys.of("default")
    task_id = tasks.record.delay("old-dead")
    previous_exchange("old-worker", [], 1, "0")
    entry = json.dumps({"exception_class_path": "builtins.ValueError", "traceback": "boom"})
    previous_exchange("old-worker", [], 0, "1", retried=(task_id, entry), outcome="dead")
    assert result_of(task_id).status == "FAILED"
    assert get_client().zscore(keys.results_expiry, task_id) is not None
    assert requeue_dead("default", task_id) == 1
    assert get_client().zscore(keys.results_expiry, task_id) is None
    assert get_client().hget(keys.results, task_id).startswith(b"READY|")
    assert not get_client().hexists(keys.results, f"{task_id}:m")
    assert not get_client().hexists(keys.results, f"{task_id}:e")
    assert get_client().hkeys(keys.record(task_id)) == [b"e"]
    assert get_client().pttl(keys.record(task_id)) == -1
    assert Worker(["default"], burst=True).run() == 1
    record = result_of(task_id)
    assert (record.status, record.attempts, record.worker_ids[0]) == ("SUCCESSFUL", 2, "old-worker")
    assert record.errors == [json.loads(entry)]
