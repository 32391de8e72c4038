"""``manage.py run_email_worker``: run queued tasks (the sold-item e-mails first)."""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_rcoord.conf import conf
from django_rcoord.worker import Worker

VERBOSITY_LEVELS = {0: logging.ERROR, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}


class Command(BaseCommand):
    help = (
        "Run tasks from the given queues, highest priority first (default: "
        "RCOORD['EMAIL_QUEUES']). SIGTERM or Ctrl-C finishes the running task and exits; "
        "a second one exits at once (the task's lease brings it back)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--queues", nargs="+", help="Queues to watch, highest priority first.")
        parser.add_argument("--burst", action="store_true", help="Exit when the queues are empty.")
        parser.add_argument("--max-tasks", type=int, help="Exit after this many tasks.")
        parser.add_argument(
            "--concurrency",
            type=int,
            default=1,
            help="Tasks run at once, each in its own thread (default 1).",
        )
        parser.add_argument("--lease", type=float, help="Seconds (default RCOORD['TASK_LEASE']).")

    def handle(self, *args: Any, **options: Any) -> None:
        queues = options["queues"] or list(conf.EMAIL_QUEUES)
        concurrency = options["concurrency"]
        if concurrency < 1:
            raise CommandError("--concurrency must be at least 1")
        configure_logging(options["verbosity"])
        stop = threading.Event()
        try:
            workers = [
                Worker(
                    queues,
                    lease=options["lease"],
                    burst=options["burst"],
                    max_tasks=options["max_tasks"],
                    stop_event=stop,
                )
                for _ in range(concurrency)
            ]
        except ValueError as exc:
            raise CommandError(str(exc)) from exc

        def on_signal(signum: int, frame: Any) -> None:
            if stop.is_set():
                os._exit(1)  # second signal: leave now; leases bring the tasks back
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, on_signal)
        if concurrency == 1:
            workers[0].run()
            return
        threads = [
            threading.Thread(target=worker.run, name=f"worker-{i}")
            for i, worker in enumerate(workers)
        ]
        for thread in threads:
            thread.start()
        while any(thread.is_alive() for thread in threads):
            for thread in threads:
                thread.join(0.2)


def configure_logging(verbosity: int) -> None:
    """Map --verbosity to django_rcoord's log level; log to stderr if nothing else does."""
    logger = logging.getLogger("django_rcoord")
    logger.setLevel(VERBOSITY_LEVELS.get(verbosity, logging.INFO))
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
