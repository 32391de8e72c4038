"""What every benchmark shares: one real Redis on loopback, Django configured, timing,
results (tables of rows with per-repeat values) and the worker processes' start gate."""

from __future__ import annotations

import datetime
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import django
import redis
from django.conf import settings
from redis.utils import HIREDIS_AVAILABLE

if TYPE_CHECKING:
    from django_rcoord.embedded import EmbeddedRedis

# -- the server ------------------------------------------------------------------------------


def bench_redis() -> EmbeddedRedis:
    """A fresh embedded redis-server on a loopback TCP port, not started yet: ``start()`` it
    inside the ``try`` whose ``finally`` calls ``stop_redis`` on it.

    Persistence is off: the benchmarks measure the coordination algorithms, not
    this machine's disk, and the autocomplete indexes would make AOF rewrites.
    """
    # Imported here, as in stop_redis: the ASGI scenario's "before" rows import this module
    # beside django_rcoord as it was before native async, which lacks process_alive.
    from django_rcoord.embedded import EmbeddedRedis, free_port

    return EmbeddedRedis(
        tempfile.mkdtemp(prefix="rcoord-bench-"),
        port=free_port(),
        extra_config={"appendonly": "no", "save": '""'},
    )


def stop_redis(server: EmbeddedRedis) -> None:
    """Stop ``server``, also when it was interrupted while starting (it does not answer
    yet): then its process is ended by its pid (it keeps no data)."""
    from django_rcoord.embedded import process_alive

    if server.stop():
        return
    pid = server.pid()
    if pid is not None and process_alive(pid):
        os.kill(pid, signal.SIGTERM)


def configure_django(url: str, rcoord: dict[str, Any] | None = None) -> None:
    """Django on this Redis: django-rcoord (``rcoord``: more RCOORD settings), and the Tasks
    framework when there is one (Django 6's own, or the backport on 5.2; backends
    "default": django-rcoord's, "rq": django-tasks-rq's when that is installed,
    "streams": django-tasks-redis's on Django 6 when that is installed)."""
    if settings.configured:
        return
    apps = ["django_rcoord"]
    tasks: dict[str, dict[str, Any]] = {}
    extra: dict[str, Any] = {}
    builtin_tasks = django.VERSION >= (6, 0)
    if builtin_tasks or _installed("django_tasks"):
        if not builtin_tasks:
            apps.append("django_tasks")
        tasks["default"] = {
            "BACKEND": "django_rcoord.queues.backend.RedisTaskBackend",
            "QUEUES": ["bench"],
        }
    if builtin_tasks and _installed("django_tasks_redis"):
        # django-tasks-redis (Redis Streams), on Django 6's own Tasks framework only.
        tasks["streams"] = {
            "BACKEND": "django_tasks_redis.RedisTaskBackend",
            "QUEUES": ["bench"],
            "OPTIONS": {"REDIS_URL": url},
        }
    if _installed("django_tasks_rq"):
        apps.append("django_rq")
        tasks["rq"] = {"BACKEND": "django_tasks_rq.RQBackend", "QUEUES": ["bench"]}
        # django-tasks-rq reads results through the "default" queue's connection.
        extra["RQ_QUEUES"] = {"bench": {"URL": url}, "default": {"URL": url}}
    settings.configure(
        INSTALLED_APPS=apps,
        CACHES={"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": url}},
        RCOORD={"CONNECTION": "default", **(rcoord or {})},
        TASKS=tasks,
        **extra,
    )
    django.setup()


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


class RoundTrips:
    """Counts the round trips of this process to Redis: every command or pipeline redis-py
    sends is one write of its connection (``install()`` wraps that write)."""

    count = 0
    _installed = False

    @classmethod
    def install(cls) -> None:
        if cls._installed:
            return
        from redis.connection import AbstractConnection

        send = AbstractConnection.send_packed_command

        def counted(connection: Any, command: Any, check_health: bool = True) -> None:
            cls.count += 1
            send(connection, command, check_health)

        AbstractConnection.send_packed_command = counted  # type: ignore[method-assign]  # counting
        cls._installed = True

    @classmethod
    def reset(cls) -> None:
        cls.count = 0


