"""Rate limits, one round trip each, decided by the Redis server's clock.

- ``allow_once(key, seconds)``: the first call in ``seconds`` is allowed ("send
  one SMS code a minute"): ``SET NX PX``.
- ``hit(key, limit, seconds, algorithm=...)`` counts a call and answers a
  ``RateLimitResult`` (allowed, hits, retry-after); ``allow_n`` answers only
  whether it was allowed. The algorithms (``ALGORITHMS``), each one script:

  ``"fixed"`` (the default)
      ``limit`` calls per window of ``seconds`` that starts at the window's first
      call ("five downloads per ten minutes"): a counter with an expiry, which
      counts refused calls too. Up to ``2 * limit`` calls can pass within
      ``seconds`` across a window's end.
  ``"sliding"``
      Exact: at most ``limit`` allowed calls in any ``seconds``. The allowed
      calls' times are logged (a ZSET of up to ``limit`` entries per key).
  ``"sliding_counter"``
      The sliding window approximated from two counters of fixed, clock-aligned
      windows, the previous one weighted by how much of it is still inside:
      constant memory, exact when calls are spread evenly.
  ``"gcra"``
      The generic cell rate algorithm, a token bucket kept as one time: calls are
      spaced ``seconds / limit`` apart, with bursts of up to ``limit`` after a quiet
      spell. Constant memory.

Each has an async twin on ``redis.asyncio`` (``aallow_once``, ``ahit``,
``aallow_n``, ``areset``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django_rcoord.connection.clients import resolve_client
from django_rcoord.connection.loops import aresolve_client
from django_rcoord.keys import KeySpace, encoded_instance_keys
from django_rcoord.scripts import arun_script, run_script
from django_rcoord.validation import is_positive_int

__all__ = [
    "ALGORITHMS",
    "RateLimitResult",
    "aallow_n",
    "aallow_once",
    "ahit",
    "allow_n",
    "allow_once",
    "areset",
    "check_algorithm",
    "hit",
    "reset",
]


#: The algorithms ``hit`` and ``@rate_limited`` know, by name.
ALGORITHMS = ("fixed", "sliding", "sliding_counter", "gcra")


@dataclass(frozen=True)
class RateLimitResult:
    allowed: bool
    #: Hits in the window, this one included: "fixed" counts every hit, refused ones
    #: too; "sliding" counts the allowed ones; "sliding_counter" estimates them; "gcra"
    #: counts the cells (tokens) in use. A refused hit answers at least ``limit + 1``.
    hits: int
    limit: int
    #: Seconds until a hit would be allowed. For "fixed": until the current window ends
    #: (allowed or not); for the others: 0 while a next hit would be allowed now.
    retry_after: float

    @property
    def remaining(self) -> int:
        return max(0, self.limit - self.hits)


def check_algorithm(algorithm: object) -> str:
    """Return ``algorithm`` if it is one of ``ALGORITHMS``, or raise ``ValueError``."""
    if algorithm not in ALGORITHMS:
        raise ValueError(
            f"unknown rate-limit algorithm {algorithm!r}; choose one of "
            + ", ".join(repr(name) for name in ALGORITHMS)
        )
    return algorithm


def _window_ms(seconds: float) -> int:
    if not seconds > 0:
        raise ValueError("seconds must be a positive number")
    return max(1, int(seconds * 1000))


def _window_us(seconds: float) -> int:
    if not seconds > 0:
        raise ValueError("seconds must be a positive number")
    return max(1, round(seconds * 1_000_000))


def _once_key(key: str) -> str:
    return KeySpace("ratelimit", key).key("once")


@dataclass(frozen=True)
class _Algorithm:
    """How one algorithm is asked: its script and the key part it keeps its state in.

    The fixed window's script (the first, kept as it was) takes the window in ms and
    answers ``{hits, ms until the window ends}``; the others take the limit and the
    window in us and answer ``{allowed, hits, us until a hit would be allowed}``.
    """

    script: str
    part: str
    fixed_window: bool = False

    def arguments(self, limit: int, seconds: float) -> list[int]:
        if self.fixed_window:
            return [_window_ms(seconds)]
        return [limit, _window_us(seconds)]

    def result(self, reply: Any, limit: int) -> RateLimitResult:
        if self.fixed_window:
            hits, remaining_ms = reply
            return RateLimitResult(hits <= limit, int(hits), limit, remaining_ms / 1000)
        allowed, hits, wait_us = reply
        return RateLimitResult(allowed == 1, int(hits), limit, wait_us / 1_000_000)


_ALGORITHMS = {
    "fixed": _Algorithm("ratelimit_hit", "window", fixed_window=True),
    "sliding": _Algorithm("ratelimit_sliding", "log"),
    "sliding_counter": _Algorithm("ratelimit_sliding_counter", "counters"),
    "gcra": _Algorithm("ratelimit_gcra", "tat"),
}


def _call(
    key: str, limit: int, seconds: float, algorithm: str
) -> tuple[_Algorithm, tuple[bytes, ...], list[int]]:
    """What ``hit`` and ``ahit`` send: the algorithm, its key and the script's arguments."""
    chosen = _ALGORITHMS[check_algorithm(algorithm)]
    if not is_positive_int(limit):
        raise ValueError("limit must be a positive integer")
    keys = encoded_instance_keys("ratelimit", key, (chosen.part,))
    return chosen, keys, chosen.arguments(limit, seconds)


