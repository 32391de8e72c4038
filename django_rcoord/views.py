"""Views for machines: guild-member autocomplete (JSON), Prometheus metrics and JSON stats
(behind ``RCOORD["METRICS_TOKEN"]``)."""

from __future__ import annotations

import importlib.util
import unicodedata

from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.utils.cache import patch_cache_control
from django.utils.crypto import constant_time_compare
from django.utils.module_loading import import_string
from django.views.decorators.http import require_GET

from django_rcoord.autocomplete import MAX_LIMIT, autocomplete_page, is_guild_member
from django_rcoord.conf import conf
from django_rcoord.connection import REDIS_UNAVAILABLE
from django_rcoord.exceptions import InvalidName
from django_rcoord.keys import encode_name

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
    query = request.GET.get("q", "")
    if len(query) > MAX_QUERY_LENGTH:
        return _private(_bad_request(f"q must be at most {MAX_QUERY_LENGTH} characters"))
    if any(unicodedata.category(ch) in ("Cc", "Cs") for ch in query):
        return _private(_bad_request("q must not hold control characters"))
    raw_limit = request.GET.get("limit", str(conf.AUTOCOMPLETE_LIMIT))
    if not raw_limit.isascii() or not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_LIMIT:
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
            guild, query, int(raw_limit), after=request.GET.get("after") or None
        )
    except ValueError as exc:  # a malformed cursor, or one from another query
        return _private(_bad_request(f"after: {exc}"))
    return _private(
        JsonResponse({"guild": guild, "query": query, "results": results, "next": cursor})
    )


# -- operations: metrics and stats -------------------------------------------------------
def _refused(request: HttpRequest) -> HttpResponse | None:
    """404 while no METRICS_TOKEN is set (the endpoints are off); 403 unless the request
    carries ``Authorization: Bearer <METRICS_TOKEN>``."""
    token = conf.METRICS_TOKEN
    if not token:
        raise Http404("No RCOORD['METRICS_TOKEN'] is set.")
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and constant_time_compare(given.strip(), token):
        return None
    return _private(
        JsonResponse(
            {"error": "forbidden", "detail": "Send Authorization: Bearer <METRICS_TOKEN>."},
            status=403,
        )
    )


def _unavailable(exc: Exception) -> HttpResponse:
    return _private(
        JsonResponse(
            {"error": "redis_unavailable", "detail": f"Redis is unreachable: {exc}"}, status=503
        )
    )


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus text exposition of the queues, workers, task outcomes and run times."""
    refused = _refused(request)
    if refused is not None:
        return refused
    if importlib.util.find_spec("prometheus_client") is None:
        return _private(
            JsonResponse(
                {
                    "error": "not_implemented",
                    "detail": "prometheus-client is not installed: "
                    'pip install "django-rcoord[metrics]"',
                },
                status=501,
            )
        )
    from django_rcoord.prometheus import prometheus_exposition

    try:
        body, content_type = prometheus_exposition(request.headers.get("Accept", ""))
    except REDIS_UNAVAILABLE as exc:
        return _unavailable(exc)
    return _private(HttpResponse(body, content_type=content_type))


@require_GET
def stats(request: HttpRequest) -> HttpResponse:
    """The dashboard's numbers as JSON (``rcoord_status --json`` prints the same document)."""
    refused = _refused(request)
    if refused is not None:
        return refused
    from django_rcoord.status import overview

    try:
        return _private(JsonResponse(overview()))
    except REDIS_UNAVAILABLE as exc:
        return _unavailable(exc)
