"""``manage.py poll_delayed``: move delayed tasks into their queues when they are due."""

from __future__ import annotations

import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_rcoord.management.base import (
    add_protocol_arguments,
    announce_protocols,
    configure_logging,
    stop_on_signals,
)
from django_rcoord.queues.delayed import DueTaskPromoter


class Command(BaseCommand):
    help = (
        "Promote due delayed tasks (scheduled ones and retries) into their queues. Several "
        "pollers may run at once. SIGTERM or Ctrl-C stops it."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add_protocol_arguments(parser)
        parser.add_argument(
            "--interval",
            type=float,
            default=1.0,
            help="Longest sleep between passes, in seconds (default 1).",
        )
        parser.add_argument(
            "--batch", type=int, default=500, help="Tasks per script call (1 to 1000, default 500)."
        )
        parser.add_argument("--once", action="store_true", help="One pass, then exit.")

    def handle(self, *args: Any, interval: float, batch: int, once: bool, **options: Any) -> None:
        configure_logging(options["verbosity"])
        announce_protocols(upgrade=options["upgrade_protocols"])
        stop = threading.Event()
        try:
            promoter = DueTaskPromoter(interval=interval, batch=batch, stop_event=stop)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if once:
            promoted, _ = promoter.run_once()
            self.stdout.write(f"promoted {promoted} task(s)")
            return

        with stop_on_signals(stop):
            promoter.run()
