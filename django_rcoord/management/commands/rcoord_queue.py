"""``manage.py rcoord_queue pause|resume QUEUE [QUEUE ...]``: stop every worker taking from a
queue, and let them take again."""

from __future__ import annotations

from typing import Any

import redis
from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_rcoord.exceptions import InvalidName
from django_rcoord.queues.keys import check_queue_name
from django_rcoord.queues.pause import pause_queue, resume_queue


class Command(BaseCommand):
    help = (
        "Pause queues (no worker takes their tasks until they are resumed; running tasks "
        "finish, new tasks wait in them) or resume them (idle workers are woken at once). "
        "The state is in Redis: it holds for every worker, those started later included, "
        "and for every shard of a sharded queue group. rcoord_status shows it."
    )
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["pause", "resume"])
        parser.add_argument(
            "queues", nargs="+", metavar="QUEUE", help='A queue name: "email", "reports/pdf".'
        )

    def handle(self, *args: Any, action: str, queues: list[str], **options: Any) -> None:
        for name in queues:  # every name checked before any queue changes
            try:
                check_queue_name(name)
            except InvalidName as exc:
                raise CommandError(str(exc)) from exc
        act = pause_queue if action == "pause" else resume_queue
        said = ("paused", "already paused") if action == "pause" else ("resumed", "not paused")
        try:
            for name in queues:
                self.stdout.write(f"{name}: {said[0] if act(name) else said[1]}")
        except redis.RedisError as exc:
            raise CommandError(f"Redis is unreachable: {exc}") from exc
