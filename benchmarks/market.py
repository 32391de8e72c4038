"""Marketplace benchmark: Redis in Action's tables 6.2 and 6.3 on this machine.

    python -m benchmarks.market [--quick] [--repeats R]

Runs the example project's ``manage.py market_bench`` (example_project/market_bench.py)
against the suite's Redis: L lister and B buyer processes race on a fresh market
for a short duration, buyers purchasing with WATCH/MULTI/EXEC, a market-wide
django-rcoord Lock, or a Lock per item. --quick runs the 5 listers / 5 buyers
mix only.
"""

from __future__ import annotations

import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import Bench, Measurement, ScenarioResult, Table
from benchmarks.runner import run_benchmark

NAME = "market"
ROOT = Path(__file__).resolve().parent.parent
METHOD_NAMES = {
    "watch": "WATCH/MULTI/EXEC (chapter 4)",
    "market-lock": "django-rcoord Lock, whole market",
    "item-lock": "django-rcoord Lock per item",
}
# One purchase, not counting the read of the ten cheapest listings before it.
ROUND_TRIPS = {
    "watch": "4 + 4 per retry",
    "market-lock": "4 + lock waits",
    "item-lock": "4 + lock waits",
}


def run(bench: Bench) -> ScenarioResult:
    duration = bench.pick(quick=1.0, full=3.0)
    mixes = bench.pick(quick=["5L5B"], full=["1L1B", "5L1B", "5L5B"])
    repeats = bench.repeats_or(3)
    with tempfile.TemporaryDirectory() as directory:
        json_path = os.path.join(directory, "market.json")
        # Each mix listed `repeats` times: one Django start-up for every run.
        subprocess.run(
            [
                sys.executable,
                "manage.py",
                "market_bench",
                "--duration",
                str(duration),
                "--configs",
                *[mix for mix in mixes for _ in range(repeats)],
                "--json",
                json_path,
            ],
            cwd=ROOT,
            env={**os.environ, "REDIS_URL": bench.url},
            check=True,
            stdout=subprocess.DEVNULL,
        )
        runs = json.loads(Path(json_path).read_text())
    grouped = collections.defaultdict(list)
    for result in runs:
        grouped[(result["method"], f"{result['listers']}L{result['buyers']}B")].append(result)
    watch_bought = {
        mix: statistics.median(r["bought"] for r in grouped[("watch", mix)]) for mix in mixes
    }
    rows = []
    for mix in mixes:
        for method, label in METHOD_NAMES.items():
            results = grouped[(method, mix)]
            row = Measurement(
                f"{mix} {label}",
                ROUND_TRIPS[method],
                [r["bought"] / r["seconds"] for r in results],
            )
            bought = statistics.median(r["bought"] for r in results)
            listed = statistics.median(r["listed"] for r in results)
            row.extra["listed"] = int(listed)
            row.extra["bought"] = int(bought)
            row.extra["retries"] = int(statistics.median(r["retries"] for r in results))
            row.extra["wait ms"] = statistics.median(r["average_wait_ms"] for r in results)
            row.extra["listed:bought"] = round(listed / bought, 1) if bought else None
            row.extra["vs WATCH"] = (
                f"{bought / watch_bought[mix]:.2f}x" if watch_bought[mix] else "-"
            )
            errors = sorted({error for r in results for error in r["errors"]})
            if errors:
                row.note = "; ".join(errors)[:200]
            rows.append(row)
    table = Table(
        f"Listers (L) and buyers (B) racing on one market, {duration:g} s x {repeats} runs",
        "purchases/s",
        rows,
        extra_columns=("listed", "bought", "retries", "wait ms", "listed:bought", "vs WATCH"),
        note="no floor: the processes share 2 cores; each method is compared with WATCH in "
        "the same mix (vs WATCH = items bought). wait ms = time in the purchase call per "
        "item bought",
    )
    return ScenarioResult(
        NAME,
        "Marketplace (the book's tables 6.2 and 6.3)",
        [table],
        params={"duration_s": duration, "mixes": mixes},
        repeats=repeats,
    )


if __name__ == "__main__":
    run_benchmark(NAME, __doc__.splitlines()[0])
