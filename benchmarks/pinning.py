"""Pin the benchmark's Redis server and its client to one CPU, the same for both, for a
measurement of the server's own CPU time.

What a command costs the server depends on how its calls arrive: the same command costs
it 2-4x more when calls arrive milliseconds apart (the queue-core issue measured it) than
sent back to back. So the benchmark sends its calls back to back, and the server's main
thread (the one ``INFO cpu``'s ``used_cpu_*_main_thread`` counts) and the client share
one CPU: a client that sends a call and waits for its reply hands that CPU straight to the
server. On two CPUs each call must wake the server's, idle meanwhile: one ``RPUSH`` per
round trip cost the server 31 us there against 14 us on one shared CPU (2026-11-29, this
project's 2-CPU machine, 5,000 calls, medians of 4).

Only a server process on this machine is pinned (its ``INFO server`` ``process_id`` a
local redis-server or valkey-server); where the platform has no
``os.sched_setaffinity``, or a process may not be pinned, nothing is, and the result
says so.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

#: The names of a server process this module pins (``/proc/<pid>/comm``).
SERVER_PROGRAMS = ("redis-server", "valkey-server")


def server_pids(client: Any) -> list[int]:
    """The process ids of ``client``'s server, or of every primary of a Redis Cluster."""
    if hasattr(client, "get_primaries"):
        sections = client.info("server", target_nodes=client.get_primaries()).values()
    else:
        sections = [client.info("server")]
    return [int(section["process_id"]) for section in sections]


def _local_server(pid: int) -> bool:
    try:
        program = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return False
    return program.startswith(SERVER_PROGRAMS)


@contextmanager
def pinned(client: Any) -> Iterator[str]:
    """Within the block, the server of ``client`` (each primary of a cluster) and this
    process run on one CPU; both are put back after. Yields what was done, in words, for
    the results ("server and client on CPU 1" or why not)."""
    if not hasattr(os, "sched_setaffinity"):
        yield "not pinned: this platform cannot pin a process to a CPU"
        return
    cpu = max(os.sched_getaffinity(0))
    pids = [pid for pid in server_pids(client) if _local_server(pid)]
    if not pids:
        yield "not pinned: the server is not a process on this machine"
        return
    before = {pid: os.sched_getaffinity(pid) for pid in [0, *pids]}
    try:
        for pid in pids:
            os.sched_setaffinity(pid, {cpu})
        os.sched_setaffinity(0, {cpu})
    except OSError as error:  # not allowed to pin it (another user's), or it ended
        _restore(before)
        yield f"not pinned: {error}"
        return
    try:
        servers = "server" if len(pids) == 1 else f"{len(pids)} servers"
        yield f"{servers} and client on CPU {cpu}"
    finally:
        _restore(before)


def _restore(affinities: dict[int, set[int]]) -> None:
    for pid, cpus in affinities.items():
        with suppress(OSError):  # a server stopped meanwhile: nothing to put back
            os.sched_setaffinity(pid, cpus)