def cpu_seconds(section: dict[str, Any]) -> float:
    """A server's CPU seconds from its ``INFO cpu``: its main thread's user + system time
    where it reports them (Redis 6.2+, Valkey), its process's otherwise."""
    if "used_cpu_user_main_thread" in section:
        return float(section["used_cpu_user_main_thread"]) + float(
            section["used_cpu_sys_main_thread"]
        )
    return float(section["used_cpu_user"]) + float(section["used_cpu_sys"])


def redis_version(client: redis.Redis) -> str:
    return client.info("server")["redis_version"]


def server_name(client: redis.Redis) -> str:
    """ "Redis 8.0.2" or "Valkey 8.1.1" (Valkey also reports a Redis-compatible version)."""
    info = client.info("server")
    if "valkey_version" in info:
        return f"Valkey {info['valkey_version']}"
    return f"Redis {info['redis_version']}"


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "redis_py": redis.__version__,
        # Every system here talks through redis-py, so all of them use the same parser.
        "reply_parser": "hiredis" if HIREDIS_AVAILABLE else "Python",
    }


def describe_machine(client: redis.Redis) -> str:
    about = machine()
    return (
        f"{server_name(client)} on loopback TCP, Python {about['python']}, "
        f"redis-py {about['redis_py']} ({about['reply_parser']} parser), "
        f"{about['cpu_count']} CPUs, {about['platform']}"
    )


@dataclass
class Bench:
    """One run's Redis and settings, handed to every scenario."""

    client: redis.Redis
    url: str
    quick: bool
    repeats: int | None = None  # None: each scenario's own default (3 or more)
    started: datetime.datetime = field(default_factory=datetime.datetime.now)

    def pick(self, *, quick: Any, full: Any) -> Any:
        return quick if self.quick else full

    def repeats_or(self, default: int) -> int:
        return max(3, self.repeats or default)


# -- results ---------------------------------------------------------------------------------


@dataclass
class Measurement:
    """One row: a name, what one operation costs in round trips, one value per repeat."""

    name: str
    round_trips: str
    values: list[float]  # one per repeat, in the table's unit
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)  # further columns, e.g. p99

    @property
    def rates(self) -> list[float]:
        return self.values

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    @property
    def spread(self) -> float:
        """(max - min) / median, as a fraction."""
        if not self.values or not self.median:
            return 0.0
        return (max(self.values) - min(self.values)) / self.median

    @property
    def missing(self) -> bool:
        return not self.values


def missing(name: str, round_trips: str, reason: str) -> Measurement:
    """A row for a peer that cannot do this, saying why."""
    return Measurement(name, round_trips, [], note=reason)


@dataclass
class Table:
    """Rows measured beside each other; ``floor`` names the row the others are compared to.

    ``vs floor`` is always speed relative to the floor (above 1 = faster): for a
    rate, row / floor; for a latency (``lower_is_better``), floor / row.
    """

    title: str
    unit: str
    rows: list[Measurement]
    floor: str | None = None
    lower_is_better: bool = False
    extra_columns: Sequence[str] = ()
    note: str = ""

    @property
    def floor_row(self) -> Measurement | None:
        return next((row for row in self.rows if row.name == self.floor), None)

    def vs_floor(self, row: Measurement) -> float | None:
        floor = self.floor_row
        if floor is None or row.missing or floor.missing or not row.median:
            return None
        if self.lower_is_better:
            return floor.median / row.median
        return row.median / floor.median

    def as_dict(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "unit": self.unit,
            "lower_is_better": self.lower_is_better,
            "floor": self.floor,
            "note": self.note,
            "rows": [
                {
                    "name": row.name,
                    "round_trips": row.round_trips,
                    "values": [round(value, 4) for value in row.values],
                    "median": None if row.missing else round(row.median, 4),
                    "spread": None if row.missing else round(row.spread, 4),
                    "vs_floor": _rounded(self.vs_floor(row)),
                    "note": row.note,
                    **{name: row.extra.get(name) for name in self.extra_columns},
                }
                for row in self.rows
            ],
        }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


