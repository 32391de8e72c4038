"""``manage.py rcoord_redis start|stop|status``: the embedded development Redis."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_rcoord.conf import conf
from django_rcoord.embedded import EmbeddedRedis
from django_rcoord.exceptions import EmbeddedRedisError


class Command(BaseCommand):
    help = (
        "Start, stop or report the embedded redis-server whose data directory is "
        "RCOORD['EMBEDDED_REDIS_DIR'] (or --dir)."
    )
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["start", "stop", "status"])
        parser.add_argument(
            "--dir",
            dest="data_dir",
            help="Data directory of the server (default: RCOORD['EMBEDDED_REDIS_DIR']).",
        )

    def handle(self, *args: Any, action: str, data_dir: str | None, **options: Any) -> None:
        data_dir = data_dir or conf.EMBEDDED_REDIS_DIR
        if not data_dir:
            raise CommandError(
                "No embedded Redis is configured: set RCOORD['EMBEDDED_REDIS_DIR'] or pass --dir."
            )
        server = EmbeddedRedis(data_dir)
        try:
            if action == "start":
                was_running = server.is_running()
                server.start()
                verb = "already running" if was_running else "started"
                self.stdout.write(f"redis-server {verb} at {server.url} (pid {server.pid()})")
            elif action == "stop":
                if server.stop():
                    self.stdout.write(f"redis-server at {server.url} stopped")
                else:
                    self.stdout.write(f"redis-server at {server.url} was not running")
            elif server.is_running():
                info = server.client().info("server")
                self.stdout.write(
                    f"redis-server {info['redis_version']} running at {server.url} "
                    f"(pid {server.pid()}), data in {server.data_dir}"
                )
            else:
                self.stdout.write(f"redis-server at {server.url} is not running")
                raise SystemExit(3)
        except EmbeddedRedisError as exc:
            raise CommandError(str(exc)) from exc
