"""Real-Redis fixtures: no mocks, no fakes.

A throwaway ``redis-server`` is started for the session (the same binary
search as the embedded server), unless ``REDIS_URL`` names one; that database
must then be empty, because every test starts by flushing it.

``RCOORD_TEST_CLUSTER=1`` runs the same suite against Redis Cluster: a
throwaway 3-master cluster on loopback ports (or, with ``REDIS_URL``, the
cluster that URL's node belongs to), reached through
``RCOORD["CLIENT_FACTORY"] = "tests.cluster.client"``.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.test.utils import override_settings
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_rcoord.connection import get_client
from django_rcoord.embedded import EmbeddedCluster, EmbeddedRedis
from django_rcoord.exceptions import EmbeddedRedisError
from django_rcoord.queues import incoming
from tests import cluster, procs


@pytest.fixture(scope="session")
def redis_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[EmbeddedRedis | EmbeddedCluster | None]:
    """The throwaway server (or cluster) the suite started, or None when REDIS_URL names one."""
    if os.environ.get("REDIS_URL"):
        yield None
        return
    server: EmbeddedRedis | EmbeddedCluster
    if cluster.ENABLED:
        server = EmbeddedCluster(tmp_path_factory.mktemp("redis-cluster"))
    else:
        server = EmbeddedRedis(tmp_path_factory.mktemp("redis"))
    try:
        server.start()
    except EmbeddedRedisError as exc:
        # No usable redis-server (Python 3.14, an Intel Mac: no bundled binary fits): every
        # test needs this server, so the run stops here with one line instead of each test
        # erroring with the same traceback.
        pytest.exit(f"The tests need a redis-server 6.2 or newer: {exc}", returncode=2)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_url(redis_server: EmbeddedRedis | EmbeddedCluster | None) -> Iterator[str]:
    """The URL of the Redis the suite runs against."""
    url = os.environ.get("REDIS_URL")
    if url:
        client = cluster.client_for_url(url)
        keys = client.dbsize()
        client.close()
        if keys:
            pytest.exit(
                f"REDIS_URL={url} holds {keys} keys; the tests flush their database, so they "
                "only run against an empty one. Point REDIS_URL at an unused database "
                "(e.g. redis://localhost:6379/15) or unset it to use a throwaway server.",
                returncode=2,
            )
        yield url
        return
    assert redis_server is not None  # it starts one whenever REDIS_URL is unset
    yield redis_server.url


@pytest.fixture(scope="session", autouse=True)
def _use_test_redis(redis_url: str) -> Iterator[None]:
    caches = {alias: dict(config) for alias, config in settings.CACHES.items()}
    caches["default"]["LOCATION"] = redis_url
    os.environ["RCOORD_TEST_REDIS_URL"] = redis_url  # for processes the tests start
    with override_settings(CACHES=caches):
        yield


@pytest.fixture(autouse=True)
def _flush_redis(_use_test_redis: None) -> None:
    get_client().flushdb()
    # A new Redis for each test: what this process saw of the last test's workers is gone.
    incoming.forget_serving()


@pytest.fixture(autouse=True)
def _no_process_outlives_its_test() -> Iterator[None]:
    """A process a test started and left running (a failed or timed-out test's worker) is
    killed as the test ends, so it cannot take the next test's tasks."""
    yield
    procs.kill_leftovers()


@pytest.fixture
def redis_client() -> redis.Redis:
    """The client every part uses (RCOORD['CONNECTION'])."""
    return get_client()


def use_redis_at(url: str) -> override_settings:
    """Settings under which every part (sync and async) uses the single Redis at ``url``."""
    caches = {
        **settings.CACHES,
        "elsewhere": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": url,
            "OPTIONS": {"CONNECTION_POOL_KWARGS": {"retry": Retry(NoBackoff(), 0)}},
        },
    }
    rcoord = {
        **settings.RCOORD,
        "CONNECTION": "elsewhere",
        "CLIENT_FACTORY": None,
        "ASYNC_CLIENT_FACTORY": None,
    }
    return override_settings(CACHES=caches, RCOORD=rcoord)


@pytest.fixture
def redis_down() -> Iterator[str]:
    """Redis is down: every part connects to a loopback port where nothing listens."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"redis://127.0.0.1:{port}/0"  # the probe is closed: connecting is refused
    with use_redis_at(url):
        yield url


@pytest.fixture
def redis_to_stop(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """A redis-server of the test's own, used by every part; the test may stop it."""
    server = EmbeddedRedis(tmp_path / "redis-to-stop").start()
    try:
        with use_redis_at(server.url):
            yield server
    finally:
        server.stop()
