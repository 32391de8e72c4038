"""Protocol versions of the script families, so that releases sharing one Redis during a
rolling deploy either interoperate or a process refuses loudly at start.

A family's version goes up when its scripts change what another process reads or
writes; ``OLDEST_COMPATIBLE`` says down to which version this release runs beside
another one (it reads what that one writes, and writes what that one reads). The
long-running commands (``run_email_worker``, ``poll_delayed``) announce this release's
versions when they start, in one HASH (``<prefix>:meta:{protocols}:announced``: per
family, the newest version announced and the oldest that version runs beside), and
refuse to start when the newest announced version does not run beside theirs, or theirs
does not run beside it. Only the newest is kept: a release that is gone leaves nothing to
refuse once a newer one announced itself. After stopping every process of an older
release that this one does not run beside, start with ``--upgrade-protocols`` to
announce over it.
"""

from __future__ import annotations

from typing import Any

from django_rcoord.connection.clients import resolve_client
from django_rcoord.exceptions import RcoordError
from django_rcoord.keys import KeySpace

#: Each family's protocol in this release. Lock 2: hand-overs under a grant lease that the
#: waiter confirms, acquires resent with the caller's identifier answered, counters that
#: expire. Semaphore 2: keys that expire, acquires resent answered. Queue 2: a finished
#: task's result record a HASH of its own (1 kept every record in the group's results HASH,
#: where 2 keeps a queued or running task's state: tasks run beside 1 as before, and 1
#: reads the states of 2's unfinished tasks, not its finished records). Queue 3: a plain
#: task is pushed to its group's incoming list, which 3's takes place, while a worker of 3
#: serves the group (its ``serving`` key), and idle workers wait on that list: 1's workers
#: take what 3's place, 3's take what 1's producers queue (see queues.incoming).
PROTOCOLS: dict[str, int] = {"lock": 2, "semaphore": 2, "queue": 3, "periodic": 1}
#: The oldest protocol of each family this release runs beside.
OLDEST_COMPATIBLE: dict[str, int] = {"lock": 1, "semaphore": 1, "queue": 1, "periodic": 1}


class ProtocolMismatch(RcoordError):
    """A release that does not run beside this one announced itself on the same Redis."""


def protocols_key() -> str:
    return KeySpace("meta", "protocols").key("announced")


def mismatches(announced: dict[str, tuple[int, int]], *, upgrade: bool = False) -> list[str]:
    """What stops this release from running beside the ``announced`` versions (family ->
    (version, oldest it runs beside)), one sentence each; [] when nothing does.
    ``upgrade``: the operator says no older release runs any more (a newer one still
    refuses this one)."""
    problems = []
    for family, ours in PROTOCOLS.items():
        if family not in announced:
            continue
        theirs, their_oldest = announced[family]
        if theirs > ours and ours < their_oldest:
            problems.append(
                f"a newer release announced {family} protocol {theirs}, which runs beside "
                f"{their_oldest} and later, not this release's {ours}: upgrade this process"
            )
        elif theirs < OLDEST_COMPATIBLE[family] and not upgrade:
            problems.append(
                f"an older release announced {family} protocol {theirs}; this release's "
                f"{ours} runs beside {OLDEST_COMPATIBLE[family]} and later: stop that "
                "release's processes, then start with --upgrade-protocols"
            )
    return problems


def announce(client: Any = None, *, upgrade: bool = False) -> None:
    """Check this release's protocols against those announced on Redis, raising
    ``ProtocolMismatch`` when it cannot run beside them, and announce them where they are
    newer. ``upgrade``: announce over an older release that this one does not run beside
    (the operator stopped its processes)."""
    client = resolve_client(client)
    key = protocols_key()
    announced = {}
    for field, value in client.hgetall(key).items():
        family = field.decode() if isinstance(field, bytes) else field
        version, _, oldest = (value.decode() if isinstance(value, bytes) else value).partition(":")
        if version.isdigit() and oldest.isdigit():
            announced[family] = (int(version), int(oldest))
    problems = mismatches(announced, upgrade=upgrade)
    if problems:
        raise ProtocolMismatch(
            "This release cannot share Redis with another one: " + "; ".join(problems) + "."
        )
    newer = {
        family: f"{version}:{OLDEST_COMPATIBLE[family]}"
        for family, version in PROTOCOLS.items()
        if family not in announced or announced[family][0] < version
    }
    if newer:
        client.hset(key, mapping=newer)
