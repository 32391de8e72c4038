"""The worker's side of the finish script (``task_finish.lua``): the KEYS and ARGV of one
call, and the jobs its reply hands over. No Redis here: ``QueueSession`` sends the call.

A call is one JSON record of its settings, then one JSON record per finished task (see
the script's header for their fields); a finished task's follow-up rides in its record
and names where its five keys start among KEYS.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django_rcoord.queues.fair import finished_fields
from django_rcoord.queues.fan_in import FanInCount
from django_rcoord.queues.keys import QueueKeys
from django_rcoord.queues.messages import wire_json
from django_rcoord.queues.metrics import duration_bucket, metric_labels
from django_rcoord.queues.outcomes import Kind
from django_rcoord.queues.producer import QueuedInStep
from django_rcoord.queues.records import result_ttl_ms
from django_rcoord.queues.worker.jobs import Done, Job

#: A script's KEYS and ARGV, as a call of the worker's builds them.
ScriptCall = tuple[list[Any], list[Any]]


class FinishProtocol:
    """The finish script's calls for worker ``worker_id`` over ``queues`` (one group, in
    priority order)."""

    def __init__(self, worker_id: str, queues: Sequence[QueueKeys]) -> None:
        self.worker_id = worker_id
        self.queues = list(queues)
        group = self.queues[0]
        # The group's keys, this worker's last exchange, the group's paused queues, its
        # queue counters (a fair key's next task takes a fresh one), four per queue, then
        # the group's incoming LIST and ready prefix (the take places what producers pushed).
        self.keys: list[Any] = [
            group.messages,
            group.owners,
            group.failures,
            group.errors,
            group.results,
            group.records,
            group.idle,
            group.metrics,
            group.exchange(worker_id),
            group.paused,
            group.queues,
            *(
                key
                for queue in self.queues
                for key in (queue.ready, queue.in_flight, queue.delayed, queue.dead)
            ),
            group.incoming,
            group.readies,
        ]
        self.incoming = len(self.keys) - 1  # its position among KEYS, 1-based
        # What the paused SET holds: each queue's name within the group.
        self.names = [queue.queue for queue in self.queues]

    def call(
        self,
        done: Sequence[Done],
        take: int,
        *,
        lease_ms: int,
        idle_ms: int = 0,
        registered: bool = False,
        nonce: str = "",
    ) -> ScriptCall:
        """The KEYS and ARGV of one call: finish ``done``, take up to ``take`` (each leased
        for ``lease_ms``); finding nothing, register idle for ``idle_ms`` (0: do not);
        ``registered``: this worker is registered idle now; ``nonce``: this exchange's
        ('' for none), so that a call retried after its reply was lost is answered as it
        ran."""
        settings = {
            "worker": self.worker_id,
            "lease": lease_ms,
            "result_ttl": result_ttl_ms(),
            "idle_ms": idle_ms,
            "registered": registered,
            "take": take,
            "queues": len(self.queues),
            "names": self.names,
            "incoming": self.incoming,
            "nonce": nonce,
        }
        keys = self.keys
        args: list[Any] = [wire_json(settings)]
        for item in done:
            record = finish_record(item)
            count = item.outcome.fan_in
            if count is not None:
                keys = [*keys, *count.keys]
                record["fan_in"] = fan_in_record(count, first_key=len(keys) - 5)
            steps = item.outcome.follow_ups
            if steps:
                record["follow_ups"] = []
                for step in steps:
                    keys = [*keys, *step.keys]
                    record["follow_ups"].append(follow_up_record(step, first_key=len(keys) - 4))
            args.append(wire_record(record))
        return keys, args

    def jobs(self, taken: Sequence[Any]) -> list[Job]:
        """The jobs a call's reply hands over: {id, message, queue index, failures, record
        state} each."""
        return [
            Job(
                task_id.decode(),
                body,
                self.queues[int(queue_index) - 1],
                int(failures),
                state.decode(),
                int(queue_index),
            )
            for task_id, body, queue_index, failures, state in taken
        ]


def finish_record(done: Done) -> dict[str, Any]:
    """A finished task's record (see task_finish.lua), with the fields its outcome uses
    only: the script decodes every record of a call, and most are acknowledgements."""
    outcome = done.outcome
    record: dict[str, Any] = {
        "id": done.job.id,
        "queue": done.job.queue_index,
        "outcome": outcome.kind,
        "labels": metric_labels(done.job.queue.name, outcome.task_name),
        "bucket": duration_bucket(done.took_ms / 1000),
        "us": round(done.took_ms * 1000),
    }
    # A run of a fair key with a limit: its end lets the key's next task in (the message
    # was decoded when the run was resolved).
    record.update(finished_fields(done.job.message))
    if outcome.kind is Kind.ACK:
        record["value"] = outcome.value_json
        return record
    record["delay"] = outcome.delay_ms
    if outcome.kind is not Kind.LATER:  # held back by its limits: it did not run, nothing failed
        record["error"] = outcome.stored_error
        record["entry"] = outcome.error_entry
    return record


#: A plain acknowledgement's fields in its compact form (see task_finish.lua), in order.
ACK_FIELDS = ("id", "queue", "labels", "bucket", "us", "value")

#: What starts a compact record and parts its fields: the byte 0x1e, which no JSON text
#: starts with or holds unescaped, as no index or number holds it (an id or labels that
#: hold it, through a group's or task's name, go as JSON).
RECORD_SEPARATOR = "\x1e"


def wire_record(record: dict[str, Any]) -> bytes:
    """A finished task's record for the script: most are plain acknowledgements (no
    follow-up, fan-in or fair key), which go in their compact form, their fields apart in
    the order of ``ACK_FIELDS`` (one ``string.match`` in Lua, where ``cjson.decode`` of the
    same record cost twice the time of the rest of its finish's parsing); any other as
    JSON."""
    if (
        record["outcome"] == Kind.ACK
        and len(record) == len(ACK_FIELDS) + 1
        and RECORD_SEPARATOR not in record["labels"]
        and RECORD_SEPARATOR not in record["id"]
    ):
        fields = (str(record[name]) for name in ACK_FIELDS)
        text = RECORD_SEPARATOR + RECORD_SEPARATOR.join(fields)
        return text.encode("utf-8", "replace")
    return wire_json(record)


def follow_up_record(step: QueuedInStep, *, first_key: int) -> dict[str, Any]:
    """A follow-up task for the script to queue (see _follow_ups.lua); its five keys are
    KEYS[first_key] to KEYS[first_key + 4]."""
    task_id, message, queue, priority, keep_ms = step.args
    return {
        "keys": first_key,
        "id": task_id,
        "message": message.decode() if isinstance(message, bytes) else message,
        "queue": queue,
        "priority": int(priority),
        "keep_ms": int(keep_ms),
        "claim": step.claim,
        "claim_ms": step.claim_ms,
    }


def fan_in_record(count: FanInCount, *, first_key: int) -> dict[str, Any]:
    """A finished task's count in its fan-in (see _fan_in.lua); its six keys are
    KEYS[first_key] to KEYS[first_key + 5]."""
    return {
        "keys": first_key,
        "id": count.fan_in_id,
        "n": count.place,
        "value": count.value,
        "how": count.how,
    }
