"""The ``RCOORD`` settings dict, read at call time so ``override_settings`` always works
(the dict is looked up once, and again whenever ``setting_changed`` says it changed)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

#: Every key ``RCOORD`` may hold, with its default. The system check ``rcoord.E002``
#: reports keys not listed here (usually a typo).
DEFAULTS: dict[str, Any] = {
    # The django-redis alias in CACHES whose client every part uses.
    "CONNECTION": "default",
    # First segment of every key: "<prefix>:<kind>:{<name>}:<part>".
    "KEY_PREFIX": "rcoord",
    # Dotted path to a zero-argument callable returning a redis-py client
    # (Redis or RedisCluster). When set, it replaces CONNECTION.
    "CLIENT_FACTORY": None,
    # Dotted path to a zero-argument callable returning a redis.asyncio client
    # (Redis or RedisCluster) for async code; called twice per event loop (one
    # client for commands, one for blocking waits). When unset, the async client
    # is built from CONNECTION's django-redis settings.
    "ASYNC_CLIENT_FACTORY": None,
    # Most connections the waiters of one event loop block on at once (one per
    # lock or semaphore being waited for, shared by all its waiters in the loop).
    "ASYNC_WAIT_CONNECTIONS": 50,
    # Data directory of the embedded redis-server used by `manage.py rcoord_redis`
    # (development only; None means no embedded server is configured).
    "EMBEDDED_REDIS_DIR": None,
    # Rules of ConcurrencyLimitMiddleware (see README, "Concurrency limits").
    "CONCURRENCY_LIMITS": [],
    # Seconds a worker holds a task before it counts as dead (renewed while it runs).
    "TASK_LEASE": 60,
    # A task whose worker dies (or loses Redis) while running it this many times is a dead
    # letter: it is probably what kills its workers.
    "TASK_MAX_DELIVERIES": 5,
    # Most tasks a worker takes in one call (it runs them in order and acknowledges them
    # with its next take); fewer when tasks run long (see django_rcoord.queues.worker).
    "TASK_PREFETCH": 32,
    # Retry n (1, 2, ...) waits TASK_RETRY_BACKOFF * 2 ** (n - 1) seconds, at most
    # TASK_RETRY_BACKOFF_MAX.
    "TASK_RETRY_BACKOFF": 1.0,
    "TASK_RETRY_BACKOFF_MAX": 600.0,
    # Seconds a finished task's result record (status, times, errors, return value)
    # is kept.
    "TASK_RESULT_TTL": 86400,
    # Queues `manage.py run_email_worker` watches by default, highest priority first.
    "EMAIL_QUEUES": ["email"],
    # Periodic tasks fired by poll_delayed: dicts of name, task, cron or every, args,
    # kwargs, catch_up (see django_rcoord.queues.periodic).
    "PERIODIC_TASKS": [],
    # Guild-member autocomplete: suggestions per query, and who may search a guild
    # (dotted path to a callable (request, guild) -> bool).
    "AUTOCOMPLETE_LIMIT": 10,
    "AUTOCOMPLETE_PERMISSION": "django_rcoord.views.default_permission",
    # The staff dashboard: who of the active staff may see it and act on it (dotted path to
    # a callable (request) -> bool, asked after is_staff).
    "DASHBOARD_PERMISSION": "django_rcoord.dashboard.default_permission",
    # Bearer token of the Prometheus metrics and JSON stats endpoints; None: both answer 404.
    "METRICS_TOKEN": None,
    # Locks on a primary with replicas: after each grant, WAIT until this many
    # replicas have it (0: do not wait). A grant they do not acknowledge within
    # LOCK_REPLICA_TIMEOUT seconds is given back and acquiring raises
    # LockNotReplicated.
    "LOCK_REPLICAS": 0,
    "LOCK_REPLICA_TIMEOUT": 1.0,
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
    and Django's lazy settings object costs about a microsecond per read."""

    user_settings: Mapping[str, Any] | None = None


@receiver(setting_changed)
def _forget_user_settings(*, setting: str, **kwargs: Any) -> None:
    if setting == "RCOORD":
        _Found.user_settings = None


def get(name: str) -> Any:
    """Return the value of ``RCOORD[name]``, or its default."""
    if name not in DEFAULTS:
        raise KeyError(f"{name!r} is not an RCOORD setting")
    return user_settings().get(name, DEFAULTS[name])


class RcoordSettings:
    """Attribute access to the settings; every read goes to ``django.conf.settings``."""

    @property
    def CONNECTION(self) -> str:
        return get("CONNECTION")

    @property
    def KEY_PREFIX(self) -> str:
        return get("KEY_PREFIX")

    @property
    def CLIENT_FACTORY(self) -> str | None:
        return get("CLIENT_FACTORY")

    @property
    def ASYNC_CLIENT_FACTORY(self) -> str | None:
        return get("ASYNC_CLIENT_FACTORY")

    @property
    def ASYNC_WAIT_CONNECTIONS(self) -> int:
        return get("ASYNC_WAIT_CONNECTIONS")

    @property
    def EMBEDDED_REDIS_DIR(self) -> str | None:
        value = get("EMBEDDED_REDIS_DIR")
        return None if value is None else str(value)

    @property
    def CONCURRENCY_LIMITS(self) -> list[dict[str, Any]]:
        return get("CONCURRENCY_LIMITS")

    @property
    def TASK_LEASE(self) -> float:
        return get("TASK_LEASE")

    @property
    def TASK_MAX_DELIVERIES(self) -> int:
        return get("TASK_MAX_DELIVERIES")

    @property
    def TASK_PREFETCH(self) -> int:
        return get("TASK_PREFETCH")

    @property
    def TASK_RETRY_BACKOFF(self) -> float:
        return get("TASK_RETRY_BACKOFF")

    @property
    def TASK_RETRY_BACKOFF_MAX(self) -> float:
        return get("TASK_RETRY_BACKOFF_MAX")

    @property
    def TASK_RESULT_TTL(self) -> float:
        return get("TASK_RESULT_TTL")

    @property
    def PERIODIC_TASKS(self) -> list[dict[str, Any]]:
        return get("PERIODIC_TASKS")

    @property
    def EMAIL_QUEUES(self) -> list[str]:
        return get("EMAIL_QUEUES")

    @property
    def AUTOCOMPLETE_LIMIT(self) -> int:
        return get("AUTOCOMPLETE_LIMIT")

    @property
    def AUTOCOMPLETE_PERMISSION(self) -> str:
        return get("AUTOCOMPLETE_PERMISSION")

    @property
    def DASHBOARD_PERMISSION(self) -> str:
        return get("DASHBOARD_PERMISSION")

    @property
    def METRICS_TOKEN(self) -> str | None:
        return get("METRICS_TOKEN")

    @property
    def LOCK_REPLICAS(self) -> int:
        return get("LOCK_REPLICAS")

    @property
    def LOCK_REPLICA_TIMEOUT(self) -> float:
        return get("LOCK_REPLICA_TIMEOUT")


conf = RcoordSettings()
