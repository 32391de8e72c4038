"""Command forms some supported servers have and older ones refuse, learnt from the servers'
own answers rather than from their version numbers (Valkey and Redis number differently, and
a failover may put an older release behind the same address).

A part sends the newer form; a server that refuses it with the error an older release gives
is remembered, per server, and the part's fallback (a script every release runs) is used for
it from then on. So a newer server costs nothing to find, and an older one one refused call
per process. That is expected, not a fault: it is logged once per process, at DEBUG.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from typing import Any

from redis.exceptions import ResponseError

logger = logging.getLogger(__name__)


def server_of(client: Any) -> Hashable:
    """What identifies the server (or cluster) ``client`` talks to, for remembering what it
    refused: its address, its Sentinel service, or a cluster's startup nodes (the nodes of
    one cluster run one release)."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        nodes = getattr(getattr(client, "nodes_manager", None), "startup_nodes", None)
        return ("cluster", tuple(sorted(nodes))) if nodes else ("client", id(client))
    kwargs = getattr(pool, "connection_kwargs", {})
    return (
        getattr(pool, "service_name", None),
        kwargs.get("path"),
        kwargs.get("host"),
        kwargs.get("port"),
        kwargs.get("db"),
    )


class Feature:
    """A newer command form, used on a server until that server refuses it."""

    def __init__(self, name: str, refusal: str, since: str) -> None:
        self.name = name
        #: Text of the error a server without the form answers with.
        self.refusal = refusal
        #: The releases that have the form, for the log line.
        self.since = since
        self._refused: set[Hashable] = set()
        self._logged = False

    def usable(self, client: Any) -> bool:
        """Whether to send the form to ``client``'s server (no refusal seen from it)."""
        return not self._refused or server_of(client) not in self._refused

    def refused(self, client: Any, error: ResponseError) -> bool:
        """Whether ``error`` is ``client``'s server refusing the form; it is then remembered
        and the caller runs its fallback. Any other error is the caller's to raise."""
        if self.refusal not in str(error):
            return False
        self._refused.add(server_of(client))
        # Once per process, however many servers (a benchmark's, a test suite's) lack it: an
        # older release is supported, and the fallback does the same work.
        if not self._logged:
            self._logged = True
            logger.debug(
                "%s (%s) is not available on this server; an equivalent Lua script, which "
                "every supported release runs, does the same work",
                self.name,
                self.since,
            )
        return True


#: ``SET key value IFEQ value PX ms``: compare-and-extend in one command (Redis 8.4+,
#: Valkey 8.1+). A lock's extend and a hand-over's confirmation, without a script.
SET_IFEQ = Feature("SET ... IFEQ", "syntax error", "Redis 8.4+, Valkey 8.1+")

#: A script's first line ``#!lua flags=no-writes`` (Redis 7+, Valkey): a read-only script
#: that a replica may run. Older servers fail to compile it.
SCRIPT_FLAGS = Feature("#!lua flags", "Error compiling script", "Redis 7+, Valkey")
