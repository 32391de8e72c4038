"""The finish script's call, as the worker builds it (no Redis: the queue tests run it)."""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any

import pytest

from django_rcoord.queues.keys import QueueKeys
from django_rcoord.queues.outcomes import Kind
from django_rcoord.queues.producer import QueuedInStep
from django_rcoord.queues.worker.calls import give_back_call, renew_call
from django_rcoord.queues.worker.finish import (
    ACK_FIELDS,
    RECORD_SEPARATOR,
    FinishProtocol,
    finish_record,
)
from django_rcoord.queues.worker.jobs import Done, Job, Outcome


def done(queue: QueueKeys, task_id: str, outcome: Outcome, index: int = 1) -> Done:
    return Done(Job(task_id, b"{}", queue, 0, "", index), outcome, 12.5)


def follow_up(queue: QueueKeys, task_id: str) -> QueuedInStep:
    message = json.dumps({"task": "next", "args": [task_id]})
    args = [task_id, message, queue.queue, 5, b"2592000000"]
    return QueuedInStep(task_id, queue, queue.enqueue_now, args, "u:x", 1000)


def read_record(arg: bytes) -> dict[str, Any]:
    """A finished task's record as the script reads it: a plain acknowledgement's compact
    form (its fields apart by RECORD_SEPARATOR, in ACK_FIELDS' order), or JSON."""
    text = arg.decode()
    if not text.startswith(RECORD_SEPARATOR):
        return json.loads(text)
    values = text[1:].split(RECORD_SEPARATOR, len(ACK_FIELDS) - 1)
    fields = dict(zip(ACK_FIELDS, values, strict=True))
    return {**fields, "queue": int(fields["queue"]), "outcome": "ack", "us": int(fields["us"])}


def test_a_call_is_its_settings_then_one_record_per_finished_task() -> None:
    high, low = QueueKeys.of("jobs/high"), QueueKeys.of("jobs/low")
    protocol = FinishProtocol("w1", [high, low])
    finished = [
        done(high, "a", Outcome(Kind.ACK, "t", value_json='{"x": 1}')),
        done(low, "b", Outcome(Kind.RETRY, "t", "boom", "E", delay_ms=250), index=2),
    ]
    keys, args = protocol.call(finished, 8, lease_ms=3000, idle_ms=0, nonce="7")
    assert keys == protocol.keys  # no follow-up: the worker's keys, as they are
    assert keys[8] == high.exchange("w1")
    assert keys[9] == high.paused
    assert keys[10] == high.queues  # a fair key's next task takes a fresh counter
    assert keys[11:] == [
        *(high.ready, high.in_flight, high.delayed, high.dead),
        *(low.ready, low.in_flight, low.delayed, low.dead),
        high.incoming,  # the group's incoming list and ready prefix: the take places first
        high.readies,
    ]
    settings = json.loads(args[0])
    assert settings | {"result_ttl": 0} == {
        "worker": "w1",
        "lease": 3000,
        "result_ttl": 0,
        "idle_ms": 0,
        "registered": False,
        "take": 8,
        "queues": 2,
        "names": ["high", "low"],
        "incoming": 20,  # 1-based, as KEYS
        "nonce": "7",
    }
    first, second = (read_record(arg) for arg in args[1:])
    assert (first["id"], first["queue"], first["outcome"], first["value"]) == (
        "a",
        1,
        "ack",
        '{"x": 1}',
    )
    assert (second["queue"], second["outcome"], second["delay"], second["us"]) == (
        2,
        "retry",
        250,
        12500,
    )
    assert "follow_ups" not in first


def test_a_record_carries_only_the_fields_its_outcome_uses() -> None:
    """The script decodes every record of a call: an acknowledgement carries its value, a
    failure its error, entry and delay, a task held back by its limits only its delay."""
    queue = QueueKeys.of("jobs/high")
    protocol = FinishProtocol("w1", [queue])
    finished = [
        done(queue, "a", Outcome(Kind.ACK, "t")),
        done(queue, "b", Outcome(Kind.DEAD, "t", "boom", "E")),
        done(queue, "c", Outcome(Kind.LATER, "t", "waiting for its rate", delay_ms=40)),
    ]
    _, args = protocol.call(finished, 0, lease_ms=3000)
    ack, dead, later = (read_record(arg) for arg in args[1:])
    common = {"id", "queue", "outcome", "labels", "bucket", "us"}
    assert set(ack) == common | {"value"}
    assert ack["value"] == "null"
    assert set(dead) == common | {"delay", "error", "entry"}
    assert (dead["error"], json.loads(dead["entry"])) == (
        "boom",
        {"exception_class_path": "E", "traceback": "boom"},
    )
    assert set(later) == common | {"delay"}
    assert later["delay"] == 40


def test_a_follow_up_names_where_its_own_keys_start() -> None:
    queue = QueueKeys.of("jobs/high")
    protocol = FinishProtocol("w1", [queue])
    steps = [follow_up(queue, "n1"), follow_up(queue, "n2")]
    finished = [
        done(queue, "a", Outcome(Kind.ACK, "t", follow_ups=[steps[0]])),
        done(queue, "b", Outcome(Kind.ACK, "t")),
        done(queue, "c", Outcome(Kind.DEAD, "t", "x", follow_ups=[steps[1]])),
    ]
    keys, args = protocol.call(finished, 0, lease_ms=1000)
    assert len(keys) == len(protocol.keys) + 10
    assert len(protocol.keys) == 17  # the worker's own keys are left as they were
    for arg, step in zip((args[1], args[3]), steps, strict=True):
        (record,) = json.loads(arg)["follow_ups"]
        start = record["keys"] - 1  # KEYS are 1-based
        assert tuple(keys[start : start + 5]) == step.keys
        assert (record["id"], record["keep_ms"]) == (step.task_id, 2592000000)
        assert "wake_ms" not in record  # enqueue_now pushes a token, which does not expire
        assert json.loads(record["message"])["args"] == [step.task_id]
    assert "follow_ups" not in read_record(args[2])


