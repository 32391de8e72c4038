"""Which Redis errors mean "out of reach for now", and how long-running loops wait them out."""

from __future__ import annotations

import logging

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.backoff

from django_rcoord.exceptions import ConnectionNotConfigured

logger = logging.getLogger(__name__)

#: Errors that mean "Redis is out of reach for now" rather than "this call is wrong":
#: a lost or timed-out connection, and Redis Cluster's own (the cluster is down,
#: a slot is moving, no node answers). Workers and pollers wait these out;
#: fail-open middleware lets the request through.
REDIS_UNAVAILABLE: tuple[type[Exception], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.ClusterError,
    redis.exceptions.TryAgainError,
    redis.exceptions.RedisClusterException,
)

#: Every error from Redis that a long-running process (a worker, a poller) waits out with
#: backoff: unavailability, and replies such as READONLY (a failover), OOM, LOADING or BUSY.
REDIS_ERRORS: tuple[type[Exception], ...] = (redis.RedisError, *REDIS_UNAVAILABLE)


def log_waited_out(
    log: logging.Logger,
    who: str,
    exc: Exception,
    wait: float,
    previous: BaseException | None = None,
) -> None:
    """What a long-running loop (a worker, a poller) logs for an error it waits out for
    ``wait`` seconds: a Redis error in one line; anything else with its traceback, unless
    it is ``previous`` again (the error the loop's last try failed with, None after a try
    that went through): then one line, so that a lasting error (a database that refuses
    every connection) shows its traceback once, not once a retry."""
    name = type(exc).__name__
    if isinstance(exc, REDIS_ERRORS):
        log.error("%s: Redis error (%s: %s); retrying in %.1fs", who, name, exc, wait)
    elif previous is not None and _same_error(previous, exc):
        log.error("%s: same error again: %s: %s; retrying in %.1fs", who, name, exc, wait)
    else:
        log.error("%s: unexpected error; retrying in %.1fs", who, wait, exc_info=exc)


def _same_error(previous: BaseException, exc: BaseException) -> bool:
    """The same error as far as a reader of the log can tell: its class and its message."""
    return type(previous) is type(exc) and str(previous) == str(exc)


def log_answering_again(log: logging.Logger, who: str, failures: int) -> None:
    """The line a long-running loop logs at INFO once Redis answers again after it waited
    out ``failures`` errors in a row (the errors were logged; this says they ended)."""
    tries = "try" if failures == 1 else "tries"
    log.info("%s: Redis answers again after %d failed %s; going on", who, failures, tries)


#: Errors that mean "this request cannot ask Redis": it is out of reach, or the settings
#: give no client at all. ``fail_open`` (the middleware's rules, ``@locked``,
#: ``@rate_limited``) decides whether the request is served anyway.
NO_REDIS: tuple[type[Exception], ...] = (*REDIS_UNAVAILABLE, ConnectionNotConfigured)

#: How long a worker or poller that lost Redis waits before its next try, by how many
#: tries failed in a row: doubling from 0.5 s up to 10 s, each wait a random point in its
#: upper half, so that the workers of a restarted Redis do not all come back at once.
RECONNECT_BACKOFF = redis.backoff.EqualJitterBackoff(cap=10.0, base=0.5)
