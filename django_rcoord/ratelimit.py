"""Rate-limit counters, one round trip each.

- ``allow_once(key, seconds)``: the first call in ``seconds`` is allowed ("send
  one SMS code a minute"): ``SET NX PX``.
- ``allow_n(key, limit, seconds)``: ``limit`` calls per window of ``seconds``
  that starts at the window's first call ("five downloads per ten minutes"):
  one script counts the hit and sets the window's expiry together, so the
  window cannot be left without one, and rolls over by expiring.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django_rcoord.connection import resolve_client
from django_rcoord.keys import KeySpace
from django_rcoord.scripts import run_script
from django_rcoord.validation import is_positive_int

__all__ = ["RateLimitResult", "allow_n", "allow_once", "hit", "reset"]


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


def allow_once(key: str, seconds: float, *, client: Any = None) -> bool:
    """True for the first call with ``key`` in ``seconds``; False until they have passed."""
    counter = KeySpace("ratelimit", key).key("once")
    return bool(resolve_client(client).set(counter, 1, nx=True, px=_window_ms(seconds)))


def hit(key: str, limit: int, seconds: float, *, client: Any = None) -> RateLimitResult:
    """Count a call with ``key``; allowed while the window holds at most ``limit`` calls."""
    if not is_positive_int(limit):
        raise ValueError("limit must be a positive integer")
    counter = KeySpace("ratelimit", key).key("window")
    hits, remaining_ms = run_script(
        "ratelimit_hit", resolve_client(client), keys=[counter], args=[_window_ms(seconds)]
    )
    return RateLimitResult(hits <= limit, int(hits), limit, remaining_ms / 1000)


def allow_n(key: str, limit: int, seconds: float, *, client: Any = None) -> bool:
    """True while ``key`` has had at most ``limit`` calls in its current window."""
    return hit(key, limit, seconds, client=client).allowed


def reset(key: str, *, client: Any = None) -> None:
    """Forget ``key``'s counters (both kinds)."""
    space = KeySpace("ratelimit", key)
    resolve_client(client).delete(space.key("once"), space.key("window"))
