"""``RCOORD["CLIENT_FACTORY"]`` and ``RCOORD["ASYNC_CLIENT_FACTORY"]`` for Redis Cluster:
every part of django-rcoord uses them (the async one in async code).

``settings.REDIS_CLUSTER_URL`` names any one node (``redis://host:port/0``);
the client discovers the others and routes each command to its slot's primary.
"""

from __future__ import annotations

import redis.asyncio.cluster
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from redis.cluster import RedisCluster


def node_url() -> str:
    # settings.py names these factories only when REDIS_CLUSTER_URL is set.
    if not settings.REDIS_CLUSTER_URL:
        raise ImproperlyConfigured("The Redis Cluster client factories need REDIS_CLUSTER_URL.")
    return settings.REDIS_CLUSTER_URL


def client() -> RedisCluster:
    return RedisCluster.from_url(node_url(), socket_timeout=5, socket_connect_timeout=5)


def async_client() -> redis.asyncio.cluster.RedisCluster:
    # redis.asyncio's cluster client refuses commands past max_connections per node.
    return redis.asyncio.cluster.RedisCluster.from_url(
        node_url(), socket_timeout=5, socket_connect_timeout=5, max_connections=1000
    )
