"""The benchmark suite's own behaviour (not its figures): it cleans up after itself, and the
queue peers that need a harness of their own (Celery's held worker, the asyncio queues'
burst workers) drain through it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from django_rcoord.embedded import find_executable, process_alive
from tests import cluster
from tests.procs import wait_until

ROOT = Path(__file__).resolve().parent.parent


def test_a_terminated_benchmark_run_stops_its_redis_server(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # where it makes its server's data dir
    env.pop("DJANGO_SETTINGS_MODULE", None)  # the suite configures Django itself
    run = subprocess.Popen(
        [sys.executable, "-m", "benchmarks", "--quick", "--only", "floor", "--no-save"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: list(tmp_path.glob("rcoord-bench-*/redis.pid")), timeout=60)
        (pid_file,) = tmp_path.glob("rcoord-bench-*/redis.pid")
        wait_until(lambda: pid_file.read_text().strip().isdigit(), timeout=10)
        server_pid = int(pid_file.read_text())
        assert process_alive(server_pid)
        run.send_signal(signal.SIGTERM)
        _, errors = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 128 + signal.SIGTERM, errors
    wait_until(lambda: not process_alive(server_pid), timeout=15)


def test_the_server_binary_is_chosen_and_named(tmp_path: Path) -> None:
    binary = find_executable()  # the one this suite runs on, named explicitly
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True)
    found = re.match(r"(\w+) server v=([\d.]+)", version.stdout)
    assert found is not None, version.stdout
    kind, number = found.groups()
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env.pop("RCOORD_REDIS_SERVER", None)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "--quick",
            "--only",
            "floor",
            "--no-save",
            "--server",
            binary,
        ],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    first = run.stdout.splitlines()[0]
    assert f"{kind} {number} on loopback TCP" in first, first


# arq passes redis-py 8 arguments it deprecates (arq caps redis-py below 6).
@pytest.mark.filterwarnings("ignore:Call to '__init__' function with deprecated usage")
@pytest.mark.parametrize(
    "system", ["celery-solo", "celery-prefork", "celery-acks-late", "arq", "arq-poll-50ms", "saq"]
)
def test_a_queue_peer_drains_through_its_own_worker(
    system: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks import queues
    from benchmarks.common import Bench, bench_redis, stop_redis

    pytest.importorskip(queues.PEER_MODULES[system])
    server = bench_redis()  # a TCP server, as the benchmark runs on (not the tests' socket)
    try:
        server.start()
        client = redis.Redis.from_url(server.url)
        monkeypatch.setenv("BENCH_REDIS_URL", server.url)
        row = queues.run_system(Bench(client, server.url, quick=True), system, 1, 20, 2)
        assert len(row.values) == 2
        assert row.extra["drain/s"] > 0
        assert not client.llen("bench")  # Celery's queue: every task was taken
        client.close()
    finally:
        stop_redis(server)


@pytest.mark.django_db(transaction=True)  # a Worker runs in this process
def test_server_cost_reads_what_the_server_spent_per_task() -> None:
    """Its rows come from the server's own counters: each positive, the floor (two list
    commands, pipelined) far cheaper than a task's scripts (about 30 times here)."""
    from benchmarks import server_cost
    from benchmarks.common import Bench
    from django_rcoord.connection import get_client

    client = get_client()
    rows = {row.name: row for row in server_cost.measure(Bench(client, "", quick=True), 300, 1)}
    floor = rows["RPUSH + LPOP per task, pipelined (the floor)"]
    end_to_end = rows["django-rcoord: end to end"]
    assert all(row.values[0] > 0 and row.extra["in commands"] > 0 for row in rows.values())
    # The floor runs no script; a task's scripts take longer than the commands they run
    # (which commandstats counts under their own names too: not twice over here).
    assert floor.extra["in scripts"] == 0
    assert end_to_end.extra["in scripts"] > end_to_end.extra["in commands"]
    assert floor.values[0] < end_to_end.values[0]
    assert end_to_end.values[0] == pytest.approx(
        rows["django-rcoord: enqueue (delay)"].values[0]
        + rows["django-rcoord: take + finish (burst worker)"].values[0]
    )


