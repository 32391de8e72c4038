"""System checks of the autocomplete settings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core.checks import CheckMessage, Error

from django_rcoord.autocomplete.search import MAX_LIMIT
from django_rcoord.conf import DEFAULTS
from django_rcoord.validation import is_positive_int, setting_callable_errors


def check_autocomplete_settings(user: Mapping[str, Any], **kwargs: Any) -> list[CheckMessage]:
    """AUTOCOMPLETE_LIMIT (rcoord.E012) and AUTOCOMPLETE_PERMISSION (E013)."""

    errors: list[CheckMessage] = []
    limit = user.get("AUTOCOMPLETE_LIMIT", DEFAULTS["AUTOCOMPLETE_LIMIT"])
    if not is_positive_int(limit) or limit > MAX_LIMIT:
        errors.append(
            Error(
                f"settings.RCOORD['AUTOCOMPLETE_LIMIT'] must be an int from 1 to {MAX_LIMIT}, "
                f"not {limit!r}.",
                hint="The default is 10.",
                id="rcoord.E012",
            )
        )
    errors.extend(
        setting_callable_errors(
            user,
            "AUTOCOMPLETE_PERMISSION",
            "Give the dotted path of a function (request, guild) -> bool.",
            "rcoord.E013",
        )
    )
    return errors
