"""The Django site the ASGI benchmark serves (``python -m benchmarks --only asgi``).

Served by uvicorn as ``benchmarks.asgi_site:application`` and by gunicorn as
``benchmarks.asgi_site:wsgi_application``; Redis comes from
``RCOORD_BENCH_REDIS_URL``, its keys' prefix from ``RCOORD_BENCH_KEY_PREFIX``
(default ``rcoord``). Every view holds its lock or permit for
``RCOORD_BENCH_HOLD`` seconds (default 2 ms):

- ``/locked/async/`` and ``/locked/sync/``: ``@locked("bench-hot", wait=60)``;
- ``/limited/async/`` and ``/limited/sync/``: under a ConcurrencyLimitMiddleware
  rule of limit 2 with ``wait`` 60;
- ``/plain/async/`` and ``/plain/sync/``: neither (what the server alone does).
"""

from __future__ import annotations

import asyncio
import os
import time

import django
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.urls import path

HOLD = float(os.environ.get("RCOORD_BENCH_HOLD", "0.002"))

if not settings.configured:
    settings.configure(
        DEBUG=False,
        SECRET_KEY="benchmark-not-secret",
        ALLOWED_HOSTS=["*"],
        ROOT_URLCONF=__name__,
        INSTALLED_APPS=["django_rcoord"],
        MIDDLEWARE=["django_rcoord.middleware.ConcurrencyLimitMiddleware"],
        CACHES={
            "default": {
                "BACKEND": "django_redis.cache.RedisCache",
                "LOCATION": os.environ["RCOORD_BENCH_REDIS_URL"],
            }
        },
        RCOORD={
            "CONNECTION": "default",
            "KEY_PREFIX": os.environ.get("RCOORD_BENCH_KEY_PREFIX", "rcoord"),
            "CONCURRENCY_LIMITS": [
                {
                    "name": "bench-limited",
                    "path": "^/limited/",
                    "limit": 2,
                    "timeout": 30,
                    "wait": 60,
                }
            ],
        },
    )
    django.setup()

from django_rcoord.decorators import locked  # noqa: E402  (after settings)


@locked("bench-hot", timeout=10, wait=60)
async def locked_async(request: HttpRequest) -> HttpResponse:
    await asyncio.sleep(HOLD)
    return HttpResponse("ok")


@locked("bench-hot", timeout=10, wait=60)
def locked_sync(request: HttpRequest) -> HttpResponse:
    time.sleep(HOLD)
    return HttpResponse("ok")


async def limited_async(request: HttpRequest) -> HttpResponse:
    await asyncio.sleep(HOLD)
    return HttpResponse("ok")


def limited_sync(request: HttpRequest) -> HttpResponse:
    time.sleep(HOLD)
    return HttpResponse("ok")


async def plain_async(request: HttpRequest) -> HttpResponse:
    await asyncio.sleep(HOLD)
    return HttpResponse("ok")


def plain_sync(request: HttpRequest) -> HttpResponse:
    time.sleep(HOLD)
    return HttpResponse("ok")


urlpatterns = [
    path("plain/async/", plain_async),
    path("plain/sync/", plain_sync),
    path("locked/async/", locked_async),
    path("locked/sync/", locked_sync),
    path("limited/async/", limited_async),
    path("limited/sync/", limited_sync),
]

from django.core.asgi import get_asgi_application  # noqa: E402
from django.core.wsgi import get_wsgi_application  # noqa: E402

application = get_asgi_application()
wsgi_application = get_wsgi_application()