@pytest.mark.django_db(transaction=True)  # a Worker runs in this process
def test_server_cost_reads_each_phase_against_its_own_floor_of_the_same_run() -> None:
    """Each phase's table has its own floor (one RPUSH per round trip for enqueue, the
    pipelined LPOP for the drain, both pipelined end to end), and each row's ``x floor`` is
    its median over that floor's median, in this run: what the targets table reads."""
    from benchmarks import server_cost
    from benchmarks.common import Bench
    from django_rcoord.connection import get_client

    rows = server_cost.measure(Bench(get_client(), "", quick=True), 200, 1)
    tables = server_cost.phase_tables(rows, "here", 200, 1)
    assert [table.floor for table in tables] == [
        "one RPUSH per round trip (the enqueue floor)",
        "LPOP, pipelined 100 at a time (the drain floor)",
        "RPUSH + LPOP per task, pipelined (the floor)",
    ]
    for table in tables:
        floor = table.floor_row
        assert floor is not None
        assert floor.extra["x floor"] == 1.0
        for row in table.rows:
            # Rounded to two decimals: half a hundredth either way.
            assert row.extra["x floor"] == pytest.approx(row.median / floor.median, abs=0.006)
    enqueue, drain, _ = ({row.name: row for row in table.rows} for table in tables)
    # Pipelined, a list's RPUSH costs the server a fraction of one sent per round trip;
    # the book's BLPOP, one per round trip, far more than the pipelined LPOP.
    assert enqueue["RPUSH, pipelined 100 at a time"].extra["x floor"] < 1
    assert drain["the book's queue: BLPOP"].extra["x floor"] > 1
    targets = server_cost.targets({"here": tables})
    assert [line[1] for line in targets.rows] == [
        f"{enqueue['django-rcoord: enqueue (delay)'].extra['x floor']:.2f}x",
        f"{enqueue['with unique_for and timeout: enqueue'].extra['x floor']:.2f}x",
        f"{drain['django-rcoord: take + finish (burst worker)'].extra['x floor']:.2f}x",
        f"{drain['with unique_for and timeout: take + finish'].extra['x floor']:.2f}x",
    ]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="pins with sched_setaffinity")
def test_server_cost_pins_its_server_and_itself_to_one_cpu_and_back() -> None:
    from benchmarks.common import bench_redis, stop_redis
    from benchmarks.pinning import pinned

    server = bench_redis()
    try:
        server.start()
        client = redis.Redis.from_url(server.url)
        pid = server.pid()
        assert pid is not None
        before = os.sched_getaffinity(0), os.sched_getaffinity(pid)
        cpu = max(before[0])
        with pinned(client) as how:
            assert os.sched_getaffinity(0) == os.sched_getaffinity(pid) == {cpu}
            assert how == f"server and client on CPU {cpu}"
        assert (os.sched_getaffinity(0), os.sched_getaffinity(pid)) == before
        client.close()
    finally:
        stop_redis(server)


@pytest.mark.django_db(transaction=True)  # a Worker runs in this process
def test_tracing_rows_run_each_way_and_the_traced_way_traces() -> None:
    """Three rows per table (absent, no provider, traced), each a positive rate; under the
    traced way a message carries its trace context (a span was made around it), and the
    shipped ``tracing.tracer`` is back in place afterwards."""
    from benchmarks import tracing as bench_tracing
    from benchmarks.common import Bench
    from django_rcoord import tracing
    from django_rcoord.connection import get_client
    from django_rcoord.queues.keys import QueueKeys

    shipped = tracing.tracer
    client = get_client()
    bench = Bench(client, "", quick=True)
    for rows in (bench_tracing.enqueue_rows(bench, 60, 1), bench_tracing.drain_rows(bench, 60, 1)):
        assert [row.name for row in rows] == [
            bench_tracing.ABSENT,
            bench_tracing.NO_PROVIDER,
            bench_tracing.TRACED,
        ]
        assert all(row.values and row.values[0] > 0 for row in rows)
    with bench_tracing.way(bench_tracing.ways()[bench_tracing.TRACED]):
        task_id = bench_tracing.noop_task().delay()
    message = json.loads(client.hget(QueueKeys.of(bench_tracing.QUEUE).messages, task_id))
    assert set(message[tracing.TRACE_FIELD]) >= {"traceparent"}
    assert tracing.tracer is shipped


def test_the_scaling_grid_runs_a_cell_of_each_layout_offline(tmp_path: Path) -> None:
    """``python -m benchmarks.cluster_queues --quick``: a plain Redis and a 3-primary
    cluster of its own, each cell drained in full (it raises otherwise), and its figures
    read from the servers' counters."""
    out = tmp_path / "grid.json"
    env = {key: value for key, value in os.environ.items() if not key.startswith("BENCH_")}
    subprocess.run(
        [sys.executable, "-m", "benchmarks.cluster_queues", "--quick", "--out", str(out)],
        cwd=ROOT,
        env=env,
        check=True,
        stdout=subprocess.PIPE,
        timeout=300,
    )
    cells = json.loads(out.read_text())["cells"]
    layouts = {(cell["primaries"], cell["layout"]) for cell in cells}
    assert layouts == {
        (1, "one group"),
        (3, "one group"),
        (3, "a group per primary"),
        (3, "a sharded queue"),
    }
    for cell in cells:
        assert cell["tasks_per_s"][0] > 0
        assert cell["server_us_per_task"] > 0
        assert cell["busiest_primary_cores"] > 0


