"""Views the tests mount in tests/urls.py."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connections, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.template import engines
from django.template.response import TemplateResponse
from django.utils.decorators import method_decorator
from django.views import View

from django_rcoord.connection import get_client
from django_rcoord.decorators import LockedRequest, locked, rate_limited
from django_rcoord.keys import KeySpace
from tests.models import Sale


def lock_is_held(name: str) -> bool:
    return bool(get_client().exists(KeySpace("lock", name).key("owner")))


def held_token(request: LockedRequest) -> int | None:
    """The fencing token of the lock a ``@locked`` view (not failing open) runs under."""
    assert request.rcoord_lock is not None
    return request.rcoord_lock.token


@locked("purchase:{item_id}", timeout=5)
def purchase(request: LockedRequest, item_id: int) -> HttpResponse:
    if request.GET.get("fail"):
        raise RuntimeError("the purchase failed")
    return JsonResponse(
        {
            "item": item_id,
            "held": lock_is_held(f"purchase:{item_id}"),
            "token": held_token(request),
        }
    )


@locked("profile:{user.pk}")
def profile(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"held": lock_is_held(f"profile:{request.user.pk}")})


@locked("purchase:{missing}")
def misconfigured(request: HttpRequest, item_id: int) -> HttpResponse:
    return HttpResponse("never")


@locked(
    lambda request, item_id: f"purchase:{item_id}",
    on_busy=lambda r: HttpResponse("later", status=423),
)
def custom_busy(request: HttpRequest, item_id: int) -> HttpResponse:
    return HttpResponse("ok")


@locked("purchase:{item_id}")
async def async_purchase(request: HttpRequest, item_id: int) -> HttpResponse:
    if request.GET.get("fail"):
        raise RuntimeError("the purchase failed")
    return JsonResponse({"item": item_id, "held": lock_is_held(f"purchase:{item_id}")})


@locked("note:{slug}")
def note(request: HttpRequest, slug: str) -> HttpResponse:
    return JsonResponse({"held": lock_is_held(f"note:{slug}")})


class PurchaseView(View):
    @method_decorator(locked("purchase:{item_id}"))
    def post(self, request: HttpRequest, item_id: int) -> HttpResponse:
        return JsonResponse({"item": item_id, "held": lock_is_held(f"purchase:{item_id}")})


class AsyncPurchaseView(View):
    @method_decorator(locked("purchase:{item_id}"))
    async def post(self, request: HttpRequest, item_id: int) -> HttpResponse:
        return JsonResponse({"item": item_id, "held": lock_is_held(f"purchase:{item_id}")})


# -- Redis unreachable, and decorators misapplied (tests/test_decorators.py) ----------
@locked("purchase:{item_id}", fail_open=True)
def purchase_fail_open(request: LockedRequest, item_id: int) -> HttpResponse:
    return JsonResponse({"locked": request.rcoord_lock is not None})


@locked("purchase:{item_id}", fail_open=True)
async def async_purchase_fail_open(request: LockedRequest, item_id: int) -> HttpResponse:
    return JsonResponse({"locked": request.rcoord_lock is not None})


@rate_limited("download:{user.pk}", limit=2, seconds=60, fail_open=False)
def download_strict(request: HttpRequest) -> HttpResponse:
    return HttpResponse("file")


@rate_limited("download:{user.pk}", limit=2, seconds=60, fail_open=False)
async def download_strict_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse("file")


@rate_limited("dl:{user}:{item_id}", limit=1, seconds=60)
def download_item(request: HttpRequest, item_id: str) -> HttpResponse:
    return HttpResponse(f"item {item_id}")


@rate_limited("dl:{user.username}:{item_id}", limit=1, seconds=60)
def download_item_by_username(request: HttpRequest, item_id: str) -> HttpResponse:
    return HttpResponse(f"item {item_id}")


#: Called inside the views below, while they hold their lock (a test sets it).
while_locked: list = []


@locked("outlive")
def outlive(request: HttpRequest) -> HttpResponse:
    for call in while_locked:
        call()
    return HttpResponse("done")


@locked("outlive")
async def outlive_async(request: HttpRequest) -> HttpResponse:
    for call in while_locked:
        call()
    return HttpResponse("done")


class MisdecoratedView(View):
    """Decorators applied to methods without method_decorator."""

    @locked("misdecorated")
    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("never")

    @rate_limited("misdecorated", limit=1, seconds=60)
    def post(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("never")


class AsyncMisdecoratedView(View):
    @locked("misdecorated")
    async def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("never")

    @rate_limited("misdecorated", limit=1, seconds=60)
    async def post(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("never")


# -- @locked and the request's transaction (tests/test_decorators.py) -----------------
#: What the selling views saw from their transaction.on_commit callbacks: one dict per
#: commit, {"item": id, "alias": database, "held": whether the item's lock was held}.
commits: list[dict] = []


def _record_commit(item_id: int, alias: str) -> None:
    commits.append({"item": item_id, "alias": alias, "held": lock_is_held(f"sale:{item_id}")})


def sell_once(request: HttpRequest, item_id: int) -> HttpResponse:
    """Sell the item unless it was sold: a read, then a write (one transaction under
    ATOMIC_REQUESTS). ``?fail=1`` raises after the write."""
    if Sale.objects.filter(item_id=item_id).exists():
        return JsonResponse({"sold": False}, status=409)
    Sale.objects.create(item_id=item_id, buyer=request.GET.get("buyer", "someone"))
    for alias in connections:
        if connections[alias].in_atomic_block:
            transaction.on_commit(functools.partial(_record_commit, item_id, alias), using=alias)
    if request.GET.get("fail"):
        raise RuntimeError("the sale failed")
    return JsonResponse({"sold": True})


@locked("sale:{item_id}", timeout=5, wait=5)
def sell(request: HttpRequest, item_id: int) -> HttpResponse:
    return sell_once(request, item_id)


@transaction.non_atomic_requests
@locked("sale:{item_id}", timeout=5)
def sell_autocommit(request: HttpRequest, item_id: int) -> HttpResponse:
    """Opted out of ATOMIC_REQUESTS: every query commits on its own."""
    return sell_once(request, item_id)


def _held_page(request: HttpRequest, item_id: int) -> TemplateResponse:
    """A TemplateResponse, rendered after the view returns; ``held`` is looked up then."""
    template = engines["django"].from_string("held={{ held }}")
    return TemplateResponse(request, template, {"held": lambda: lock_is_held(f"sale:{item_id}")})


@locked("sale:{item_id}")
def sale_page(request: HttpRequest, item_id: int) -> TemplateResponse:
    return _held_page(request, item_id)


@locked("sale:{item_id}")
async def async_sale_page(request: HttpRequest, item_id: int) -> TemplateResponse:
    return _held_page(request, item_id)


@sync_to_async
def _sell_in_a_transaction(request: HttpRequest, item_id: int) -> HttpResponse:
    with transaction.atomic():
        return sell_once(request, item_id)


# Under ATOMIC_REQUESTS, Django requires an async view to opt out: it has no async
# transactions. The view opens one of its own, in a thread.
@transaction.non_atomic_requests
@locked("sale:{item_id}")
async def async_sell(request: HttpRequest, item_id: int) -> HttpResponse:
    return await _sell_in_a_transaction(request, item_id)


class SellView(View):
    @method_decorator(locked("sale:{item_id}", timeout=5, wait=5))
    def post(self, request: HttpRequest, item_id: int) -> HttpResponse:
        return sell_once(request, item_id)


@method_decorator(locked("sale:{item_id}", timeout=5, wait=5), name="dispatch")
class SellDispatchView(View):
    def post(self, request: HttpRequest, item_id: int) -> HttpResponse:
        return sell_once(request, item_id)


class SellAutocommitView(View):
    """Opted out of ATOMIC_REQUESTS on ``dispatch``, locked on ``post``."""

    @transaction.non_atomic_requests
    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        return super().dispatch(request, *args, **kwargs)

    @method_decorator(locked("sale:{item_id}", timeout=5))
    def post(self, request: HttpRequest, item_id: int) -> HttpResponse:
        return sell_once(request, item_id)


# -- async under load (tests/test_async.py) -------------------------------------------
class Occupancy:
    """How many requests are inside a view at once, and the most ever seen."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.inside = 0
        self.most = 0
        self.entries = 0

    def reset(self) -> None:
        with self._lock:
            self.inside = self.most = self.entries = 0

    def __enter__(self) -> None:
        with self._lock:
            self.inside += 1
            self.entries += 1
            self.most = max(self.most, self.inside)

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.inside -= 1


