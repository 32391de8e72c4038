"""``manage.py run_email_worker``: run queued tasks (the sold-item e-mails first)."""

from __future__ import annotations

import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_rcoord.conf import conf
from django_rcoord.management.base import configure_logging, stop_on_signals
from django_rcoord.worker import Worker


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

        with stop_on_signals(stop):
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
