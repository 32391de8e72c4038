"""Async under load: an ASGI server with many clients waiting on one lock or a small limit.

Rows, side by side on one Redis:

- **ASGI native**: this checkout under uvicorn (one process), async views,
  waiting on redis.asyncio;
- **ASGI thread executor (before)**: the same site and server with
  django_rcoord as it was before native async (``BEFORE_NATIVE_ASYNC``), whose
  async paths ran the sync code in the loop's default executor;
- **WSGI sync**: the same views written sync, under gunicorn's threaded worker
  (one process, 100 threads): each waiting request holds a thread.

Tables: ``@locked(wait=60)`` view and a middleware rule (limit 2, wait 60),
each with 100 and 1,000 concurrent keep-alive clients; every view holds its lock
or permit 2 ms. Then 1,000 async waiters on one Lock in one process
(``benchmarks.asgi_waiters``), native and before.

    python -m benchmarks --only asgi      (or python -m benchmarks.asgi)
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from contextlib import contextmanager
from io import BytesIO
from pathlib import Path
from typing import Any

from benchmarks.common import Bench, Measurement, ScenarioResult, Table, missing, percentile
from django_rcoord.embedded import free_port

ROOT = Path(__file__).resolve().parent.parent

#: The last commit whose async paths ran in the default executor (before native async).
BEFORE_NATIVE_ASYNC = "0bc7a1f"

NATIVE = "ASGI native (uvicorn)"
BEFORE = "ASGI thread executor (before)"
WSGI = "WSGI sync (gunicorn gthread, 100 threads)"
EXTRA = ("p50_ms", "p99_ms", "errors")


def run(bench: Bench) -> ScenarioResult:
    _raise_open_files_limit()
    repeats = bench.repeats_or(bench.pick(quick=1, full=3))
    time_limit = bench.pick(quick=20, full=40)
    clients_list = bench.pick(quick=(100,), full=(100, 1000))
    before_dir = _checkout_before()
    tables = []
    with _servers(bench.url, before_dir) as ports:
        tables.append(_ceiling_table(bench, ports, repeats, time_limit))
        for view in ("locked", "limited"):
            for clients in clients_list:
                tables.append(
                    _http_table(bench, ports, view, clients, repeats, time_limit, before_dir)
                )
    tables.append(_waiters_table(bench, before_dir, bench.pick(quick=300, full=1000)))
    if before_dir is not None:
        shutil.rmtree(before_dir, ignore_errors=True)
    return ScenarioResult(
        name="asgi",
        title="Async under load (ASGI server, many waiters)",
        tables=tables,
        params={
            "hold_ms": 2,
            "repeats": repeats,
            "time_limit_s": time_limit,
            "before": BEFORE_NATIVE_ASYNC,
            "server": "uvicorn --loop asyncio --http h11 (1 process); gunicorn -k gthread "
            "--threads 100 (1 process)",
        },
        repeats=repeats,
    )


# -- the servers ---------------------------------------------------------------------------
@contextmanager
def _servers(url: str, before_dir: Path | None) -> Any:
    env = {**os.environ, "RCOORD_BENCH_REDIS_URL": url, "PYTHONPATH": str(ROOT)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    ports = {NATIVE: free_port(), WSGI: free_port()}
    commands = {
        NATIVE: (_uvicorn(ports[NATIVE]), ROOT, env),
        WSGI: (
            [
                sys.executable,
                "-m",
                "gunicorn",
                "benchmarks.asgi_site:wsgi_application",
                "-k",
                "gthread",
                "--threads",
                "100",
                "-w",
                "1",
                "--backlog",
                "4096",
                "-b",
                f"127.0.0.1:{ports[WSGI]}",
                "--log-level",
                "warning",
            ],
            ROOT,
            env,
        ),
    }
    if before_dir is not None:
        ports[BEFORE] = free_port()
        # The old django_rcoord comes first on the path; the site module is this one. Its
        # keys have their own prefix: its row ends at the time limit with requests still
        # waiting in the server, and those would otherwise wait on the same lock and limit
        # as the next rows' servers, speaking the old protocol (its waiters take a lock's
        # hand-over for a plain wake-up: the lock then stays with nobody until its TTL).
        commands[BEFORE] = (
            _uvicorn(ports[BEFORE]),
            before_dir,
            {
                **env,
                "PYTHONPATH": f"{before_dir}{os.pathsep}{ROOT}",
                "RCOORD_BENCH_KEY_PREFIX": "rcoord-before",
            },
        )
    # Each server logs to a file, not a pipe: a pipe nobody reads during the run fills up
    # (64 KiB of warnings) and then blocks every thread of the server that logs.
    logs = {name: _log_file(name) for name in commands}
    processes = {
        name: subprocess.Popen(
            command, cwd=cwd, env=environment, stdout=subprocess.DEVNULL, stderr=logs[name]
        )
        for name, (command, cwd, environment) in commands.items()
    }
    try:
        for name, port in ports.items():
            _wait_for_port(port, processes[name], logs[name])
        yield ports
    finally:
        for process in processes.values():
            process.terminate()
        for process in processes.values():
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
        for name, log in logs.items():
            log.flush()
            _report_log(name, log.name)
            log.close()


def _log_file(name: str) -> Any:
    """Where server ``name`` writes its log: under RCOORD_BENCH_SERVER_LOGS (a directory,
    kept), else a temporary file (removed after the run)."""
    directory = os.environ.get("RCOORD_BENCH_SERVER_LOGS")
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        slug = "".join(c if c.isalnum() else "-" for c in name).strip("-")
        return open(Path(directory) / f"{slug}.log", "w+b")  # closed by _servers
    return tempfile.NamedTemporaryFile(prefix="rcoord-bench-server-", suffix=".log")


def _report_log(name: str, path: str) -> None:
    """Say how many lines server ``name`` logged (warnings and errors), with the last one."""
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return
    if lines:
        print(f"  {name}: {len(lines)} log lines; the last: {lines[-1][:200]}", file=sys.stderr)


def _uvicorn(port: int) -> list[str]:
    return [
        sys.executable, "-m", "uvicorn", "benchmarks.asgi_site:application",
        "--port", str(port), "--loop", "asyncio", "--http", "h11", "--no-access-log",
        "--log-level", "warning", "--backlog", "4096", "--timeout-keep-alive", "120",
    ]  # fmt: skip


def _wait_for_port(port: int, process: subprocess.Popen, log: Any) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"server exited: {log.read().decode(errors='replace')[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"no server on port {port}")


def _checkout_before() -> Path | None:
    """django_rcoord as of BEFORE_NATIVE_ASYNC, in a temporary directory (None without git)."""
    try:
        archive = subprocess.run(
            ["git", "archive", BEFORE_NATIVE_ASYNC, "django_rcoord"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    directory = Path(tempfile.mkdtemp(prefix="rcoord-before-"))
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(directory, filter="data")
    (directory / "benchmarks").symlink_to(ROOT / "benchmarks")
    return directory


def _raise_open_files_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 16384 if hard == resource.RLIM_INFINITY else min(hard, 16384)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


# -- HTTP load -------------------------------------------------------------------------------
def _http_table(
    bench: Bench,
    ports: dict[str, int],
    view: str,
    clients: int,
    repeats: int,
    time_limit: float,
    before_dir: Path | None,
) -> Table:
    requests = max(clients, 500)
    what = "@locked(wait=60) view" if view == "locked" else "middleware rule, limit 2, wait 60"
    rows = []
    for name, flavour in ((NATIVE, "async"), (BEFORE, "async"), (WSGI, "sync")):
        if name not in ports:
            rows.append(missing(name, "-", "no git checkout to take the old code from"))
            continue
        runs = []
        # The old implementation convoys until its time limit: one run says enough.
        for _ in range(1 if name == BEFORE else repeats):
            bench.client.flushdb()
            runs.append(
                asyncio.run(
                    _load(ports[name], f"/{view}/{flavour}/", clients, requests, time_limit)
                )
            )
        rows.append(_row(name, runs, requests))
    return Table(
        f"{what}: {clients:,} concurrent clients, {requests:,} requests, 2 ms hold",
        "requests/s",
        rows,
        floor=NATIVE,
        extra_columns=EXTRA,
        note=f"Requests not answered 200 within {time_limit:g} s count as errors.",
    )


def _ceiling_table(bench: Bench, ports: dict[str, int], repeats: int, time_limit: float) -> Table:
    """What each server does with the same 2 ms view and no lock or limit: its ceiling."""
    rows = []
    for name, flavour in ((NATIVE, "async"), (WSGI, "sync")):
        runs = [
            asyncio.run(_load(ports[name], f"/plain/{flavour}/", 100, 1000, time_limit))
            for _ in range(repeats)
        ]
        rows.append(_row(name, runs, 1000))
    return Table(
        "The servers alone: a 2 ms view, no lock or limit, 100 clients, 1,000 requests",
        "requests/s",
        rows,
        floor=NATIVE,
        extra_columns=EXTRA,
    )


def _row(name: str, runs: list[dict[str, Any]], requests: int) -> Measurement:
    """A table row from the runs of one server: requests/s per run, latencies over all."""
    latencies = sorted(latency for run_ in runs for latency in run_["latencies"])
    return Measurement(
        name,
        "-",
        [run_["ok"] / run_["seconds"] for run_ in runs],
        note=_note(runs, requests),
        extra={
            "p50_ms": round(percentile(latencies, 0.5), 1) if latencies else None,
            "p99_ms": round(percentile(latencies, 0.99), 1) if latencies else None,
            "errors": sum(run_["errors"] for run_ in runs),
        },
    )


def _note(runs: list[dict[str, Any]], requests: int) -> str:
    statuses: collections.Counter[str] = collections.Counter()
    for run_ in runs:
        statuses.update(run_["statuses"])
    unfinished = sum(run_["unfinished"] for run_ in runs)
    parts = [f"{status}: {count}" for status, count in sorted(statuses.items()) if status != "200"]
    if unfinished:
        parts.append(f"unfinished at the time limit: {unfinished}")
    return "; ".join(parts)


async def _load(
    port: int, path: str, clients: int, requests: int, time_limit: float
) -> dict[str, Any]:
    """``clients`` keep-alive connections sending ``requests`` GETs in all; latencies in ms."""
    latencies: list[float] = []
    statuses: collections.Counter[str] = collections.Counter()
    per_client = [requests // clients + (index < requests % clients) for index in range(clients)]
    request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()

    async def client(count: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for _ in range(count):
                started = time.perf_counter()
                writer.write(request)
                status = await _read_response(reader)
                latencies.append((time.perf_counter() - started) * 1000)
                statuses[status] += 1
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
            statuses["connection error"] += 1
        finally:
            writer.close()

    started = time.perf_counter()
    tasks = [asyncio.ensure_future(client(count)) for count in per_client if count]
    _, pending = await asyncio.wait(tasks, timeout=time_limit)
    seconds = time.perf_counter() - started
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    ok = statuses["200"]
    answered = sum(count for status, count in statuses.items() if status != "connection error")
    return {
        "ok": ok,
        "seconds": seconds,
        "latencies": latencies,
        "statuses": dict(statuses),
        "unfinished": requests - answered,
        "errors": requests - ok,
    }


async def _read_response(reader: asyncio.StreamReader) -> str:
    status_line = await reader.readline()
    if not status_line:
        raise asyncio.IncompleteReadError(b"", None)
    status = status_line.split()[1].decode()
    length = 0
    chunked = False
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == "content-length":
            length = int(value)
        elif name == "transfer-encoding" and "chunked" in value:
            chunked = True
    if chunked:
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            await reader.readexactly(size + 2)  # the chunk and its CRLF
            if size == 0:
                break
    elif length:
        await reader.readexactly(length)
    return status


# -- 1,000 waiters in one process -----------------------------------------------------------
def _waiters_table(bench: Bench, before_dir: Path | None, waiters: int) -> Table:
    rows = []
    for name, cwd in (("native (redis.asyncio)", ROOT), ("thread executor (before)", before_dir)):
        if cwd is None:
            rows.append(missing(name, "-", "no git checkout to take the old code from"))
            continue
        bench.client.flushdb()
        output = subprocess.run(
            [sys.executable, "-m", "benchmarks.asgi_waiters", bench.url,
             "--waiters", str(waiters), "--time-limit", "30"],
            cwd=cwd,
            env={**os.environ, "PYTHONPATH": f"{cwd}{os.pathsep}{ROOT}"},
            capture_output=True,
            text=True,
            check=True,
        ).stdout  # fmt: skip
        result = json.loads(output.strip().splitlines()[-1])
        median = result["handoff_median_ms"]
        rows.append(
            Measurement(
                name,
                "-",
                [] if median is None else [median],
                note=", ".join(result["error_kinds"]),
                extra={
                    "p99_ms": result["handoff_p99_ms"],
                    "max_ms": result["handoff_max_ms"],
                    "completed": f"{result['completed']:,} of {waiters:,}",
                    "seconds": result["seconds"],
                    "threads": result["threads"],
                    "connections": result["connections"],
                },
            )
        )
    return Table(
        f"{waiters:,} async waiters on one Lock in one process (1 ms hold, 30 s limit)",
        "hand-off ms",
        rows,
        floor="native (redis.asyncio)",
        lower_is_better=True,
        extra_columns=("p99_ms", "max_ms", "completed", "seconds", "threads", "connections"),
        note="Threads and Redis connections: the most in use at once beyond the process's own.",
    )


if __name__ == "__main__":
    from benchmarks.runner import run_benchmark

    run_benchmark("asgi", __doc__.split("\n")[0])