hot_occupancy = Occupancy()
busy_occupancy = Occupancy()


@locked("hot", timeout=5, wait=60)
async def hot(request: LockedRequest) -> HttpResponse:
    with hot_occupancy:
        await asyncio.sleep(0.002)
    return JsonResponse({"token": held_token(request)})


async def busy_async(request: HttpRequest) -> HttpResponse:
    with busy_occupancy:
        await asyncio.sleep(0.002)
    return HttpResponse("done")


@locked("profile:{user.pk}")
async def profile_async(request: LockedRequest) -> HttpResponse:
    user = await request.auser()
    return JsonResponse({"user": user.get_username(), "token": held_token(request)})


@rate_limited("download:{user.pk}", limit=2, seconds=60)
async def download_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse("file")


# -- rate limits ------------------------------------------------------------------
@rate_limited("download:{user.pk}", limit=2, seconds=60)
def download(request: HttpRequest) -> HttpResponse:
    return HttpResponse("file")


@rate_limited(lambda request, name: f"greet:{name}", limit=1, seconds=60)
async def async_greet(request: HttpRequest, name: str) -> HttpResponse:
    return HttpResponse(f"hello {name}")


# -- concurrency limits ---------------------------------------------------------------
gate = threading.Event()
inside = threading.Semaphore(0)
async_gate: asyncio.Event | None = None


