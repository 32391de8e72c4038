"""A throwaway Redis Cluster for tests: ``EmbeddedCluster(data_dir)``, three (or more)
primaries on loopback ports, each an ``EmbeddedRedis``, joined with the cluster's own
commands (``CLUSTER ADDSLOTS``, ``CLUSTER MEET``)."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import redis
from redis.cluster import ClusterNode, RedisCluster

from django_rcoord.embedded.server import EmbeddedRedis, free_port
from django_rcoord.exceptions import EmbeddedRedisError


def _free_port_pair() -> int:
    """A loopback port that is free, and whose cluster bus port (port + 10000) is free too."""
    for _ in range(100):
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise EmbeddedRedisError("Found no free loopback port pair for a cluster node.")


class EmbeddedCluster:
    """A Redis Cluster of ``masters`` primaries (no replicas) on loopback ports.

    Each node is an ``EmbeddedRedis`` in ``data_dir/<port>`` with
    ``cluster-enabled yes``; ``start()`` starts them and, the first time, joins
    them (``CLUSTER ADDSLOTS`` and ``CLUSTER MEET``). The ports are chosen once and
    kept in ``data_dir/ports.json``, so a cluster stopped and started again
    keeps its slots and data. ``url`` is a node's URL for
    ``redis.cluster.RedisCluster.from_url``; ``client()`` returns a
    ``RedisCluster``.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        masters: int = 3,
        ports: list[int] | None = None,
        executable: str | None = None,
        node_timeout_ms: int = 2000,
    ) -> None:
        if masters < 3:
            raise ValueError("Redis Cluster needs at least 3 primaries")
        self.data_dir = Path(data_dir).expanduser().resolve()
        self.masters = masters
        self._ports = list(ports) if ports is not None else None
        self._executable = executable
        self.node_timeout_ms = node_timeout_ms

    @property
    def ports(self) -> list[int]:
        if self._ports is None:
            saved = self.data_dir / "ports.json"
            try:
                self._ports = json.loads(saved.read_text())
            except (OSError, ValueError):
                self.data_dir.mkdir(parents=True, exist_ok=True)
                self._ports = [_free_port_pair() for _ in range(self.masters)]
                saved.write_text(json.dumps(self._ports))
        return self._ports

    @property
    def nodes(self) -> list[EmbeddedRedis]:
        config = {
            "cluster-enabled": "yes",
            "cluster-config-file": "nodes.conf",
            "cluster-node-timeout": str(self.node_timeout_ms),
            # A test cluster answers for the slots it has even if a node is down.
            "cluster-require-full-coverage": "no",
        }
        return [
            EmbeddedRedis(
                self.data_dir / str(port),
                port=port,
                executable=self._executable,
                extra_config=config,
            )
            for port in self.ports
        ]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def client(self, **kwargs: Any) -> Any:
        """A new ``redis.cluster.RedisCluster`` for this cluster."""

        kwargs.setdefault("socket_timeout", 5)
        startup = [ClusterNode("127.0.0.1", port) for port in self.ports]
        return RedisCluster(startup_nodes=startup, **kwargs)

    def is_running(self) -> bool:
        """True when every node answers and the cluster reports state ok."""
        return self._state_ok()

    def _state_ok(self) -> bool:
        for node in self.nodes:
            info = _cluster_info(node)
            if (
                info is None
                or info.get("cluster_state") != "ok"
                or int(info.get("cluster_slots_assigned", 0)) != 16384
                or int(info.get("cluster_known_nodes", 0)) != len(self.ports)
            ):
                return False
        return True

    def start(self, timeout: float = 30.0) -> EmbeddedCluster:
        """Start every node and join them into a cluster (once). Returns self."""
        nodes = self.nodes
        for node in nodes:
            node.start(timeout=timeout)
        with nodes[0]._start_lock():
            first = _cluster_info(nodes[0]) or {}
            if not self._state_ok() and int(first.get("cluster_slots_assigned", 0)) == 0:
                self._create(timeout)
        deadline = time.monotonic() + timeout
        while not self._state_ok():
            if time.monotonic() > deadline:
                raise EmbeddedRedisError(
                    f"The cluster at ports {self.ports} did not reach state ok in {timeout:.0f}s."
                )
            time.sleep(0.05)
        return self

    def _create(self, timeout: float) -> None:
        """Join the nodes with the cluster's own commands, as ``redis-cli --cluster create``
        does (so no ``redis-cli`` is needed): a distinct config epoch per node, an even
        share of the slot range each, then every node meets the first."""
        nodes = self.nodes
        share = 16384 // len(nodes)
        try:
            for index, node in enumerate(nodes):
                client = node._client_without_retries(timeout=timeout)
                try:
                    client.execute_command("CLUSTER SET-CONFIG-EPOCH", index + 1)
                    first = index * share
                    last = 16383 if index == len(nodes) - 1 else first + share - 1
                    # ADDSLOTS, not ADDSLOTSRANGE: Redis 6.2 has no ranges.
                    client.execute_command("CLUSTER ADDSLOTS", *range(first, last + 1))
                    if index:
                        client.execute_command("CLUSTER MEET", "127.0.0.1", self.ports[0])
                finally:
                    client.close()
        except redis.RedisError as exc:
            raise EmbeddedRedisError(
                f"Joining the cluster at ports {self.ports} failed: {exc}"
            ) from exc

    def stop(self, timeout: float = 15.0) -> bool:
        """Stop every node. Returns False when none was running."""
        stopped = [node.stop(timeout=timeout) for node in self.nodes]
        return any(stopped)

    def __repr__(self) -> str:
        return f"EmbeddedCluster({str(self.data_dir)!r}, ports={self._ports!r})"


def _cluster_info(node: EmbeddedRedis) -> dict[str, str] | None:
    """``CLUSTER INFO`` of one node, or None when it does not answer."""
    client = node._client_without_retries(timeout=1)
    try:
        info = client.cluster("INFO")
    except (redis.RedisError, OSError):
        return None
    finally:
        client.close()
    return _parse_cluster_info(info) if isinstance(info, (bytes, str)) else info


def _parse_cluster_info(text: bytes | str) -> dict[str, str]:
    if isinstance(text, bytes):
        text = text.decode()
    pairs = (line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {name.strip(): value.strip() for name, value in pairs}
