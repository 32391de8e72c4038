"""What a worker took and how its run ended: no Redis here, and no task code.

A ``Job`` is a task as the take script handed it over (its id, message, queue and
record). An ``Outcome`` says how its run ended (``later``, ``stopped`` and
``not_runnable`` make the common ones), and a ``Done`` is the two together, waiting to
be acknowledged. The runner makes outcomes and
the session sends them. A ``Call`` is a task ready to run (a ``@task`` or a Tasks
framework task: the runner runs both the same way), a ``Refusal`` one that cannot.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from django_rcoord.exceptions import TaskCancelled, TaskNotRunnable
from django_rcoord.queues.fan_in import FanInCount
from django_rcoord.queues.keys import QueueKeys
from django_rcoord.queues.messages import decode_message
from django_rcoord.queues.options import DEFAULT_OPTIONS, RunOptions
from django_rcoord.queues.outcomes import Kind
from django_rcoord.queues.producer import QueuedInStep
from django_rcoord.queues.results import TaskRecord, record_from

#: The most characters of an error's text (a traceback) a result record keeps. The call
#: that records a task's end carries it twice, JSON in JSON, at most 20 bytes a character
#: (an escaped control or astral character), under the 1 MiB a server accepts at least.
MAX_ERROR_CHARS = 32_768


@dataclass
class Outcome:
    """How a run ended (its ``Kind``); for failures the error text (a traceback), the
    error entry of the result record and the retry delay; for ``Kind.ACK`` the return value
    as JSON."""

    kind: Kind
    task_name: str
    error: str = ""
    error_class: str = ""
    delay_ms: int = 0
    value_json: str = "null"
    exception: BaseException | None = None  # what the task raised (logged with its traceback)
    traceback_logged: bool = False  # by the Tasks framework's task_finished receiver already
    # Queued by the finish script with this end: its follow-up, the task counting it in its
    # fan-in (in another group); or counted by that script in its fan-in (``fan_in``).
    follow_ups: list[QueuedInStep] = field(default_factory=list)
    fan_in: FanInCount | None = None

    def __post_init__(self) -> None:
        if type(self.kind) is not Kind:  # its Lua string is taken too: ValueError for another
            self.kind = Kind(self.kind)

    @property
    def summary(self) -> str:
        """One line for the log: the exception and its message (a traceback's last line)."""
        lines = self.error.strip().splitlines()
        return lines[-1] if lines else ""

    @property
    def stored_error(self) -> str:
        """The error text as the result record keeps it: its first and last characters when
        it is over ``MAX_ERROR_CHARS``, so that no error (a task may raise one with any text)
        makes the call that records it larger than a server accepts."""
        error = self.error
        if len(error) <= MAX_ERROR_CHARS:
            return error
        head = MAX_ERROR_CHARS // 4
        cut = len(error) - MAX_ERROR_CHARS
        return f"{error[:head]}\n[... {cut:,} characters left out ...]\n{error[head + cut :]}"

    @property
    def error_entry(self) -> str:
        if not self.error:
            return ""
        return json.dumps(
            {"exception_class_path": self.error_class, "traceback": self.stored_error}
        )


@dataclass
class Job:
    """A task a worker took: its id, message, queue and what its record says."""

    id: str
    body: bytes
    queue: QueueKeys
    failures: int  # failed attempts before this one
    state: str = ""  # its result record: 'RUNNING|started|last attempted|finished|workers'
    queue_index: int = 1  # of the worker's queues, 1-based (as the finish script's KEYS)

    @functools.cached_property
    def message(self) -> dict[str, Any] | None:
        """Its message, decoded once (the limits, the runner and the logs all read it)."""
        return decode_message(self.body)

    @property
    def task_name(self) -> str:
        """The task its message names ('?' for a message that names none)."""
        message = self.message
        name = message.get("task") if message is not None else None
        return name if isinstance(name, str) else "?"

    @property
    def record(self) -> TaskRecord | None:
        """Its result record as it is now (RUNNING), from what the take script returned."""
        return self.record_of(None)

    def record_of(self, message: dict[str, Any] | None) -> TaskRecord | None:
        """``record``, from its message already decoded (``message``) when given."""
        body = self.body.encode() if isinstance(self.body, str) else self.body
        fields = [self.state.encode(), None, None, None]
        return record_from(self.id, body, fields, None, None, (0, 0), decoded=message)


@dataclass
class Done:
    """A task that ran, waiting to be acknowledged with its worker's next take."""

    job: Job
    outcome: Outcome
    took_ms: float
    at: float = 0.0  # when it ended (time.monotonic())


class FollowUp(Protocol):
    """A task that can follow another: a ``@task``, or a Tasks framework task's adapter."""

    def queued_in_step(self, task_id: str) -> QueuedInStep: ...

    def delay(self, task_id: str) -> str: ...


def _nothing(*_: Any) -> None:
    return None


@dataclass(frozen=True)
class FollowUps:
    """The tasks that follow a run (``on_success``, ``on_failure``), looked up when its job is
    resolved: each a task, None, or why the one named cannot be found here, raised by
    ``after`` when the run ends (a successful run whose follow-up cannot be queued fails
    then and is retried, as one whose follow-up cannot be queued for any other reason)."""

    on_success: FollowUp | Exception | None = None
    on_failure: FollowUp | Exception | None = None

    def after(self, succeeded: bool) -> FollowUp | None:
        found = self.on_success if succeeded else self.on_failure
        if isinstance(found, Exception):
            raise found
        return found


@dataclass
class Call:
    """A task ready to run: its function, arguments and options, its ``follow_ups``, and
    what to do just before the call (``started``) and once the run's end is final
    (``ended``, not after a retry): the Tasks framework's signals."""

    function: Callable[..., Any]
    args: list[Any]
    kwargs: dict[str, Any]
    options: RunOptions
    follow_ups: FollowUps
    started: Callable[[], None] = _nothing
    ended: Callable[[Outcome], None] = _nothing


@dataclass
class Refusal:
    """A task that cannot run: ``anywhere`` False when another worker may (a rolling
    deploy's newer release: deferred), True when none can (dead)."""

    reason: str
    anywhere: bool = False

    @property
    def options(self) -> RunOptions:
        """The settings' defaults: what the worker knows of a task it cannot run."""
        return DEFAULT_OPTIONS


def later(job: Job, delay_ms: int, why: str) -> Outcome:
    """A run its limits hold back (``why``: "its rate 100/m"): back to the delayed set for
    ``delay_ms``, not an attempt."""
    return Outcome(Kind.LATER, job.task_name, f"waiting for {why}", delay_ms=delay_ms)


def stopped(task_name: str, reason: str) -> Outcome:
    """A run the worker stopped because ``cancel()`` asked: it fails with ``TaskCancelled``
    and is finished (no retry, no dead letter, no follow-up)."""
    return Outcome(Kind.STOPPED, task_name, f"TaskCancelled: {reason}", class_path(TaskCancelled))


def failure(
    job: Job,
    options: RunOptions,
    error: str,
    error_class: str,
    exception: BaseException | None = None,
) -> Outcome:
    """A failed run of ``job``: another attempt after its retry delay while its retries
    last, else a dead letter."""
    if job.failures < options.max_retries:
        delay_ms = options.retry_delay_ms(job.failures)
        return Outcome(Kind.RETRY, job.task_name, error, error_class, delay_ms, exception=exception)
    return Outcome(Kind.DEAD, job.task_name, error, error_class, exception=exception)


def not_runnable(task_name: str, reason: str) -> Outcome:
    """A task that cannot run anywhere (bad message, wrong arguments): dead."""
    return Outcome(Kind.DEAD, task_name, reason, class_path(TaskNotRunnable))


def class_path(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"
