"""System checks of ConcurrencyLimitMiddleware's rules and its place in MIDDLEWARE."""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning
from django.urls import URLPattern, URLResolver, get_resolver
from django.urls.resolvers import ResolverMatch

from django_rcoord.conf import DEFAULTS
from django_rcoord.semaphores.rules import RULE_KEYS, rule_problems

MIDDLEWARE_PATH = "django_rcoord.middleware.ConcurrencyLimitMiddleware"
AUTH_MIDDLEWARE_PATH = "django.contrib.auth.middleware.AuthenticationMiddleware"

HINTS = {
    "rcoord.E008": "CONCURRENCY_LIMITS is a list of dicts, each with a unique 'name'; "
    f"rule keys: {', '.join(RULE_KEYS)}.",
    "rcoord.E009": "Give each rule 'path' (a regex searched in request.path_info) "
    "and/or 'url_names' (a list of URL names, namespaced as 'ns:name').",
    "rcoord.E010": "For example {'limit': 10, 'timeout': 30, 'wait': 0, 'scope': 'global', "
    "'fail_open': True, 'max_hold': 300}.",
}


def check_concurrency_limits(user: Mapping[str, Any], **kwargs: Any) -> list[CheckMessage]:
    """CONCURRENCY_LIMITS' rules (rcoord.E008-E010), their URL names (W006) and the
    middleware's place (W001, E011)."""
    raw = user.get("CONCURRENCY_LIMITS", DEFAULTS["CONCURRENCY_LIMITS"])
    errors: list[CheckMessage] = [
        Error(f"settings.RCOORD: {message}.", hint=HINTS[check_id], id=check_id)
        for check_id, message in rule_problems(raw)
    ]
    if errors or not raw or not isinstance(raw, (list, tuple)):  # the check narrows the type
        return errors
    errors.extend(_unknown_url_names(raw))
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


def _unknown_url_names(rules: Sequence[Mapping[str, Any]]) -> list[CheckMessage]:
    """rcoord.W006: a rule's ``url_names`` entry that no URL of ROOT_URLCONF answers to, so
    the rule never matches by it (a typo). A warning, not an error: a project may resolve
    some requests with a URLconf of their own (``request.urlconf``), which no check sees."""
    wanted = [name for rule in rules for name in rule.get("url_names") or ()]
    if not wanted:
        return []
    try:
        known = set(url_names())
    # No URLconf, or one that fails to import: Django's own checks (urls.*) report that.
    except Exception:  # noqa: BLE001
        return []
    messages: list[CheckMessage] = []
    for index, rule in enumerate(rules):
        for name in rule.get("url_names") or ():
            if name in known:
                continue
            close = difflib.get_close_matches(name, known, n=1)
            messages.append(
                Warning(
                    f"settings.RCOORD: CONCURRENCY_LIMITS[{index}] ({rule['name']!r}) names "
                    f"the URL {name!r}, which no URL in ROOT_URLCONF has: the rule never "
                    "matches by it.",
                    hint=(f"Did you mean {close[0]!r}? " if close else "")
                    + "A url_names entry is a URL's name ('report') or its namespaced name "
                    "('ns:report'), as in {% url %}.",
                    id="rcoord.W006",
                )
            )
    return messages


def url_names(
    resolver: URLResolver | None = None, namespaces: tuple[str, ...] = ()
) -> Iterator[str]:
    """Every name a rule's ``url_names`` can match in the URLconf (``resolver``, default
    ROOT_URLCONF's): each URL's name and its full view name (its namespaces, then its name
    or its view's dotted path), the two the middleware compares a request's match with."""
    for pattern in (resolver or get_resolver()).url_patterns:
        if isinstance(pattern, URLResolver):
            inner = (*namespaces, pattern.namespace) if pattern.namespace else namespaces
            yield from url_names(pattern, inner)
        elif isinstance(pattern, URLPattern):
            if pattern.name:
                yield pattern.name
            match = ResolverMatch(pattern.callback, (), {}, pattern.name, [], list(namespaces))
            yield match.view_name
