"""A real ``redis-server`` for development and tests, started on demand.

- ``EmbeddedRedis(data_dir)``: one server per data directory (``embedded.server``);
- ``EmbeddedCluster(data_dir)``: a Redis Cluster of three or more of them
  (``embedded.cluster``);
- ``embedded_cache(data_dir)``: the ``CACHES`` entry of a project's development
  server, started by the first process that connects to it (``embedded.caches``).

Importing this package works on any platform; starting a server needs POSIX (a
daemon, a file lock and, by default, a unix socket).
"""

from __future__ import annotations

from django_rcoord.embedded.caches import embedded_cache
from django_rcoord.embedded.cluster import EmbeddedCluster
from django_rcoord.embedded.finder import find_executable, program_name, server_version
from django_rcoord.embedded.server import MINIMUM_VERSION, EmbeddedRedis, free_port, process_alive

__all__ = [
    "MINIMUM_VERSION",
    "EmbeddedCluster",
    "EmbeddedRedis",
    "embedded_cache",
    "find_executable",
    "free_port",
    "process_alive",
    "program_name",
    "server_version",
]
