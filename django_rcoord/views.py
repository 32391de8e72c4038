"""The guild-member autocomplete endpoint (JSON) and its default permission.

The operations endpoints (dashboard, metrics, stats) are in ``django_rcoord.ops``.
"""

from __future__ import annotations

import unicodedata

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.cache import patch_cache_control
from django.utils.module_loading import import_string
from django.views.decorators.http import require_GET

from django_rcoord.autocomplete import MAX_LIMIT, autocomplete_page, is_guild_member
from django_rcoord.conf import conf
from django_rcoord.exceptions import InvalidName
from django_rcoord.keys import encode_name
from django_rcoord.validation import parse_int_in

#: The view's parameters. Others are let through beside ``q`` (a client's cache buster);
#: without ``q`` they are a 400 that names ``q``.
PARAMETERS = frozenset({"q", "limit", "after"})

#: Longest query accepted, in characters.
MAX_QUERY_LENGTH = 100


def default_permission(request: HttpRequest, guild: str) -> bool:
    """Only an authenticated member of the guild may search it."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return False
    return is_guild_member(guild, user.get_username())


def _bad_request(message: str) -> JsonResponse:
    return JsonResponse({"error": "bad_request", "detail": message}, status=400)


def _private(response: HttpResponse) -> HttpResponse:
    patch_cache_control(response, private=True, max_age=0)
    return response


@require_GET
def guild_members(request: HttpRequest, guild: str) -> HttpResponse:
    """``GET ?q=<prefix>&limit=<n>&after=<cursor>`` ->
    ``{"guild", "query", "results": [...], "next": cursor or null}``."""
    try:
        encode_name(guild)
    except InvalidName as exc:
        return _private(_bad_request(f"guild: {exc}"))
    unknown = sorted(set(request.GET) - PARAMETERS)
    if unknown and "q" not in request.GET:
        # ?prefix=ma would otherwise be a search for "" that lists the whole guild.
        return _private(
            _bad_request(
                f"unknown parameter {unknown[0]!r}: the query is q "
                f"(parameters: {', '.join(sorted(PARAMETERS))})"
            )
        )
    query = request.GET.get("q", "")
    if "\ufffd" in query:  # what Django decodes bytes that are not UTF-8 to
        return _private(_bad_request("q must be UTF-8 (percent-encode its bytes)"))
    if len(query) > MAX_QUERY_LENGTH:
        return _private(_bad_request(f"q must be at most {MAX_QUERY_LENGTH} characters"))
    if any(unicodedata.category(ch) in ("Cc", "Cs") for ch in query):
        return _private(_bad_request("q must not hold control characters"))
    limit = parse_int_in(request.GET.get("limit", str(conf.AUTOCOMPLETE_LIMIT)), 1, MAX_LIMIT)
    if limit is None:
        return _private(_bad_request(f"limit must be an integer from 1 to {MAX_LIMIT}"))
    permission = import_string(conf.AUTOCOMPLETE_PERMISSION)
    if not permission(request, guild):
        return _private(
            JsonResponse(
                {"error": "forbidden", "detail": "You may not search this guild."}, status=403
            )
        )
    try:
        results, cursor = autocomplete_page(
            guild, query, limit, after=request.GET.get("after") or None
        )
    except ValueError as exc:  # a malformed cursor, or one from another query
        return _private(_bad_request(f"after: {exc}"))
    return _private(
        JsonResponse({"guild": guild, "query": query, "results": results, "next": cursor})
    )
