"""System checks for the ``RCOORD`` settings (``manage.py check``)."""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning
from django.utils.module_loading import import_string

from django_rcoord.conf import DEFAULTS
from django_rcoord.exceptions import InvalidName
from django_rcoord.keys import validate_prefix
from django_rcoord.queues.keys import one_group
from django_rcoord.validation import MAX_BATCH, is_number, is_positive_int


def check_settings(**kwargs: Any) -> list[CheckMessage]:
    """Check ``settings.RCOORD`` and the Redis connection it names."""
    user = getattr(settings, "RCOORD", {})
    if not isinstance(user, Mapping):
        return [
            Error(
                f"settings.RCOORD must be a dict, not {type(user).__name__}.",
                hint='Write it as RCOORD = {"CONNECTION": "default", ...}.',
                id="rcoord.E001",
            )
        ]
    errors: list[CheckMessage] = []
    for name in user:
        if name not in DEFAULTS:
            close = difflib.get_close_matches(str(name), DEFAULTS, n=1)
            hint = f"Did you mean {close[0]!r}? " if close else ""
            errors.append(
                Error(
                    f"settings.RCOORD has an unknown key {name!r}.",
                    hint=hint + "Known keys: " + ", ".join(sorted(DEFAULTS)) + ".",
                    id="rcoord.E002",
                )
            )
    factory = user.get("CLIENT_FACTORY", DEFAULTS["CLIENT_FACTORY"])
    async_factory = user.get("ASYNC_CLIENT_FACTORY", DEFAULTS["ASYNC_CLIENT_FACTORY"])
    if factory is not None:
        errors.extend(_check_client_factory(factory))
    else:
        errors.extend(_check_connection(user.get("CONNECTION", DEFAULTS["CONNECTION"])))
    if async_factory is not None:
        errors.extend(_check_client_factory(async_factory, "ASYNC_CLIENT_FACTORY", "rcoord.E015"))
    elif factory is not None:
        errors.append(
            Warning(
                "settings.RCOORD['CLIENT_FACTORY'] is set without "
                "RCOORD['ASYNC_CLIENT_FACTORY']: async code (async views under @locked or "
                "@rate_limited, the middleware under ASGI, Lock.aacquire...) has no client and "
                "raises ConnectionNotConfigured.",
                hint="Set RCOORD['ASYNC_CLIENT_FACTORY'] to a function returning the "
                "redis.asyncio twin of the sync client, e.g. "
                "redis.asyncio.cluster.RedisCluster.from_url(...) for Redis Cluster.",
                id="rcoord.W002",
            )
        )
    wait_connections = user.get("ASYNC_WAIT_CONNECTIONS", DEFAULTS["ASYNC_WAIT_CONNECTIONS"])
    if not is_positive_int(wait_connections):
        errors.append(
            Error(
                "settings.RCOORD['ASYNC_WAIT_CONNECTIONS'] must be a positive int, not "
                f"{wait_connections!r}.",
                hint="The default is 50: at most 50 locks and semaphores waited for at once "
                "per event loop, each with one blocking connection.",
                id="rcoord.E016",
            )
        )
    prefix_problem = validate_prefix(user.get("KEY_PREFIX", DEFAULTS["KEY_PREFIX"]))
    if prefix_problem:
        errors.append(
            Error(
                f"settings.RCOORD['KEY_PREFIX'] is not usable: {prefix_problem}.",
                hint='Use a short identifier such as "rcoord" or "myproject:rcoord".',
                id="rcoord.E006",
            )
        )
    embedded_dir = user.get("EMBEDDED_REDIS_DIR", DEFAULTS["EMBEDDED_REDIS_DIR"])
    if embedded_dir is not None and not isinstance(embedded_dir, (str, os.PathLike)):
        errors.append(
            Error(
                "settings.RCOORD['EMBEDDED_REDIS_DIR'] must be a path (str or Path) or None, "
                f"not {type(embedded_dir).__name__}.",
                hint='For example BASE_DIR / ".rcoord" / "redis".',
                id="rcoord.E007",
            )
        )
    result_ttl = user.get("TASK_RESULT_TTL", DEFAULTS["TASK_RESULT_TTL"])
    if not is_number(result_ttl) or not result_ttl >= 1:
        errors.append(
            Error(
                "settings.RCOORD['TASK_RESULT_TTL'] must be a number of seconds of at least 1, "
                f"not {result_ttl!r}.",
                hint="The default keeps finished results for a day (86400).",
                id="rcoord.E017",
            )
        )
    errors.extend(_check_task_settings(user))
    errors.extend(
        _check_periodic(
            user.get("PERIODIC_TASKS", DEFAULTS["PERIODIC_TASKS"]),
            look_up_tasks=not prefix_problem,
        )
    )
    errors.extend(_check_autocomplete(user))
    errors.extend(_check_operations(user))
    errors.extend(_check_lock_replicas(user))
    errors.extend(
        _check_concurrency_limits(user.get("CONCURRENCY_LIMITS", DEFAULTS["CONCURRENCY_LIMITS"]))
    )
    return errors


