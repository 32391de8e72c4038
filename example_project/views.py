from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from redis.exceptions import RedisError

from django_rcoord.connection import get_client
from django_rcoord.connection.errors import REDIS_UNAVAILABLE
from django_rcoord.responses import refused_unavailable

#: The demos of the example project, linked from the home page as they land.
DEMOS: list[tuple[str, str, str]] = [
    (
        "guild-mail",
        "Mail your guild",
        "pick a recipient with the accessible guild-member autocomplete",
    ),
    (
        "market",
        "Marketplace",
        "list and buy items; each purchase holds a per-item lock with a fencing token",
    ),
    (
        "verification-code",
        "Send me a verification code",
        "one code a minute per user, with an atomic rate-limit counter",
    ),
    (
        "slow-report",
        "Slow report",
        "at most two at once across all processes (ConcurrencyLimitMiddleware, a fair semaphore)",
    ),
]


def needs_redis(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A page that cannot work without Redis answers its being out of reach as the library's
    own surfaces do (``@locked``'s 503 ``unavailable``, with ``Retry-After``: the 503 page,
    or JSON for a JSON client), not with a 500."""

    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return view(request, *args, **kwargs)
        except REDIS_UNAVAILABLE as exc:
            return refused_unavailable(request, exc, what=f"The example's {view.__name__} page")

    return wrapped


def home(request: HttpRequest) -> HttpResponse:
    try:
        info = get_client().info("server")
        redis_status = f"Redis {info['redis_version']} on {info.get('os', 'unknown OS')}"
        redis_ok = True
    except RedisError as exc:
        redis_status = f"Redis is unreachable: {exc}"
        redis_ok = False
    context = {
        "demos": DEMOS,
        "redis_ok": redis_ok,
        "redis_status": redis_status,
        "redis_source": "embedded"
        if getattr(settings, "EMBEDDED_REDIS_DIR", None)
        else "REDIS_URL",
    }
    return render(request, "example/home.html", context, status=200 if redis_ok else 503)
