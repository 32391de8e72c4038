"""The embedded server in a Django project: one line of development settings.

``CACHES = {"default": embedded_cache(BASE_DIR / ".redis")}`` gives django-redis the
address of the embedded server in that directory, and a connection factory that starts
the server (or finds it running) when a process first connects to it: commands that use
Redis start it, the others (``check``, ``migrate``, ``rcoord_redis status``) do not. It
keeps running, with its data, until ``manage.py rcoord_redis stop``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from django.conf import settings
from django_redis.pool import ConnectionFactory

from django_rcoord.conf import conf
from django_rcoord.embedded.server import EmbeddedRedis, started_port

FACTORY_PATH = "django_rcoord.embedded.caches.EmbeddedConnectionFactory"

# The servers this process has started or found running: a server stopped afterwards
# (`rcoord_redis stop`) stays stopped for this process, which then sees connection errors.
_started: set[tuple[str, int | None]] = set()
_started_lock = threading.Lock()


def embedded_cache(data_dir: str | os.PathLike[str], *, port: int | None = None) -> dict[str, Any]:
    """The ``CACHES`` entry of the embedded redis-server in ``data_dir``: on a unix socket in
    that directory, or on ``127.0.0.1:port``. For development and tests only."""
    server = EmbeddedRedis(data_dir, port=port)
    return {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": server.url,
        "OPTIONS": {
            "CONNECTION_FACTORY": FACTORY_PATH,
            "EMBEDDED_REDIS_DIR": str(server.data_dir),
            "EMBEDDED_REDIS_PORT": port,
        },
    }


class EmbeddedConnectionFactory(ConnectionFactory):
    """django-redis's connection factory, which first makes sure the embedded server named
    by the cache's ``OPTIONS`` runs (once per process)."""

    def connect(self, url: str) -> Any:
        data_dir, port = self.options["EMBEDDED_REDIS_DIR"], self.options.get("EMBEDDED_REDIS_PORT")
        with _started_lock:
            if (data_dir, port) not in _started:
                EmbeddedRedis(data_dir, port=port).start()
                _started.add((data_dir, port))
        return super().connect(url)


def is_embedded_cache(cache: object) -> bool:
    """Whether the ``CACHES`` entry ``cache`` was made by ``embedded_cache()``."""
    options = cache.get("OPTIONS") if isinstance(cache, Mapping) else None
    return isinstance(options, Mapping) and options.get("CONNECTION_FACTORY") == FACTORY_PATH


def configured_server(
    data_dir: str | os.PathLike[str] | None = None, port: int | None = None
) -> EmbeddedRedis | None:
    """The embedded server of this project, for ``manage.py rcoord_redis``: in ``data_dir``
    when given, else in ``RCOORD["EMBEDDED_REDIS_DIR"]``, else the one the cache of
    ``RCOORD["CONNECTION"]`` was made for by ``embedded_cache()``; None when there is none.
    Its port is ``port`` when given, else the cache's (for the same directory), else the
    one it was last started on."""
    cache: dict[str, Any] = settings.CACHES.get(conf.CONNECTION, {})
    options: dict[str, Any] = cache.get("OPTIONS") or {}
    cache_dir = options.get("EMBEDDED_REDIS_DIR") if is_embedded_cache(cache) else None
    data_dir = data_dir or conf.EMBEDDED_REDIS_DIR or cache_dir
    if not data_dir:
        return None
    if port is None:
        same_directory = cache_dir is not None and (
            Path(cache_dir) == EmbeddedRedis(data_dir).data_dir
        )
        port = options.get("EMBEDDED_REDIS_PORT") if same_directory else started_port(data_dir)
    return EmbeddedRedis(data_dir, port=port)
