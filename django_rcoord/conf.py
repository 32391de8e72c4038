"""The ``RCOORD`` settings dict, read at call time so ``override_settings`` always works
(each value is looked up once, and again whenever ``setting_changed`` says ``RCOORD``
changed)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, cast

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver


@dataclass(frozen=True)
class Settings:
    """Every key ``RCOORD`` may hold, with its type and default: the one list of them.
    ``DEFAULTS`` and ``conf``'s attributes come from it; the system check ``rcoord.E002``
    reports keys not listed here (usually a typo)."""

    #: The django-redis alias in CACHES whose client every part uses.
    CONNECTION: str = "default"
    #: First segment of every key: "<prefix>:<kind>:{<name>}:<part>".
    KEY_PREFIX: str = "rcoord"
    #: Dotted path to a zero-argument callable returning a redis-py client
    #: (Redis or RedisCluster). When set, it replaces CONNECTION.
    CLIENT_FACTORY: str | None = None
    #: Dotted path to a zero-argument callable returning a redis.asyncio client
    #: (Redis or RedisCluster) for async code; called twice per event loop (one
    #: client for commands, one for blocking waits). When unset, the async client
    #: is built from CONNECTION's django-redis settings.
    ASYNC_CLIENT_FACTORY: str | None = None
    #: Most connections the waiters of one event loop block on at once (one per
    #: lock or semaphore being waited for, shared by all its waiters in the loop).
    ASYNC_WAIT_CONNECTIONS: int = 50
    #: Data directory of the embedded redis-server used by `manage.py rcoord_redis`
    #: (development only; None means no embedded server is configured).
    EMBEDDED_REDIS_DIR: str | os.PathLike[str] | None = None
    #: Rules of ConcurrencyLimitMiddleware (see README, "Concurrency limits").
    CONCURRENCY_LIMITS: list[dict[str, Any]] = field(default_factory=list)
    #: Seconds a worker holds a task before it counts as dead (renewed while it runs).
    TASK_LEASE: float = 60
    #: A task whose worker dies (or loses Redis) while running it this many times is a dead
    #: letter: it is probably what kills its workers.
    TASK_MAX_DELIVERIES: int = 5
    #: Most tasks a worker takes in one call (it runs them in order and acknowledges them
    #: with its next take); fewer when tasks run long (see django_rcoord.queues.worker).
    TASK_PREFETCH: int = 32
    #: Retry n (1, 2, ...) waits TASK_RETRY_BACKOFF * 2 ** (n - 1) seconds, at most
    #: TASK_RETRY_BACKOFF_MAX.
    TASK_RETRY_BACKOFF: float = 1.0
    TASK_RETRY_BACKOFF_MAX: float = 600.0
    #: Each retry's wait is shortened by a random share of up to this fraction (0 to 1), so
    #: that tasks failing together do not all come back together. A task's own
    #: ``retry_jitter`` wins.
    TASK_RETRY_JITTER: float = 0.0
    #: Seconds a task may run before it is stopped and fails (None: no limit); a task's own
    #: ``timeout`` wins. How it is stopped depends on the worker's --isolation (see the
    #: docs: async tasks are cancelled; sync tasks get TaskTimeLimitExceeded raised in the
    #: main thread, or their process is killed).
    TASK_TIMEOUT: float | None = None
    #: While a worker runs a task, it asks Redis every this many seconds (the task's lease
    #: renewed in the same call) whether cancel() asked it to stop: an async task is then
    #: cancelled, one in a --isolation process child killed (None: only at the lease
    #: renewals, every third of TASK_LEASE). Tasks shorter than this cost no check.
    TASK_STOP_CHECK: float | None = 2.0
    #: A worker that took no task for this many seconds while tasks wait in queues no live
    #: worker watches says so (a warning naming them and the flag to serve them), at most
    #: once each this many seconds (None: never).
    WORKER_IDLE_WARNING: float | None = 60.0
    #: How often a worker process looks in the registry for queue groups beside its shard
    #: layout (other layouts' shards: producers with another QUEUE_SHARDS) to serve, and
    #: ends the loops of groups that left it (None: only at start).
    WORKER_DISCOVERY: float | None = 60.0
    #: Largest task message (its JSON: arguments and all) accepted at enqueue, in bytes;
    #: a bigger one raises MessageTooLarge there (None: no limit). Big payloads belong in
    #: storage the task reads, not in Redis.
    MAX_MESSAGE_BYTES: int | None = 10 * 1024 * 1024
    #: Largest return value a task may leave (its JSON), in bytes; a bigger one makes the
    #: run a dead letter saying so (ResultTooLarge), and the worker goes on (None: no
    #: limit). The default keeps every call that records a task's end under 1 MiB, the
    #: least `proto-max-bulk-len` a Redis server accepts: the value travels as JSON text
    #: inside JSON, where a quote or a backslash takes two bytes.
    MAX_RESULT_BYTES: int | None = 500_000
    #: Seconds a finished task's result record (status, times, errors, return value)
    #: is kept.
    TASK_RESULT_TTL: float = 86400
    #: Queues `manage.py run_email_worker` watches by default, highest priority first.
    EMAIL_QUEUES: list[str] = field(default_factory=lambda: ["email"])
    #: Queue groups spread over shards: {"<group>": N} (N from 1 to MAX_SHARDS). A sharded
    #: group's tasks are spread over N groups of their own, whose hash slots are spread over
    #: the slot range (one shard per primary of an evenly split N-primary cluster); see
    #: django_rcoord.queues.shards (check rcoord.E035).
    QUEUE_SHARDS: dict[str, int] = field(default_factory=dict)
    #: Options of Django's Tasks framework tasks, by task path (django.tasks.task takes no
    #: backend options): {"myapp.tasks.export": {"unique_for": 300, "unique_key": path}}
    #: (see django_rcoord.queues.task_options; check rcoord.E033).
    TASK_OPTIONS: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Periodic tasks fired by poll_delayed: dicts of name, task, cron or every, args,
    #: kwargs, catch_up (see django_rcoord.queues.periodic).
    PERIODIC_TASKS: list[dict[str, Any]] = field(default_factory=list)
    #: Guild-member autocomplete: suggestions per query, and who may search a guild
    #: (dotted path to a callable (request, guild) -> bool).
    AUTOCOMPLETE_LIMIT: int = 10
    AUTOCOMPLETE_PERMISSION: str = "django_rcoord.views.default_permission"
    #: The staff dashboard: who of the active staff may see it and act on it (dotted path to
    #: a callable (request) -> bool, asked after is_staff).
    DASHBOARD_PERMISSION: str = "django_rcoord.dashboard.default_permission"
    #: Bearer token of the Prometheus metrics and JSON stats endpoints; None: both answer 404.
    METRICS_TOKEN: str | None = None
    #: Locks on a primary with replicas: after each grant, WAIT until this many
    #: replicas have it (0: do not wait). A grant they do not acknowledge within
    #: LOCK_REPLICA_TIMEOUT seconds is given back and acquiring raises
    #: LockNotReplicated.
    LOCK_REPLICAS: int = 0
    LOCK_REPLICA_TIMEOUT: float = 1.0


#: Every setting's default, by name.
DEFAULTS: dict[str, Any] = {
    setting.name: getattr(Settings(), setting.name) for setting in fields(Settings)
}


_NO_SETTINGS: dict[str, Any] = {}


def user_settings() -> Mapping[str, Any]:
    """Return the project's ``RCOORD`` dict (empty when unset)."""
    value = _Found.user_settings
    if value is None:
        value = _Found.user_settings = _read_user_settings()
    return value


