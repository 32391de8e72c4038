from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from redis.exceptions import RedisError

from django_rcoord.connection import get_client

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
