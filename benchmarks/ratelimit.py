"""Rate-limit benchmark: checks per second of each algorithm, beside the ``limits`` library.

    python -m benchmarks.ratelimit [--quick] [--repeats R]

One client checks a limit over and over, on the same Redis, each of django-rcoord's
algorithms (``ratelimit.hit(..., algorithm=...)``) beside ``limits``' equivalent
strategy on its Redis storage (``limits.storage.RedisStorage``):

- fixed window: django-rcoord "fixed", limits' ``FixedWindowRateLimiter``;
- exact sliding window: django-rcoord "sliding", limits' ``MovingWindowRateLimiter``;
- sliding window counter: django-rcoord "sliding_counter", limits'
  ``SlidingWindowCounterRateLimiter``;
- GCRA: django-rcoord "gcra"; limits has no such strategy.

1. Allowed: a limit no check reaches, so every check is counted.
2. Refused: a full limit (10 per minute), so every check is refused.
3. Many keys: checks take turns over 1,000 keys (users), 10 per minute each: the first
   ten checks of a key pass, the rest are refused.

Each of django-rcoord's checks also answers the seconds until the next allowed hit
(``Retry-After``); limits' ``hit`` answers only True or False (its
``get_window_stats`` is a second round trip).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from benchmarks.common import (
    Bench,
    Measurement,
    RoundTrips,
    ScenarioResult,
    Table,
    measure_side_by_side,
    missing,
    ping_operation,
)
from benchmarks.runner import run_benchmark

NAME = "ratelimit"
WINDOW = 60  # seconds
KEYS = 1000  # in the many-keys table

# django-rcoord's algorithm: (its row, limits' strategy class, limits' row)
PAIRS = {
    "fixed": ("django-rcoord fixed", "FixedWindowRateLimiter", "limits fixed-window"),
    "sliding": (
        "django-rcoord sliding (exact log)",
        "MovingWindowRateLimiter",
        "limits moving-window",
    ),
    "sliding_counter": (
        "django-rcoord sliding_counter",
        "SlidingWindowCounterRateLimiter",
        "limits sliding-window-counter",
    ),
    "gcra": ("django-rcoord gcra", None, "limits: no GCRA"),
}


def limits_unavailable() -> str | None:
    try:
        import limits  # noqa: F401
    except ImportError:
        return "limits not installed (pip install -e '.' --group bench)"
    return None


Check = Callable[[], object]


def rcoord_check(bench: Bench, algorithm: str, limit: int, names: list[str]) -> Check:
    from django_rcoord.ratelimit import hit

    client = bench.client
    if len(names) == 1:
        (name,) = names

        def check() -> object:
            return hit(name, limit, WINDOW, algorithm=algorithm, client=client)

        return check
    turns = itertools.cycle(names)

    def check_in_turn() -> object:
        return hit(next(turns), limit, WINDOW, algorithm=algorithm, client=client)

    return check_in_turn


def limits_check(storage: Any, strategy: str, limit: int, names: list[str]) -> Check:
    import limits

    limiter = getattr(limits.strategies, strategy)(storage)
    item = limits.RateLimitItemPerSecond(limit, WINDOW)
    if len(names) == 1:
        (name,) = names
        return lambda: limiter.hit(item, name)
    turns = itertools.cycle(names)
    return lambda: limiter.hit(item, next(turns))


def round_trips(check: Check) -> str:
    """Round trips of one check, counted on the wire (after a warm-up: scripts loaded)."""
    for _ in range(5):
        check()
    RoundTrips.install()
    RoundTrips.reset()
    for _ in range(20):
        check()
    trips = RoundTrips.count / 20
    return f"{trips:g}"


def table(
    bench: Bench,
    title: str,
    *,
    limit: int,
    names: Callable[[str], list[str]],
    fill: bool,
    count: int,
    repeats: int,
) -> Table:
    """One table: the floor, then each algorithm's row beside limits' (``names(row)``: the
    keys that row checks; ``fill``: use its limit up before measuring)."""
    reason = limits_unavailable()
    storage = None
    if reason is None:
        from limits.storage import RedisStorage

        storage = RedisStorage(bench.url)
    operations: list[tuple[str, str, Check]] = [ping_operation(bench.client, 1)]
    absent: dict[str, Measurement] = {}
    for algorithm, (ours, strategy, theirs) in PAIRS.items():
        checks = [(ours, rcoord_check(bench, algorithm, limit, names(ours)))]
        if strategy is None:
            absent[theirs] = missing(theirs, "-", "limits has no GCRA strategy")
        elif storage is None:
            absent[theirs] = missing(theirs, "1", reason or "")
        else:
            checks.append((theirs, limits_check(storage, strategy, limit, names(theirs))))
        for row, check in checks:
            if fill:
                for _ in range(limit * len(names(row))):
                    check()
            operations.append((row, round_trips(check), check))
    measured = {
        row.name: row for row in measure_side_by_side(operations, count=count, repeats=repeats)
    }
    rows = [measured[operations[0][0]]]
    for ours, _, theirs in PAIRS.values():
        rows.append(measured[ours])
        rows.append(measured.get(theirs) or absent[theirs])
        mine, peer = measured[ours], measured.get(theirs)
        if peer is not None and peer.median:
            mine.extra["vs limits"] = f"{mine.median / peer.median:.2f}x"
    return Table(
        title,
        "checks/s",
        rows,
        floor=rows[0].name,
        extra_columns=("vs limits",),
        note="vs limits = django-rcoord's checks/s / limits' equivalent strategy's",
    )


def run(bench: Bench) -> ScenarioResult:
    count = bench.pick(quick=300, full=3000)
    repeats = bench.repeats_or(bench.pick(quick=3, full=5))
    big = 10 * (count + 1) * repeats  # a limit the allowed table never reaches

    def one_key(row: str) -> list[str]:
        return [f"bench:{row}"]

    def many_keys(row: str) -> list[str]:
        return [f"bench:{row}:user{number}" for number in range(KEYS)]

    tables = [
        table(
            bench,
            f"Allowed checks (limit {big:,} per {WINDOW} s), {repeats} x {count}",
            limit=big,
            names=one_key,
            fill=False,
            count=count,
            repeats=repeats,
        ),
        table(
            bench,
            f"Refused checks (10 per {WINDOW} s, used up), {repeats} x {count}",
            limit=10,
            names=one_key,
            fill=True,
            count=count,
            repeats=repeats,
        ),
        table(
            bench,
            f"Many keys: checks in turn over {KEYS:,} keys, 10 per {WINDOW} s each, "
            f"{repeats} x {count}",
            limit=10,
            names=many_keys,
            fill=False,
            count=count,
            repeats=repeats,
        ),
    ]
    return ScenarioResult(
        NAME,
        "Rate limits: checks per second, django-rcoord beside limits",
        tables,
        params={"count": count, "window_seconds": WINDOW, "keys": KEYS},
        repeats=repeats,
    )


if __name__ == "__main__":
    run_benchmark(NAME, __doc__.splitlines()[0])