@pytest.mark.skipif(cluster.ENABLED, reason="reads one server's SLOWLOG")
@pytest.mark.django_db(transaction=True)  # a Worker runs in this process
def test_script_ab_times_both_versions_of_a_changed_script(tmp_path: Path) -> None:
    """The two versions of a script that differs take turns, and each one's full-batch
    finish calls are timed; a script both versions share is not compared; the server's
    SLOWLOG settings are put back, and the scripts module is as it was."""
    import shutil

    from benchmarks import script_ab
    from django_rcoord import scripts
    from django_rcoord.connection import get_client

    old = tmp_path / "lua"
    shutil.copytree(ROOT / "django_rcoord" / "lua", old)
    with (old / "task_finish.lua").open("a") as script:
        script.write("\n-- an older version\n")
    client = get_client()
    before = client.config_get("slowlog-*")
    own = (scripts._source, scripts._evalsha_of)
    with script_ab.take_turns(old) as versions:
        found = script_ab.compare(versions, 300, 1)["plain"]
    assert (scripts._source, scripts._evalsha_of) == own
    assert client.config_get("slowlog-*") == before
    assert found[("task_finish", "old")]
    assert found[("task_finish", "new")]
    assert all(duration > 0 for values in found.values() for duration in values)
    assert ("task_enqueue", "new") not in found
    # The old version is the changed copy: its SHA1 is not the working tree's.
    assert {version for name, version in versions.values()} == {"old", "new"}


def test_script_ab_reads_a_revisions_scripts(tmp_path: Path) -> None:
    from benchmarks import script_ab

    lua = script_ab.scripts_at("HEAD", tmp_path)
    assert (lua / "task_finish.lua").read_bytes().startswith(b"-- ")
    assert (lua / "_finish.lua").exists()


@pytest.mark.once
def test_tree_ab_runs_two_revisions_in_turn_and_gives_their_ratios(tmp_path: Path) -> None:
    """``python -m benchmarks.tree_ab HEAD HEAD``: each tree's rounds run in a child of its
    own (the tree's code, not this checkout's), and each figure gets both trees' medians
    and the ratio of the pairs of rounds."""
    from benchmarks import tree_ab

    tree = tree_ab.tree_at("HEAD", tmp_path)
    assert (tree / "django_rcoord" / "__init__.py").exists()
    assert tree.resolve() != ROOT
    finished = subprocess.run(
        [sys.executable, "-m", "benchmarks.tree_ab", "HEAD", "--tasks", "40", "--rounds", "2"],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert finished.returncode == 0, finished.stderr
    text = finished.stdout
    assert "head HEAD against base HEAD, 2 rounds each" in text
    for phase in ("enqueue", "drain"):
        for measure in ("server CPU", "wall", "client CPU"):
            ratio = re.search(
                rf"\n  {phase}, {measure}\n(?:    .*\n)*?    head HEAD / base HEAD, pairs of "
                r"rounds: *([0-9.]+) \(([0-9.]+)-([0-9.]+)\)",
                text,
            )
            assert ratio is not None, text
            low, high = float(ratio[2]), float(ratio[3])
            assert 0 < low <= float(ratio[1]) <= high


def test_drain_floor_takes_leases_and_records_what_it_says() -> None:
    """The minimal take and finish do the work the row names: every task taken, no lease
    left, each record written with its message and an expiry (or none, without records),
    every message dropped; and the command prints each row against the floor."""
    from benchmarks import drain_floor
    from django_rcoord.connection import get_client

    client = get_client()
    keys = drain_floor.KEYS
    assert drain_floor.drain(client, 50, 32, client.register_script(drain_floor.FINISH)) > 0
    assert client.zcard(keys["ready"]) == client.zcard(keys["in_flight"]) == 0
    assert client.hlen(keys["messages"]) == 0
    record = "{floor}:r:" + f"{49:010d}"
    assert client.hget(record, "m") == drain_floor.MESSAGE
    assert 0 < client.pttl(record) <= 86_400_000
    without = client.register_script(drain_floor.WITHOUT_RECORDS)
    assert drain_floor.drain(client, 50, 32, without) > 0
    assert not client.exists(record)
    assert client.hlen(keys["messages"]) == 0
    finished = subprocess.run(
        [sys.executable, "-m", "benchmarks.drain_floor", "--tasks", "200", "--batches", "32",
         "--rounds", "1"],
        check=False, cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert finished.returncode == 0, finished.stderr
    assert "take + finish, batches of 32, with records" in finished.stdout
    assert "x the floor" in finished.stdout
