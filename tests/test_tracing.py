"""OpenTelemetry spans (django_rcoord.tracing) across real processes: a producer that
queues tasks inside a request's span, and a worker that runs them, each with the SDK's
in-memory exporter; and no trace context in a message when no provider is configured."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from django_rcoord.locks import Lock
from django_rcoord.queues.keys import QueueKeys
from django_rcoord.queues.worker import Worker
from django_rcoord.semaphores import Semaphore
from django_rcoord.tracing import TRACE_FIELD, tracer
from tests import framework_tasks, tasks
from tests.procs import run_in_processes, wait_until

pytest.importorskip("opentelemetry.sdk", reason="the tracing tests need opentelemetry-sdk")


def _trace_into_memory() -> Any:
    """Configure this process's tracer provider with an in-memory exporter (the SDK's)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return exporter


def _finished(exporter: Any) -> list[dict[str, Any]]:
    """The exporter's finished spans, as plain data to send back to the test."""
    return [
        {
            "name": span.name,
            "kind": span.kind.name,
            "trace_id": span.context.trace_id,
            "span_id": span.context.span_id,
            "parent": span.parent.span_id if span.parent is not None else None,
            "attributes": dict(span.attributes or {}),
            "status": span.status.status_code.name,
            "events": [event.name for event in span.events],
        }
        for span in exporter.get_finished_spans()
    ]


def produce_in_a_request() -> list[dict[str, Any]]:
    """In a spawned process: a request's span that queues tasks (sync, async, the Tasks
    framework's) and takes a lock and a permit."""
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind

    exporter = _trace_into_memory()
    with trace.get_tracer("tests").start_as_current_span("GET /buy", kind=SpanKind.SERVER):
        tasks.add_numbers.delay(2, 3)
        tasks.always_fail.delay("traced")
        framework_tasks.add.enqueue(1, 2)
        asyncio.run(tasks.record.adelay("from async code"))
        with Lock("traced-lock"):
            pass
        semaphore = Semaphore("traced-permits", 2)
        permit = semaphore.acquire()
        assert permit is not None
        semaphore.release(permit)
    return _finished(exporter)


def work_traced() -> list[dict[str, Any]]:
    """In a spawned process: a burst worker's runs."""
    exporter = _trace_into_memory()
    Worker(["default"], burst=True).run()
    return _finished(exporter)


def test_a_requests_trace_goes_on_into_the_tasks_it_queued_in_another_process() -> None:
    [produced] = run_in_processes(produce_in_a_request, [()])
    [worked] = run_in_processes(work_traced, [()])

    [request] = [span for span in produced if span["name"] == "GET /buy"]
    sends = [span for span in produced if span["kind"] == "PRODUCER"]
    assert len(sends) == 4, produced
    for send in sends:
        assert send["name"] == "send default"
        assert (send["trace_id"], send["parent"]) == (request["trace_id"], request["span_id"])
        attributes = send["attributes"]
        assert attributes["messaging.system"] == "django_rcoord"
        assert attributes["messaging.operation.type"] == "send"
        assert attributes["messaging.destination.name"] == "default"
        assert attributes["messaging.message.id"]
    sent = {send["attributes"]["messaging.message.id"]: send for send in sends}

    runs = [span for span in worked if span["kind"] == "CONSUMER"]
    assert len(runs) == 4, worked
    by_task = {}
    for run in runs:
        attributes = run["attributes"]
        send = sent[attributes["messaging.message.id"]]
        # The run is the child of its enqueue, in the request's trace.
        assert (run["trace_id"], run["parent"]) == (request["trace_id"], send["span_id"])
        assert run["name"] == "process default"
        assert attributes["messaging.operation.type"] == "process"
        assert attributes["messaging.destination.name"] == "default"
        assert attributes["rcoord.task.attempt"] == 1
        by_task[attributes["rcoord.task.name"]] = run
    assert set(by_task) == {
        "tests.tasks.add_numbers",
        "tests.tasks.always_fail",
        "tests.tasks.record",
        "tests.framework_tasks.add",
    }
    succeeded = by_task["tests.tasks.add_numbers"]
    assert (succeeded["status"], succeeded["events"]) == ("UNSET", [])
    assert succeeded["attributes"]["rcoord.task.outcome"] == "ack"
    failed = by_task["tests.tasks.always_fail"]
    assert (failed["status"], failed["events"]) == ("ERROR", ["exception"])
    assert failed["attributes"]["rcoord.task.outcome"] == "dead"

    [lock] = [span for span in produced if span["name"] == "acquire lock traced-lock"]
    assert lock["parent"] == request["span_id"]
    assert lock["attributes"]["rcoord.acquired"] is True
    assert lock["attributes"]["rcoord.lock.token"] >= 1
    assert lock["attributes"]["rcoord.wait.seconds"] >= 0
    [permit] = [span for span in produced if span["name"] == "acquire semaphore traced-permits"]
    assert permit["attributes"]["rcoord.acquired"] is True
    assert permit["attributes"]["rcoord.semaphore.permit"]


def enqueue_from_many_coroutines(count: int) -> list[dict[str, Any]]:
    """In a spawned process: ``count`` coroutines in one loop, each in a span of its own,
    each queueing a task after the others have started theirs."""
    from opentelemetry import trace

    exporter = _trace_into_memory()
    started = asyncio.Event()

    async def job(number: int) -> None:
        with trace.get_tracer("tests").start_as_current_span(f"job {number}"):
            if number == count - 1:
                started.set()
            await started.wait()  # every job's span is open before any enqueue
            await tasks.record.adelay(f"job {number}")

    async def main() -> None:
        await asyncio.gather(*(job(number) for number in range(count)))

    asyncio.run(main())
    return _finished(exporter)


def test_concurrent_async_enqueues_each_join_their_own_callers_trace() -> None:
    [spans] = run_in_processes(enqueue_from_many_coroutines, [(200,)])
    jobs = {span["span_id"]: span for span in spans if span["name"].startswith("job ")}
    sends = [span for span in spans if span["kind"] == "PRODUCER"]
    assert len(jobs) == len(sends) == 200
    # Each send is the child of its own coroutine's span, never of another's.
    assert sorted(send["parent"] for send in sends) == sorted(jobs)
    for send in sends:
        assert send["trace_id"] == jobs[send["parent"]]["trace_id"]


def configure_after_the_first_look() -> bool:
    """In a spawned process: a provider configured after the hooks found none."""
    assert tracer() is None
    _trace_into_memory()
    wait_until(lambda: tracer() is not None)  # within RECHECK_SECONDS
    return True


def test_a_provider_configured_late_is_seen() -> None:
    assert run_in_processes(configure_after_the_first_look, [()]) == [True]


def test_without_a_tracer_provider_a_message_carries_no_trace_context(redis_client) -> None:
    assert tracer() is None  # this process never configures one
    task_id = tasks.record.delay("untraced")
    message = json.loads(redis_client.hget(QueueKeys.of("default").messages, task_id))
    assert message["args"] == ["untraced"]
    assert TRACE_FIELD not in message
