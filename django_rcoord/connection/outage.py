"""An outage as the callers of the services see it: one ``RedisUnavailable``, and a way to
know that a call which failed never reached the server.

A call that fails once its command may have been sent leaves its effect in doubt (the
server may have granted a lock whose reply was lost), so a lock or semaphore gives back
what it may have been granted. A connection that was never made (refused, a name that
does not resolve, a connect timeout) leaves nothing in doubt, and giving back then only
costs redis-py's retries a second time. redis-py raises the same ``ConnectionError`` for
both, and with its retries a command's last error may be a failed reconnect after a first
try that was sent; so the question is asked before anything is sent: ``connect`` takes a
connection from the client's pool (redis-py connects it there, with its retries) and puts
it back, and the command then goes out on it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import redis
import redis.asyncio

from django_rcoord.connection.errors import REDIS_UNAVAILABLE
from django_rcoord.exceptions import RedisUnavailable


def connect(client: Any) -> None:
    """Make sure ``client`` has a live connection before a call whose effect would be in
    doubt if it failed: when this raises, nothing was sent.

    Redis Cluster clients are left alone: they move between nodes on errors (a failover),
    so a refused node says nothing about where the call would go.
    """
    pool = _pool(client, redis.Redis)
    if pool is not None:
        try:
            connection = pool.get_connection()
        except TypeError:  # redis-py before 5.3 asks which command the connection is for
            connection = pool.get_connection("PING")
        pool.release(connection)


async def aconnect(client: Any) -> None:
    """``connect`` for a redis.asyncio client."""
    pool = _pool(client, redis.asyncio.Redis)
    if pool is not None:
        try:
            connection = await pool.get_connection()
        except TypeError:  # as in connect()
            connection = await pool.get_connection("PING")
        await pool.release(connection)


def _pool(client: Any, kind: type) -> Any:
    # A single-connection client (or one pinned to a connection) has no pool to ask.
    if isinstance(client, kind) and getattr(client, "connection", None) is None:
        return getattr(client, "connection_pool", None)
    return None


@contextmanager
def unavailable_as_one_error(what: str) -> Iterator[None]:
    """Redis out of reach inside the block raises ``RedisUnavailable`` saying ``what`` could
    not be done, chained once to redis-py's error (the socket error under that is in its
    message, and redis-py's own frames are left out)."""
    try:
        yield
    except REDIS_UNAVAILABLE as exc:
        raise_unavailable(what, exc)


def raise_unavailable(what: str, exc: BaseException) -> NoReturn:
    """Raise ``exc`` as ``unavailable_as_one_error`` does, for a hot path that catches
    ``REDIS_UNAVAILABLE`` itself (a ``with`` costs a generator per call): a
    ``RedisUnavailable`` as it is, else one saying ``what`` could not be done."""
    if isinstance(exc, RedisUnavailable):
        raise exc
    raise unavailable(what, exc) from _without_internals(exc)


def unavailable(what: str, exc: BaseException) -> RedisUnavailable:
    """The ``RedisUnavailable`` for ``what`` failing on ``exc`` (raise it ``from exc``)."""
    return RedisUnavailable(f"{what}: Redis is unreachable ({type(exc).__name__}: {exc})")


def _without_internals(exc: BaseException) -> BaseException:
    exc.__suppress_context__ = True  # the OSError under a connect error: in its message
    return exc.with_traceback(None)
