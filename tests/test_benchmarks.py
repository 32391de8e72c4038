"""The benchmark suite's own behaviour (not its figures): it cleans up after itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from django_rcoord.embedded import _process_alive
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
        assert _process_alive(server_pid)
        run.send_signal(signal.SIGTERM)
        _, errors = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 128 + signal.SIGTERM, errors
    wait_until(lambda: not _process_alive(server_pid), timeout=15)