def _read_user_settings() -> Mapping[str, Any]:
    value = getattr(settings, "RCOORD", _NO_SETTINGS)
    if not isinstance(value, Mapping):
        raise ImproperlyConfigured(
            f"settings.RCOORD must be a dict, not {type(value).__name__} (see check rcoord.E001)."
        )
    return value


class _Found:
    """The ``RCOORD`` mapping found last: hot paths read settings several times per call,
    and each read through Django's lazy settings object costs a look-up."""

    user_settings: Mapping[str, Any] | None = None


def get(name: str) -> Any:
    """Return the value of ``RCOORD[name]``, or its default."""
    if name not in DEFAULTS:
        raise KeyError(f"{name!r} is not an RCOORD setting")
    return user_settings().get(name, DEFAULTS[name])


class RcoordSettings:
    """Attribute access to the settings (``conf.TASK_LEASE``): each read returns the
    project's ``RCOORD`` value, or the default, as the settings are at the time of the
    read. A value read is kept as an attribute of this object until ``setting_changed``
    says ``RCOORD`` changed: a hot path then reads a setting as a plain attribute."""

    def __getattr__(self, name: str) -> Any:
        # Only called for a name not kept yet.
        try:
            value = get(name)
        except KeyError:
            raise AttributeError(f"{name!r} is not an RCOORD setting") from None
        self.__dict__[name] = value
        return value


_settings = RcoordSettings()
#: Typed as ``Settings``: ``conf.TASK_LEASE`` is a float to the type checker.
conf = cast(Settings, _settings)


@receiver(setting_changed)
def _forget_user_settings(*, setting: str, **kwargs: Any) -> None:
    if setting == "RCOORD":
        _Found.user_settings = None
        vars(_settings).clear()
