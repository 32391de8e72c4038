"""Async clients: one set per running event loop, closed with that loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import weakref
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

from django_rcoord.conf import conf
from django_rcoord.connection.clients import bytes_client, client_from_cache
from django_rcoord.connection.convert import (
    POOL_TIMEOUT,
    async_client_like,
    portable_kwargs,
    queueing_client,
)
from django_rcoord.connection.kinds import is_async_client, is_async_cluster
from django_rcoord.exceptions import ConnectionNotConfigured

logger = logging.getLogger(__name__)


# -- async clients ------------------------------------------------------------------
@dataclass
class LoopClients:
    """The async clients of one event loop.

    ``commands`` runs every short command and script. ``waits`` only blocks
    (``BLPOP`` on wake-up lists, see ``django_rcoord.waiting``): its connections
    are never the ones a release or any other short command needs.
    """

    commands: Any
    waits: Any
    # Keeps the loop's closing hook alive (the loop holds async generators weakly).
    closer: Any = None
    hub: Any = None  # django_rcoord.waiting.SignalHub, made on first wait
    node_clients: dict[str, Any] | None = None  # per cluster node, for slot pipelines


_loop_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopClients] = (
    weakref.WeakKeyDictionary()
)
_loop_clients_lock = threading.Lock()
# Clients the running loop stopped using when settings changed, kept for its shutdown.
_retired_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[LoopClients]] = (
    weakref.WeakKeyDictionary()
)


def get_async_client() -> Any:
    """The ``redis.asyncio`` client every async path uses when no ``client=`` is given.

    Call it from code running in an event loop: each loop gets its own client
    (asyncio connections cannot cross loops), made on first use and closed when
    the loop shuts down (``asyncio.run``, ASGI servers and asgiref all do).
    ``RCOORD["ASYNC_CLIENT_FACTORY"]`` wins when set (Redis Cluster:
    ``redis.asyncio.cluster.RedisCluster``); otherwise the client is built from
    the django-redis alias's own connection settings (URL, password, db, TLS,
    timeouts, Sentinel).
    """
    return loop_clients().commands


def resolve_async_client(client: Any = None) -> Any:
    """Return ``client`` if one was passed (it must be a redis.asyncio client), else the
    configured one."""
    if client is None:
        return get_async_client()
    if not is_async_client(client):
        raise TypeError(
            f"async methods need a redis.asyncio client, not {type(client).__name__}: pass "
            "client=redis.asyncio.Redis(...) (or RedisCluster), or no client to use "
            "get_async_client()"
        )
    return client


async def aresolve_client(client: Any = None) -> Any:
    """``resolve_async_client``, ready for many tasks at once.

    redis.asyncio's cluster client maps the cluster's slots on first use, and
    commands sent by many tasks before that map exists race each other; its
    ``initialize()`` is safe to share (and a no-op once done), so every async
    path awaits it first.
    """
    client = resolve_async_client(client)
    if is_async_cluster(client):
        await client.initialize()
    return client


def loop_clients() -> LoopClients:
    """The running loop's clients, made on first use."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError(
            "get_async_client() is for code running in an event loop; sync code uses get_client()"
        ) from None
    clients = _loop_clients.get(loop)
    if clients is not None:
        return clients
    clients = LoopClients(
        commands=_new_async_client(), waits=_new_async_client(conf.ASYNC_WAIT_CONNECTIONS)
    )
    clients.closer = _close_with_loop(clients)
    with _loop_clients_lock:
        _loop_clients[loop] = clients
    return clients


def loop_clients_if_made() -> LoopClients | None:
    """The running loop's clients if it has made them (None outside a loop)."""
    try:
        return _loop_clients.get(asyncio.get_running_loop())
    except RuntimeError:
        return None


