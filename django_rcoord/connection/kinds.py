"""What kind of client a caller passed: cluster or not, sync or async."""

from __future__ import annotations

from typing import Any

import redis.asyncio
import redis.asyncio.cluster
from redis.cluster import RedisCluster


def is_cluster(client: Any) -> bool:
    """True for a ``redis.cluster.RedisCluster`` (or one of its pipelines)."""

    return isinstance(client, RedisCluster)


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
