"""Where Redis is: the one place that turns settings into redis-py clients.

Sync code gets ``get_client()``: the django-redis alias's client, or
``RCOORD["CLIENT_FACTORY"]``'s. Async code gets ``get_async_client()``: a
``redis.asyncio`` client built from the same configuration, or
``RCOORD["ASYNC_CLIENT_FACTORY"]``'s, one per running event loop (asyncio
connections belong to the loop that opened them) and closed with that loop.
"""

from __future__ import annotations

from django_rcoord.connection.clients import get_client, resolve_client, slot_pipeline
from django_rcoord.connection.convert import async_client_like
from django_rcoord.connection.errors import (
    NO_REDIS,
    RECONNECT_BACKOFF,
    REDIS_ERRORS,
    REDIS_UNAVAILABLE,
    log_waited_out,
)
from django_rcoord.connection.kinds import is_async_client, is_async_cluster, is_cluster
from django_rcoord.connection.loops import (
    LoopClients,
    aresolve_client,
    aslot_pipeline,
    get_async_client,
    loop_clients,
    loop_clients_if_made,
    resolve_async_client,
)

__all__ = [
    "NO_REDIS",
    "RECONNECT_BACKOFF",
    "REDIS_ERRORS",
    "REDIS_UNAVAILABLE",
    "LoopClients",
    "aresolve_client",
    "aslot_pipeline",
    "async_client_like",
    "get_async_client",
    "get_client",
    "is_async_client",
    "is_async_cluster",
    "is_cluster",
    "log_waited_out",
    "loop_clients",
    "loop_clients_if_made",
    "resolve_async_client",
    "resolve_client",
    "slot_pipeline",
]