def _new_async_client(max_connections: int | None = None) -> Any:
    factory_path = conf.ASYNC_CLIENT_FACTORY
    if factory_path:
        try:
            factory = import_string(factory_path)
        except ImportError as exc:
            raise ConnectionNotConfigured(
                f'RCOORD["ASYNC_CLIENT_FACTORY"] {factory_path!r} cannot be imported: {exc} '
                "(see check rcoord.E015)."
            ) from exc
        return bytes_client(factory(), "ASYNC_CLIENT_FACTORY")
    if conf.CLIENT_FACTORY:
        raise ConnectionNotConfigured(
            'RCOORD["CLIENT_FACTORY"] is set but RCOORD["ASYNC_CLIENT_FACTORY"] is not: async '
            "code needs a redis.asyncio client from the same place (see check rcoord.W002)."
        )
    return async_client_like(client_from_cache(conf.CONNECTION), max_connections=max_connections)


def _close_with_loop(clients: LoopClients) -> Any:
    """Close ``clients`` when their loop shuts down its async generators.

    An async generator first iterated inside a loop is registered with it, and
    ``loop.shutdown_asyncgens()`` (run by ``asyncio.run``, ``asyncio.Runner``,
    asgiref and ASGI servers before closing the loop) closes it: its ``finally``
    then closes the clients while the loop still runs.
    """

    async def closer() -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            await _close_clients(clients)
            _drop_closed(clients)

    generator = closer()
    step = generator.asend(None)
    with contextlib.suppress(StopIteration):
        step.send(None)  # runs up to the yield without suspending: registers with the loop
    return generator


def _drop_closed(clients: LoopClients) -> None:
    """Take closed clients out of the tables: their connections hold their loop, the
    tables' weak key, alive."""
    loop = asyncio.get_running_loop()
    with _loop_clients_lock:
        if _loop_clients.get(loop) is clients:
            del _loop_clients[loop]
        retired = [each for each in _retired_clients.pop(loop, ()) if each is not clients]
        if retired:
            _retired_clients[loop] = retired


async def _close_clients(clients: LoopClients) -> None:
    if clients.hub is not None:
        clients.hub.close()
    for client in (clients.commands, clients.waits, *(clients.node_clients or {}).values()):
        # A client behind Sentinel does not close its manager's clients of the sentinels.
        # (A cluster client has no connection_pool.)
        pool = getattr(client, "connection_pool", None)
        manager = getattr(pool, "sentinel_manager", None)
        for each in (client, *(manager.sentinels if manager is not None else ())):
            try:
                await each.aclose()
            except Exception:  # a broken connection closes as well as it can
                logger.debug("closing an async client failed", exc_info=True)


@receiver(setting_changed)
def _forget_loop_clients_on_change(*, setting: str, **kwargs: Any) -> None:
    if setting in ("RCOORD", "CACHES"):
        _forget_loop_clients()


def _forget_loop_clients() -> None:
    """Settings changed: later calls build new clients; close the old ones in their loops
    (the running loop's as it shuts down)."""
    with _loop_clients_lock:
        entries = list(_loop_clients.items())
        _loop_clients.clear()
    for loop, clients in entries:
        if loop.is_closed():
            continue
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            # Not closed in a task of their own: a loop shutting down cancels pending
            # tasks, and a cluster client interrupted in aclose() counts itself closed
            # with its nodes still connected. Their closer runs with the loop's shutdown.
            _retired_clients.setdefault(loop, []).append(clients)
        else:
            with contextlib.suppress(RuntimeError):  # the loop closed since the check
                asyncio.run_coroutine_threadsafe(_close_clients(clients), loop)


async def aslot_pipeline(client: Any, key: str | bytes, *, transaction: bool = True) -> Any:
    """``slot_pipeline`` for redis.asyncio clients.

    On Redis Cluster: a pipeline of a plain client of the primary that owns
    ``key``'s slot (cached per loop and node), so it can run scripts and WAIT.
    """
    if not is_async_cluster(client):
        return client.pipeline(transaction=transaction)
    await client.initialize()  # see aresolve_client
    node = client.get_node_from_key(key)
    clients = loop_clients()
    if clients.node_clients is None:
        clients.node_clients = {}
    node_client = clients.node_clients.get(node.name)
    if node_client is None:
        node_client = queueing_client(
            node.connection_class,
            node.max_connections,
            POOL_TIMEOUT,
            {**portable_kwargs(node.connection_kwargs), "host": node.host, "port": node.port},
        )
        clients.node_clients[node.name] = node_client
    return node_client.pipeline(transaction=transaction)