def _check_task_settings(user: Mapping[str, Any]) -> list[CheckMessage]:
    """The queue's settings: lease, retry backoff, deliveries, the e-mail worker's queues."""
    errors: list[CheckMessage] = []

    def value(name: str) -> Any:
        return user.get(name, DEFAULTS[name])

    def bad(name: str, wanted: str, hint: str) -> None:
        errors.append(
            Error(
                f"settings.RCOORD[{name!r}] must be {wanted}, not {value(name)!r}.",
                hint=hint,
                id="rcoord.E020",
            )
        )

    lease = value("TASK_LEASE")
    if not is_number(lease) or not lease >= 0.1:
        bad(
            "TASK_LEASE",
            "a number of seconds of at least 0.1",
            "How long a worker holds a task before another may take it (renewed while the "
            "task runs); the default is 60.",
        )
    backoff, backoff_max = value("TASK_RETRY_BACKOFF"), value("TASK_RETRY_BACKOFF_MAX")
    if not is_number(backoff) or not backoff >= 0:
        bad("TASK_RETRY_BACKOFF", "a number of seconds of 0 or more", "The default is 1.0.")
    if not is_number(backoff_max) or not backoff_max >= 0:
        bad("TASK_RETRY_BACKOFF_MAX", "a number of seconds of 0 or more", "The default is 600.")
    elif is_number(backoff) and backoff_max < backoff:
        bad(
            "TASK_RETRY_BACKOFF_MAX",
            f"at least TASK_RETRY_BACKOFF ({backoff!r})",
            "It caps the doubling retry delay.",
        )
    if not is_positive_int(value("TASK_MAX_DELIVERIES")):
        bad(
            "TASK_MAX_DELIVERIES",
            "a positive int",
            "A task whose worker dies while running it this many times becomes a dead letter; "
            "the default is 5.",
        )
    prefetch = value("TASK_PREFETCH")
    if not is_positive_int(prefetch) or prefetch > MAX_BATCH:
        bad(
            "TASK_PREFETCH",
            f"an int from 1 to {MAX_BATCH}",
            "The most tasks a worker takes in one call; 1 takes them one by one. The "
            "default is 32.",
        )
    queues = value("EMAIL_QUEUES")
    hint = (
        'A non-empty list of queue names of one queue group, e.g. ["email"] or '
        '["mail/urgent", "mail/bulk"] (one worker watches one group).'
    )
    if not isinstance(queues, (list, tuple)) or not queues:
        errors.append(
            Error(
                f"settings.RCOORD['EMAIL_QUEUES'] must be a non-empty list, not {queues!r}.",
                hint=hint,
                id="rcoord.E021",
            )
        )
    else:
        try:
            one_group(list(queues))
        except (InvalidName, ValueError) as exc:
            errors.append(
                Error(
                    f"settings.RCOORD['EMAIL_QUEUES'] cannot be watched by one worker: {exc}",
                    hint=hint,
                    id="rcoord.E021",
                )
            )
    return errors


