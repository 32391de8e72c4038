"""Where Redis is: the one place that turns settings into redis-py clients.

Sync code gets ``get_client()``: the django-redis alias's client, or
``RCOORD["CLIENT_FACTORY"]``'s. Async code gets ``get_async_client()``: a
``redis.asyncio`` client built from the same configuration, or
``RCOORD["ASYNC_CLIENT_FACTORY"]``'s, one per running event loop (asyncio
connections belong to the loop that opened them) and closed with that loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import weakref
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.backoff
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

from django_rcoord.conf import conf
from django_rcoord.exceptions import ConnectionNotConfigured

logger = logging.getLogger(__name__)

#: Errors that mean "Redis is out of reach for now" rather than "this call is wrong":
#: a lost or timed-out connection, and Redis Cluster's own (the cluster is down,
#: a slot is moving, no node answers). Workers and pollers wait these out;
#: fail-open middleware lets the request through.
REDIS_UNAVAILABLE: tuple[type[Exception], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.ClusterError,
    redis.exceptions.TryAgainError,
    redis.exceptions.RedisClusterException,
)

#: Every error from Redis that a long-running process (a worker, a poller) waits out with
#: backoff: unavailability, and replies such as READONLY (a failover), OOM, LOADING or BUSY.
REDIS_ERRORS: tuple[type[Exception], ...] = (redis.RedisError, *REDIS_UNAVAILABLE)


def log_waited_out(log: logging.Logger, who: str, exc: Exception, wait: float) -> None:
    """The one line a long-running loop (a worker, a poller) logs for an error it waits out
    for ``wait`` seconds: a Redis error in brief, anything else with its traceback."""
    if isinstance(exc, REDIS_ERRORS):
        log.error("%s: Redis error (%s: %s); retrying in %.1fs", who, type(exc).__name__, exc, wait)
    else:
        log.error("%s: unexpected error; retrying in %.1fs", who, wait, exc_info=exc)


#: Errors that mean "this request cannot ask Redis": it is out of reach, or the settings
#: give no client at all. ``fail_open`` (the middleware's rules, ``@locked``,
#: ``@rate_limited``) decides whether the request is served anyway.
NO_REDIS: tuple[type[Exception], ...] = (*REDIS_UNAVAILABLE, ConnectionNotConfigured)

#: How long a worker or poller that lost Redis waits before its next try, by how many
#: tries failed in a row: doubling from 0.5 s up to 10 s, each wait a random point in its
#: upper half, so that the workers of a restarted Redis do not all come back at once.
RECONNECT_BACKOFF = redis.backoff.EqualJitterBackoff(cap=10.0, base=0.5)

# Clients built by RCOORD["CLIENT_FACTORY"], one per dotted path: a factory is
# called once per process so its connection pool is shared by every caller.
_factory_clients: dict[str, Any] = {}
_factory_lock = threading.Lock()


def get_client() -> Any:
    """Return the redis-py client every part uses when no ``client=`` is given.

    ``RCOORD["CLIENT_FACTORY"]`` wins when set (this is how Redis Cluster is
    configured); otherwise the django-redis cache named by ``RCOORD["CONNECTION"]``
    gives its primary (``write=True``: coordination never reads from a replica).
    The client is looked up once per process (a redis-py client is shared by threads
    through its connection pool) and again after ``RCOORD`` or ``CACHES`` change.
    """
    client = _Found.client
    if client is None:
        client = _look_up_client()
    return client


def _look_up_client() -> Any:
    factory_path = conf.CLIENT_FACTORY
    if factory_path:
        client = _client_from_factory(factory_path)
    else:
        client = _client_from_cache(conf.CONNECTION)
    _Found.client = client
    return client


class _Found:
    """What get_client() found last: looking it up again costs more than a round trip's
    worth of Python on every call (settings, Django's cache handler, django-redis)."""

    client: Any = None


def resolve_client(client: Any = None) -> Any:
    """Return ``client`` if one was passed (a sync redis-py client), else the configured one."""
    if client is None:
        return get_client()
    if is_async_client(client):
        raise TypeError(
            f"sync methods need a sync redis-py client, not {type(client).__name__}; "
            "use the a-prefixed async method (aacquire, ahit, adelay...) with a "
            "redis.asyncio client"
        )
    return client


def is_cluster(client: Any) -> bool:
    """True for a ``redis.cluster.RedisCluster`` (or one of its pipelines)."""
    from redis.cluster import RedisCluster

    return isinstance(client, RedisCluster)


def slot_pipeline(client: Any, key: str | bytes, *, transaction: bool = True) -> Any:
    """A pipeline for commands whose keys all share ``key``'s hash slot.

    On a single Redis this is ``client.pipeline(transaction=...)``. On Redis
    Cluster it is a plain pipeline on the primary that owns the slot, so it
    can run Lua scripts (EVALSHA is refused in cluster pipelines), WATCH and
    MULTI/EXEC like on one server. Every key used in it must hash to ``key``'s
    slot, which the key layout's hash tags guarantee for one primitive.
    """
    if is_cluster(client):
        node = client.get_node_from_key(key)
        return client.get_redis_connection(node).pipeline(transaction=transaction)
    return client.pipeline(transaction=transaction)


def _client_from_cache(alias: str) -> Any:
    from django.conf import settings
    from django_redis import get_redis_connection

    if alias not in getattr(settings, "CACHES", {}):
        raise ConnectionNotConfigured(
            f'RCOORD["CONNECTION"] is {alias!r}, which is not an alias in settings.CACHES '
            "(see check rcoord.E003)."
        )
    try:
        return get_redis_connection(alias, write=True)
    except NotImplementedError:
        raise ConnectionNotConfigured(
            f"The cache {alias!r} does not give a raw Redis client: it must use "
            "django_redis.cache.RedisCache with a non-sharded client (see check rcoord.E004)."
        ) from None


def _client_from_factory(path: str) -> Any:
    try:
        return _factory_clients[path]
    except KeyError:
        pass
    with _factory_lock:
        if path not in _factory_clients:
            try:
                factory = import_string(path)
            except ImportError as exc:
                raise ConnectionNotConfigured(
                    f'RCOORD["CLIENT_FACTORY"] {path!r} cannot be imported: {exc} '
                    "(see check rcoord.E005)."
                ) from exc
            _factory_clients[path] = _bytes_client(factory(), "CLIENT_FACTORY")
        return _factory_clients[path]


def _bytes_client(client: Any, setting: str) -> Any:
    """``client``, unless it decodes replies to str: every part reads bytes."""
    encoder = getattr(client, "get_encoder", None)
    if encoder is not None and encoder().decode_responses:
        raise ConnectionNotConfigured(
            f'RCOORD["{setting}"] returned a client made with decode_responses=True; '
            "django-rcoord reads replies as bytes: make it without decode_responses."
        )
    return client


@receiver(setting_changed)
def _forget_factory_clients(*, setting: str, **kwargs: Any) -> None:
    if setting in ("RCOORD", "CACHES"):
        _Found.client = None
    if setting == "RCOORD":
        with _factory_lock:
            _factory_clients.clear()
    if setting in ("RCOORD", "CACHES"):
        _forget_loop_clients()


# -- async clients ------------------------------------------------------------------
@dataclass
class LoopClients:
    """The async clients of one event loop.

    ``commands`` runs every short command and script. ``waits`` only blocks
    (``BLPOP`` on wake-up lists, see ``django_rcoord.waiting``): its connections
    are never the ones a release or any other short command needs.
    """

    commands: Any
    waits: Any
    # Keeps the loop's closing hook alive (the loop holds async generators weakly).
    closer: Any = None
    hub: Any = None  # django_rcoord.waiting.SignalHub, made on first wait
    node_clients: dict[str, Any] | None = None  # per cluster node, for slot pipelines


_loop_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopClients] = (
    weakref.WeakKeyDictionary()
)
_loop_clients_lock = threading.Lock()


