"""``manage.py rundemo``: the whole example project in one terminal, stopped by Ctrl-C.

It starts the embedded Redis (unless ``REDIS_URL`` names one), migrates the SQLite
database, then runs the web server, a worker (the sold-item e-mails and the market's
relisting tasks) and the delayed-task poller as child processes sharing that Redis.
When one of them exits, or on Ctrl-C / SIGTERM, all are stopped, and so is the embedded
Redis if rundemo started it (one already running is left running, and said so).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_rcoord.embedded import program_name
from django_rcoord.embedded.caches import configured_server
from django_rcoord.management.base import stop_on_signals


def web_address(addrport: str) -> str:
    """``host:port`` for the web server from ``addrport`` as runserver takes it (``8765``,
    ``0.0.0.0:8765``, ``[::1]:8765``), once the port is known to be free: a CommandError
    that says how to pick another port otherwise."""
    host, _, port = addrport.rpartition(":")
    host = host or "127.0.0.1"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise CommandError(
            f"{addrport!r} is not a port or an address:port; e.g. "
            "`python manage.py rundemo 8765` or `rundemo 127.0.0.1:8765`."
        )
    family = socket.AF_INET6 if host.startswith("[") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host.strip("[]"), int(port)))
        except OSError as exc:
            raise CommandError(
                f"Cannot serve on {host}:{port} ({exc.strerror}): another program uses it. "
                f"Give rundemo another port: `python manage.py rundemo {int(port) + 1}` "
                f"(or `rundemo {host}:{int(port) + 1}`)."
            ) from None
    return f"{host}:{port}"


class Command(BaseCommand):
    help = "Run the example project: web server and background processes, stopped by Ctrl-C."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "addrport",
            nargs="?",
            default="127.0.0.1:8000",
            help="Web server port or address:port, as runserver takes it (default 127.0.0.1:8000).",
        )

    def handle(self, *args: Any, addrport: str, **options: Any) -> None:
        addrport = web_address(addrport)
        Path(settings.STATE_DIR).mkdir(exist_ok=True)
        # Ctrl-C and SIGTERM set `stop` from here on, so that every path below ends
        # through the clean-up, which stops what rundemo started.
        with stop_on_signals(second_signal_exits=False) as stop:
            server = configured_server()
            started_here = server is not None and not server.is_running()
            if server is not None:
                server.start()
            try:
                exit_code = self.run_site(addrport, stop)
            finally:
                if server is not None and started_here:
                    server.stop()
                    self.stdout.write(f"Stopped {program_name()} at {server.url}")
                elif server is not None:
                    self.stdout.write(
                        f"{program_name()} at {server.url} was running before rundemo and still "
                        "is; `python manage.py rcoord_redis stop` stops it."
                    )
        if exit_code:
            raise SystemExit(exit_code)

    def run_site(self, addrport: str, stop: threading.Event) -> int:
        """Run the site's processes until ``stop`` is set or one of them exits; its exit
        status, or 0."""
        call_command("migrate", interactive=False, verbosity=0)
        call_command("seed_demo", verbosity=0)
        call_command("seed_guild", verbosity=0)
        manage = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py")]
        commands = {
            "web": [*manage, "runserver", "--noreload", addrport],
            "worker": [*manage, "run_email_worker", "--queues", "email", "market"],
            "poller": [*manage, "poll_delayed"],
        }
        if stop.is_set():
            return 0
        exit_code = 0
        # Each child in a session of its own: Ctrl-C reaches rundemo alone, which then asks
        # each child once to stop (a second signal would make a worker drop its task).
        children = {
            name: subprocess.Popen(command, start_new_session=True)
            for name, command in commands.items()
        }
        self.stdout.write(
            f"Running {', '.join(children)} on http://{addrport}/ (Ctrl-C stops everything)"
        )
        try:
            while not stop.is_set():
                exited = [name for name, child in children.items() if child.poll() is not None]
                if exited:
                    name = exited[0]
                    self.stderr.write(f"{name} exited with {children[name].returncode}; stopping")
                    exit_code = children[name].returncode or 1
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
        return exit_code