def _check_periodic(raw: object, *, look_up_tasks: bool = True) -> list[CheckMessage]:
    """The schedules' shape and timing, then whether each names a task. Looking a task up
    imports every app's ``tasks`` module, whose ``@task`` builds keys: with an unusable
    KEY_PREFIX (``look_up_tasks`` False; rcoord.E006 says why) that is not tried."""
    from django_rcoord.queues import periodic

    hint = (
        'Each entry: {"name": "digest", "task": "myapp.tasks.send_digest", "cron": '
        '"0 7 * * *"} or "every": seconds (1 or more), optional "args", "kwargs", '
        '"catch_up" ("skip" or "once").'
    )
    errors: list[CheckMessage] = [
        Error(f"settings.RCOORD['PERIODIC_TASKS']{text}.", hint=hint, id=check_id)
        for check_id, text in periodic.problems(raw)
    ]
    if errors or not look_up_tasks:
        return errors
    try:
        unknown = periodic.unknown_tasks(raw)
    # The project's own modules may raise anything on import: a check reports, never crashes.
    except Exception as exc:  # noqa: BLE001
        return [
            Error(
                "settings.RCOORD['PERIODIC_TASKS'] could not be checked: looking its tasks up "
                f"(importing each app's tasks module) raised {type(exc).__name__}: {exc}",
                hint="Fix the error (python -c 'import myapp.tasks' shows its traceback); "
                "the worker and poll_delayed import the same modules at start.",
                id="rcoord.E029",
            )
        ]
    for task in unknown:
        errors.append(
            Error(
                f"settings.RCOORD['PERIODIC_TASKS'] names the task {task!r}, which is neither "
                "a registered @task nor a Tasks framework task on a RedisTaskBackend.",
                hint="Use the @task's name (its module path and function name by default) "
                "or the dotted path of a django.tasks @task.",
                id="rcoord.E025",
            )
        )
    return errors


def _check_autocomplete(user: Mapping[str, Any]) -> list[CheckMessage]:
    from django_rcoord.autocomplete import MAX_LIMIT

    errors: list[CheckMessage] = []
    limit = user.get("AUTOCOMPLETE_LIMIT", DEFAULTS["AUTOCOMPLETE_LIMIT"])
    if not is_positive_int(limit) or limit > MAX_LIMIT:
        errors.append(
            Error(
                f"settings.RCOORD['AUTOCOMPLETE_LIMIT'] must be an int from 1 to {MAX_LIMIT}, "
                f"not {limit!r}.",
                hint="The default is 10.",
                id="rcoord.E012",
            )
        )
    errors.extend(
        _check_callable(
            user,
            "AUTOCOMPLETE_PERMISSION",
            "Give the dotted path of a function (request, guild) -> bool.",
            "rcoord.E013",
        )
    )
    return errors


def _check_callable(
    user: Mapping[str, Any], name: str, hint: str, check_id: str
) -> list[CheckMessage]:
    """An error unless ``RCOORD[name]`` is the dotted path of an importable callable."""
    path = user.get(name, DEFAULTS[name])
    problem = "is not an importable callable"
    try:
        found = import_string(path) if isinstance(path, str) else None
    except ImportError:
        found = None
    # Importing the project's module may raise anything: a check reports, never crashes.
    except Exception as exc:  # noqa: BLE001
        found = None
        problem = f"cannot be imported: {type(exc).__name__}: {exc}"
    if callable(found):
        return []
    return [Error(f"settings.RCOORD[{name!r}] {path!r} {problem}.", hint=hint, id=check_id)]


#: Shortest METRICS_TOKEN accepted (a bearer token guessed is the whole defence).
MIN_TOKEN_LENGTH = 16


def _check_operations(user: Mapping[str, Any]) -> list[CheckMessage]:
    import importlib.util

    errors: list[CheckMessage] = []
    errors.extend(
        _check_callable(
            user,
            "DASHBOARD_PERMISSION",
            "Give the dotted path of a function (request) -> bool; it is asked after the "
            "user was found to be active staff.",
            "rcoord.E026",
        )
    )
    token = user.get("METRICS_TOKEN", DEFAULTS["METRICS_TOKEN"])
    if token is not None and (not isinstance(token, str) or len(token) < MIN_TOKEN_LENGTH):
        errors.append(
            Error(
                f"settings.RCOORD['METRICS_TOKEN'] must be None or a str of at least "
                f"{MIN_TOKEN_LENGTH} characters.",
                hint="Generate one (python -c 'import secrets; print(secrets.token_urlsafe(32))') "
                "and read it from the environment; None turns the metrics and stats endpoints "
                "off.",
                id="rcoord.E027",
            )
        )
    elif token is not None and importlib.util.find_spec("prometheus_client") is None:
        errors.append(
            Warning(
                "settings.RCOORD['METRICS_TOKEN'] is set but prometheus-client is not installed: "
                "the metrics endpoint answers 501 (the JSON stats work).",
                hint='pip install "django-rcoord[metrics]"',
                id="rcoord.W004",
            )
        )
    return errors


