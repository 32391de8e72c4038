"""System checks of the Redis that django-rcoord uses: the connection ``RCOORD`` names (a
cache alias of ``CACHES``, or client factories), for ``check_settings``; and, with
``--deploy``, the server itself (``check_redis_server``: reachable, recent enough, not
evicting what django-rcoord keeps, accepting the calls that record a task's end)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning
from django.utils.module_loading import import_string
from django_redis.cache import RedisCache
from django_redis.client import ShardClient
from redis.exceptions import NoPermissionError, RedisError

from django_rcoord.conf import DEFAULTS, conf
from django_rcoord.connection import get_client
from django_rcoord.connection.errors import REDIS_ERRORS


def client_problems(user: Mapping[str, Any]) -> list[CheckMessage]:
    """The connection: a cache alias, or the client factories."""
    errors: list[CheckMessage] = []
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
    cache = caches[alias]
    return _backend_problems(alias, cache) or _pool_problems(alias, cache)


def _backend_problems(alias: str, cache: Mapping[str, Any]) -> list[CheckMessage]:
    """rcoord.E004: a cache that is not django-redis's, or whose client shards keys."""
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
    except Exception as exc:  # noqa: BLE001  (a check reports, never crashes)
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
    return []


def _pool_problems(alias: str, cache: Mapping[str, Any]) -> list[CheckMessage]:
    """rcoord.E022: a pool that decodes replies."""
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
    return messages + result_bound_problems(client, where)


#: Room in the call recording a task's end for its record's other fields (its id, queue,
#: metric labels, a follow-up's message), bytes; the value takes up to twice its length.
FINISH_RECORD_OVERHEAD = 16 * 1024


def result_bound_problems(client: Any, where: str) -> list[CheckMessage]:
    """``RCOORD["MAX_RESULT_BYTES"]`` against the server's ``proto-max-bulk-len``: a task's
    end is recorded in one call whose record carries the return value as JSON text inside
    JSON (up to twice its length); a server that refuses that call refuses it every time.
    Nothing to say where the server keeps CONFIG to itself (a managed service)."""

    limit = conf.MAX_RESULT_BYTES
    try:
        found = client.config_get("proto-max-bulk-len")
    except RedisError:
        return []
    values = [found] if "proto-max-bulk-len" in found else list(found.values())  # a cluster's
    accepted = min((int(each["proto-max-bulk-len"]) for each in values), default=None)
    if accepted is None:
        return []
    needed = None if limit is None else 2 * limit + FINISH_RECORD_OVERHEAD
    if needed is not None and needed <= accepted:
        return []
    what = "no limit" if limit is None else f"{limit:,} bytes"
    return [
        Error(
            f"The Redis server at {where} accepts arguments of at most {accepted:,} bytes "
            f"(proto-max-bulk-len), and RCOORD['MAX_RESULT_BYTES'] is {what}: a task whose "
            "return value is near it ends in a call the server refuses, every time it is "
            "sent, and its worker takes nothing new.",
            hint="Lower RCOORD['MAX_RESULT_BYTES'] to at most "
            f"{(accepted - FINISH_RECORD_OVERHEAD) // 2:,}, or raise the server's "
            "proto-max-bulk-len to at least twice it plus 16 KiB.",
            id="rcoord.E037",
        )
    ]


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

    parts = urlsplit(url)
    if not parts.password:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()
