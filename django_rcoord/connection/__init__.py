"""Where Redis is: the one place that turns settings into redis-py clients.

Sync code gets ``get_client()``: the django-redis alias's client, or
``RCOORD["CLIENT_FACTORY"]``'s. Async code gets ``get_async_client()``: a
``redis.asyncio`` client built from the same configuration, or
``RCOORD["ASYNC_CLIENT_FACTORY"]``'s, one per running event loop (asyncio
connections belong to the loop that opened them) and closed with that loop.
"""

from __future__ import annotations

from django_rcoord.connection.clients import get_client, resolve_client, slot_pipeline
from django_rcoord.connection.kinds import is_cluster
from django_rcoord.connection.loops import aslot_pipeline, get_async_client

__all__ = [
    "aslot_pipeline",
    "get_async_client",
    "get_client",
    "is_cluster",
    "resolve_client",
    "slot_pipeline",
]