@dataclass
class TextTable:
    """Words beside the measured tables (what each system guarantees): one row per
    system, its name first, then one cell per column after the first."""

    title: str
    columns: Sequence[str]  # the first names the rows
    rows: list[Sequence[str]]

    def as_dict(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "columns": list(self.columns),
            "rows": [list(row) for row in self.rows],
        }


def print_text_table(table: TextTable, *, file: Any = None) -> None:
    """One block per row: its name, then each column's cell on a line of its own."""
    file = file or sys.stdout
    width = max(len(column) for column in table.columns[1:])
    print(f"\n{table.title}", file=file)
    for name, *cells in table.rows:
        print(f"  {name}", file=file)
        for column, cell in zip(table.columns[1:], cells, strict=True):
            print(f"    {column + ':':<{width + 1}} {cell}", file=file)


@dataclass
class ScenarioResult:
    name: str  # file name under results/
    title: str
    tables: list[Table]
    params: dict[str, Any] = field(default_factory=dict)  # counts, sizes, durations
    repeats: int = 0
    text_tables: list[TextTable] = field(default_factory=list)


def format_value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if value != value:  # NaN
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3f}" if abs(value) < 1 else f"{value:.2f}"


def print_table(table: Table, *, file: Any = None) -> None:
    file = file or sys.stdout
    width = max(34, *(len(row.name) for row in table.rows))
    extra = "".join(f" {name:>10}" for name in table.extra_columns)
    header = (
        f"{'':<{width}} {'round trips':>16} {table.unit + ' (median)':>18} {'spread':>7} "
        f"{'vs floor':>9}{extra}"
    )
    print(f"\n{table.title}", file=file)
    print(header, file=file)
    print("-" * len(header), file=file)
    for row in table.rows:
        if row.missing:
            print(f"{row.name:<{width}} {row.round_trips:>16}  not measured: {row.note}", file=file)
            continue
        ratio = table.vs_floor(row)
        extras = "".join(
            f" {format_value(row.extra[name]) if name in row.extra else '-':>10}"
            for name in table.extra_columns
        )
        print(
            f"{row.name:<{width}} {row.round_trips:>16} {format_value(row.median):>18} "
            f"{row.spread:>6.0%} {'-' if ratio is None else f'{ratio:.2f}x':>9}{extras}",
            file=file,
        )
        if row.note:
            print(f"{'':<{width}}   ({row.note})", file=file)
    if table.note:
        print(f"  {table.note}", file=file)


# -- timing ----------------------------------------------------------------------------------


Operation = tuple[str, str, Callable[[], object]]  # row name, round trips, one operation


def measure_side_by_side(
    operations: Sequence[Operation], *, count: int, repeats: int
) -> list[Measurement]:
    """Run each operation ``count`` times per repeat; record operations per second.

    The repeats are interleaved (every row's first repeat, then every row's
    second...), and within a repeat the rows take turns every ``TURN``
    operations, so that each row's repeat spans the same stretch of time: a noisy
    neighbour's bursts (this is a shared 2-core machine) fall on all rows alike.
    """
    for _, _, operation in operations:
        for _ in range(min(count, 200)):  # warm up connections and script caches
            operation()
    rows = [Measurement(name, round_trips, []) for name, round_trips, _ in operations]
    for _ in range(repeats):
        spent = [0.0] * len(operations)
        for done in range(0, count, TURN):
            turn = min(TURN, count - done)
            for index, (_, _, operation) in enumerate(operations):
                started = time.perf_counter()
                for _ in range(turn):
                    operation()
                spent[index] += time.perf_counter() - started
        for row, seconds in zip(rows, spent, strict=True):
            row.values.append(count / seconds)
    return rows


#: Operations one row runs before the next row's turn (``measure_side_by_side``).
TURN = 50


def measure(
    name: str,
    round_trips: str,
    operation: Callable[[], object],
    *,
    count: int,
    repeats: int,
    note: str = "",
) -> Measurement:
    """One row of ``measure_side_by_side``."""
    (row,) = measure_side_by_side([(name, round_trips, operation)], count=count, repeats=repeats)
    row.note = note
    return row


