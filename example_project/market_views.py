"""Marketplace pages: list an item, buy one. Buying holds a per-item lock (``@locked``)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from django_rcoord.decorators import LockedRequest, locked
from django_rcoord.queues import execute_later
from example_project.market import Market
from example_project.views import needs_redis

STARTING_FUNDS = 1000
STARTER_ITEMS = ("teapot", "lantern", "compass")

market = Market("main")


def _ensure_trader(username: str) -> None:
    """Give a user who has never traded some funds and a few things to sell."""
    if not market.client.exists(market.user_key(username)):
        market.create_user(username, STARTING_FUNDS)
        for label in STARTER_ITEMS:
            market.new_item(username, label)


@login_required
@needs_redis
def market_home(request: HttpRequest) -> HttpResponse:
    username = request.user.get_username()
    _ensure_trader(username)
    context = {
        "funds": market.funds(username),
        "inventory": market.inventory(username),
        "listings": market.listings(),
    }
    return render(request, "example/market.html", context)


@require_POST
@login_required
@needs_redis
def list_item(request: HttpRequest) -> HttpResponse:
    username = request.user.get_username()
    item_id = request.POST.get("item", "")
    try:
        price = int(request.POST.get("price", ""))
    except ValueError:
        price = 0
    if not 1 <= price <= 1_000_000:
        messages.error(request, "The price must be a whole number from 1 to 1,000,000.")
    elif market.list_item(item_id, username, price):
        messages.success(request, f"{item_id} is on the market for {price}.")
    else:
        messages.error(request, f"{item_id} is not in your inventory.")
    return redirect("market")


@require_POST
@login_required
@needs_redis
def list_later(request: HttpRequest) -> HttpResponse:
    """List an item in N seconds: a delayed task, promoted by `manage.py poll_delayed`."""
    username = request.user.get_username()
    item_id = request.POST.get("item", "")
    try:
        price, seconds = int(request.POST.get("price", "")), int(request.POST.get("seconds", ""))
    except ValueError:
        price = seconds = 0
    if not 1 <= price <= 1_000_000 or not 1 <= seconds <= 3600:
        messages.error(request, "Give a price from 1 to 1,000,000 and 1 to 3600 seconds.")
    elif item_id not in market.inventory(username):
        messages.error(request, f"{item_id} is not in your inventory.")
    else:
        execute_later("market", "example.relist_item", [item_id, username, price], delay=seconds)
        messages.success(request, f"{item_id} goes on the market in {seconds} seconds.")
    return redirect("market")


def _busy(request: HttpRequest) -> HttpResponse:
    messages.warning(request, "Someone else is buying that item right now; try again.")
    return redirect("market")


@require_POST
@login_required
@needs_redis  # @locked answers for its lock; this for the market's own reads and writes
@locked("market:main:item:{member}", timeout=10, wait=2, on_busy=_busy)
def buy_item(request: LockedRequest, member: str) -> HttpResponse:
    item_id, _, seller = member.partition(".")
    buyer = request.user.get_username()
    if seller == buyer:
        messages.error(request, "That is your own item.")
        return redirect("market")
    _ensure_trader(buyer)
    # The write checks this lock's fencing token, so a purchase whose lock
    # expired mid-way cannot overwrite the next holder's decision. The same script
    # queues the seller's e-mail (`manage.py run_email_worker` sends it): a crash
    # cannot leave a purchase without its e-mail.
    lock = request.rcoord_lock
    assert lock is not None  # not fail_open: the view runs only under the lock
    result = market.purchase_under_lock(lock, buyer, item_id, seller, email_seller=True)
    if result.bought:
        messages.success(request, f"You bought {item_id} from {seller}.")
    else:
        explanations = {
            "gone": "That item is no longer on the market.",
            "funds": "You cannot afford that item.",
            "stale lock": "Your purchase took too long and was cancelled; try again.",
        }
        messages.error(request, explanations[result.reason])
    return redirect("market")
