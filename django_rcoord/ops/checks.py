"""System checks of the operations settings: the dashboard and the metrics token."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

from django.core.checks import CheckMessage, Error, Warning

from django_rcoord.conf import DEFAULTS
from django_rcoord.validation import setting_callable_errors

#: Shortest METRICS_TOKEN accepted (a bearer token guessed is the whole defence).
MIN_TOKEN_LENGTH = 16


def check_operations_settings(user: Mapping[str, Any], **kwargs: Any) -> list[CheckMessage]:
    """DASHBOARD_PERMISSION (rcoord.E026) and METRICS_TOKEN (E027, W004)."""

    errors: list[CheckMessage] = []
    errors.extend(
        setting_callable_errors(
            user,
            "DASHBOARD_PERMISSION",
            "Give the dotted path of a function (request) -> bool; it is asked after the "
            "user was found to be active staff.",
            "rcoord.E026",
        )
    )
    token = user.get("METRICS_TOKEN", DEFAULTS["METRICS_TOKEN"])
    if token is not None and (not isinstance(token, str) or len(token) < MIN_TOKEN_LENGTH):
        errors.append(
            Error(
                f"settings.RCOORD['METRICS_TOKEN'] must be None or a str of at least "
                f"{MIN_TOKEN_LENGTH} characters.",
                hint="Generate one (python -c 'import secrets; print(secrets.token_urlsafe(32))') "
                "and read it from the environment; None turns the metrics and stats endpoints "
                "off.",
                id="rcoord.E027",
            )
        )
    elif token is not None and importlib.util.find_spec("prometheus_client") is None:
        errors.append(
            Warning(
                "settings.RCOORD['METRICS_TOKEN'] is set but prometheus-client is not installed: "
                "the metrics endpoint answers 501 (the JSON stats work).",
                hint='pip install "django-rcoord[metrics]"',
                id="rcoord.W004",
            )
        )
    return errors