def measure_runs(
    name: str,
    round_trips: str,
    run_once: Callable[[], float],
    *,
    repeats: int,
    note: str = "",
) -> Measurement:
    """Call ``run_once`` (which returns this repeat's value) ``repeats`` times."""
    return Measurement(name, round_trips, [run_once() for _ in range(repeats)], note=note)


def percentile(samples: Sequence[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def ping_operation(client: redis.Redis, times: int) -> Operation:
    """The floor for an operation of ``times`` round trips, to measure beside it."""

    def ping_times() -> None:
        for _ in range(times):
            client.ping()

    name = "PING (the floor)" if times == 1 else f"{times} x PING (the floor)"
    return name, str(times), ping_times


def pings(client: redis.Redis, times: int, *, count: int, repeats: int) -> Measurement:
    return measure(*ping_operation(client, times), count=count, repeats=repeats)


# -- worker processes ------------------------------------------------------------------------


class Gate:
    """Starts worker processes together: each says it is ready, then waits for "go".

    The parent starts the processes (imports and connections happen before the
    clock runs), waits until all are ready, then opens the gate. Each repeat of a
    run opens it again, so one set of processes serves every repeat.
    """

    def __init__(self, client: redis.Redis, name: str) -> None:
        self.client = client
        self.ready_key = f"bench:gate:{name}:ready"
        self.go_key = f"bench:gate:{name}:go"

    def wait_ready(self, processes: int, children: Sequence[subprocess.Popen], round_: int) -> None:
        deadline = time.monotonic() + 120
        while int(self.client.get(self.ready_key) or 0) < processes * round_:
            for child in children:
                if child.poll() is not None:
                    raise RuntimeError(f"a benchmark process exited early ({child.args!r})")
            if time.monotonic() > deadline:
                raise RuntimeError("benchmark processes were not ready within 120 s")
            time.sleep(0.01)

    def open(self, processes: int) -> None:
        self.client.rpush(self.go_key, *["go"] * processes)

    # in the worker process
    def pass_through(self) -> None:
        self.client.incr(self.ready_key)
        # Short blocks: redis-py 8's clients time reads out after 5 s by default.
        deadline = time.monotonic() + 300
        while not self.client.blpop([self.go_key], timeout=1):
            if time.monotonic() > deadline:
                raise RuntimeError("no go signal within 300 s")


def spawn_workers(
    module: str, args: Sequence[str], processes: int, *, stdin: bool = False
) -> list[subprocess.Popen]:
    """Start ``python -m <module> --worker <args>`` ``processes`` times (JSON lines out;
    ``stdin``: lines in, too)."""
    return [
        subprocess.Popen(
            [sys.executable, "-m", module, "--worker", *args],
            stdin=subprocess.PIPE if stdin else None,
            stdout=subprocess.PIPE,
            text=True,
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        )
        for _ in range(processes)
    ]


def read_result(child: subprocess.Popen, timeout: float = 900) -> dict[str, Any]:
    """The next JSON line a worker process prints."""
    assert child.stdout is not None  # started with stdout=PIPE
    line = child.stdout.readline()
    if not line:
        child.wait(timeout)
        raise RuntimeError(f"benchmark process ended with {child.returncode} ({child.args!r})")
    return json.loads(line)


def report(result: dict[str, Any]) -> None:
    """In a worker process: hand one result to the parent."""
    print(json.dumps(result), flush=True)


def stop_workers(
    children: Sequence[subprocess.Popen], readers: Sequence[threading.Thread] = ()
) -> None:
    """Stop the worker processes, then close their pipes (once ``readers``, the threads
    reading their output, if any, have read to the end)."""
    for child in children:
        if child.poll() is None:
            child.terminate()
    for child in children:
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(10)
    for reader in readers:
        reader.join(10)
    for child in children:
        for pipe in (child.stdin, child.stdout):
            if pipe is not None:
                pipe.close()
