"""The exceptions django-rcoord raises. Catch ``RcoordError`` to catch them all."""

from __future__ import annotations


class RcoordError(Exception):
    """Base class of every error raised by django-rcoord."""


class InvalidName(RcoordError, ValueError):
    """A name given for a primitive (lock, guild, queue...) cannot be used as a key part."""


class ConnectionNotConfigured(RcoordError):
    """The settings do not lead to a usable Redis client."""


class EmbeddedRedisError(RcoordError):
    """The embedded redis-server could not be found, started or stopped."""


class LockTimeout(RcoordError):
    """A lock could not be acquired within its wait time."""


class LockLost(RcoordError):
    """A lock is no longer held by the caller (its TTL ran out, or another holder has it)."""


class SemaphoreTimeout(RcoordError):
    """No semaphore permit could be had within the wait time."""


class LockNotReplicated(RcoordError):
    """A lock was granted, but fewer replicas than ``RCOORD["LOCK_REPLICAS"]``
    acknowledged it in time; the grant was given back."""


class TaskNotRunnable(RcoordError):
    """A queued task cannot run in this worker: its message is not a task, its name is not
    registered, or it does not accept its arguments. (Recorded in its result's errors.)"""


class MessageTooLarge(RcoordError, ValueError):
    """A task's message is larger than ``RCOORD["MAX_MESSAGE_BYTES"]``: it was not queued."""


class ResultTooLarge(RcoordError, ValueError):
    """A task's return value, as JSON, is larger than ``RCOORD["MAX_RESULT_BYTES"]``: the
    run is a dead letter with this error, and no value is stored. (Recorded in its
    result's errors; never raised to the caller.)"""


class WorkerLost(RcoordError):
    """A task's worker died (or lost Redis) while running it ``RCOORD["TASK_MAX_DELIVERIES"]``
    times: the task is a dead letter, as it probably kills its workers. (Recorded in its
    result's errors by the queue's recovery script; never raised.)"""


class TaskCancelled(RcoordError):
    """A task was cancelled by ``django_rcoord.queues.cancel()`` before it ran. (The error of
    its Tasks framework result, which reads FAILED: the framework has no cancelled status;
    never raised.)"""


class RedisUnavailable(RcoordError):
    """Redis stayed out of reach longer than a bounded wait allowed (a burst worker's
    ``max_outage``)."""


class TaskTimeLimitExceeded(RcoordError):
    """A task ran past its time limit (``@task(timeout=...)`` or ``RCOORD["TASK_TIMEOUT"]``):
    raised inside an async task (cancelled) or a sync one run in the worker's main thread,
    or recorded for one whose process was killed (``run_email_worker --isolation
    process``). It fails the attempt like any error: retried, then a dead letter."""
