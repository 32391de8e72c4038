"""Error responses shared by the Django surface: JSON for JSON clients, a page otherwise.

Pages are rendered from ``django_rcoord/errors/<status>.html`` (each extends
``django_rcoord/errors/base.html``, which also serves other statuses), found by
the project's template loaders, so a project overrides them like any app's
templates.
"""

from __future__ import annotations

import functools
import logging
import math
from pathlib import Path

from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template import Context, Engine, TemplateDoesNotExist, loader
from django.utils.http import url_has_allowed_host_and_scheme

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
    always_json: bool = False,
) -> HttpResponse:
    """An error response with a machine-readable ``code`` and, if given, ``Retry-After``:
    JSON for JSON clients (for everyone with ``always_json``: an endpoint of JSON), else a
    page."""
    body: dict[str, object] = {"error": code, "detail": message}
    if retry_after is not None:
        seconds = max(1, math.ceil(retry_after))
        body["retry_after"] = seconds
    if always_json or wants_json(request):
        response: HttpResponse = JsonResponse(body, status=status)
    else:
        response = HttpResponse(error_page(request, status, body), status=status)
    if retry_after is not None:
        response["Retry-After"] = str(body["retry_after"])
    response["Cache-Control"] = "no-store"
    return response


def unavailable(
    request: HttpRequest,
    exc: BaseException,
    *,
    fail_open: bool,
    what: str,
    always_json: bool = False,
) -> HttpResponse | None:
    """Redis could not be asked about ``what``: None serves the request without it (fail
    open), else a 503 with ``Retry-After``. Either way an error is logged."""
    if fail_open:
        logger.error("%s not applied: Redis unavailable: %s", what, exc)
        return None
    return refused_unavailable(request, exc, what=what, always_json=always_json)


def refused_unavailable(
    request: HttpRequest, exc: BaseException, *, what: str, always_json: bool = False
) -> HttpResponse:
    """The 503 ``unavailable`` (with ``Retry-After``) of a surface that cannot serve the
    request without Redis (``what``: the surface, for the ERROR line logged)."""
    logger.error("%s refused a request: Redis unavailable: %s", what, exc)
    return error_response(
        request,
        503,
        "unavailable",
        "This service is temporarily unavailable; try again shortly.",
        retry_after=UNAVAILABLE_RETRY_AFTER,
        always_json=always_json,
    )


def error_page(request: HttpRequest, status: int, body: dict[str, object]) -> str:
    """The HTML page of an error response (``body`` is its JSON form)."""
    names = [f"django_rcoord/errors/{status}.html", "django_rcoord/errors/base.html"]
    context = {
        "status": status,
        "error": body["error"],
        "detail": body["detail"],
        "retry_after": body.get("retry_after"),
        "back_url": _back_url(request),
        "retry_url": _retry_url(request),
    }
    try:
        return loader.render_to_string(names, context, request=request)
    except TemplateDoesNotExist:
        # The project's TEMPLATES do not look in installed apps: the app's own copies.
        return _own_templates().select_template(names).render(Context(context))


def _retry_url(request: HttpRequest) -> str | None:
    """The page itself, as a path of this site, for a GET; None otherwise.

    Repeating a GET is safe; a form is sent again by the user, not by a link.
    The requested path is the client's to choose: ``//evil.example/x`` as a link
    is protocol-relative (another site), and an ASGI path need not even start
    with a slash. Leading slashes (and backslashes, which browsers read as
    slashes) are made one, so the link always stays on this site.
    """
    if request.method not in ("GET", "HEAD"):
        return None
    url = "/" + request.get_full_path().lstrip("/\\")
    if not url_has_allowed_host_and_scheme(url, allowed_hosts=None):
        return None
    return url


def _back_url(request: HttpRequest) -> str:
    """The referring page when it is on this site, else the site's root."""
    referer = request.META.get("HTTP_REFERER", "")
    try:
        host = request.get_host()
    except DisallowedHost:
        return "/"
    if referer and url_has_allowed_host_and_scheme(
        referer, allowed_hosts={host}, require_https=request.is_secure()
    ):
        return referer
    return "/"


@functools.cache
def _own_templates() -> Engine:
    return Engine(
        dirs=[str(Path(__file__).resolve().parent / "templates")],
        libraries={"i18n": "django.templatetags.i18n"},
    )
