"""What a change to the queue's scripts costs the server: the scripts of a git revision
against the working tree's, call by call in one run.

    python -m benchmarks.script_ab [--against REV] [--tasks N] [--rounds R]

A busy or shared machine moves the server's CPU per task by tens of per cent from one run
to the next (``server_cost``), more than most changes to a script move it. Here the two
versions of ``task_enqueue.lua`` and of ``task_finish.lua`` are both loaded on one
server and take turns: each ``delay()`` and each call of a burst worker's take and finish
goes to the other version than the one before, so a stall falls on both alike. The
server's ``SLOWLOG`` (told to log every command) gives each call's duration, and each
version's median is read: per enqueue, and per finish call of a full batch (32 finished
and 32 taken) over 32. Each round queues and drains ``N`` no-op tasks, plain, then with
``unique_for`` and ``timeout``. A version's Python (what the worker sends) is the
working tree's for both: the tool compares the scripts only.

``--against`` defaults to ``HEAD``: run it with a change to ``django_rcoord/lua/``
uncommitted. It reads that revision's scripts with ``git archive``, so it runs from a git
checkout. Nothing is saved: it prints one line per phase and kind of task.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import re
import shutil
import statistics
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.common import bench_redis, configure_django, stop_redis

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ("task_enqueue", "task_finish")
#: The finish calls compared: 32 records finished (and, in a drain, 32 tasks taken).
FULL_BATCH = 32
#: SLOWLOG shows a command's first 31 arguments, then "... (N more arguments)".
_MORE = re.compile(rb"\((\d+) more arguments\)$")


def scripts_at(revision: str, into: Path) -> Path:
    """The ``lua`` folder of ``revision``, extracted under ``into``."""
    archive = into / "lua.tar"
    with archive.open("wb") as out:
        subprocess.run(
            ["git", "archive", revision, "django_rcoord/lua"], cwd=ROOT, stdout=out, check=True
        )
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / "django_rcoord" / "lua"


@contextlib.contextmanager
def take_turns(old_lua: Path) -> Iterator[dict[bytes, tuple[str, str]]]:
    """Within it, each call of the compared scripts alternates between ``old_lua``'s
    version and the working tree's (where they differ); yields {SHA1: (script, "old" |
    "new")}, filled as they run."""
    from django_rcoord import scripts

    own_source, own_evalsha_of = scripts._source, scripts._evalsha_of

    def old_source(name: str, spliced: set[str] | None = None) -> bytes:
        # Each helper once, where it is first included, as scripts._source splices them:
        # spliced at every include, a script's helpers pass Lua's 200 locals.
        spliced = set() if spliced is None else spliced
        spliced.add(name)
        text = (old_lua / f"{name}.lua").read_bytes()

        def included(match: re.Match[bytes]) -> bytes:
            helper = match[2].decode()
            if helper in spliced:
                return b"-- (" + match[2] + b": above)"
            return old_source(helper, spliced).rstrip(b"\n")

        return scripts._INCLUDE.sub(included, text)

    def source(name: str, package: str, spliced: set[tuple[str, str]] | None = None) -> bytes:
        base, _, version = name.partition("@")
        return old_source(base) if version == "old" else own_source(base, package, spliced)

    # A script the two revisions share is one SHA1: nothing to compare.
    turns = {
        name: itertools.cycle(("old", "new"))
        for name in SCRIPTS
        if old_source(name) != own_source(name, scripts.OURS)
    }
    versions: dict[bytes, tuple[str, str]] = {}

    def evalsha_of(name: str, package: str) -> tuple[Any, bytes]:
        if name not in turns:
            return own_evalsha_of(name, package)
        version = next(turns[name])
        script, sha = own_evalsha_of(f"{name}@{version}", package)
        versions[sha] = (name, version)
        return script, sha

    scripts._source = source
    scripts._evalsha_of = evalsha_of  # type: ignore[assignment]  # a cached function's place
    try:
        yield versions
    finally:
        scripts._source, scripts._evalsha_of = own_source, own_evalsha_of


def durations(
    client: Any, versions: dict[bytes, tuple[str, str]]
) -> dict[tuple[str, str], list[int]]:
    """The logged calls' durations (us) by (script, version): every enqueue, and the finish
    calls of a full batch."""
    found: dict[tuple[str, str], list[int]] = {}
    for entry in client.slowlog_get(1_000_000):
        command = entry["command"]
        parts = command.split(b" ", 3)
        if parts[0] != b"EVALSHA" or parts[1] not in versions:
            continue
        name, version = versions[parts[1]]
        if name == "task_finish":
            more = _MORE.search(command)
            # EVALSHA, its SHA1 and the key count; the keys; the call's settings, then one
            # record per finished task.
            if more is None or 31 + int(more[1]) - 3 - int(parts[2]) - 1 != FULL_BATCH:
                continue
        found.setdefault((name, version), []).append(int(entry["duration"]))
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--against", default="HEAD", help="the git revision (default HEAD)")
    parser.add_argument("--tasks", type=int, default=4000, help="tasks per round")
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="rcoord-bench-ab-"))
    server = bench_redis()
    try:
        with take_turns(scripts_at(options.against, work)) as versions:
            server.start()
            configure_django(server.url)
            print(f"the scripts of {options.against} (old) against the working tree's (new)")
            for kind, found in compare(versions, options.tasks, options.rounds).items():
                for name, per in (("task_enqueue", 1), ("task_finish", FULL_BATCH)):
                    if (name, "new") not in found:
                        print(f"{kind:>8} {name:<13} the same script in both")
                        continue
                    old, new = (statistics.median(found[(name, v)]) / per for v in ("old", "new"))
                    calls = len(found[(name, "old")]) + len(found[(name, "new")])
                    print(
                        f"{kind:>8} {name:<13} us per task: old {old:6.2f}  new {new:6.2f}  "
                        f"new/old {new / old:.3f}  ({calls:,} calls)"
                    )
    finally:
        stop_redis(server)
        shutil.rmtree(work, ignore_errors=True)


def compare(
    versions: dict[bytes, tuple[str, str]], count: int, rounds: int
) -> dict[str, dict[tuple[str, str], list[int]]]:
    """Queue and drain ``count`` tasks of each kind ``rounds`` times (on the configured
    Redis, which it flushes), within ``take_turns``; the durations by kind of task."""
    from benchmarks.server_cost import QUEUE, enqueue, tasks
    from django_rcoord.connection import get_client
    from django_rcoord.queues.worker import Worker

    client = get_client()
    logged = client.config_get("slowlog-*")
    client.config_set("slowlog-log-slower-than", 0)
    client.config_set("slowlog-max-len", 1_000_000)
    by_kind: dict[str, dict[tuple[str, str], list[int]]] = {}
    try:
        for kind, noop in tasks().items():
            found = by_kind.setdefault(kind, {})
            for _ in range(rounds):
                client.flushdb()
                client.slowlog_reset()
                enqueue(noop, kind, count)
                worker = Worker([QUEUE], burst=True)
                worker.run()
                if worker.processed != count:
                    raise RuntimeError(f"the worker ran {worker.processed} of {count}")
                for key, values in durations(client, versions).items():
                    found.setdefault(key, []).extend(values)
    finally:
        for name in ("slowlog-log-slower-than", "slowlog-max-len"):
            client.config_set(name, logged[name])
        client.slowlog_reset()
    return by_kind


if __name__ == "__main__":
    main()
