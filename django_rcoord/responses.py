"""Error responses shared by the Django surface: JSON for JSON clients, a small page otherwise."""

from __future__ import annotations

import logging
import math

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.html import format_html

logger = logging.getLogger(__name__)

#: Seconds a client is asked to wait when Redis cannot be reached and the request is refused.
UNAVAILABLE_RETRY_AFTER = 5


def wants_json(request: HttpRequest) -> bool:
    """True for requests that send JSON or prefer it to HTML."""
    if request.content_type == "application/json":
        return True
    return request.accepts("application/json") and not request.accepts("text/html")


def error_response(
    request: HttpRequest,
    status: int,
    code: str,
    message: str,
    *,
    retry_after: float | None = None,
) -> HttpResponse:
    """An error response with a machine-readable ``code`` and, if given, ``Retry-After``."""
    body: dict[str, object] = {"error": code, "detail": message}
    if retry_after is not None:
        seconds = max(1, math.ceil(retry_after))
        body["retry_after"] = seconds
    if wants_json(request):
        response: HttpResponse = JsonResponse(body, status=status)
    else:
        response = HttpResponse(
            format_html(
                '<!doctype html><html lang="en"><head><meta charset="utf-8">'
                "<title>{} {}</title></head><body><h1>{}</h1><p>{}</p></body></html>",
                status,
                code,
                code.replace("_", " ").capitalize(),
                message,
            ),
            status=status,
        )
    if retry_after is not None:
        response["Retry-After"] = str(body["retry_after"])
    response["Cache-Control"] = "no-store"
    return response


def unavailable(
    request: HttpRequest, exc: BaseException, *, fail_open: bool, what: str
) -> HttpResponse | None:
    """Redis could not be asked about ``what``: None serves the request without it (fail
    open), else a 503 with ``Retry-After``. Either way an error is logged."""
    if fail_open:
        logger.error("%s not applied: Redis unavailable: %s", what, exc)
        return None
    logger.error("%s refused a request: Redis unavailable: %s", what, exc)
    return error_response(
        request,
        503,
        "unavailable",
        "This service is temporarily unavailable; try again shortly.",
        retry_after=UNAVAILABLE_RETRY_AFTER,
    )
