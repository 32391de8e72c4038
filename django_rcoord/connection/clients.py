"""The sync client: the django-redis alias's, or ``RCOORD["CLIENT_FACTORY"]``'s."""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string
from django_redis import get_redis_connection

from django_rcoord.conf import conf
from django_rcoord.connection.kinds import is_async_client, is_cluster
from django_rcoord.exceptions import ConnectionNotConfigured

logger = logging.getLogger(__name__)

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
        client = client_from_cache(conf.CONNECTION)
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


def client_from_cache(alias: str) -> Any:

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
            _factory_clients[path] = bytes_client(factory(), "CLIENT_FACTORY")
        return _factory_clients[path]


def bytes_client(client: Any, setting: str) -> Any:
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
