"""The rules of ``ConcurrencyLimitMiddleware``: ``RCOORD["CONCURRENCY_LIMITS"]`` checked
(``rule_problems``, for the system checks) and compiled (``load_rules``, for the middleware).

Each rule is a dict: ``name``, ``path`` (a regex searched in ``request.path_info``) and/or
``url_names``, ``limit``, ``timeout``, ``wait`` (default 0), ``scope`` ("global", "user" or
"ip"), ``fail_open`` (default True) and ``max_hold`` (seconds; default None).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest

from django_rcoord.exceptions import InvalidName
from django_rcoord.identity import client_ip, requester
from django_rcoord.semaphores.semaphore import Semaphore
from django_rcoord.validation import is_number, is_positive_int, named_dicts

#: A rule's keys, in the order the docs give them: the one list (unknown keys, hints).
RULE_KEYS = (
    "name",
    "path",
    "url_names",
    "limit",
    "timeout",
    "wait",
    "scope",
    "fail_open",
    "max_hold",
)
SCOPES = ("global", "user", "ip")


@dataclass(frozen=True)
class ConcurrencyRule:
    name: str
    path: re.Pattern[str] | None
    url_names: frozenset[str]
    limit: int
    timeout: float
    wait: float
    scope: str
    fail_open: bool
    max_hold: float | None = None

    def covers(self, request: HttpRequest, view_names: Sequence[str]) -> bool:
        if self.path is not None and self.path.search(request.path_info):
            return True
        return any(name in self.url_names for name in view_names)

    def semaphore_for(self, request: HttpRequest, user: Any = None) -> Semaphore:
        """The rule's semaphore for ``request``; ``user`` is its user for a "user" rule."""
        if self.scope == "global":
            name = self.name
        elif self.scope == "user":  # anonymous users by IP
            name = f"{self.name}:{requester(request, user)}"
        else:
            name = f"{self.name}:ip:{client_ip(request)}"
        return Semaphore(name, self.limit, timeout=self.timeout)


def rule_problems(raw: object) -> list[tuple[str, str]]:
    """(check id, message) for each problem of a CONCURRENCY_LIMITS value; [] when valid."""
    entries, problems = named_dicts(raw, frozenset(RULE_KEYS), "rcoord.E008", "CONCURRENCY_LIMITS")
    for where, rule, name in entries:
        if name is not None:
            try:
                Semaphore(name, 1)
            except InvalidName as exc:
                problems.append(("rcoord.E008", f"{where}: the name is not usable: {exc}"))
        path, url_names = rule.get("path"), rule.get("url_names")
        if path is None and url_names is None:
            problems.append(("rcoord.E009", f"{where} needs 'path' (a regex) or 'url_names'"))
        if path is not None:
            try:
                re.compile(path)
            except (re.error, TypeError) as exc:
                problems.append(("rcoord.E009", f"{where}: 'path' is not a valid regex: {exc}"))
        if url_names is not None and (
            not isinstance(url_names, (list, tuple))
            or not all(isinstance(item, str) and item for item in url_names)
        ):
            problems.append(("rcoord.E009", f"{where}: 'url_names' must be a list of URL names"))
        limit = rule.get("limit")
        if not is_positive_int(limit):
            problems.append(("rcoord.E010", f"{where}: 'limit' must be a positive int"))
        if not is_number(rule.get("timeout")) or not rule["timeout"] > 0:
            problems.append(("rcoord.E010", f"{where}: 'timeout' must be a positive number"))
        if not is_number(rule.get("wait", 0)) or rule.get("wait", 0) < 0:
            problems.append(("rcoord.E010", f"{where}: 'wait' must be a number >= 0"))
        if rule.get("scope", "global") not in SCOPES:
            problems.append(("rcoord.E010", f"{where}: 'scope' must be one of {SCOPES}"))
        max_hold = rule.get("max_hold")
        if max_hold is not None and (not is_number(max_hold) or not max_hold > 0):
            problems.append(("rcoord.E010", f"{where}: 'max_hold' must be a positive number"))
        if not isinstance(rule.get("fail_open", True), bool):
            problems.append(("rcoord.E010", f"{where}: 'fail_open' must be True or False"))
    return problems


def load_rules(raw: Any) -> tuple[ConcurrencyRule, ...]:
    """Compile CONCURRENCY_LIMITS (already validated by the system checks)."""

    problems = rule_problems(raw)
    if problems:
        raise ImproperlyConfigured("; ".join(f"{message} ({id_})" for id_, message in problems))
    return tuple(
        ConcurrencyRule(
            name=rule["name"],
            path=re.compile(rule["path"]) if rule.get("path") is not None else None,
            url_names=frozenset(rule.get("url_names") or ()),
            limit=rule["limit"],
            timeout=float(rule["timeout"]),
            wait=float(rule.get("wait", 0)),
            scope=rule.get("scope", "global"),
            fail_open=rule.get("fail_open", True),
            max_hold=float(rule["max_hold"]) if rule.get("max_hold") is not None else None,
        )
        for rule in raw
    )
