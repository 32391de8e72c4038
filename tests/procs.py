"""Run test code in real, separate processes (spawned, with Django set up as in the tests),
and wait for what they do."""

from __future__ import annotations

import asyncio
import inspect
import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from django_rcoord.embedded import find_executable


def _setup_django() -> None:
    # Spawned children inherit DJANGO_SETTINGS_MODULE and RCOORD_TEST_REDIS_URL
    # from the test process; tests/settings.py reads the latter.
    import django

    django.setup()


def _call(target: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    _setup_django()
    return target(*args)


def run_in_processes(target: Callable[..., Any], args_list: Iterable[tuple[Any, ...]]) -> list[Any]:
    """Run ``target(*args)`` once per item, each in its own spawned process, in parallel.

    ``target`` must be importable (a module-level function). Returns the results in order.
    """
    args_list = list(args_list)
    context = multiprocessing.get_context("spawn")
    with context.Pool(len(args_list)) as pool:
        results = [pool.apply_async(_call, (target, args)) for args in args_list]
        return [result.get(timeout=300) for result in results]


#: The processes the running test started (``start_process``, ``started``). What it leaves
#: running is killed when it ends (``kill_leftovers``, from conftest): a worker a failed or
#: timed-out test did not stop must not take the next test's tasks.
STARTED: list[BaseProcess | subprocess.Popen] = []


def started(process: subprocess.Popen) -> subprocess.Popen:
    """``process``, killed when the test that started it ends if it is still running."""
    STARTED.append(process)
    return process


def kill_leftovers() -> None:
    """SIGKILL every process the test started and left running."""
    for process in STARTED:
        if isinstance(process, subprocess.Popen):
            if process.poll() is None:
                process.kill()
                process.wait(30)
        elif process.is_alive():
            process.kill()
            process.join(30)
    STARTED.clear()


def start_process(target: Callable[..., Any], *args: Any) -> BaseProcess:
    """Start ``target(*args)`` in a spawned process and return it (the caller joins or kills it)."""
    context = multiprocessing.get_context("spawn")
    process = context.Process(target=_call, args=(target, args), daemon=True)
    process.start()
    STARTED.append(process)
    return process


def wait_until(
    predicate: Callable[[], Any], timeout: float = 30, why: Callable[[], Any] | None = None
) -> None:
    """Poll ``predicate`` until it is true; fail the test after ``timeout`` seconds, saying
    ``why()`` (what the test can tell of the state it waited on) when given."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            # One last look: the process may have been stalled past the deadline after a
            # look that came just too early.
            assert predicate(), f"timed out: {why()}" if why else "timed out"
            return
        time.sleep(0.01)


async def await_until(predicate: Callable[[], Any], timeout: float = 30) -> None:
    """``wait_until`` for a running event loop: ``predicate`` may return an awaitable."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


def blpop_within(key: str, timeout: float, client: Any = None) -> bytes | None:
    """Pop from the list ``key``, waiting up to ``timeout`` seconds, in BLPOPs as long as the
    client's socket timeout allows (``pop_signal``; 5 s by redis-py's default, 10 s on the
    test cluster): a longer one would end in an error, and the client's retry could lose
    what was pushed meanwhile. What was popped, or None."""
    from django_rcoord.waiting import pop_signal

    client = client or _default_client()
    deadline = time.monotonic() + timeout
    while True:
        popped = pop_signal(client, key, deadline - time.monotonic())
        if popped is not None or time.monotonic() >= deadline:
            return popped


def server_now(client: Any = None) -> float:
    """The Redis server's clock, in seconds: what its scripts and expiries go by."""
    seconds, microseconds = (client or _default_client()).time()
    return seconds + microseconds / 1_000_000


def server_ms(client: Any = None) -> int:
    """The Redis server's clock, in whole milliseconds."""
    seconds, microseconds = (client or _default_client()).time()
    return seconds * 1000 + microseconds // 1000


#: What the steps of the running ``within_a_window`` try asked ``nap`` to sleep, ms.
_NAPPED_MS = [0.0]


def nap(seconds: float) -> None:
    """``time.sleep`` for the steps of ``within_a_window``: what they ask to sleep is not
    counted as a stall (what a busy machine adds to it is)."""
    _NAPPED_MS[0] += seconds * 1000
    time.sleep(seconds)


def within_a_window(steps: Callable[[str], None], name: str, window_ms: int = 1000) -> None:
    """Run ``steps(name)``, whose assertions hold while a window the scripts keep stands (a
    hand-over's grant lease, a "woken, not asked yet" mark: ``window_ms``). A try that
    failed and took longer than the window by the server's clock, beyond what its steps
    slept by design (``nap``), is run again: the test process may have been stalled that
    long on a busy machine. Under a new name, three tries in all; a failed try shorter than
    that, or a third failure, fails the test."""
    for attempt in range(3):
        began = server_ms()
        _NAPPED_MS[0] = 0.0
        try:
            steps(f"{name}-{attempt}")
            return
        except AssertionError:
            if attempt == 2 or server_ms() - began - _NAPPED_MS[0] < window_ms:
                raise


def _default_client() -> Any:
    from django_rcoord.connection import get_client

    return get_client()


def run_python(
    *args: str,
    cwd: str | Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run this Python with ``args`` to its end; its output as text, its exit code unchecked."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def server_program() -> bytes:
    """How the embedded server's processes are named in their command line: after the
    binary the tests run (``redis-server``, or ``valkey-server`` when RCOORD_REDIS_SERVER
    names Valkey's)."""
    return os.fsencode(Path(find_executable()).name)


def close_thread_connections() -> None:
    """Close the database connections the calling thread opened.

    The test client keeps Django from closing them when its request finishes, and the
    SQLite backend's close() leaves a connection to an in-memory database open (closing
    the last one would drop the database; the test's own connection keeps it alive).
    """
    from django.db import connections
    from django.db.backends.base.base import BaseDatabaseWrapper

    for connection in connections.all(initialized_only=True):
        if connection.connection is not None:
            BaseDatabaseWrapper.close(connection)