def slow(request: HttpRequest) -> HttpResponse:
    """Blocks until the test opens the gate (or sleeps ?sleep= seconds)."""
    if "sleep" in request.GET:
        time.sleep(float(request.GET["sleep"]))
    else:
        inside.release()
        gate.wait(30)
    if request.GET.get("fail"):
        raise RuntimeError("the view failed")
    return HttpResponse("done")


async def slow_async(request: HttpRequest) -> HttpResponse:
    if async_gate is not None:
        await async_gate.wait()
    if request.GET.get("fail"):
        raise RuntimeError("the view failed")
    return HttpResponse("done")


def streaming(request: HttpRequest) -> StreamingHttpResponse:
    return StreamingHttpResponse(f"chunk {index}\n" for index in range(3))


def streaming_async_body(request: HttpRequest) -> StreamingHttpResponse:
    """A sync view whose body is an async iterator."""

    async def chunks() -> AsyncIterator[str]:
        for index in range(3):
            yield f"chunk {index}\n"

    return StreamingHttpResponse(chunks())


def unlimited(request: HttpRequest) -> HttpResponse:
    return HttpResponse("free")


# -- two autocomplete widgets on one page -----------------------------------------------
def two_pickers(request: HttpRequest) -> HttpResponse:
    from django import forms
    from django.template import engines

    from django_rcoord.forms import GuildMemberField

    class PairForm(forms.Form):
        first = GuildMemberField(guild="adventurers")
        second = GuildMemberField(guild="adventurers")

    form = PairForm()
    page = engines["django"].from_string(
        "<!doctype html><html><head>{{ form.media }}</head><body>{{ form.as_p }}</body></html>"
    )
    return HttpResponse(page.render({"form": form}, request))


# -- the widget's media loaded twice, a long list ----------------------------------------
def both_media(request: HttpRequest) -> HttpResponse:
    """``{{ form.media }}`` and ``{% rcoord_autocomplete_media %}`` on one page (as the docs
    show), and a widget that lists up to 20 names (more than fit without scrolling)."""
    from django import forms
    from django.template import engines

    from django_rcoord.forms import GuildMemberField, GuildMemberWidget

    class MemberForm(forms.Form):
        member = GuildMemberField(
            guild="adventurers", widget=GuildMemberWidget(guild="adventurers", limit=20)
        )

    page = engines["django"].from_string(
        "{% load rcoord %}<!doctype html><html><head>{{ form.media }}"
        "{% rcoord_autocomplete_media %}</head><body>{{ form.as_p }}</body></html>"
    )
    return HttpResponse(page.render({"form": MemberForm()}, request))


@locked("counter:{name}", fair=False)
def bump_counter(request: LockedRequest, name: str) -> HttpResponse:
    assert request.rcoord_lock is not None
    return JsonResponse({"fair": request.rcoord_lock.fair, "token": held_token(request)})