def get_async_client() -> Any:
    """The ``redis.asyncio`` client every async path uses when no ``client=`` is given.

    Call it from code running in an event loop: each loop gets its own client
    (asyncio connections cannot cross loops), made on first use and closed when
    the loop shuts down (``asyncio.run``, ASGI servers and asgiref all do).
    ``RCOORD["ASYNC_CLIENT_FACTORY"]`` wins when set (Redis Cluster:
    ``redis.asyncio.cluster.RedisCluster``); otherwise the client is built from
    the django-redis alias's own connection settings (URL, password, db, TLS,
    timeouts, Sentinel).
    """
    return loop_clients().commands


def resolve_async_client(client: Any = None) -> Any:
    """Return ``client`` if one was passed (it must be a redis.asyncio client), else the
    configured one."""
    if client is None:
        return get_async_client()
    if not is_async_client(client):
        raise TypeError(
            f"async methods need a redis.asyncio client, not {type(client).__name__}: pass "
            "client=redis.asyncio.Redis(...) (or RedisCluster), or no client to use "
            "get_async_client()"
        )
    return client


async def aresolve_client(client: Any = None) -> Any:
    """``resolve_async_client``, ready for many tasks at once.

    redis.asyncio's cluster client maps the cluster's slots on first use, and
    commands sent by many tasks before that map exists race each other; its
    ``initialize()`` is safe to share (and a no-op once done), so every async
    path awaits it first.
    """
    client = resolve_async_client(client)
    if is_async_cluster(client):
        await client.initialize()
    return client


