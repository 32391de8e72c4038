"""What the long-running management commands share: logging at the verbosity asked for, and
stopping on SIGINT (Ctrl-C) or SIGTERM between units of work."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.core.management.base import CommandError

from django_rcoord.connection.errors import REDIS_ERRORS
from django_rcoord.protocols import ProtocolMismatch, announce

VERBOSITY_LEVELS = {0: logging.ERROR, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}


#: The loggers of the Tasks framework (Django's own, the backport's): their task_finished
#: receiver logs a failed task with its traceback, which the worker's line then leaves out.
FRAMEWORK_LOGGERS = ("django.tasks", "django_tasks")


def configure_logging(verbosity: int) -> None:
    """Map --verbosity to django_rcoord's log level; log to stderr if nothing else does,
    the Tasks framework's errors too (Django's default logging shows them only with DEBUG
    on: a failed framework task's traceback would be in no output of the worker)."""
    logger = logging.getLogger("django_rcoord")
    logger.setLevel(VERBOSITY_LEVELS.get(verbosity, logging.INFO))
    if not logger.handlers and not logging.getLogger().handlers:
        formatter = logging.Formatter("%(asctime)s %(levelname)s %(message)s")
        handler = logging.StreamHandler()
        handler.setFormatter(formatter)
        logger.addHandler(handler)
        errors = logging.StreamHandler()
        errors.setFormatter(formatter)
        errors.setLevel(logging.ERROR)
        for name in FRAMEWORK_LOGGERS:
            logging.getLogger(name).addHandler(errors)


@contextmanager
def stop_on_signals(
    stop: threading.Event | None = None, *, second_signal_exits: bool = True
) -> Iterator[threading.Event]:
    """Within the block, SIGINT and SIGTERM set ``stop`` (a new event unless one is given),
    which the command checks between units of work. With ``second_signal_exits``, a second
    signal ends the process at once with status 1 (a worker's lease brings its task back).
    The previous handlers are put back when the block ends."""
    event = threading.Event() if stop is None else stop
    received = []

    def on_signal(signum: int, frame: Any) -> None:
        received.append(signum)
        if len(received) > 1 and second_signal_exits:
            os._exit(1)
        # Not event.set() here: the handler runs in the main thread, which may be inside
        # event.wait() holding the event's lock (a deadlock), or inside a log call;
        # another thread logs and sets it.
        threading.Thread(target=stopping, args=(signum,), name="stop-on-signal").start()

    def stopping(signum: int) -> None:
        # Set before it is said: whoever reads the line (an operator, a deploy script, a
        # test) knows no new unit of work starts from then on.
        event.set()
        logging.getLogger("django_rcoord").info(
            "%s received: stopping after what is running%s",
            signal.Signals(signum).name,
            " (a second one stops at once)" if second_signal_exits else "",
        )

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield event
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def add_protocol_arguments(parser: Any) -> None:
    parser.add_argument(
        "--upgrade-protocols",
        action="store_true",
        help="Announce this release's script protocols over an older release's that it does "
        "not run beside (once every process of that release is stopped).",
    )


def announce_protocols(*, upgrade: bool) -> None:
    """Refuse to start (CommandError) when another release that does not run beside this one
    announced itself on Redis; otherwise announce this release's protocols. Redis out of
    reach: nothing is checked now (the command waits Redis out as it always does)."""
    try:
        announce(upgrade=upgrade)
    except ProtocolMismatch as exc:
        raise CommandError(str(exc)) from exc
    except REDIS_ERRORS as exc:
        logging.getLogger("django_rcoord").warning(
            "could not check the script protocols on Redis (%s); starting anyway", exc
        )
