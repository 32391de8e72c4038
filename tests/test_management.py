"""What the management commands share (django_rcoord.management.base)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from django_rcoord.management.base import configure_logging, stop_on_signals
from tests.procs import run_python

ROOT = Path(__file__).resolve().parent.parent


def wait_for(event: threading.Event, timeout: float = 5) -> bool:
    deadline = time.monotonic() + timeout
    while not event.is_set() and time.monotonic() < deadline:
        time.sleep(0.01)  # the handler runs in the main thread, between bytecodes
    return event.is_set()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_sets_stop_and_the_old_handlers_come_back(signum: int) -> None:
    before = signal.getsignal(signum)
    with stop_on_signals() as stop:
        assert signal.getsignal(signum) is not before
        assert not stop.is_set()
        os.kill(os.getpid(), signum)
        assert wait_for(stop)
    assert signal.getsignal(signum) is before


def test_stop_is_set_before_the_signal_is_logged() -> None:
    """Whoever reads "SIGTERM received" (an operator, a deploy script, a test that then
    lets the running task end) knows no new unit of work starts from then on."""
    seen: list[bool] = []
    logged = threading.Event()

    class Watch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "received" in record.getMessage():
                seen.append(stop.is_set())
                logged.set()

    logger = logging.getLogger("django_rcoord")
    level, watch = logger.level, Watch()
    logger.setLevel(logging.INFO)
    logger.addHandler(watch)
    try:
        with stop_on_signals() as stop:
            os.kill(os.getpid(), signal.SIGTERM)
            assert wait_for(logged, timeout=30)
    finally:
        logger.removeHandler(watch)
        logger.setLevel(level)
    assert seen == [True]


def run_with_two_signals(second_signal_exits: bool) -> subprocess.CompletedProcess[str]:
    code = (
        "import os, signal, sys, time\n"
        "from django_rcoord.management.base import stop_on_signals\n"
        f"with stop_on_signals(second_signal_exits={second_signal_exits}) as stop:\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    while not stop.is_set(): time.sleep(0.01)\n"
        "    print('stopping', flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    time.sleep(0.5)\n"
        "    print('finished', flush=True)\n"
    )
    return run_python("-c", code, cwd=ROOT, timeout=60)


def test_a_second_signal_ends_the_process_at_once() -> None:
    result = run_with_two_signals(True)
    assert (result.returncode, result.stdout) == (1, "stopping\n"), result.stderr


def test_a_second_signal_can_be_left_to_the_command() -> None:
    result = run_with_two_signals(False)
    assert (result.returncode, result.stdout) == (0, "stopping\nfinished\n"), result.stderr


def test_verbosity_sets_the_log_level() -> None:
    logger = logging.getLogger("django_rcoord")
    level, handlers = logger.level, list(logger.handlers)
    try:
        configure_logging(0)
        assert logger.level == logging.ERROR
        configure_logging(2)
        assert logger.level == logging.DEBUG
        configure_logging(1)
        assert logger.level == logging.INFO
    finally:
        logger.setLevel(level)
        logger.handlers[:] = handlers
