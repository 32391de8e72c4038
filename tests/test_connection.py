from __future__ import annotations

import asyncio
import gc
import threading
import weakref

import pytest
import redis
import redis.asyncio
from django.conf import settings
from django.test import override_settings

from django_rcoord.connection import get_async_client, get_client
from django_rcoord.connection.clients import resolve_client
from django_rcoord.connection.convert import async_client_like
from django_rcoord.connection.loops import resolve_async_client
from django_rcoord.exceptions import ConnectionNotConfigured, RcoordError
from tests import cluster, factories
from tests.procs import wait_until


def test_default_client_reaches_the_configured_server(redis_url: str) -> None:
    get_client().set("probe", "from get_client")
    other = cluster.client_for_url(redis_url)
    assert other.get("probe") == b"from get_client"


def test_resolve_client_prefers_the_given_one(redis_url: str) -> None:
    mine = redis.Redis.from_url(redis_url)
    assert resolve_client(mine) is mine
    assert resolve_client(None) is get_client()


def test_the_default_client_is_looked_up_once_and_again_when_settings_change(
    redis_url: str,
) -> None:
    first = get_client()
    seen: list[object] = []
    thread = threading.Thread(target=lambda: seen.append(get_client()))
    thread.start()
    thread.join()
    assert seen == [first]  # one client for every thread: its pool is thread-safe
    if cluster.ENABLED:
        return  # the cluster's client comes from CLIENT_FACTORY, tested below
    other = _db_url(redis_url, 4)
    caches = {"db4": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": other}}
    with override_settings(CACHES=caches, RCOORD={"CONNECTION": "db4"}):
        assert get_client() is not first
        get_client().set("which-db", "4")
    assert get_client().get("which-db") is None
    assert redis.Redis.from_url(other).getdel("which-db") == b"4"


def _db_url(redis_url: str, db: int) -> str:
    """The URL of database ``db`` on the suite's server (0 is the suite's). Each test takes
    its own: django-redis keeps one connection pool per URL, whatever the OPTIONS."""
    if "db=" in redis_url:
        return redis_url.replace("db=0", f"db={db}")
    return redis_url.rstrip("/0") + f"/{db}"


def test_client_factory_overrides_connection_and_is_called_once() -> None:
    factories.calls.clear()
    with override_settings(
        RCOORD={"CONNECTION": "missing", "CLIENT_FACTORY": "tests.factories.make_client"}
    ):
        first = get_client()
        assert get_client() is first
        assert first.client_getname() == "rcoord-factory"
    assert factories.calls == ["make_client"]
    assert get_client().client_getname() != "rcoord-factory"


def test_unimportable_factory_is_a_clear_error() -> None:
    with (
        override_settings(RCOORD={"CLIENT_FACTORY": "tests.factories.nope"}),
        pytest.raises(ConnectionNotConfigured, match=r"rcoord\.E005"),
    ):
        get_client()


def test_missing_alias_is_a_clear_error() -> None:
    with (
        override_settings(RCOORD={"CONNECTION": "elsewhere"}),
        pytest.raises(ConnectionNotConfigured, match=r"rcoord\.E003"),
    ):
        get_client()


def test_cache_without_raw_client_is_a_clear_error() -> None:
    caches = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    }
    with (
        override_settings(CACHES=caches, RCOORD={"CONNECTION": "default"}),
        pytest.raises(RcoordError, match=r"rcoord\.E004"),
    ):
        get_client()


# -- async clients -----------------------------------------------------------------------
def _server_clients() -> int:
    return cluster.connections(get_client())


async def test_async_client_reaches_the_same_server() -> None:
    client = get_async_client()
    await client.set("probe", "from get_async_client")
    assert get_client().get("probe") == b"from get_async_client"
    assert get_async_client() is client  # one per loop


def test_each_loop_has_its_own_async_client_closed_with_the_loop() -> None:
    before = _server_clients()
    clients = []

    async def use() -> int:
        clients.append(get_async_client())
        await clients[-1].ping()
        return _server_clients()

    during = asyncio.run(use())
    asyncio.run(use())
    assert clients[0] is not clients[1]
    if not cluster.ENABLED:  # a cluster's count also moves with other nodes' connections
        assert during > before
    # asyncio.run shut the loop's async generators down, which closed its clients.
    wait_until(lambda: _server_clients() <= before, timeout=10)


