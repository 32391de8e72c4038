"""``manage.py rundemo``: the whole example project in one terminal, stopped by Ctrl-C.

It migrates the SQLite database, then runs the web server, a worker (the
sold-item e-mails and the market's relisting tasks) and the delayed-task
poller as child processes sharing the same Redis. When one of them exits, or
on Ctrl-C / SIGTERM, all are stopped.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser


class Command(BaseCommand):
    help = "Run the example project: web server and background processes, stopped by Ctrl-C."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "addrport", nargs="?", default="127.0.0.1:8000", help="Web server address."
        )

    def handle(self, *args: Any, addrport: str, **options: Any) -> None:
        Path(settings.STATE_DIR).mkdir(exist_ok=True)
        call_command("migrate", interactive=False, verbosity=0)
        call_command("seed_demo", verbosity=0)
        call_command("seed_guild", verbosity=0)
        manage = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py")]
        commands = {
            "web": [*manage, "runserver", "--noreload", addrport],
            "worker": [*manage, "run_email_worker", "--queues", "email", "market"],
            "poller": [*manage, "poll_delayed"],
        }
        children = {name: subprocess.Popen(command) for name, command in commands.items()}
        self.stdout.write(
            f"Running {', '.join(children)} on http://{addrport}/ (Ctrl-C stops everything)"
        )

        stopping = False

        def request_stop(signum: int, frame: Any) -> None:
            nonlocal stopping
            stopping = True

        previous = {
            sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        exit_code = 0
        try:
            while not stopping:
                for name, child in children.items():
                    if child.poll() is not None:
                        self.stderr.write(f"{name} exited with {child.returncode}; stopping")
                        exit_code = child.returncode or 1
                        stopping = True
                        break
                time.sleep(0.2)
        finally:
            for child in children.values():
                if child.poll() is None:
                    child.terminate()
            for child in children.values():
                try:
                    child.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if exit_code:
            raise SystemExit(exit_code)
