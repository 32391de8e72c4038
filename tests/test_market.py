"""The example marketplace: the book's purchase three ways, its pages, and its benchmark command."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import redis

from django_rcoord.connection import get_client
from django_rcoord.locks import Lock
from django_rcoord.queues import queue_stats
from django_rcoord.queues.keys import QueueKeys
from example_project.market import Market
from tests.procs import run_in_processes
from tests.test_example_project import example_env, manage, redis_setting


@pytest.fixture
def market() -> Market:
    market = Market("test")
    market.create_user("seller", 0)
    market.create_user("buyer", 100)
    return market


def listed_item(market: Market, price: int = 30) -> str:
    item = market.new_item("seller", "lamp")
    assert market.list_item(item, "seller", price)
    return item


@pytest.mark.parametrize("method", ["watch", "market-lock", "item-lock"])
def test_purchase_moves_item_and_funds(market: Market, method: str) -> None:
    item = listed_item(market)
    if method == "watch":
        result = market.purchase_with_watch("buyer", item, "seller")
    else:
        result = market.purchase_with_lock(
            "buyer", item, "seller", fine_grained=method == "item-lock"
        )
    assert result.bought
    assert (market.funds("buyer"), market.funds("seller")) == (70, 30)
    assert market.inventory("buyer") == [item]
    assert market.listings() == []
    again = market.purchase_with_lock("buyer", item, "seller")
    assert (again.bought, again.reason) == (False, "gone")


def test_purchase_refuses_without_funds(market: Market) -> None:
    item = listed_item(market, price=500)
    assert market.purchase_with_lock("buyer", item, "seller").reason == "funds"
    assert market.purchase_with_watch("buyer", item, "seller").reason == "funds"
    assert market.funds("buyer") == 100


def test_a_buyer_whose_lock_expired_cannot_write(market: Market) -> None:
    item = listed_item(market)
    name = market.lock_name(item, "seller", fine_grained=True)
    slow = Lock(name, timeout=0.1, wait=0)
    assert slow.acquire()
    price, _ = market.quote("buyer", item, "seller")
    assert price is not None
    time.sleep(0.2)  # the slow buyer stalls after deciding; its lock expires
    market.create_user("fast", 100)
    fast = Lock(name, wait=0)
    assert fast.acquire()
    assert market.purchase_under_lock(fast, "fast", item, "seller").bought
    fast.release()
    late = market.complete_purchase(slow, "buyer", item, "seller", price, email_seller=True)
    assert (late.bought, late.reason, late.email_task_id) == (False, "stale lock", None)
    assert email_tasks(market.email_queue) == []
    assert market.funds("buyer") == 100
    assert market.inventory("fast") == [item]


def email_tasks(queue: str) -> list[dict]:
    """The task messages stored in ``queue``'s group, and the ids ready on ``queue``."""
    client = get_client()
    keys = QueueKeys.of(queue)
    ready = [task_id.decode() for task_id in client.zrange(keys.ready, 0, -1)]
    messages = [json.loads(body) for body in client.hvals(keys.messages)]
    return [{**message, "ready": message["id"] in ready} for message in messages]


@pytest.mark.django_db
def test_a_purchase_queues_the_sellers_email_in_the_same_script(
    market: Market, django_user_model, mailoutbox
) -> None:
    from django_rcoord.queues.worker import Worker

    django_user_model.objects.create_user("seller", "seller@example.com", "pw")
    item = listed_item(market)
    lock = Lock(market.lock_name(item, "seller", fine_grained=True), wait=0)
    assert lock.acquire()
    result = market.purchase_under_lock(lock, "buyer", item, "seller", email_seller=True)
    lock.release()
    assert result.bought
    assert result.email_task_id
    assert market.inventory("buyer") == [item]
    assert market.listings() == []
    # Exactly one e-mail, queued (ready) in the market's own queue group (one hash slot).
    assert market.email_queue == "test/email"
    (letter,) = email_tasks(market.email_queue)
    assert letter["id"] == result.email_task_id
    assert letter["ready"]
    assert (letter["task"], letter["args"]) == (
        "rcoord.send_sold_email",
        ["seller", item, 30, "buyer"],
    )
    # It is a task like any other: a worker on that queue sends it.
    Worker([market.email_queue], burst=True).run()
    (sent,) = mailoutbox
    assert sent.to == ["seller@example.com"]
    assert item in sent.body


