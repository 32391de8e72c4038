"""Reproduce Redis in Action's tables 6.2 and 6.3: listers and buyers racing on one market.

Each run starts L lister and B buyer processes on a fresh market for a fixed
duration. Listers create items and list them (chapter 4's WATCH-based
list_item, in every run, as in the book). Buyers repeatedly pick one of the
ten cheapest listings and buy it with the run's method:

- ``watch``: WATCH/MULTI/EXEC on the market and the buyer (retries counted);
- ``market-lock``: one django-rcoord Lock for the whole market;
- ``item-lock``: one Lock per item (fine-grained).

"Average wait per purchase" is the time a buyer spends in the purchase call
(lock waits and WATCH retries included) divided by the items it bought.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.synchronize
import random
import time
import uuid
from dataclasses import asdict, dataclass, field

METHODS = ("watch", "market-lock", "item-lock")
CONFIGS = ((1, 1), (5, 1), (5, 5))


@dataclass
class RunResult:
    method: str
    listers: int
    buyers: int
    seconds: float
    listed: int = 0
    bought: int = 0
    retries: int = 0
    missed: int = 0
    purchase_seconds: float = 0.0
    stale: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def average_wait_ms(self) -> float:
        return 1000 * self.purchase_seconds / self.bought if self.bought else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "average_wait_ms": round(self.average_wait_ms, 3)}


def _lister(
    market_name: str, index: int, start: multiprocessing.synchronize.Event, seconds: float
) -> dict:
    import django

    django.setup()
    from example_project.market import Market

    market = Market(market_name)
    seller = f"lister-{index}"
    market.create_user(seller, 0)
    listed = 0
    start.wait()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        item = market.new_item(seller)
        if market.list_item(item, seller, random.randint(1, 10)):
            listed += 1
    return {"listed": listed}


def _buyer(
    market_name: str,
    index: int,
    method: str,
    start: multiprocessing.synchronize.Event,
    seconds: float,
) -> dict:
    import django

    django.setup()
    from example_project.market import Market

    market = Market(market_name)
    buyer = f"buyer-{index}"
    market.create_user(buyer, 10**12)
    stats = {"bought": 0, "retries": 0, "missed": 0, "purchase_seconds": 0.0, "stale": 0}
    start.wait()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        rows = market.listings(limit=10)
        if not rows:
            time.sleep(0.0005)
            continue
        item_id, seller, _ = random.choice(rows)
        began = time.perf_counter()
        if method == "watch":
            result = market.purchase_with_watch(buyer, item_id, seller)
        else:
            result = market.purchase_with_lock(
                buyer, item_id, seller, fine_grained=(method == "item-lock")
            )
        spent = time.perf_counter() - began
        stats["retries"] += result.retries
        if result.bought:
            stats["bought"] += 1
            stats["purchase_seconds"] += spent
        else:
            stats["missed"] += 1
            stats["stale"] += result.reason == "stale lock"
    return stats


def run(method: str, listers: int, buyers: int, seconds: float) -> RunResult:
    """One run on a fresh market; the market's keys are deleted afterwards."""
    from example_project.market import Market

    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}")
    market = Market(f"bench-{uuid.uuid4().hex[:10]}")
    context = multiprocessing.get_context("spawn")
    result = RunResult(method, listers, buyers, seconds)
    everyone = [market.user_key(f"lister-{i}") for i in range(listers)]
    everyone += [market.user_key(f"buyer-{i}") for i in range(buyers)]
    with context.Manager() as manager, context.Pool(listers + buyers) as pool:
        start = manager.Event()
        jobs = [pool.apply_async(_lister, (market.name, i, start, seconds)) for i in range(listers)]
        jobs += [
            pool.apply_async(_buyer, (market.name, i, method, start, seconds))
            for i in range(buyers)
        ]
        # Let every process finish starting up (Django setup) before the clock runs.
        deadline = time.monotonic() + 60
        while market.client.exists(*everyone) < len(everyone):
            if time.monotonic() > deadline:
                raise RuntimeError("benchmark processes did not start within 60 s")
            time.sleep(0.05)
        start.set()
        for job in jobs:
            for name, value in job.get(timeout=seconds + 120).items():
                setattr(result, name, getattr(result, name) + value)
    market.delete()
    return result
