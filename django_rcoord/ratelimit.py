"""Rate-limit counters, one round trip each.

- ``allow_once(key, seconds)``: the first call in ``seconds`` is allowed ("send
  one SMS code a minute"): ``SET NX PX``.
- ``allow_n(key, limit, seconds)``: ``limit`` calls per window of ``seconds``
  that starts at the window's first call ("five downloads per ten minutes"):
  one script counts the hit and sets the window's expiry together, so the
  window cannot be left without one, and rolls over by expiring.

Each has an async twin on ``redis.asyncio`` (``aallow_once``, ``ahit``,
``aallow_n``, ``areset``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django_rcoord.connection import aresolve_client, resolve_client
from django_rcoord.keys import KeySpace
from django_rcoord.scripts import arun_script, run_script
from django_rcoord.validation import is_positive_int

__all__ = [
    "RateLimitResult",
    "aallow_n",
    "aallow_once",
    "ahit",
    "allow_n",
    "allow_once",
    "areset",
    "hit",
    "reset",
]


@dataclass(frozen=True)
class RateLimitResult:
    allowed: bool
    hits: int  # hits counted in the current window, this one included
    limit: int
    retry_after: float  # seconds until the current window ends

    @property
    def remaining(self) -> int:
        return max(0, self.limit - self.hits)


def _window_ms(seconds: float) -> int:
    if not seconds > 0:
        raise ValueError("seconds must be a positive number")
    return max(1, int(seconds * 1000))


def _once_key(key: str) -> str:
    return KeySpace("ratelimit", key).key("once")


def _window_key(key: str, limit: int) -> str:
    if not is_positive_int(limit):
        raise ValueError("limit must be a positive integer")
    return KeySpace("ratelimit", key).key("window")


def _result(reply: Any, limit: int) -> RateLimitResult:
    hits, remaining_ms = reply
    return RateLimitResult(hits <= limit, int(hits), limit, remaining_ms / 1000)


def allow_once(key: str, seconds: float, *, client: Any = None) -> bool:
    """True for the first call with ``key`` in ``seconds``; False until they have passed."""
    return bool(resolve_client(client).set(_once_key(key), 1, nx=True, px=_window_ms(seconds)))


async def aallow_once(key: str, seconds: float, *, client: Any = None) -> bool:
    """``allow_once`` for async code."""
    client = await aresolve_client(client)
    return bool(await client.set(_once_key(key), 1, nx=True, px=_window_ms(seconds)))


def hit(key: str, limit: int, seconds: float, *, client: Any = None) -> RateLimitResult:
    """Count a call with ``key``; allowed while the window holds at most ``limit`` calls."""
    counter = _window_key(key, limit)
    reply = run_script(
        "ratelimit_hit", resolve_client(client), keys=[counter], args=[_window_ms(seconds)]
    )
    return _result(reply, limit)


async def ahit(key: str, limit: int, seconds: float, *, client: Any = None) -> RateLimitResult:
    """``hit`` for async code."""
    counter = _window_key(key, limit)
    client = await aresolve_client(client)
    reply = await arun_script("ratelimit_hit", client, keys=[counter], args=[_window_ms(seconds)])
    return _result(reply, limit)


def allow_n(key: str, limit: int, seconds: float, *, client: Any = None) -> bool:
    """True while ``key`` has had at most ``limit`` calls in its current window."""
    return hit(key, limit, seconds, client=client).allowed


async def aallow_n(key: str, limit: int, seconds: float, *, client: Any = None) -> bool:
    """``allow_n`` for async code."""
    return (await ahit(key, limit, seconds, client=client)).allowed


def _both_keys(key: str) -> tuple[str, str]:
    space = KeySpace("ratelimit", key)
    return space.key("once"), space.key("window")


def reset(key: str, *, client: Any = None) -> None:
    """Forget ``key``'s counters (both kinds)."""
    resolve_client(client).delete(*_both_keys(key))


async def areset(key: str, *, client: Any = None) -> None:
    """``reset`` for async code."""
    client = await aresolve_client(client)
    await client.delete(*_both_keys(key))
