"""The client factory the suite uses when it runs against Redis Cluster.

``RCOORD_TEST_CLUSTER=1`` switches the suite to a 3-master cluster (see
conftest.py); tests/settings.py then names ``tests.cluster.client`` as
``RCOORD["CLIENT_FACTORY"]``, the way a project configures a cluster.
"""

from __future__ import annotations

import os
from typing import Any

import redis
import redis.asyncio.cluster
from redis.cluster import RedisCluster

#: True when the suite runs against Redis Cluster.
ENABLED = os.environ.get("RCOORD_TEST_CLUSTER", "") not in ("", "0")


def client() -> RedisCluster:
    return RedisCluster.from_url(os.environ["RCOORD_TEST_REDIS_URL"], socket_timeout=10)


def async_client() -> redis.asyncio.cluster.RedisCluster:
    # Hundreds of concurrent tasks in the async tests: room for them on each node.
    return redis.asyncio.cluster.RedisCluster.from_url(
        os.environ["RCOORD_TEST_REDIS_URL"], socket_timeout=10, max_connections=2000
    )


def client_for_url(url: str, **options: Any) -> redis.Redis | RedisCluster:
    """A new client of the kind the suite runs against, for ``url`` (``options``: the
    client's, such as ``socket_timeout``)."""
    return (RedisCluster if ENABLED else redis.Redis).from_url(url, **options)


def connections(client: redis.Redis | RedisCluster) -> int:
    """How many client connections the server (every node of a cluster) has now."""
    if isinstance(client, RedisCluster):
        # redis-py annotates client_list() as a list; asked of several nodes it returns
        # {node: list}.
        per_node = client.client_list(target_nodes="all")
        return sum(len(clients) for clients in per_node.values())  # type: ignore[attr-defined,misc]
    return len(client.client_list())


def info_of_node(client: redis.Redis | RedisCluster, key: str, section: str) -> dict[str, Any]:
    """``INFO section`` of the server that holds ``key`` (a cluster's node of its slot)."""
    if not isinstance(client, RedisCluster):
        return client.info(section)
    node = client.get_node_from_key(key)
    info = client.info(section, target_nodes=node)
    # redis-py answers {node name: its answer} when asked of nodes, or the answer itself.
    return info.get(node.name, info)


def reset_stats_of_node(client: redis.Redis | RedisCluster, key: str) -> None:
    """``CONFIG RESETSTAT`` on the server that holds ``key``."""
    if isinstance(client, RedisCluster):
        client.config_resetstat(target_nodes=client.get_node_from_key(key))
    else:
        client.config_resetstat()
