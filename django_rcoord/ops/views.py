"""Views for machines: Prometheus metrics and JSON stats, behind ``RCOORD["METRICS_TOKEN"]``."""

from __future__ import annotations

import importlib.util

from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.utils.cache import patch_cache_control
from django.utils.crypto import constant_time_compare
from django.views.decorators.http import require_GET

from django_rcoord.conf import conf
from django_rcoord.connection.errors import REDIS_UNAVAILABLE
from django_rcoord.ops.status import overview
from django_rcoord.responses import refused_unavailable


def _private(response: HttpResponse) -> HttpResponse:
    patch_cache_control(response, private=True, max_age=0)
    return response


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


def _unavailable(request: HttpRequest, exc: Exception, what: str) -> HttpResponse:
    """The 503 every surface answers with Redis out of reach (JSON, as all of these)."""
    return _private(refused_unavailable(request, exc, what=what, always_json=True))


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
    from django_rcoord.ops.prometheus import prometheus_exposition

    try:
        body, content_type = prometheus_exposition(request.headers.get("Accept", ""))
    except REDIS_UNAVAILABLE as exc:
        return _unavailable(request, exc, "rcoord metrics")
    return _private(HttpResponse(body, content_type=content_type))


@require_GET
def stats(request: HttpRequest) -> HttpResponse:
    """The dashboard's numbers as JSON (``rcoord_status --json`` prints the same document)."""
    refused = _refused(request)
    if refused is not None:
        return refused

    try:
        return _private(JsonResponse(overview()))
    except REDIS_UNAVAILABLE as exc:
        return _unavailable(request, exc, "rcoord stats")