#: The classes of redis.asyncio clients and pipelines (looked up on every resolve).
_ASYNC_CLIENT_CLASSES = (
    redis.asyncio.Redis,
    redis.asyncio.client.Pipeline,
    redis.asyncio.cluster.RedisCluster,
    redis.asyncio.cluster.ClusterPipeline,
)


#: Answers of ``is_async_client`` per class: isinstance against these classes goes through
#: ABC and typing hooks, and every call of every part asks.
_async_by_class: dict[type, bool] = {}


def is_async_client(client: Any) -> bool:
    """True for a ``redis.asyncio`` client, cluster client or pipeline."""
    kind = type(client)
    try:
        return _async_by_class[kind]
    except KeyError:
        answer = _async_by_class[kind] = isinstance(client, _ASYNC_CLIENT_CLASSES)
        return answer


def is_async_cluster(client: Any) -> bool:
    return isinstance(client, redis.asyncio.cluster.RedisCluster)


def loop_clients() -> LoopClients:
    """The running loop's clients, made on first use."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError(
            "get_async_client() is for code running in an event loop; sync code uses get_client()"
        ) from None
    clients = _loop_clients.get(loop)
    if clients is not None:
        return clients
    clients = LoopClients(
        commands=_new_async_client(), waits=_new_async_client(conf.ASYNC_WAIT_CONNECTIONS)
    )
    clients.closer = _close_with_loop(clients)
    with _loop_clients_lock:
        _loop_clients[loop] = clients
    return clients


def loop_clients_if_made() -> LoopClients | None:
    """The running loop's clients if it has made them (None outside a loop)."""
    try:
        return _loop_clients.get(asyncio.get_running_loop())
    except RuntimeError:
        return None


def _new_async_client(max_connections: int | None = None) -> Any:
    factory_path = conf.ASYNC_CLIENT_FACTORY
    if factory_path:
        try:
            factory = import_string(factory_path)
        except ImportError as exc:
            raise ConnectionNotConfigured(
                f'RCOORD["ASYNC_CLIENT_FACTORY"] {factory_path!r} cannot be imported: {exc} '
                "(see check rcoord.E015)."
            ) from exc
        return _bytes_client(factory(), "ASYNC_CLIENT_FACTORY")
    if conf.CLIENT_FACTORY:
        raise ConnectionNotConfigured(
            'RCOORD["CLIENT_FACTORY"] is set but RCOORD["ASYNC_CLIENT_FACTORY"] is not: async '
            "code needs a redis.asyncio client from the same place (see check rcoord.W002)."
        )
    return async_client_like(_client_from_cache(conf.CONNECTION), max_connections=max_connections)


