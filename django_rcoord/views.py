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
from django_rcoord.connection.errors import NO_REDIS
from django_rcoord.exceptions import InvalidName
from django_rcoord.keys import encode_name
from django_rcoord.responses import refused_unavailable
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
    ``{"guild", "query", "results": [...], "next": cursor or null}``.

    Always JSON: a bad parameter is a 400, Redis out of reach a 503 (as ``@locked``'s).
    """
    problem = _bad_parameter(request, guild)
    if problem is not None:
        return _private(_bad_request(problem))
    try:
        return _private(_search(request, guild))
    except NO_REDIS as exc:
        response = refused_unavailable(request, exc, what="Guild member search", always_json=True)
        return _private(response)


def _bad_parameter(request: HttpRequest, guild: str) -> str | None:
    """What is wrong with the request's guild or parameters, or None."""
    try:
        encode_name(guild)
    except InvalidName as exc:
        return f"guild: {exc}"
    unknown = sorted(set(request.GET) - PARAMETERS)
    if unknown and "q" not in request.GET:
        # ?prefix=ma would otherwise be a search for "" that lists the whole guild.
        return (
            f"unknown parameter {unknown[0]!r}: the query is q "
            f"(parameters: {', '.join(sorted(PARAMETERS))})"
        )
    for name in sorted(PARAMETERS):
        # ?q=a&q=b would otherwise search for the last one, silently.
        if len(request.GET.getlist(name)) > 1:
            return f"{name} must be given once (got {len(request.GET.getlist(name))})"
    query = request.GET.get("q", "")
    if "\ufffd" in query:  # what Django decodes bytes that are not UTF-8 to
        return "q must be UTF-8 (percent-encode its bytes)"
    if len(query) > MAX_QUERY_LENGTH:
        return f"q must be at most {MAX_QUERY_LENGTH} characters"
    if any(unicodedata.category(ch) in ("Cc", "Cs") for ch in query):
        return "q must not hold control characters"
    if _limit(request) is None:
        return f"limit must be an integer from 1 to {MAX_LIMIT}"
    return None


def _limit(request: HttpRequest) -> int | None:
    return parse_int_in(request.GET.get("limit", str(conf.AUTOCOMPLETE_LIMIT)), 1, MAX_LIMIT)


def _search(request: HttpRequest, guild: str) -> HttpResponse:
    """The page of results, once the parameters are known good (asks Redis)."""
    permission = import_string(conf.AUTOCOMPLETE_PERMISSION)
    if not permission(request, guild):
        return JsonResponse(
            {"error": "forbidden", "detail": "You may not search this guild."}, status=403
        )
    query = request.GET.get("q", "")
    limit = _limit(request)
    assert limit is not None  # checked by _bad_parameter
    try:
        results, cursor = autocomplete_page(
            guild, query, limit, after=request.GET.get("after") or None
        )
    except ValueError as exc:  # a malformed cursor, or one from another query
        return _bad_request(f"after: {exc}")
    return JsonResponse({"guild": guild, "query": query, "results": results, "next": cursor})
