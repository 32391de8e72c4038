"""Sentinel: the parts reach the primary through django-redis's Sentinel client
and follow it across a failover (real redis-server processes, one in sentinel mode)."""

from __future__ import annotations

import asyncio
import gc
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.test import override_settings

from django_rcoord.connection import get_async_client, get_client
from django_rcoord.embedded import EmbeddedRedis, find_executable, free_port
from django_rcoord.locks import Lock, LockNotReplicated
from tests.procs import wait_until

SERVICE = "rcoord-primary"
# What a pooled connection to the old primary can answer during and just after a failover
# (the pool drops such connections; the next attempt reaches the new primary).
FAILOVER_ERRORS = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.ReadOnlyError,
    LockNotReplicated,
)


@pytest.fixture
def sentinel_setup(tmp_path: Path) -> Iterator[tuple[EmbeddedRedis, EmbeddedRedis, int]]:
    primary = EmbeddedRedis(tmp_path / "primary", port=free_port()).start()
    replica = EmbeddedRedis(
        tmp_path / "replica",
        port=free_port(),
        extra_config={"replicaof": f"127.0.0.1 {primary.port}"},
    ).start()
    # A replica acknowledges writes (the lock's WAIT) once its first sync is done: on a
    # busy machine that can take longer than the test's first WAIT allows.
    wait_until(lambda: replica_in_sync(primary), timeout=60)
    port = free_port()
    config = tmp_path / "sentinel.conf"
    config.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\n"
        f"sentinel monitor {SERVICE} 127.0.0.1 {primary.port} 1\n"
        # (5 s: a primary stalled on a busy machine is not failed over before the test asks.)
        f"sentinel down-after-milliseconds {SERVICE} 5000\n"
        f"sentinel failover-timeout {SERVICE} 10000\n"
    )
    sentinel = subprocess.Popen(
        [find_executable(), str(config), "--sentinel"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield primary, replica, port
    finally:
        sentinel.terminate()
        sentinel.wait(10)
        replica.stop()
        primary.stop()


def replica_in_sync(primary: EmbeddedRedis) -> bool:
    """Whether the primary counts a replica online (its first sync done)."""
    client = primary.client()
    try:
        replica = client.info("replication").get("slave0")
    finally:
        client.close()
    return isinstance(replica, dict) and replica.get("state") == "online"


def primary_port(sentinel_port: int) -> int | None:
    client = redis.Redis(port=sentinel_port, socket_timeout=10)
    try:
        address = client.sentinel_get_master_addr_by_name(SERVICE)
    except (redis.ConnectionError, redis.TimeoutError):  # a sentinel stalled or restarting
        return None
    finally:
        client.close()
    return int(address[1]) if isinstance(address, tuple) else None


def role(server: EmbeddedRedis) -> str | None:
    """The server's replication role; None while it cannot say (a server whose role changes
    closes its clients' connections: a reset mid-failover is part of it, not a failure)."""
    client = server.client()
    try:
        return client.info("replication")["role"]
    except redis.ConnectionError:
        return None
    finally:
        client.close()


def test_locks_reach_the_primary_through_sentinel_and_follow_a_failover(
    sentinel_setup: tuple[EmbeddedRedis, EmbeddedRedis, int],
) -> None:
    primary, replica, sentinel_port = sentinel_setup
    wait_until(lambda: primary_port(sentinel_port) == primary.port, timeout=30)
    caches = {
        **settings.CACHES,
        "sentinel": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://{SERVICE}/0",
            "OPTIONS": {
                "CLIENT_CLASS": "django_redis.client.SentinelClient",
                "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
                "SENTINELS": [("127.0.0.1", sentinel_port)],
            },
        },
    }
    rcoord = {
        **settings.RCOORD,
        "CONNECTION": "sentinel",
        "CLIENT_FACTORY": None,
        "ASYNC_CLIENT_FACTORY": None,
        "LOCK_REPLICAS": 1,  # each grant is on the replica before acquire returns
        "LOCK_REPLICA_TIMEOUT": 5,
    }
    with override_settings(CACHES=caches, RCOORD=rcoord):
        lock = Lock("sentinel-lock", wait=0)
        assert lock.acquire()
        assert get_client().info("server")["tcp_port"] == primary.port
        first_token = lock.token
        assert first_token is not None
        lock.release()
        # The async client comes from the same alias: Sentinel's primary, WAIT included.
        assert asyncio.run(async_lock_port()) == primary.port

        sentinel = redis.Redis(port=sentinel_port)

        def start_failover() -> bool:
            try:  # refused until the sentinel has seen the replica (its INFO polling)
                return bool(sentinel.execute_command("SENTINEL", "FAILOVER", SERVICE))
            except redis.ResponseError:
                return False

        wait_until(start_failover, timeout=30)
        sentinel.close()
        wait_until(lambda: primary_port(sentinel_port) == replica.port, timeout=30)
        # The failover is over once the old primary replicates the new one. (Before
        # that, a pooled connection to the old primary can still write, and lose
        # the write: the window the docs' failover section is about.)
        wait_until(lambda: role(primary) == "slave" and role(replica) == "master", timeout=30)

        acquired: list[Lock] = []

        def acquire_on_new_primary() -> bool:
            lock = Lock("sentinel-lock", wait=0)
            try:
                if lock.acquire():
                    acquired.append(lock)
                    return True
            except FAILOVER_ERRORS:
                pass  # a pooled connection to the old primary; the pool drops it
            return False

        wait_until(acquire_on_new_primary, timeout=30)
        new_primary = replica.client()
        (granted,) = acquired
        assert granted.identifier is not None
        assert granted.token is not None
        owner = new_primary.get(granted._owner_key)
        assert owner == granted.identifier.encode()  # granted by the new primary
        # The counter carried over: the async grant took first_token + 1, and an attempt
        # whose reply the failover cut off (a timeout) may have taken one more.
        assert int(new_primary.get(granted._fence_key) or 0) == granted.token
        assert granted.token >= first_token + 2
        new_primary.close()
        # A new event loop's async client asks the sentinel too: it reaches the new primary.
        assert asyncio.run(async_lock_port()) == replica.port
    # Each loop's clients closed with it, their clients of the sentinel too: a connection
    # left open would be a ResourceWarning here, an error in this suite.
    gc.collect()


async def async_lock_port() -> int:
    """Take and give back a lock with the async API; the port of the server that granted it."""
    for _ in range(300):
        lock = Lock("sentinel-lock", wait=0)
        try:
            if await lock.aacquire():
                port = (await get_async_client().info("server"))["tcp_port"]
                await lock.arelease()
                return port
        except FAILOVER_ERRORS:
            pass  # a pooled connection to the old primary; the pool drops it
        await asyncio.sleep(0.1)
    raise AssertionError("no async lock within 30 s")
