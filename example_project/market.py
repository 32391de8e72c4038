"""The book's model-free marketplace (Redis in Action 4.4 and 6.2), on django-rcoord keys.

Users are HASHes with ``funds``, inventories are SETs of item ids, and the
market is a ZSET of ``"<item>.<seller>" -> price``. All keys of one market
share a hash tag, so the WATCH/MULTI purchase and the fenced purchase script
touch one Redis Cluster slot.

Three ways to buy, as in the book's tables 6.2 and 6.3:

- ``purchase_with_watch``: chapter 4's optimistic WATCH/MULTI/EXEC, retried on conflict;
- ``purchase_with_lock(..., fine_grained=False)``: one lock for the whole market;
- ``purchase_with_lock(..., fine_grained=True)``: one lock per item.

Both lock variants write through ``market_purchase.lua``, which checks the
lock's fencing token, so a buyer whose lock expired mid-purchase cannot
complete a purchase the next holder already decided. Asked to (``email_seller``),
the same script queues the seller's sold-item e-mail: the purchase and its
e-mail happen together or not at all, whatever crashes when.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis

from django_rcoord.connection import resolve_client, slot_pipeline
from django_rcoord.keys import KeySpace
from django_rcoord.locks import Lock
from django_rcoord.queues import enqueue_in_script
from django_rcoord.scripts import run_script
from django_rcoord.tasks import send_sold_email


@dataclass
class PurchaseResult:
    bought: bool
    retries: int = 0
    reason: str = ""
    price: int | None = None
    email_task_id: str | None = None  # the seller's e-mail, queued by the purchase


class Market:
    def __init__(self, name: str = "main", *, client: Any = None) -> None:
        self.name = name
        KeySpace("market", name, prefix="rcoord")  # a bad market name fails here, now
        self._client = client
        # The seller's e-mail goes to a queue of the queue group named like the market: the
        # group's keys share the market's hash tag, so the purchase script can queue it
        # (one Redis Cluster slot). For the market "main" this is the queue "email".
        self.email_queue = f"{name}/email"

    @property
    def client(self) -> Any:
        return resolve_client(self._client)

    # Keys are built when used, with the KEY_PREFIX of that moment: the module-level market
    # of market_views builds none at import (a bad prefix is check rcoord.E006's to report).
    @property
    def space(self) -> KeySpace:
        return KeySpace("market", self.name)

    @property
    def market_key(self) -> str:
        return self.space.key("market")

    @property
    def fences_key(self) -> str:
        return self.space.key("fences")

    @property
    def ids_key(self) -> str:
        return self.space.key("next-item-id")

    def user_key(self, user: str) -> str:
        return self.space.key(f"users:{user}")

    def inventory_key(self, user: str) -> str:
        return self.space.key(f"inventory:{user}")

    # -- people and things ---------------------------------------------------
    def create_user(self, user: str, funds: int) -> None:
        self.client.hset(self.user_key(user), mapping={"name": user, "funds": funds})

    def ensure_user(self, user: str, funds: int) -> None:
        self.client.hsetnx(self.user_key(user), "funds", funds)

    def funds(self, user: str) -> int:
        return int(self.client.hget(self.user_key(user), "funds") or 0)

    def new_item(self, owner: str, label: str | None = None) -> str:
        """Create an item in ``owner``'s inventory; returns its id."""
        # Item ids hold no ".": market members are "<item>.<seller>".
        label = (label or "item").replace(".", "-")
        item_id = f"{label}-{self.client.incr(self.ids_key)}"
        self.client.sadd(self.inventory_key(owner), item_id)
        return item_id

    def inventory(self, user: str) -> list[str]:
        return sorted(member.decode() for member in self.client.smembers(self.inventory_key(user)))

    def listings(self, limit: int = 100) -> list[tuple[str, str, int]]:
        """(item id, seller, price) of the cheapest ``limit`` listings."""
        rows = self.client.zrange(self.market_key, 0, limit - 1, withscores=True)
        result = []
        for member, price in rows:
            item_id, _, seller = member.decode().partition(".")
            result.append((item_id, seller, int(price)))
        return result

    # -- listing (chapter 4's list_item) -------------------------------------
    def list_item(self, item_id: str, seller: str, price: int, timeout: float = 5) -> bool:
        """Move ``item_id`` from ``seller``'s inventory to the market, optimistically."""
        inventory = self.inventory_key(seller)
        end = time.monotonic() + timeout
        with slot_pipeline(self.client, self.market_key) as pipe:
            while time.monotonic() < end:
                try:
                    pipe.watch(inventory)
                    if not pipe.sismember(inventory, item_id):
                        pipe.unwatch()
                        return False
                    pipe.multi()
                    pipe.zadd(self.market_key, {f"{item_id}.{seller}": price})
                    pipe.srem(inventory, item_id)
                    pipe.execute()
                    return True
                except redis.WatchError:
                    continue
        return False

    # -- buying ----------------------------------------------------------------
    def purchase_with_watch(
        self, buyer: str, item_id: str, seller: str, timeout: float = 10
    ) -> PurchaseResult:
        """Chapter 4's purchase_item: WATCH the market and the buyer, retry on conflict."""
        member = f"{item_id}.{seller}"
        buyer_key = self.user_key(buyer)
        retries = 0
        end = time.monotonic() + timeout
        with slot_pipeline(self.client, self.market_key) as pipe:
            while time.monotonic() < end:
                try:
                    pipe.watch(self.market_key, buyer_key)
                    price = pipe.zscore(self.market_key, member)
                    funds = int(pipe.hget(buyer_key, "funds") or 0)
                    if price is None:
                        pipe.unwatch()
                        return PurchaseResult(False, retries, "gone")
                    if price > funds:
                        pipe.unwatch()
                        return PurchaseResult(False, retries, "funds")
                    pipe.multi()
                    pipe.hincrby(self.user_key(seller), "funds", int(price))
                    pipe.hincrby(buyer_key, "funds", -int(price))
                    pipe.sadd(self.inventory_key(buyer), item_id)
                    pipe.zrem(self.market_key, member)
                    pipe.execute()
                    return PurchaseResult(True, retries)
                except redis.WatchError:
                    retries += 1
        return PurchaseResult(False, retries, "timeout")

    def lock_name(self, item_id: str, seller: str, *, fine_grained: bool) -> str:
        if fine_grained:
            return f"market:{self.name}:item:{item_id}.{seller}"
        return f"market:{self.name}"

    def purchase_with_lock(
        self, buyer: str, item_id: str, seller: str, *, fine_grained: bool = True, wait: float = 10
    ) -> PurchaseResult:
        """Chapter 6's purchase_item_with_lock, with a market-wide or a per-item lock."""
        lock = Lock(self.lock_name(item_id, seller, fine_grained=fine_grained), wait=wait)
        if not lock.acquire():
            return PurchaseResult(False, 0, "busy")
        try:
            return self.purchase_under_lock(lock, buyer, item_id, seller)
        finally:
            lock.release()

    def purchase_under_lock(
        self, lock: Lock, buyer: str, item_id: str, seller: str, *, email_seller: bool = False
    ) -> PurchaseResult:
        """The purchase itself, for a caller holding ``lock`` (e.g. a ``@locked`` view);
        ``email_seller`` queues the seller's sold-item e-mail with it."""
        price, reason = self.quote(buyer, item_id, seller)
        if price is None:
            return PurchaseResult(False, 0, reason)
        return self.complete_purchase(
            lock, buyer, item_id, seller, price, email_seller=email_seller
        )

    def quote(self, buyer: str, item_id: str, seller: str) -> tuple[int | None, str]:
        """Read the price and check the buyer's funds: (price, "") or (None, reason)."""
        with slot_pipeline(self.client, self.market_key, transaction=False) as pipe:
            pipe.zscore(self.market_key, f"{item_id}.{seller}")
            pipe.hget(self.user_key(buyer), "funds")
            price, funds = pipe.execute()
        if price is None:
            return None, "gone"
        if price > int(funds or 0):
            return None, "funds"
        return int(price), ""

    def complete_purchase(
        self,
        lock: Lock,
        buyer: str,
        item_id: str,
        seller: str,
        price: int,
        *,
        email_seller: bool = False,
    ) -> PurchaseResult:
        """Write a purchase decided under ``lock``, unless a newer holder of it has written;
        with ``email_seller``, queue the seller's sold-item e-mail in the same script."""
        keys = [
            self.fences_key,
            self.market_key,
            self.user_key(buyer),
            self.user_key(seller),
            self.inventory_key(buyer),
        ]
        args: list[Any] = [lock.name, lock.token, f"{item_id}.{seller}", item_id, price]
        email = None
        if email_seller:
            email = enqueue_in_script(
                send_sold_email,
                (seller, item_id, price, buyer),
                queue=self.email_queue,
                client=self.client,
            )
            if email.hash_tag != self.space.hash_tag:  # kept in one slot for Redis Cluster
                raise ValueError(f"{self.email_queue!r} is not in the market's hash slot")
            keys += email.keys
            args += email.args
        outcome, queued = run_script(
            "market_purchase", self.client, keys=keys, args=args, package="example_project"
        )
        if email is not None:
            email.registered(self.client, queued)
        reasons = {1: "", 0: "gone", -1: "funds", -2: "stale lock"}
        return PurchaseResult(
            outcome == 1,
            0,
            reasons[outcome],
            price,
            email.task_id if email is not None and queued else None,
        )

    def delete(self) -> int:
        """Delete every key of this market (for benchmark runs)."""
        keys = list(self.client.scan_iter(match=self.space.pattern, count=1000))
        return self.client.delete(*keys) if keys else 0