def _check_lock_replicas(user: Mapping[str, Any]) -> list[CheckMessage]:
    replicas = user.get("LOCK_REPLICAS", DEFAULTS["LOCK_REPLICAS"])
    timeout = user.get("LOCK_REPLICA_TIMEOUT", DEFAULTS["LOCK_REPLICA_TIMEOUT"])
    replicas_ok = isinstance(replicas, int) and not isinstance(replicas, bool) and replicas >= 0
    if replicas_ok and is_number(timeout) and timeout > 0:
        return []
    return [
        Error(
            "settings.RCOORD['LOCK_REPLICAS'] must be an int of 0 or more and "
            "RCOORD['LOCK_REPLICA_TIMEOUT'] a positive number of seconds, not "
            f"{replicas!r} and {timeout!r}.",
            hint="For example LOCK_REPLICAS 1 and LOCK_REPLICA_TIMEOUT 0.5; 0 replicas "
            "(the default) does not wait.",
            id="rcoord.E014",
        )
    ]


MIDDLEWARE_PATH = "django_rcoord.middleware.ConcurrencyLimitMiddleware"
AUTH_MIDDLEWARE_PATH = "django.contrib.auth.middleware.AuthenticationMiddleware"


def _check_concurrency_limits(raw: object) -> list[CheckMessage]:
    from django_rcoord.semaphores.rules import rule_problems

    hints = {
        "rcoord.E008": "CONCURRENCY_LIMITS is a list of dicts, each with a unique 'name'; "
        "rule keys: name, path, url_names, limit, timeout, wait, scope, fail_open.",
        "rcoord.E009": "Give each rule 'path' (a regex searched in request.path_info) "
        "and/or 'url_names' (a list of URL names, namespaced as 'ns:name').",
        "rcoord.E010": "For example {'limit': 10, 'timeout': 30, 'wait': 0, 'scope': 'global', "
        "'fail_open': True}.",
    }
    errors: list[CheckMessage] = [
        Error(f"settings.RCOORD: {message}.", hint=hints[check_id], id=check_id)
        for check_id, message in rule_problems(raw)
    ]
    if errors or not raw or not isinstance(raw, (list, tuple)):  # the check narrows the type
        return errors
    middleware = list(getattr(settings, "MIDDLEWARE", []))
    if MIDDLEWARE_PATH not in middleware:
        errors.append(
            Warning(
                "RCOORD['CONCURRENCY_LIMITS'] has rules, but ConcurrencyLimitMiddleware is not "
                "in MIDDLEWARE, so none is applied.",
                hint=f'Add "{MIDDLEWARE_PATH}" to MIDDLEWARE.',
                id="rcoord.W001",
            )
        )
    elif any(rule.get("scope") == "user" for rule in raw) and (
        AUTH_MIDDLEWARE_PATH not in middleware
        or middleware.index(AUTH_MIDDLEWARE_PATH) > middleware.index(MIDDLEWARE_PATH)
    ):
        errors.append(
            Error(
                "A CONCURRENCY_LIMITS rule has scope 'user', but ConcurrencyLimitMiddleware "
                "comes before AuthenticationMiddleware (or it is missing), so request.user is "
                "not known to it.",
                hint="Put ConcurrencyLimitMiddleware after AuthenticationMiddleware.",
                id="rcoord.E011",
            )
        )
    return errors


