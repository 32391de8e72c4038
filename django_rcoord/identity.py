"""Who a request comes from, as the Django surface keys it.

One place for the middleware's ``"user"`` and ``"ip"`` scopes and the view
decorators' ``{user...}`` keys, so that they agree: a signed-in user is
``user:<pk>``, anyone else (anonymous, or no ``AuthenticationMiddleware``) is
``ip:<REMOTE_ADDR>``.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest


def client_ip(request: HttpRequest) -> str:
    """The client's address: ``REMOTE_ADDR`` (behind a proxy, set it from the forwarded one)."""
    return request.META.get("REMOTE_ADDR") or "unknown"


def is_signed_in(user: Any) -> bool:
    return user is not None and bool(getattr(user, "is_authenticated", False))


def requester(request: HttpRequest, user: Any) -> str:
    """``user:<pk>`` for a signed-in ``user``, else ``ip:<client address>``."""
    if is_signed_in(user):
        return f"user:{user.pk}"
    return f"ip:{client_ip(request)}"


def get_user(request: HttpRequest) -> Any:
    """``request.user``, or None without ``AuthenticationMiddleware``."""
    return getattr(request, "user", None)


async def aget_user(request: HttpRequest) -> Any:
    """The user for async code: ``await request.auser()``, never ``request.user`` on the loop."""
    auser = getattr(request, "auser", None)
    return await auser() if auser is not None else get_user(request)