def test_a_refused_purchase_queues_no_email(market: Market) -> None:
    item = listed_item(market, price=500)
    name = market.lock_name(item, "seller", fine_grained=True)
    # Too dear for the buyer; a price that is not the market's (the item changed). A stale
    # lock: test_a_buyer_whose_lock_expired_cannot_write.
    for price, reason in [(500, "funds"), (499, "gone")]:
        lock = Lock(name, wait=0)
        assert lock.acquire()
        result = market.complete_purchase(lock, "buyer", item, "seller", price, email_seller=True)
        lock.release()
        assert (result.bought, result.reason, result.email_task_id) == (False, reason, None)
    assert email_tasks(market.email_queue) == []
    assert market.listings() == [(item, "seller", 500)]
    assert market.funds("buyer") == 100


def test_a_purchase_whose_email_cannot_be_queued_is_not_written(market: Market) -> None:
    """Purchase and e-mail are one script: the e-mail fails, the purchase is not written
    (two round trips would have kept the purchase and lost the e-mail)."""
    item = listed_item(market)
    client = get_client()
    # A key of the e-mail queue's group holding something else (a wrong type).
    messages_key = QueueKeys.of(market.email_queue).messages
    client.set(messages_key, "not a hash")
    lock = Lock(market.lock_name(item, "seller", fine_grained=True), wait=0)
    assert lock.acquire()
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        market.purchase_under_lock(lock, "buyer", item, "seller", email_seller=True)
    lock.release()
    assert market.listings() == [(item, "seller", 30)]
    assert (market.funds("buyer"), market.funds("seller")) == (100, 0)
    assert market.inventory("buyer") == []
    assert market.inventory("seller") == []
    assert queue_stats(market.email_queue) == {"ready": 0, "in_flight": 0, "delayed": 0, "dead": 0}
    assert client.get(messages_key) == b"not a hash"


def test_the_email_queue_must_share_the_markets_hash_slot(market: Market) -> None:
    item = listed_item(market)
    market.email_queue = "email"  # the group "main": another slot than the market "test"
    lock = Lock(market.lock_name(item, "seller", fine_grained=True), wait=0)
    assert lock.acquire()
    with pytest.raises(ValueError, match="hash slot"):
        market.purchase_under_lock(lock, "buyer", item, "seller", email_seller=True)
    lock.release()
    assert market.listings() == [(item, "seller", 30)]


def buy_everything(market_name: str, buyer: str, method: str) -> int:
    market = Market(market_name)
    bought = 0
    for _ in range(200):
        rows = market.listings(limit=5)
        if not rows:
            break
        item_id, seller, _ = rows[0]
        if method == "watch":
            result = market.purchase_with_watch(buyer, item_id, seller)
        else:
            result = market.purchase_with_lock(buyer, item_id, seller)
        bought += result.bought
    return bought


@pytest.mark.parametrize("method", ["watch", "item-lock"])
def test_racing_buyer_processes_sell_each_item_once(method: str) -> None:
    market = Market("race")
    market.create_user("seller", 0)
    for index in range(4):
        market.create_user(f"buyer-{index}", 10_000)
    items = [market.new_item("seller") for _ in range(60)]
    for item in items:
        assert market.list_item(item, "seller", 10)
    counts = run_in_processes(
        buy_everything, [("race", f"buyer-{index}", method) for index in range(4)]
    )
    assert sum(counts) == 60
    owned = [item for index in range(4) for item in market.inventory(f"buyer-{index}")]
    assert sorted(owned) == sorted(items)
    assert market.funds("seller") == 600
    assert sum(market.funds(f"buyer-{index}") for index in range(4)) == 40_000 - 600