def _check_connection(alias: object) -> list[CheckMessage]:
    caches = getattr(settings, "CACHES", {})
    if not isinstance(alias, str) or alias not in caches:
        return [
            Error(
                f"settings.RCOORD['CONNECTION'] is {alias!r}, which is not an alias in "
                "settings.CACHES.",
                hint="Add a django-redis cache under that alias to CACHES, or set "
                "RCOORD['CONNECTION'] to the alias of one (known: "
                + ", ".join(map(repr, caches))
                + ").",
                id="rcoord.E003",
            )
        ]
    from django_redis.cache import RedisCache
    from django_redis.client import ShardClient

    cache = caches[alias]
    backend_path = cache.get("BACKEND", "")
    client_path = cache.get("OPTIONS", {}).get("CLIENT_CLASS", "django_redis.client.DefaultClient")
    hint = (
        'Use "BACKEND": "django_redis.cache.RedisCache" with the default client (or the '
        "Sentinel or Herd client); a sharded client spreads one primitive's keys over "
        "several servers, which breaks its atomicity."
    )
    try:
        backend = import_string(backend_path)
        client_class = import_string(client_path)
    except Exception as exc:  # noqa: BLE001  (as _check_callable: report, never crash)
        return [Error(f"CACHES[{alias!r}] cannot be imported: {exc}.", hint=hint, id="rcoord.E004")]
    if not (isinstance(backend, type) and issubclass(backend, RedisCache)):
        return [
            Error(
                f"CACHES[{alias!r}] uses {backend_path!r}, which is not a django-redis cache.",
                hint=hint,
                id="rcoord.E004",
            )
        ]
    if isinstance(client_class, type) and issubclass(client_class, ShardClient):
        return [
            Error(
                f"CACHES[{alias!r}] uses the sharded client {client_path!r}.",
                hint=hint,
                id="rcoord.E004",
            )
        ]
    pool_kwargs = cache.get("OPTIONS", {}).get("CONNECTION_POOL_KWARGS", {})
    if isinstance(pool_kwargs, Mapping) and pool_kwargs.get("decode_responses"):
        return [
            Error(
                f"CACHES[{alias!r}] sets decode_responses=True: django-rcoord (and "
                "django-redis) read replies as bytes.",
                hint="Remove decode_responses from CONNECTION_POOL_KWARGS.",
                id="rcoord.E022",
            )
        ]
    return []


def _check_client_factory(
    path: object, setting: str = "CLIENT_FACTORY", check_id: str = "rcoord.E005"
) -> list[CheckMessage]:
    kind = "redis.asyncio" if setting == "ASYNC_CLIENT_FACTORY" else "redis-py"
    hint = (
        f"Set RCOORD[{setting!r}] to the dotted path of a function that takes no "
        f'arguments and returns a {kind} client, e.g. "myproject.redis.make_cluster_client", '
        "or remove it to use RCOORD['CONNECTION']."
    )
    if not isinstance(path, str):
        return [
            Error(
                f"settings.RCOORD[{setting!r}] must be a dotted path string, not "
                f"{type(path).__name__}.",
                hint=hint,
                id=check_id,
            )
        ]
    try:
        factory = import_string(path)
    # Importing the project's module may raise anything: a check reports, never crashes.
    except Exception as exc:  # noqa: BLE001
        return [
            Error(
                f"settings.RCOORD[{setting!r}] {path!r} cannot be imported: "
                f"{type(exc).__name__}: {exc}",
                hint=hint,
                id=check_id,
            )
        ]
    if not callable(factory):
        return [
            Error(
                f"settings.RCOORD[{setting!r}] {path!r} is not callable.",
                hint=hint,
                id=check_id,
            )
        ]
    return []


# -- the server itself (``check --deploy``) ------------------------------------------------
#: The oldest Redis django-rcoord runs on (ZRANGE ... BYLEX LIMIT, ZMSCORE: Redis 6.2).
MIN_REDIS_VERSION = (6, 2)

#: maxmemory-policy values that may evict a key without a TTL: a queued task, a dead letter.
EVICTS_ANY_KEY = ("allkeys-lru", "allkeys-lfu", "allkeys-random")


