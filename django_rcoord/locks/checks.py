"""System checks of the locks' settings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core.checks import CheckMessage, Error

from django_rcoord.conf import DEFAULTS
from django_rcoord.validation import is_number


def check_lock_settings(user: Mapping[str, Any], **kwargs: Any) -> list[CheckMessage]:
    """LOCK_REPLICAS and LOCK_REPLICA_TIMEOUT (rcoord.E014)."""
    replicas = user.get("LOCK_REPLICAS", DEFAULTS["LOCK_REPLICAS"])
    timeout = user.get("LOCK_REPLICA_TIMEOUT", DEFAULTS["LOCK_REPLICA_TIMEOUT"])
    replicas_ok = isinstance(replicas, int) and not isinstance(replicas, bool) and replicas >= 0
    if replicas_ok and is_number(timeout) and timeout > 0:
        return []
    return [
        Error(
            "settings.RCOORD['LOCK_REPLICAS'] must be an int of 0 or more and "
            "RCOORD['LOCK_REPLICA_TIMEOUT'] a positive number of seconds, not "
            f"{replicas!r} and {timeout!r}.",
            hint="For example LOCK_REPLICAS 1 and LOCK_REPLICA_TIMEOUT 0.5; 0 replicas "
            "(the default) does not wait.",
            id="rcoord.E014",
        )
    ]
