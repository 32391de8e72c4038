"""Where Redis is: the one place that turns settings into a redis-py client."""

from __future__ import annotations

import threading
from typing import Any

import redis
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

from django_rcoord.conf import conf
from django_rcoord.exceptions import ConnectionNotConfigured

#: Errors that mean "Redis is out of reach for now" rather than "this call is wrong":
#: a lost or timed-out connection, and Redis Cluster's own (the cluster is down,
#: a slot is moving, no node answers). Workers and pollers wait these out;
#: fail-open middleware lets the request through.
REDIS_UNAVAILABLE: tuple[type[BaseException], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.ClusterError,
    redis.exceptions.TryAgainError,
    redis.exceptions.RedisClusterException,
)

# Clients built by RCOORD["CLIENT_FACTORY"], one per dotted path: a factory is
# called once per process so its connection pool is shared by every caller.
_factory_clients: dict[str, Any] = {}
_factory_lock = threading.Lock()


def get_client() -> Any:
    """Return the redis-py client every part uses when no ``client=`` is given.

    ``RCOORD["CLIENT_FACTORY"]`` wins when set (this is how Redis Cluster is
    configured); otherwise the django-redis cache named by ``RCOORD["CONNECTION"]``
    gives its primary (``write=True``: coordination never reads from a replica).
    """
    factory_path = conf.CLIENT_FACTORY
    if factory_path:
        return _client_from_factory(factory_path)
    return _client_from_cache(conf.CONNECTION)


def resolve_client(client: Any = None) -> Any:
    """Return ``client`` if one was passed, else the configured one."""
    return get_client() if client is None else client


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
            _factory_clients[path] = factory()
        return _factory_clients[path]


@receiver(setting_changed)
def _forget_factory_clients(*, setting: str, **kwargs: Any) -> None:
    if setting == "RCOORD":
        with _factory_lock:
            _factory_clients.clear()