def check_redis_server(**kwargs: Any) -> list[CheckMessage]:
    """Deploy check (``manage.py check --deploy``): connect to the configured Redis once
    (one ``INFO``) and report a server out of reach, older than 6.2, or one that may evict
    the keys django-rcoord needs. Settings that give no client are check_settings' to
    report."""
    from redis.exceptions import NoPermissionError

    from django_rcoord.connection import REDIS_ERRORS, get_client

    where = _where_redis_is()
    try:
        client = get_client()
    # No client from these settings (check_settings reports why): nothing to connect to.
    except Exception:  # noqa: BLE001
        return []
    try:
        reply = client.info()
    except NoPermissionError:  # an ACL user without INFO: the server cannot be inspected
        return []
    except REDIS_ERRORS as exc:
        return [
            Error(
                f"Redis cannot be reached through {where}: {type(exc).__name__}: {exc}",
                hint="Start Redis, or point the setting at a running server (its URL, "
                "password and TLS); redis-cli -u <url> ping must answer PONG from this host.",
                id="rcoord.E030",
            )
        ]
    messages: list[CheckMessage] = []
    for node, info in _server_infos(reply):
        messages.extend(server_problems(info, f"The Redis server at {node or where}"))
    return messages


def server_problems(info: Mapping[str, Any], server: str) -> list[CheckMessage]:
    """What is wrong with a Redis server for django-rcoord, from its ``INFO`` reply."""
    messages: list[CheckMessage] = []
    version = str(info.get("redis_version", ""))
    numbers = tuple(int(part) for part in version.split(".")[:2] if part.isdigit())
    if len(numbers) == 2 and numbers < MIN_REDIS_VERSION:
        messages.append(
            Error(
                f"{server} runs Redis {version}; django-rcoord needs 6.2 or later.",
                hint="It uses commands Redis 6.2 added (ZRANGE ... BYLEX LIMIT for "
                "autocomplete, ZMSCORE in the queues' scripts); upgrade the server (Redis 6.2 "
                "or later, or Valkey).",
                id="rcoord.E031",
            )
        )
    policy = str(info.get("maxmemory_policy", "noeviction"))
    if policy in EVICTS_ANY_KEY:
        messages.append(
            Error(
                f"{server} has maxmemory-policy {policy}: when it is full it evicts any key, "
                "queued tasks and dead letters included, which are lost without a trace.",
                hint="Set maxmemory-policy noeviction (a full server then refuses writes, and "
                "producers and workers see the error), or give django-rcoord a Redis of its "
                "own apart from a cache that must evict.",
                id="rcoord.E032",
            )
        )
    elif policy.startswith("volatile-"):
        messages.append(
            Warning(
                f"{server} has maxmemory-policy {policy}: when it is full it evicts keys with "
                "a TTL early. Queued tasks (no TTL) survive, but locks, semaphore permits, "
                "rate-limit windows, task results and periodic claims carry TTLs: a lock "
                "evicted before its time is a lock two processes hold.",
                hint="Prefer maxmemory-policy noeviction for the Redis django-rcoord uses (a "
                "full server then refuses writes instead of dropping keys), or keep enough "
                "maxmemory headroom that nothing is ever evicted.",
                id="rcoord.W030",
            )
        )
    return messages


def _server_infos(reply: Any) -> list[tuple[str | None, Mapping[str, Any]]]:
    """(node, INFO) pairs: a Redis client answers one INFO, a cluster client one per node."""
    if not isinstance(reply, Mapping):
        return []
    if "redis_version" in reply:
        return [(None, reply)]
    return [(str(node), info) for node, info in reply.items() if isinstance(info, Mapping)]


def _where_redis_is() -> str:
    """The setting that names the Redis django-rcoord uses, for messages."""
    user = getattr(settings, "RCOORD", {})
    user = user if isinstance(user, Mapping) else {}
    factory = user.get("CLIENT_FACTORY", DEFAULTS["CLIENT_FACTORY"])
    if factory is not None:
        return f"RCOORD['CLIENT_FACTORY'] ({factory!r})"
    alias = user.get("CONNECTION", DEFAULTS["CONNECTION"])
    cache = getattr(settings, "CACHES", {}).get(alias, {})
    location = cache.get("LOCATION") if isinstance(cache, Mapping) else None
    if isinstance(location, str):
        return f"CACHES[{alias!r}] ({_without_password(location)})"
    return f"CACHES[{alias!r}]"


def _without_password(url: str) -> str:
    """``url`` with any password replaced by ``***`` (check output ends up in CI logs)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if not parts.password:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()
