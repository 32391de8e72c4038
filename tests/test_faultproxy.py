"""The fault proxy itself (``tests/faultproxy.py``): a closed proxy serves nobody, and a pump
stopped inside ``recv()`` never reads a newer connection's bytes. The fault matrix's
verdicts rest on both."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from redis.cluster import RedisCluster

from tests.faultproxy import FaultProxy
from tests.procs import wait_until


@pytest.fixture
def address(redis_client: Any) -> tuple[str, int] | str:
    """A server to proxy: the suite's, or one node of its cluster (the tests send keyless
    commands, which any node answers)."""
    if isinstance(redis_client, RedisCluster):
        node = redis_client.get_default_node()
        return (node.host, node.port)
    kwargs = redis_client.connection_pool.connection_kwargs
    return kwargs["path"] if "path" in kwargs else (kwargs["host"], kwargs["port"])


@pytest.fixture
def proxy(address: tuple[str, int] | str) -> Iterator[FaultProxy]:
    fault_proxy = FaultProxy(address)
    yield fault_proxy
    fault_proxy.resume_replies()
    fault_proxy.close()


def connect(proxy: FaultProxy) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=5)


def reply(sock: socket.socket, expected: bytes) -> bytes:
    """What arrives on ``sock``, up to the length of ``expected``, or until it ends or is
    silent for its timeout."""
    data = b""
    try:
        while len(data) < len(expected):
            chunk = sock.recv(len(expected) - len(data))
            if not chunk:
                break
            data += chunk
    except OSError:  # a timeout, or a reset
        pass
    return data


def test_a_closed_proxy_serves_no_connection(proxy: FaultProxy) -> None:
    """Its accept thread was blocked in accept() when close() came (before: the listener,
    closed under it, took one more connection, and a retried call got through)."""
    with connect(proxy) as served:
        served.sendall(b"PING\r\n")
        assert reply(served, b"+PONG\r\n") == b"+PONG\r\n"
    proxy.close()
    try:
        late = connect(proxy)
    except OSError:
        return  # refused: nothing listens there any more
    with late:
        late.settimeout(2)  # a served PING answers in microseconds
        late.sendall(b"PING\r\n")
        assert reply(late, b"+PONG\r\n") == b""


def test_a_stopped_pump_never_reads_a_newer_connections_bytes(
    proxy: FaultProxy, redis_client: Any
) -> None:
    """A connection's reply pump is stopped before its recv() (its descriptor chosen, as a
    process stopped inside recv() is), the connection ends, a new one opens: when the pump
    resumes, the new connection gets every reply (before: the ended connection's descriptor
    was closed, the new one could reuse it, and the stopped pump swallowed its replies)."""

    def named(name: str) -> int:
        return sum(1 for client in redis_client.client_list() if client["name"] == name)

    proxy.pause_replies()
    stale = connect(proxy)
    stale.sendall(b"CLIENT SETNAME stale\r\n")  # its reply pump stops; commands still pass
    wait_until(lambda: named("stale") == 1 and len(proxy.stopped) == 1)
    ((descriptor, inode),) = proxy.stopped
    stale.close()
    wait_until(lambda: named("stale") == 0)  # the server saw the connection end
    with connect(proxy) as newer:
        wait_until(lambda: len(proxy.stopped) == 2)  # the newer connection's pump too
        # The stopped pump's descriptor is still its own connection's socket, not a newer one.
        assert os.fstat(descriptor).st_ino == inode
        proxy.resume_replies()
        for index in range(20):
            text = f"reply-{index}".encode()
            newer.sendall(b"ECHO " + text + b"\r\n")
            expected = b"$%d\r\n%s\r\n" % (len(text), text)
            assert reply(newer, expected) == expected