def _close_with_loop(clients: LoopClients) -> Any:
    """Close ``clients`` when their loop shuts down its async generators.

    An async generator first iterated inside a loop is registered with it, and
    ``loop.shutdown_asyncgens()`` (run by ``asyncio.run``, ``asyncio.Runner``,
    asgiref and ASGI servers before closing the loop) closes it: its ``finally``
    then closes the clients while the loop still runs.
    """

    async def closer() -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            await _close_clients(clients)

    generator = closer()
    step = generator.asend(None)
    with contextlib.suppress(StopIteration):
        step.send(None)  # runs up to the yield without suspending: registers with the loop
    return generator


async def _close_clients(clients: LoopClients) -> None:
    if clients.hub is not None:
        clients.hub.close()
    for client in (clients.commands, clients.waits, *(clients.node_clients or {}).values()):
        # A client behind Sentinel does not close its manager's clients of the sentinels.
        # (A cluster client has no connection_pool.)
        pool = getattr(client, "connection_pool", None)
        manager = getattr(pool, "sentinel_manager", None)
        for each in (client, *(manager.sentinels if manager is not None else ())):
            try:
                await each.aclose()
            except Exception:  # a broken connection closes as well as it can
                logger.debug("closing an async client failed", exc_info=True)


def _forget_loop_clients() -> None:
    """Settings changed: later calls build new clients; close the old ones in their loops."""
    with _loop_clients_lock:
        entries = list(_loop_clients.items())
        _loop_clients.clear()
    for loop, clients in entries:
        if loop.is_closed():
            continue
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            loop.create_task(_close_clients(clients))
        else:
            with contextlib.suppress(RuntimeError):  # the loop closed since the check
                asyncio.run_coroutine_threadsafe(_close_clients(clients), loop)


def async_client_like(client: Any, *, max_connections: int | None = None) -> Any:
    """A ``redis.asyncio.Redis`` that reaches the same server as the sync ``client``, with
    the same connection settings (django-redis has parsed LOCATION and OPTIONS into its
    connection pool: host or unix socket, db, credentials, TLS, timeouts, retries, pool size,
    Sentinel). ``max_connections`` replaces the pool size."""
    from redis.sentinel import SentinelConnectionPool

    pool = client.connection_pool
    kwargs = _portable(pool.connection_kwargs)
    if isinstance(pool, SentinelConnectionPool):
        from redis.asyncio.sentinel import Sentinel

        manager = pool.sentinel_manager
        sentinels = [
            (
                sentinel.connection_pool.connection_kwargs["host"],
                sentinel.connection_pool.connection_kwargs["port"],
            )
            for sentinel in manager.sentinels
        ]
        async_manager = Sentinel(
            sentinels,
            min_other_sentinels=manager.min_other_sentinels,
            sentinel_kwargs=_portable(manager.sentinel_kwargs),
            **_portable(manager.connection_kwargs),
        )
        kwargs.pop("host", None)
        kwargs.pop("port", None)
        kwargs["max_connections"] = max_connections or pool.max_connections
        if pool.is_master:
            return async_manager.master_for(pool.service_name, **kwargs)
        return async_manager.slave_for(pool.service_name, **kwargs)
    connection_class = _ASYNC_CONNECTION_CLASSES.get(pool.connection_class.__name__)
    if connection_class is None:
        raise ConnectionNotConfigured(
            f"Cannot build a redis.asyncio client like the sync one: its connections are "
            f"{pool.connection_class.__qualname__}. Set RCOORD['ASYNC_CLIENT_FACTORY']."
        )
    return _queueing_client(
        connection_class,
        max_connections or pool.max_connections,
        getattr(pool, "timeout", None) or POOL_TIMEOUT,
        kwargs,
    )


