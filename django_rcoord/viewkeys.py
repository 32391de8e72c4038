"""What the view decorators share: the names their ``key`` gives a request (a format
string of the view's URL arguments and ``user``, or a callable), and their argument
checks."""

from __future__ import annotations

import inspect
import re
import string
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest

from django_rcoord.identity import aget_user, client_ip, get_user, is_signed_in, requester

KeyTemplate = str | Callable[..., Any]


def check_request(request: Any, decorator: str) -> None:
    # As Django's own view decorators do: on a method without method_decorator, the
    # first argument is ``self``.
    if not hasattr(request, "META"):
        raise TypeError(
            f"{decorator} didn't receive an HttpRequest. If you are decorating a method, "
            "be sure to use @method_decorator."
        )


def check_fail_open(fail_open: object, decorator: str) -> None:
    if not isinstance(fail_open, bool):
        raise ImproperlyConfigured(f"{decorator}: fail_open must be True or False.")


def _escape_key_value(text: str) -> str:
    """A value filled into a key template, with ``%`` and ``:`` escaped: a URL argument or
    a user's field cannot spell the separators of the template around it (a user named
    ``ip`` asking for item ``127.0.0.1:x`` of ``"dl:{user.username}:{item_id}"`` would
    otherwise share an anonymous visitor's key). Values without either are unchanged."""
    return text.replace("%", "%25").replace(":", "%3A")


class _SignedInUser:
    """``user`` in a key template when someone is signed in: ``{user}`` is ``user:<pk>``
    (the middleware's "user" scope's name; never the username, which anyone may choose to
    read like another key's), and every attribute is the user's own (``{user.pk}``)."""

    def __init__(self, user: Any, requester: str) -> None:
        self._user = user
        self._requester = requester

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._user, name)

    def __getitem__(self, key: Any) -> Any:
        return self._user[key]


class _AnonymousUser:
    """``user`` in a key template when nobody is signed in: every ``{user...}`` field is
    ``ip:<client address>``, so anonymous clients are keyed apart, as the middleware's
    "user" scope keys them, instead of sharing one ``None`` key."""

    def __init__(self, requester: str) -> None:
        self._requester = requester

    def __getattr__(self, name: str) -> _AnonymousUser:
        if name.startswith("__"):
            raise AttributeError(name)
        return self

    def __getitem__(self, key: object) -> _AnonymousUser:
        return self


class _KeyFormatter(string.Formatter):
    """``str.format`` for key templates: each value filled in is escaped
    (``_escape_key_value``), except the requester that ``{user}`` stands for (``user:<pk>``
    or ``ip:<address>``, whose one ``:`` is the project's own), whatever its conversion."""

    def convert_field(self, value: Any, conversion: str | None) -> Any:
        if isinstance(value, (_SignedInUser, _AnonymousUser)):
            return value
        return super().convert_field(value, conversion)

    def format_field(self, value: Any, format_spec: str) -> str:
        if isinstance(value, (_SignedInUser, _AnonymousUser)):
            return format(value._requester, format_spec)
        return _escape_key_value(format(value, format_spec))


_key_formatter = _KeyFormatter()


class KeyFunction:
    """Turns a decorator's ``key`` into the name for one request.

    A format string is filled from the URL arguments and ``user``; the user is
    loaded only when the template names it, with ``await request.auser()`` on
    async views, and stands for the client's IP when nobody is signed in. A
    callable gets ``(request, *args, **kwargs)``; on async views it may be a
    coroutine function.
    """

    def __init__(self, key: KeyTemplate, view: Callable[..., Any], decorator: str) -> None:
        self.key = key
        self.decorator = decorator
        self.view_name = f"{view.__module__}.{getattr(view, '__qualname__', view)}"
        self.uses_user = False
        if callable(key):
            return
        if not isinstance(key, str) or not key:
            raise ImproperlyConfigured(
                f"{decorator} on {self.view_name}: key must be a str or a callable."
            )
        try:
            fields = [field for _, field, _, _ in string.Formatter().parse(key) if field]
        except ValueError as exc:
            raise ImproperlyConfigured(
                f"{decorator} key {key!r} on {self.view_name}: {exc}"
            ) from exc
        self.uses_user = any(re.match(r"user\b", field) for field in fields)

    def __call__(self, request: HttpRequest, args: tuple, kwargs: dict, user: Any) -> Any:
        """The name (or, from an async callable, an awaitable of it)."""
        if callable(self.key):
            return self.key(request, *args, **kwargs)
        if self.uses_user:
            if is_signed_in(user):
                user = _SignedInUser(user, requester(request, user))
            else:
                user = _AnonymousUser(f"ip:{_escape_key_value(client_ip(request))}")
        try:
            return _key_formatter.vformat(self.key, args, {"user": user, **kwargs})
        except (KeyError, IndexError, AttributeError) as exc:
            raise ImproperlyConfigured(
                f"{self.decorator} key {self.key!r} on view {self.view_name} names {exc}, which "
                f"the view does not get (URL kwargs: {sorted(kwargs)}; 'user' is request.user)."
            ) from exc

    def sync_name(self, request: HttpRequest, args: tuple, kwargs: dict) -> str:
        user = get_user(request) if self.uses_user else None
        return self(request, args, kwargs, user)

    async def async_name(self, request: HttpRequest, args: tuple, kwargs: dict) -> str:
        user = await aget_user(request) if self.uses_user else None
        name = self(request, args, kwargs, user)
        return await name if inspect.isawaitable(name) else name
