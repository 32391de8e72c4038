"""What a change to the queue costs, Python and scripts together: two git revisions' trees
in turn on one server, round by round.

    python -m benchmarks.tree_ab BASE [HEAD] [--tasks N] [--rounds R]

``script_ab`` compares two versions of the queue's scripts under one Python; this compares
two whole revisions (``HEAD`` defaults to the working tree's ``HEAD`` commit), the way a
user would meet them: each round runs the base's tree, then the head's, each in a child
process of its own against one shared redis-server, with the server and the children
pinned to one CPU (``pinning``). A round measures, per no-op task: a ``delay()``'s and a
burst worker's drain's server CPU (``INFO cpu``), wall time and the child's own CPU, and
the Tasks framework end to end (enqueue, drain, read each result) in wall time when the
tree has a Tasks framework backend. Each child measures twice and keeps the second (the
first loads the scripts and warms the code paths).

A busy machine moves these figures by tens of per cent from one round to the next; the
rounds alternate so that a stall falls on both trees alike, and the table gives each
tree's median and range, and the median and range of the head-over-base ratio of each
pair of rounds. Ratios whose range holds 1.0 are within this run's noise. Both trees must
have ``benchmarks.server_cost`` (the revisions of the queue-core work onwards).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# A child's round imports only what every tree it runs in has: the rest is imported by the
# parent, in main, from this tree.

ROOT = Path(__file__).resolve().parent.parent


def tree_at(revision: str, into: Path) -> Path:
    """The files of ``revision`` (``git archive``), unpacked in a new folder under ``into``."""
    archive = Path(tempfile.mkdtemp(dir=into)) / "tree.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), revision], check=True)
    tree = into / archive.stem
    with tarfile.open(archive) as files:
        files.extractall(tree, filter="data")
    return tree


def one_round(url: str, count: int) -> dict[str, float]:
    """A child's round, run in the tree on ``sys.path``: see the module's docstring."""
    from benchmarks.common import configure_django

    configure_django(url)
    import django
    import redis

    django.setup()
    from benchmarks import server_cost
    from django_rcoord.queues.worker import Worker

    client = redis.Redis.from_url(url)
    noop = server_cost.tasks()["plain"]
    found: dict[str, float] = {}
    for _ in range(2):  # the first warms up; the second counts
        client.flushdb()
        before = _now(client, server_cost)
        server_cost.enqueue(noop, "plain", count)
        enqueued = _now(client, server_cost)
        worker = Worker([server_cost.QUEUE], burst=True)
        worker.run()
        drained = _now(client, server_cost)
        assert worker.processed == count, worker.processed
        for phase, start, end in (("enqueue", before, enqueued), ("drain", enqueued, drained)):
            found[f"{phase}, server CPU"] = (end[2] - start[2]).cpu * 1e6 / count
            found[f"{phase}, wall"] = (end[0] - start[0]) * 1e6 / count
            found[f"{phase}, client CPU"] = (end[1] - start[1]) * 1e6 / count
        found.update(_framework_end_to_end(count // 2))
    return found


def _now(client: Any, server_cost: Any) -> tuple[float, float, Any]:
    """Wall time, this process's CPU time and the server's counters, now."""
    return time.perf_counter(), time.process_time(), server_cost.read_counters(client)


def _framework_end_to_end(count: int) -> dict[str, float]:
    """Wall time per task to enqueue ``count`` Tasks framework no-ops, drain them and read
    each result; nothing where the tree has no Tasks framework backend."""
    from django.conf import settings

    if "default" not in getattr(settings, "TASKS", {}):
        return {}
    from benchmarks import framework_tasks
    from django_rcoord.queues.worker import Worker

    started = time.perf_counter()
    results = [framework_tasks.rcoord_noop.enqueue() for _ in range(count)]
    Worker(["bench"], burst=True).run()
    for result in results:
        result.refresh()
    assert all(result.status == "SUCCESSFUL" for result in results)
    return {"Tasks framework end to end, wall": (time.perf_counter() - started) * 1e6 / count}


def compare(trees: dict[str, Path], url: str, count: int, rounds: int) -> dict[str, list]:
    """Each tree's rounds, in turn: {tree's name: [its rounds' figures]}."""
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for _ in range(rounds):
        for name, tree in trees.items():
            child = subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), "--round", url, str(count)],
                cwd=tree,
                env={**os.environ, "PYTHONPATH": str(tree)},
                capture_output=True,
                text=True,
                check=False,
            )
            if child.returncode != 0:
                raise SystemExit(f"{name}'s round failed:\n{child.stderr[-3000:]}")
            runs[name].append(json.loads(child.stdout.splitlines()[-1]))
    return runs


def table(runs: dict[str, list[dict[str, float]]], names: tuple[str, str]) -> Any:
    """The figures of the ``base`` and ``head`` runs, side by side, named ``names``."""
    from benchmarks.common import TextTable

    base, head = runs["base"], runs["head"]
    rows: list[Sequence[str]] = []
    for metric in base[0]:
        before = [figures[metric] for figures in base]
        after = [figures[metric] for figures in head if metric in figures]
        ratios = [a / b for a, b in zip(after, before, strict=False)]
        rows.append(
            [metric, _spread(before), _spread(after), _spread(ratios, digits=2) if ratios else "-"]
        )
    return TextTable(
        f"{names[1]} against {names[0]}, {len(base)} rounds each, per task (us)",
        ["", names[0], names[1], f"{names[1]} / {names[0]}, pairs of rounds"],
        rows,
    )


def _spread(values: list[float], digits: int = 1) -> str:
    if not values:
        return "-"
    low, middle, high = (
        f"{value:.{digits}f}" for value in (min(values), statistics.median(values), max(values))
    )
    return f"{middle} ({low}-{high})"


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--round"]:
        print(json.dumps(one_round(args[1], int(args[2]))))
        return
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tree_ab", description=__doc__)
    parser.add_argument("base")
    parser.add_argument("head", nargs="?", default="HEAD")
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=7)
    options = parser.parse_args(args)
    from benchmarks.common import bench_redis, print_text_table, stop_redis
    from benchmarks.pinning import pinned

    server = bench_redis()
    with tempfile.TemporaryDirectory(prefix="rcoord-tree-ab-") as scratch:
        revisions = {"base": options.base, "head": options.head}
        trees = {name: tree_at(revision, Path(scratch)) for name, revision in revisions.items()}
        try:
            server.start()
            import redis

            with pinned(redis.Redis.from_url(server.url)) as how:
                runs = compare(trees, server.url, options.tasks, options.rounds)
        finally:
            stop_redis(server)
    print(f"{how}; {options.tasks} no-op tasks a round")
    print_text_table(table(runs, (f"base {options.base}", f"head {options.head}")))


if __name__ == "__main__":
    main()
