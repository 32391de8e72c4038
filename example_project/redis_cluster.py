"""``RCOORD["CLIENT_FACTORY"]`` for Redis Cluster: every part of django-rcoord uses it.

``settings.REDIS_CLUSTER_URL`` names any one node (``redis://host:port/0``);
the client discovers the others and routes each command to its slot's primary.
"""

from __future__ import annotations

from django.conf import settings
from redis.cluster import RedisCluster


def client() -> RedisCluster:
    return RedisCluster.from_url(
        settings.REDIS_CLUSTER_URL, socket_timeout=5, socket_connect_timeout=5
    )