@pytest.mark.django_db
def test_market_pages_list_and_buy_with_the_item_lock(client, django_user_model) -> None:
    alice = django_user_model.objects.create_user("alice", password="pw")
    bob = django_user_model.objects.create_user("bob", password="pw")
    client.force_login(alice)
    page = client.get("/example/market/")
    assert page.status_code == 200
    teapot = next(item for item in page.context["inventory"] if item.startswith("teapot"))
    client.post("/example/market/list/", {"item": teapot, "price": "25"})
    assert Market("main").listings() == [(teapot, "alice", 25)]

    client.force_login(bob)
    member = f"{teapot}.alice"
    held = Lock(f"market:main:item:{member}", wait=0)
    assert held.acquire()
    busy = client.post(f"/example/market/buy/{member}/", follow=True)
    assert "Someone else is buying" in busy.content.decode()
    held.release()
    bought = client.post(f"/example/market/buy/{member}/", follow=True)
    assert f"You bought {teapot}" in bought.content.decode()
    assert teapot in bought.context["inventory"]
    assert bought.context["funds"] == 975
    assert Market("main").funds("alice") == 1025
    # The purchase queued the seller's sold-item e-mail: it waits on the queue "email"
    # (the one `rundemo`'s worker serves) for the email worker.
    (letter,) = email_tasks("email")
    assert letter["task"] == "rcoord.send_sold_email"
    assert letter["ready"]
    assert letter["args"] == ["alice", teapot, 25, "bob"]
    # GET is refused; an anonymous user is sent to sign in.
    assert client.get(f"/example/market/buy/{member}/").status_code == 405
    client.logout()
    assert client.post(f"/example/market/buy/{member}/").status_code == 302


def test_market_bench_command_prints_the_table(tmp_path: Path, redis_url: str) -> None:
    output = tmp_path / "bench.json"
    result = manage(
        "market_bench",
        "--duration",
        "2",  # each process times its own run: long enough to overlap on a busy machine
        "--configs",
        "1L1B",
        "--methods",
        "watch",
        "item-lock",
        "--json",
        str(output),
        env=example_env(tmp_path, **redis_setting(redis_url)),
    )
    assert result.returncode == 0, result.stderr
    assert "item-lock    1L1B" in result.stdout
    rows = json.loads(output.read_text())
    assert [(row["method"], row["listers"], row["buyers"]) for row in rows] == [
        ("watch", 1, 1),
        ("item-lock", 1, 1),
    ]
    assert all(row["listed"] > 0 and row["bought"] > 0 for row in rows)
    assert rows[1]["retries"] == 0


@pytest.mark.django_db(transaction=True)
def test_list_later_schedules_the_relisting_through_execute_later(
    client, django_user_model
) -> None:
    from django_rcoord.queues import queue_stats
    from django_rcoord.queues.delayed import poll_queue
    from django_rcoord.queues.worker import Worker

    alice = django_user_model.objects.create_user("alice", password="pw")
    client.force_login(alice)
    page = client.get("/example/market/")
    lantern = next(item for item in page.context["inventory"] if item.startswith("lantern"))
    client.post("/example/market/list-later/", {"item": lantern, "price": "12", "seconds": "1"})
    assert queue_stats("market")["delayed"] == 1
    assert Market("main").listings() == []
    time.sleep(1.05)
    assert poll_queue() == 1
    Worker(["market"], burst=True).run()
    assert Market("main").listings() == [(lantern, "alice", 12)]
    refused = client.post(
        "/example/market/list-later/",
        {"item": "not-mine", "price": "12", "seconds": "1"},
        follow=True,
    )
    assert "not in your inventory" in refused.content.decode()