def test_a_plain_acknowledgement_goes_in_its_compact_form() -> None:
    """Most records are plain acknowledgements: the script reads them with one
    string.match, not cjson. An acknowledgement that carries more (a follow-up, a fair key
    with a limit), or whose labels or id hold the separator, and every other outcome go as JSON,
    and both forms read the same."""
    queue = QueueKeys.of("jobs/high")
    protocol = FinishProtocol("w1", [queue])
    fair = Job("f", b'{"task": "t", "fair_key": "k", "fair_limit": 1}', queue, 0, "", 1)
    finished = [
        done(queue, "a", Outcome(Kind.ACK, "t", value_json='{"x": "1\\u001e2"}')),
        done(queue, "b", Outcome(Kind.ACK, "t", follow_ups=[follow_up(queue, "n")])),
        Done(fair, Outcome(Kind.ACK, "t"), 1.0),
        done(queue, "c", Outcome(Kind.ACK, "t\x1eodd")),
        done(queue, "d", Outcome(Kind.RETRY, "t", "boom", "E", delay_ms=5)),
        done(queue, "e\x1eodd", Outcome(Kind.ACK, "t")),  # a group's name may hold it
    ]
    _, args = protocol.call(finished, 0, lease_ms=1000)
    compact = [arg.startswith(RECORD_SEPARATOR.encode()) for arg in args[1:]]
    assert compact == [True, False, False, False, False, False]
    plain = read_record(args[1])
    assert plain == {
        "id": "a",
        "queue": 1,
        "outcome": "ack",
        "labels": "jobs/high\x1ft",
        "bucket": "3",
        "us": 12500,
        "value": '{"x": "1\\u001e2"}',
    }
    assert read_record(args[4])["labels"] == "jobs/high\x1ft\x1eodd"


def test_the_reply_is_read_into_jobs_of_their_queues() -> None:
    high, low = QueueKeys.of("jobs/high"), QueueKeys.of("jobs/low")
    protocol = FinishProtocol("w1", [high, low])
    (job,) = protocol.jobs([[b"t1", b'{"task": "x"}', 2, 1, b"RUNNING|1|1||w1"]])
    assert (job.id, job.queue, job.queue_index, job.failures, job.state) == (
        "t1",
        low,
        2,
        1,
        "RUNNING|1|1||w1",
    )
    assert job.task_name == "x"


def test_the_outcome_kinds_are_the_strings_the_finish_script_reads() -> None:
    """One vocabulary: each kind a finished record carries is one the scripts compare
    against, and the scripts compare against no other (STOPPED goes to task_stopped)."""
    lua = resources.files("django_rcoord") / "lua"
    code = "".join(
        (lua / f"{name}.lua").read_text() for name in ("_finish", "_follow_ups", "_metrics")
    )
    compared = set(re.findall(r"outcome\s*[=~]=\s*'(\w+)'", code))
    assert compared == {kind.value for kind in Kind} - {Kind.STOPPED.value}
    retried = done(QueueKeys.of("q"), "a", Outcome(Kind.RETRY, "t", "boom", "E", delay_ms=5))
    assert json.loads(json.dumps(finish_record(retried)))["outcome"] == "retry"
    assert Outcome("dead", "t").kind is Kind.DEAD  # type: ignore[arg-type]  # the Lua string
    with pytest.raises(ValueError, match="'acked'"):
        Outcome("acked", "t")  # type: ignore[arg-type]


def lua_reads(script: str) -> set[str]:
    """The fields of the call's record a script reads (``call.<name>``)."""
    text = (resources.files("django_rcoord") / "lua" / f"{script}.lua").read_text()
    return set(re.findall(r"\bcall\.(\w+)", text))


def test_the_lease_scripts_read_their_calls_by_name() -> None:
    """renew and give-back send their settings as one named record, as the finish does:
    each script reads each field its builder writes, and no other."""
    queue = QueueKeys.of("jobs/high")
    keys, args = renew_call(queue, "w1", 30_000, ["a", "b"])
    assert keys == [queue.owners, queue.in_flight, queue.stop("a"), queue.stop("b")]
    assert json.loads(args[0]) == {"worker": "w1", "lease_ms": 30_000}
    assert args[1:] == ["a", "b"]
    assert lua_reads("task_renew") == set(json.loads(args[0]))
    keys, args = give_back_call(queue, "w1", ["a"])
    assert keys[:2] == [queue.owners, queue.in_flight]
    assert args[1:] == ["a"]
    assert json.loads(args[0])["queue"] == "high"
    assert lua_reads("task_give_back") == set(json.loads(args[0]))
    _, args = FinishProtocol("w1", [queue]).call([], 5, lease_ms=30_000)
    assert lua_reads("task_finish") == set(json.loads(args[0]))
