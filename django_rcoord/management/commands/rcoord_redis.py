"""``manage.py rcoord_redis start|stop|status``: the embedded development Redis."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_rcoord.conf import conf
from django_rcoord.embedded.caches import configured_server
from django_rcoord.embedded.finder import program_name
from django_rcoord.embedded.server import EmbeddedRedis, started_port
from django_rcoord.exceptions import EmbeddedRedisError


class Command(BaseCommand):
    help = (
        "Start, stop or report the embedded redis-server of this project: the one in --dir, "
        "else in RCOORD['EMBEDDED_REDIS_DIR'], else the one CACHES uses through "
        "django_rcoord.embedded.embedded_cache(). Only start starts it."
    )
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["start", "stop", "status"])
        parser.add_argument(
            "--dir",
            dest="data_dir",
            help="Data directory of the server (default: RCOORD['EMBEDDED_REDIS_DIR'], else "
            "the directory given to embedded_cache() in CACHES).",
        )
        parser.add_argument(
            "--port",
            type=int,
            help="Listen on 127.0.0.1:PORT instead of a unix socket in the data directory. "
            "Default: start uses the port given to embedded_cache() in CACHES, stop and "
            "status the address the server last started at.",
        )

    def handle(
        self, *args: Any, action: str, data_dir: str | None, port: int | None, **options: Any
    ) -> None:
        if port is not None and not 0 < port < 65536:
            raise CommandError(f"--port must be from 1 to 65535, not {port}")
        server = configured_server(data_dir, port)
        if server is None:
            raise CommandError(
                "No embedded Redis is configured: put embedded_cache(<directory>) in CACHES "
                "(from django_rcoord.embedded), set RCOORD['EMBEDDED_REDIS_DIR'], or pass --dir."
            )
        if action != "start" and port is None and server.config_path.exists():
            # Stop and report the server where it last started, whatever the settings say now.
            server = EmbeddedRedis(server.data_dir, port=started_port(server.data_dir))
        name = program_name()
        try:
            if action == "start":
                was_running = server.is_running()
                server.start()
                verb = "already running" if was_running else "started"
                self.stdout.write(
                    f"{name} {verb} at {server.url} (pid {server.pid()}), data in {server.data_dir}"
                )
                self.stdout.write(self.settings_for(server))
            elif action == "stop":
                if server.stop():
                    self.stdout.write(f"{name} at {server.url} stopped")
                else:
                    self.stdout.write(f"{name} at {server.url} was not running")
            elif server.is_running():
                info = server.client().info("server")
                version = info.get("valkey_version") or info["redis_version"]
                self.stdout.write(
                    f"{name} {version} running at {server.url} "
                    f"(pid {server.pid()}), data in {server.data_dir}"
                )
            else:
                self.stdout.write(f"{name} at {server.url} is not running")
                raise SystemExit(3)
        except EmbeddedRedisError as exc:
            raise CommandError(str(exc)) from exc

    def settings_for(self, server: EmbeddedRedis) -> str:
        """What to put in CACHES to use ``server``, unless the settings already do."""
        alias = conf.CONNECTION
        if getattr(settings, "CACHES", {}).get(alias, {}).get("LOCATION") == server.url:
            return f'CACHES["{alias}"] uses it.'
        spelled = json.dumps(str(server.data_dir))
        base_dir = getattr(settings, "BASE_DIR", None)
        if base_dir is not None and server.data_dir.is_relative_to(Path(base_dir).resolve()):
            relative = server.data_dir.relative_to(Path(base_dir).resolve())
            spelled = f"BASE_DIR / {json.dumps(str(relative))}"
        port = "" if server.port is None else f", port={server.port}"
        return (
            "To use it, in your development settings:\n"
            "    from django_rcoord.embedded import embedded_cache\n\n"
            f'    CACHES = {{"{alias}": embedded_cache({spelled}{port})}}'
        )
