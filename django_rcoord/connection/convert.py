"""A ``redis.asyncio`` client from a sync client's settings (django-redis gives only sync ones)."""

from __future__ import annotations

import functools
import logging
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.backoff
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.sentinel import SentinelConnectionPool

from django_rcoord.exceptions import ConnectionNotConfigured

logger = logging.getLogger(__name__)


def async_client_like(client: Any, *, max_connections: int | None = None) -> Any:
    """A ``redis.asyncio.Redis`` that reaches the same server as the sync ``client``, with
    the same connection settings (django-redis has parsed LOCATION and OPTIONS into its
    connection pool: host or unix socket, db, credentials, TLS, timeouts, retries, pool size,
    Sentinel). ``max_connections`` replaces the pool size."""

    pool = client.connection_pool
    kwargs = portable_kwargs(pool.connection_kwargs)
    if isinstance(pool, SentinelConnectionPool):
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
            sentinel_kwargs=portable_kwargs(manager.sentinel_kwargs),
            **portable_kwargs(manager.connection_kwargs),
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
    return queueing_client(
        connection_class,
        max_connections or pool.max_connections,
        getattr(pool, "timeout", None) or POOL_TIMEOUT,
        kwargs,
    )


def queueing_client(
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


def portable_kwargs(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    portable = {key: value for key, value in (kwargs or {}).items() if key in _PORTABLE_KWARGS}
    if "lib_name" not in portable and "lib_version" not in portable and _driver_info():
        portable["driver_info"] = _driver_info()
    retry = (kwargs or {}).get("retry")
    if retry is not None:
        portable["retry"] = Retry(retry._backoff, retry._retries, retry._supported_errors)
    return portable
