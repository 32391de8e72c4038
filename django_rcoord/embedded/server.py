"""One real ``redis-server``, started on demand: ``EmbeddedRedis(data_dir)``.

It runs one daemonized ``redis-server`` per data directory, with AOF persistence on
(nothing is lost between runs) and, by default, a unix socket in that directory (no TCP
port is opened). Starting is idempotent and safe across processes: a file lock in the
data directory makes concurrent starters agree on one server, and a server already
answering is reused.

The binary is the one ``embedded.finder.find_executable`` finds.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_rcoord.embedded.finder import find_executable, server_version
from django_rcoord.exceptions import EmbeddedRedisError

#: Oldest redis-server this project supports.
MINIMUM_VERSION = (6, 2)

# sockaddr_un.sun_path holds 108 bytes on Linux, including the final NUL.
_MAX_SOCKET_PATH = 100


def _quote(value: str | os.PathLike[str]) -> str:
    """Quote a value for redis.conf (double quotes, backslash escapes)."""
    text = os.fspath(value)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _socket_path(data_dir: Path) -> Path:
    """The unix socket of the server of ``data_dir``: in it, or where a deep directory
    cannot hold one, under a short, stable name in the temporary directory."""
    path = data_dir / "redis.sock"
    if len(os.fsencode(path)) <= _MAX_SOCKET_PATH:
        return path
    digest = hashlib.sha1(os.fsencode(data_dir)).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"rcoord-redis-{digest}.sock"


class EmbeddedRedis:
    """One ``redis-server`` daemon that lives in ``data_dir``.

    ``port=None`` (the default) listens on a unix socket only; an integer port
    listens on 127.0.0.1 only, and no socket. Use ``start()`` / ``stop()``;
    ``url`` is the URL to give django-redis or redis-py.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        port: int | None = None,
        executable: str | None = None,
        extra_config: dict[str, str] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).expanduser().resolve()
        self.port = port
        self._executable = executable
        self.extra_config = dict(extra_config or {})

    # -- where it is -------------------------------------------------------
    @property
    def socket_path(self) -> Path | None:
        return None if self.port is not None else _socket_path(self.data_dir)

    @property
    def url(self) -> str:
        if self.port is not None:
            return f"redis://127.0.0.1:{self.port}/0"
        return f"unix://{self.socket_path}?db=0"

    @property
    def pid_path(self) -> Path:
        return self.data_dir / "redis.pid"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "redis.log"

    @property
    def config_path(self) -> Path:
        return self.data_dir / "redis.conf"

    @property
    def executable(self) -> str:
        if self._executable is None:
            self._executable = find_executable()
        return self._executable

    def client(self, **kwargs: Any) -> redis.Redis:
        """A new redis-py client for this server."""
        kwargs.setdefault("socket_timeout", 5)
        if self.port is not None:
            return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)
        return redis.Redis(unix_socket_path=str(self.socket_path), **kwargs)

    def _client_without_retries(self, timeout: float = 5) -> redis.Redis:
        # A server that is down, or going down, should be reported at once.
        return self.client(
            socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0)
        )

    # -- state -------------------------------------------------------------
    def pid(self) -> int | None:
        try:
            return int(self.pid_path.read_text().strip())
        except (OSError, ValueError):
            return None

    def is_running(self) -> bool:
        """True when this data directory's server answers at this address."""
        answering = self._answering()
        return answering is not None and self._is_this_server(answering)

    def _answering(self) -> dict[str, Any] | None:
        """``INFO server`` of whatever answers at this address ({} when it refuses to say),
        or None when nothing does (a server stalled on a busy machine gets 5 s)."""
        client = self._client_without_retries(timeout=5)
        try:
            return client.info("server")
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            return None
        except redis.ResponseError:  # e.g. NOAUTH: a server, and not one of ours
            return {}
        finally:
            client.close()

    def _is_this_server(self, info: dict[str, Any]) -> bool:
        # Another redis-server may listen on the same port: ours runs from our redis.conf.
        config_file = info.get("config_file") or ""
        return bool(config_file) and os.path.realpath(config_file) == os.path.realpath(
            self.config_path
        )

    # -- lifecycle ---------------------------------------------------------
    @contextmanager
    def _start_lock(self) -> Iterator[None]:
        import fcntl  # POSIX only, like the daemon and its unix socket; here, so that
        # importing this module works everywhere.

        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.data_dir / "start.lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def config_text(self) -> str:
        lines = {
            "daemonize": "yes",
            "dir": _quote(self.data_dir),
            "pidfile": _quote(self.pid_path),
            "logfile": _quote(self.log_path),
            "appendonly": "yes",
            "appendfsync": "everysec",
            "save": '""',
        }
        socket_path = self.socket_path  # None exactly when the server listens on a port
        if socket_path is not None:
            lines.update(port="0", unixsocket=_quote(socket_path), unixsocketperm="700")
        else:
            lines.update(port=str(self.port), bind="127.0.0.1")
        lines.update(self.extra_config)
        header = "# Written by django_rcoord.embedded; rewritten at each start.\n"
        return header + "".join(f"{name} {value}\n" for name, value in lines.items())

    def start(self, timeout: float = 15.0) -> EmbeddedRedis:
        """Start the server, or reuse it when it already answers. Returns self.

        Raises ``EmbeddedRedisError`` when another server listens at this address, or
        when this data directory's server runs at another address (one data directory,
        one server).
        """
        with self._start_lock():
            answering = self._answering()
            if answering is not None and self._is_this_server(answering):
                return self
            self._refuse_another_address(answering)
            version = server_version(self.executable)
            if version[:2] < MINIMUM_VERSION:
                raise EmbeddedRedisError(
                    f"{self.executable} is Redis {'.'.join(map(str, version))}; "
                    f"django-rcoord needs {'.'.join(map(str, MINIMUM_VERSION))} or newer."
                )
            self._launch(timeout)
            self._wait_until_ready(timeout)
        return self

    def _refuse_another_address(self, answering: dict[str, Any] | None) -> None:
        """EmbeddedRedisError when another server answers at this address, or this data
        directory's server runs at another address."""
        if answering is not None:
            raise EmbeddedRedisError(
                f"Another redis-server (pid {answering.get('process_id', '?')}) listens "
                f"at {self.url}, not the one of {self.data_dir}"
                + ("; choose another port." if self.port is not None else ".")
            )
        previous = EmbeddedRedis(self.data_dir, port=started_port(self.data_dir))
        if previous.port != self.port and previous.is_running():
            raise EmbeddedRedisError(
                f"The redis-server of {self.data_dir} runs at {previous.url}; stop it "
                f"before starting it at {self.url}."
            )

    def _launch(self, timeout: float) -> None:
        """Write the configuration and start the daemon (it forks and returns)."""
        socket_path = self.socket_path
        if socket_path is not None and socket_path.exists():
            socket_path.unlink()  # left by a server that died; nothing answers on it
        self.config_path.write_text(self.config_text())
        result = subprocess.run(
            [self.executable, str(self.config_path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            check=False,  # the exit code is reported below, with the output and log
        )
        if result.returncode != 0:
            raise EmbeddedRedisError(
                f"{self.executable} exited with {result.returncode}: "
                f"{result.stdout.strip()}{self._log_tail()}"
            )

    def _wait_until_ready(self, timeout: float) -> None:
        """Until the server answers PING for up to ``timeout`` seconds: a daemon still
        starting refuses connections, and one loading the AOF of a previous run answers
        LOADING (``BusyLoadingError``, a ``ConnectionError``); a stalled one times out."""
        deadline = time.monotonic() + timeout
        client = self._client_without_retries(timeout=5)
        try:
            while True:
                try:
                    client.ping()
                    return
                except (redis.ConnectionError, redis.TimeoutError) as exc:
                    if time.monotonic() > deadline:
                        raise EmbeddedRedisError(
                            f"redis-server did not answer at {self.url} within {timeout:.0f}s "
                            f"({exc}).{self._log_tail()}"
                        ) from exc
                    time.sleep(0.02)
        finally:
            client.close()

    def stop(self, timeout: float = 15.0) -> bool:
        """Stop the server (its AOF is flushed). Returns False when it was not running."""
        with self._start_lock():
            if not self.is_running():
                return False
            pid = self.pid()
            deadline = time.monotonic() + timeout
            client = self._client_without_retries()
            try:
                while True:
                    try:
                        client.shutdown()
                        break
                    except redis.ConnectionError:
                        break  # the server closed the connection as it went down
                    except redis.ResponseError:
                        # Refused while it writes its first AOF (e.g. a replica that
                        # has just synced): try again until it is done.
                        if time.monotonic() > deadline:
                            raise EmbeddedRedisError(
                                f"redis-server (pid {pid}) refused to shut down.{self._log_tail()}"
                            ) from None
                        time.sleep(0.05)
            finally:
                client.close()
            while self.is_running() or (pid is not None and process_alive(pid)):
                if time.monotonic() > deadline:
                    raise EmbeddedRedisError(
                        f"redis-server (pid {pid}) did not stop in {timeout}s."
                    )
                time.sleep(0.02)
        return True

    def _log_tail(self, lines: int = 15) -> str:
        try:
            tail = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return "\nLast lines of " + str(self.log_path) + ":\n" + "\n".join(tail)

    def __repr__(self) -> str:
        return f"EmbeddedRedis({str(self.data_dir)!r}, port={self.port!r})"


def started_port(data_dir: str | os.PathLike[str]) -> int | None:
    """The TCP port of the server last started in ``data_dir`` (read from the redis.conf
    written at that start); None for a unix socket, or when none was started there."""
    try:
        lines = (Path(data_dir).expanduser() / "redis.conf").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        name, _, value = line.partition(" ")
        if name == "port" and value.strip().isdigit():
            return int(value) or None
    return None


def process_alive(pid: int) -> bool:
    """Whether a process with id ``pid`` exists (ours or not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (a child of ours that exited) still answers kill 0.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
