"""System checks of ConcurrencyLimitMiddleware's rules and its place in MIDDLEWARE."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning

from django_rcoord.conf import DEFAULTS
from django_rcoord.semaphores.rules import rule_problems

MIDDLEWARE_PATH = "django_rcoord.middleware.ConcurrencyLimitMiddleware"
AUTH_MIDDLEWARE_PATH = "django.contrib.auth.middleware.AuthenticationMiddleware"


def check_concurrency_limits(user: Mapping[str, Any], **kwargs: Any) -> list[CheckMessage]:
    """CONCURRENCY_LIMITS' rules (rcoord.E008-E010) and the middleware's place (W001, E011)."""
    raw = user.get("CONCURRENCY_LIMITS", DEFAULTS["CONCURRENCY_LIMITS"])

    hints = {
        "rcoord.E008": "CONCURRENCY_LIMITS is a list of dicts, each with a unique 'name'; "
        "rule keys: name, path, url_names, limit, timeout, wait, scope, fail_open.",
        "rcoord.E009": "Give each rule 'path' (a regex searched in request.path_info) "
        "and/or 'url_names' (a list of URL names, namespaced as 'ns:name').",
        "rcoord.E010": "For example {'limit': 10, 'timeout': 30, 'wait': 0, 'scope': 'global', "
        "'fail_open': True}.",
    }
    errors: list[CheckMessage] = [
        Error(f"settings.RCOORD: {message}.", hint=hints[check_id], id=check_id)
        for check_id, message in rule_problems(raw)
    ]
    if errors or not raw or not isinstance(raw, (list, tuple)):  # the check narrows the type
        return errors
    middleware = list(getattr(settings, "MIDDLEWARE", []))
    if MIDDLEWARE_PATH not in middleware:
        errors.append(
            Warning(
                "RCOORD['CONCURRENCY_LIMITS'] has rules, but ConcurrencyLimitMiddleware is not "
                "in MIDDLEWARE, so none is applied.",
                hint=f'Add "{MIDDLEWARE_PATH}" to MIDDLEWARE.',
                id="rcoord.W001",
            )
        )
    elif any(rule.get("scope") == "user" for rule in raw) and (
        AUTH_MIDDLEWARE_PATH not in middleware
        or middleware.index(AUTH_MIDDLEWARE_PATH) > middleware.index(MIDDLEWARE_PATH)
    ):
        errors.append(
            Error(
                "A CONCURRENCY_LIMITS rule has scope 'user', but ConcurrencyLimitMiddleware "
                "comes before AuthenticationMiddleware (or it is missing), so request.user is "
                "not known to it.",
                hint="Put ConcurrencyLimitMiddleware after AuthenticationMiddleware.",
                id="rcoord.E011",
            )
        )
    return errors