def allow_once(key: str, seconds: float, *, client: Any = None) -> bool:
    """True for the first call with ``key`` in ``seconds``; False until they have passed."""
    return bool(resolve_client(client).set(_once_key(key), 1, nx=True, px=_window_ms(seconds)))


async def aallow_once(key: str, seconds: float, *, client: Any = None) -> bool:
    """``allow_once`` for async code."""
    client = await aresolve_client(client)
    return bool(await client.set(_once_key(key), 1, nx=True, px=_window_ms(seconds)))


def hit(
    key: str, limit: int, seconds: float, *, algorithm: str = "fixed", client: Any = None
) -> RateLimitResult:
    """Count a call with ``key``; allowed while ``algorithm`` finds at most ``limit``
    calls in ``seconds``."""
    chosen, keys, args = _call(key, limit, seconds, algorithm)
    reply = run_script(chosen.script, resolve_client(client), keys=keys, args=args)
    return chosen.result(reply, limit)


async def ahit(
    key: str, limit: int, seconds: float, *, algorithm: str = "fixed", client: Any = None
) -> RateLimitResult:
    """``hit`` for async code."""
    chosen, keys, args = _call(key, limit, seconds, algorithm)
    client = await aresolve_client(client)
    reply = await arun_script(chosen.script, client, keys=keys, args=args)
    return chosen.result(reply, limit)


def allow_n(
    key: str, limit: int, seconds: float, *, algorithm: str = "fixed", client: Any = None
) -> bool:
    """True while ``key`` has had at most ``limit`` calls in ``seconds`` (``hit``)."""
    return hit(key, limit, seconds, algorithm=algorithm, client=client).allowed


async def aallow_n(
    key: str, limit: int, seconds: float, *, algorithm: str = "fixed", client: Any = None
) -> bool:
    """``allow_n`` for async code."""
    return (await ahit(key, limit, seconds, algorithm=algorithm, client=client)).allowed


def _all_keys(key: str) -> list[str]:
    space = KeySpace("ratelimit", key)
    return [space.key("once"), *(space.key(each.part) for each in _ALGORITHMS.values())]


def reset(key: str, *, client: Any = None) -> None:
    """Forget ``key``'s counters (of ``allow_once`` and of every algorithm)."""
    resolve_client(client).delete(*_all_keys(key))


async def areset(key: str, *, client: Any = None) -> None:
    """``reset`` for async code."""
    client = await aresolve_client(client)
    await client.delete(*_all_keys(key))