def _queueing_client(
    connection_class: type, max_connections: int, timeout: float, kwargs: dict[str, Any]
) -> Any:
    """A ``redis.asyncio.Redis`` on a blocking pool: past ``max_connections``, commands
    queue in the process for a free connection (in order, up to ``timeout`` seconds)
    instead of failing with "Too many connections"."""
    pool = redis.asyncio.BlockingConnectionPool(
        connection_class=connection_class,
        max_connections=max_connections,
        timeout=timeout,
        **kwargs,
    )
    # from_pool: the client owns its pool, and closing it disconnects the pool.
    return redis.asyncio.Redis.from_pool(pool)


#: Seconds an async command waits for a free pooled connection before it fails.
POOL_TIMEOUT = 20

_ASYNC_CONNECTION_CLASSES = {
    "Connection": redis.asyncio.Connection,
    "SSLConnection": redis.asyncio.SSLConnection,
    "UnixDomainSocketConnection": redis.asyncio.UnixDomainSocketConnection,
}

# Connection settings that mean the same to redis.asyncio (everything else a sync pool
# holds is a sync-only helper object).
_PORTABLE_KWARGS = frozenset(
    {
        "host",
        "port",
        "path",
        "db",
        "username",
        "password",
        "credential_provider",
        "client_name",
        "lib_name",
        "lib_version",
        "socket_timeout",
        "socket_connect_timeout",
        "socket_keepalive",
        "socket_keepalive_options",
        "retry_on_timeout",
        "retry_on_error",
        "health_check_interval",
        "encoding",
        "encoding_errors",
        "decode_responses",
        "protocol",
        "ssl_keyfile",
        "ssl_certfile",
        "ssl_cert_reqs",
        "ssl_ca_certs",
        "ssl_ca_data",
        "ssl_ca_path",
        "ssl_check_hostname",
        "ssl_min_version",
        "ssl_ciphers",
        "ssl_password",
        "ssl_include_verify_flags",
        "ssl_exclude_verify_flags",
    }
)


@functools.cache
def _driver_info() -> Any:
    """redis-py's CLIENT SETINFO data, looked up once (redis-py reads package metadata
    again for every new connection)."""
    try:
        from redis.driver_info import DriverInfo
        from redis.utils import get_lib_version
    except ImportError:  # redis-py < 7
        return None
    return DriverInfo(lib_version=get_lib_version())


def _portable(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    portable = {key: value for key, value in (kwargs or {}).items() if key in _PORTABLE_KWARGS}
    if "lib_name" not in portable and "lib_version" not in portable and _driver_info():
        portable["driver_info"] = _driver_info()
    retry = (kwargs or {}).get("retry")
    if retry is not None:
        from redis.asyncio.retry import Retry

        portable["retry"] = Retry(retry._backoff, retry._retries, retry._supported_errors)
    return portable


async def aslot_pipeline(client: Any, key: str | bytes, *, transaction: bool = True) -> Any:
    """``slot_pipeline`` for redis.asyncio clients.

    On Redis Cluster: a pipeline of a plain client of the primary that owns
    ``key``'s slot (cached per loop and node), so it can run scripts and WAIT.
    """
    if not is_async_cluster(client):
        return client.pipeline(transaction=transaction)
    await client.initialize()  # see aresolve_client
    node = client.get_node_from_key(key)
    clients = loop_clients()
    if clients.node_clients is None:
        clients.node_clients = {}
    node_client = clients.node_clients.get(node.name)
    if node_client is None:
        node_client = _queueing_client(
            node.connection_class,
            node.max_connections,
            POOL_TIMEOUT,
            {**_portable(node.connection_kwargs), "host": node.host, "port": node.port},
        )
        clients.node_clients[node.name] = node_client
    return node_client.pipeline(transaction=transaction)
