"""Views the tests mount in tests/urls.py."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.decorators import method_decorator
from django.views import View

from django_rcoord.connection import get_client
from django_rcoord.decorators import locked
from django_rcoord.keys import KeySpace


def lock_is_held(name: str) -> bool:
    return bool(get_client().exists(KeySpace("lock", name).key("owner")))


@locked("purchase:{item_id}", timeout=5)
def purchase(request: HttpRequest, item_id: int) -> HttpResponse:
    if request.GET.get("fail"):
        raise RuntimeError("the purchase failed")
    return JsonResponse(
        {
            "item": item_id,
            "held": lock_is_held(f"purchase:{item_id}"),
            "token": request.rcoord_lock.token,
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
