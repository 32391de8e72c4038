"""OpenTelemetry spans, when a project configures a tracer provider (the ``otel`` extra:
``opentelemetry-api``).

- Every enqueue (``delay``, ``schedule``, ``execute_later``, the Tasks framework's
  ``enqueue``, their async twins) is a PRODUCER span ``send <queue>``; the message carries
  its W3C trace context (the ``trace_context`` field), so a run's CONSUMER span
  ``process <queue>`` is its child: a request's trace goes on into the tasks it queued.
  A retry or a delayed run is another ``process`` span under the same ``send``. Tasks a
  run queues (follow-ups, ``delay()`` in a task) are children of that run.
- The attributes follow OpenTelemetry's messaging conventions: ``messaging.system``,
  ``messaging.operation.type`` (``send``/``process``), ``messaging.operation.name``,
  ``messaging.destination.name`` (the queue), ``messaging.message.id`` (the task id).
- A run that fails (retried, dead, stopped) has status ERROR and its exception recorded.
- ``Lock`` and ``Semaphore`` acquires are INTERNAL spans ``acquire lock <name>`` with how
  long they waited, whether they got it, and the fencing token or permit.

With ``opentelemetry-api`` absent, or installed with no tracer provider configured (the
API's default proxy), each of these costs one check and nothing is added to messages.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from django_rcoord import __version__

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import ProxyTracerProvider, SpanKind, Status, StatusCode
except ImportError:  # the otel extra is not installed
    trace = None  # type: ignore[assignment]

#: The message field that carries the enqueue's trace context (W3C ``traceparent``...).
TRACE_FIELD = "trace_context"
#: ``messaging.system``: a name of our own, as the conventions allow for other systems.
SYSTEM = "django_rcoord"


#: How long "no provider is configured" is believed before the API is asked again: asking
#: costs about 0.8 us (the API looks up an environment variable each time), a fair share
#: of a no-op task's run. A provider configured later is seen within this time.
RECHECK_SECONDS = 1.0
_unconfigured_until = [0.0]  # time.monotonic() until which no provider is assumed


def tracer() -> Any:
    """This library's tracer, or None when OpenTelemetry is absent or no tracer provider
    is configured (then nothing is traced and nothing is carried)."""
    if trace is None:
        return None
    now = time.monotonic()
    if now < _unconfigured_until[0]:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, ProxyTracerProvider):
        _unconfigured_until[0] = now + RECHECK_SECONDS
        return None
    return _tracer_of(provider)


@functools.lru_cache(maxsize=8)
def _tracer_of(provider: Any) -> Any:

    return provider.get_tracer("django_rcoord", __version__)


def carrier() -> dict[str, str] | None:
    """The current trace context, for a new message: None outside any valid span (as
    always when no provider is configured, unless something upstream attached a remote
    context, which then goes on with the message)."""
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return None
    fields: dict[str, str] = {}
    propagate.inject(fields)
    return fields or None


def _messaging(operation: str, queue: str, task_name: str) -> dict[str, Any]:
    return {
        "messaging.system": SYSTEM,
        "messaging.operation.type": operation,
        "messaging.operation.name": operation,
        "messaging.destination.name": queue,
        "rcoord.task.name": task_name,
    }


_Function = TypeVar("_Function", bound=Callable[..., Any])


def traced_send(send: _Function) -> _Function:
    """Decorate ``send(client, run)`` (sync or async; ``run`` a producer's ``Enqueue``),
    which returns an ``Enqueued``: a PRODUCER span ``send <queue>`` around it, when
    traced."""

    def started(active: Any, run: Any) -> Any:
        return active.start_as_current_span(
            f"send {run.queue}",
            kind=SpanKind.PRODUCER,
            attributes=_messaging("send", run.queue, run.task_name),
        )

    def sent(span: Any, enqueued: Any) -> None:
        span.set_attribute("messaging.message.id", enqueued.task_id)
        if not enqueued.queued:  # a unique task already queued: this call queued nothing
            span.set_attribute("rcoord.task.already_queued", True)

    if inspect.iscoroutinefunction(send):

        @functools.wraps(send)
        async def asend(client: Any, run: Any) -> Any:
            active = tracer()
            if active is None:
                return await send(client, run)
            with started(active, run) as span:
                enqueued = await send(client, run)
                sent(span, enqueued)
                return enqueued

        return asend  # type: ignore[return-value]

    @functools.wraps(send)
    def traced(client: Any, run: Any) -> Any:
        active = tracer()
        if active is None:
            return send(client, run)
        with started(active, run) as span:
            enqueued = send(client, run)
            sent(span, enqueued)
            return enqueued

    return traced  # type: ignore[return-value]


@contextmanager
def processing(
    active: Any, message: dict[str, Any] | None, task_id: str, queue: str, attempt: int
) -> Iterator[Any]:
    """A CONSUMER span around one run, the child of the enqueue's span when the message
    carries its context; end it with ``processed``."""
    fields = message.get(TRACE_FIELD) if message is not None else None
    parent = propagate.extract(fields) if isinstance(fields, dict) else None
    name = message.get("task") if message is not None else None
    attributes = _messaging("process", queue, name if isinstance(name, str) else "?")
    attributes["messaging.message.id"] = task_id
    attributes["rcoord.task.attempt"] = attempt
    token = otel_context.attach(parent) if parent is not None else None
    try:
        with active.start_as_current_span(
            f"process {queue}",
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            yield span
    finally:
        if token is not None:
            otel_context.detach(token)


def processed(
    span: Any, kind: str, failed: bool, summary: str, exception: BaseException | None
) -> None:
    """Say how a run ended (an ``Outcome``'s kind, whether it failed, its one-line summary,
    what it raised)."""
    span.set_attribute("rcoord.task.outcome", kind)
    if failed:
        if exception is not None:
            span.record_exception(exception)
        span.set_status(Status(StatusCode.ERROR, summary or kind))


def traced_wait(
    kind: str, describe: Callable[[Any, Any], dict[str, Any]]
) -> Callable[[_Function], _Function]:
    """Decorate ``acquire(self, wait=None)`` (sync or async) of a lock or a semaphore of
    ``kind``: an INTERNAL span ``acquire <kind> <name>`` with the wait, whether it got it
    and ``describe(self, result)``'s attributes (its token)."""

    def decorate(acquire: _Function) -> _Function:
        if inspect.iscoroutinefunction(acquire):

            @functools.wraps(acquire)
            async def atraced(self: Any, wait: float | None = None) -> Any:
                active = tracer()
                if active is None:
                    return await acquire(self, wait)
                with _wait_span(active, kind, describe, self) as ended:
                    return ended(await acquire(self, wait))

            return atraced  # type: ignore[return-value]

        @functools.wraps(acquire)
        def traced(self: Any, wait: float | None = None) -> Any:
            active = tracer()
            if active is None:
                return acquire(self, wait)
            with _wait_span(active, kind, describe, self) as ended:
                return ended(acquire(self, wait))

        return traced  # type: ignore[return-value]

    return decorate


@contextmanager
def _wait_span(
    active: Any, kind: str, describe: Callable[[Any, Any], dict[str, Any]], primitive: Any
) -> Iterator[Callable[[Any], Any]]:
    """The span of one wait of ``primitive``; what it yields is given the wait's result
    (its attributes set) and returns it."""
    started = time.perf_counter()
    name = primitive.name
    with active.start_as_current_span(
        f"acquire {kind} {name}", attributes={f"rcoord.{kind}.name": name}
    ) as span:

        def ended(result: Any) -> Any:
            span.set_attribute("rcoord.wait.seconds", round(time.perf_counter() - started, 6))
            span.set_attribute("rcoord.acquired", bool(result))
            if result:
                span.set_attributes(describe(primitive, result))
            return result

        yield ended
