"""``manage.py market_bench``: the book's tables 6.2 and 6.3 on this machine."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from example_project.market_bench import CONFIGS, METHODS, run

BOOK_CLAIMS = (
    "Redis in Action (tables 6.2, 6.3) reports: WATCH retries soar as buyers and listers are "
    "added; with per-item locks, zero retries, under 3 ms average wait even at 5 listers / "
    "5 buyers, and a listed-to-bought ratio close to the listers-to-buyers ratio."
)


class Command(BaseCommand):
    help = (
        "Race lister and buyer processes on a fresh market for each purchase method "
        "(WATCH, market-wide lock, per-item lock) and each mix (1L/1B, 5L/1B, 5L/5B)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--duration", type=float, default=10.0, help="Seconds per run.")
        parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
        parser.add_argument(
            "--configs",
            nargs="+",
            default=[f"{listers}L{buyers}B" for listers, buyers in CONFIGS],
            help="Mixes such as 1L1B 5L1B 5L5B.",
        )
        parser.add_argument("--json", dest="json_path", help="Also write the results here.")

    def handle(
        self,
        *args: Any,
        duration: float,
        methods: list[str],
        configs: list[str],
        json_path: str | None,
        **options: Any,
    ) -> None:
        mixes = []
        for config in configs:
            lister_count, _, buyer_count = config.upper().rstrip("B").partition("L")
            mixes.append((int(lister_count), int(buyer_count)))
        header = (
            f"{'method':<12} {'mix':<6} {'listed':>8} {'bought':>8} {'retries':>8} "
            f"{'avg wait/purchase':>18} {'listed:bought':>14}"
        )
        self.stdout.write(f"{duration:g} s per run\n{header}\n{'-' * len(header)}")
        results = []
        for method in methods:
            for listers, buyers in mixes:
                result = run(method, listers, buyers, duration)
                results.append(result)
                ratio = f"{result.listed / result.bought:.1f}" if result.bought else "-"
                self.stdout.write(
                    f"{method:<12} {listers}L{buyers}B{'':<2} {result.listed:>8} "
                    f"{result.bought:>8} {result.retries:>8} "
                    f"{result.average_wait_ms:>15.2f} ms {ratio:>14}"
                )
        self.stdout.write("\n" + BOOK_CLAIMS)
        if json_path:
            with open(json_path, "w") as handle:
                json.dump([result.as_dict() for result in results], handle, indent=2)