def test_clients_a_settings_change_replaced_in_a_loop_close_with_it() -> None:
    """As ``override_settings`` in an async test does: the old clients are not closed in a
    task of their own, which the loop's shutdown cancelled half way (a cluster client
    then counted itself closed with its nodes still connected)."""
    loops = []

    async def use() -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        await get_async_client().ping()
        with override_settings(RCOORD=dict(settings.RCOORD)):
            await get_async_client().ping()

    asyncio.run(use())
    # A connection left open would be a ResourceWarning here, an error in this suite.
    gc.collect()
    assert loops[0]() is None  # nor are they kept once closed, with their loop


def test_a_loop_is_not_kept_with_its_closed_clients() -> None:
    loops = []

    async def use() -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        await get_async_client().ping()

    asyncio.run(use())
    gc.collect()
    assert loops[0]() is None


def test_async_client_keeps_the_aliases_settings(redis_url: str) -> None:
    if cluster.ENABLED:
        pytest.skip("django-redis aliases are single-server; the cluster uses the factories")
    caches = {
        "other": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": _db_url(redis_url, 3),
            "OPTIONS": {"SOCKET_TIMEOUT": 7, "SOCKET_CONNECT_TIMEOUT": 3, "PASSWORD": None},
        },
    }

    async def write() -> dict:
        client = get_async_client()
        await client.set("where", "db 3")
        return dict(client.connection_pool.connection_kwargs)

    with override_settings(CACHES=caches, RCOORD={"CONNECTION": "other"}):
        kwargs = asyncio.run(write())
        sync = get_client()
        assert sync.get("where") == b"db 3"
    assert kwargs["db"] == 3
    assert kwargs["socket_timeout"] == 7
    assert kwargs["socket_connect_timeout"] == 3
    assert get_client().get("where") is None  # db 0 untouched


def test_async_client_of_a_tls_alias_speaks_tls() -> None:
    caches = {
        "tls": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "rediss://user:secret@redis.example.invalid:6380/2",
            "OPTIONS": {"CONNECTION_POOL_KWARGS": {"ssl_cert_reqs": "none"}},
        },
    }
    with override_settings(CACHES=caches, RCOORD={"CONNECTION": "tls"}):
        client = async_client_like(get_client())
    pool = client.connection_pool
    assert pool.connection_class is redis.asyncio.SSLConnection
    assert pool.connection_kwargs["host"] == "redis.example.invalid"
    assert pool.connection_kwargs["port"] == 6380
    assert pool.connection_kwargs["db"] == 2
    assert pool.connection_kwargs["username"] == "user"
    assert pool.connection_kwargs["password"] == "secret"
    assert pool.connection_kwargs["ssl_cert_reqs"] == "none"


def test_async_client_factory_is_called_per_loop_for_commands_and_waits() -> None:
    factories.calls.clear()

    async def name() -> bytes:
        return await get_async_client().client_getname()

    with override_settings(
        RCOORD={
            "CLIENT_FACTORY": "tests.factories.make_client",
            "ASYNC_CLIENT_FACTORY": "tests.factories.make_async_client",
        }
    ):
        assert asyncio.run(name()) in ("rcoord-async-factory", b"rcoord-async-factory")
    assert factories.calls == ["make_async_client", "make_async_client"]


def test_client_factory_without_an_async_one_is_a_clear_error() -> None:
    async def use() -> None:
        get_async_client()

    with (
        override_settings(RCOORD={"CLIENT_FACTORY": "tests.factories.make_client"}),
        pytest.raises(ConnectionNotConfigured, match=r"rcoord\.W002"),
    ):
        asyncio.run(use())


async def test_clients_of_the_wrong_kind_are_refused(redis_url: str) -> None:
    with pytest.raises(TypeError, match=r"redis\.asyncio client"):
        resolve_async_client(get_client())
    with pytest.raises(TypeError, match="sync redis-py client"):
        resolve_client(get_async_client())


def test_async_client_outside_a_loop_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match="sync code uses get_client"):
        get_async_client()
