"""System checks (``manage.py check``): the ``RCOORD`` dict. Each capability checks its own
settings in its ``checks`` module, which ``check_settings`` runs: the connection and, with
``--deploy``, the Redis server in ``connection.checks``, the embedded server's in
``embedded.checks``, the queues' in ``queues.checks``... The check IDs are listed in the
docs' reference."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error

from django_rcoord.autocomplete.checks import check_autocomplete_settings
from django_rcoord.conf import DEFAULTS
from django_rcoord.connection.checks import check_redis_server, client_problems, server_problems
from django_rcoord.embedded.checks import embedded_dir_problems
from django_rcoord.keys import validate_prefix
from django_rcoord.locks.checks import check_lock_settings
from django_rcoord.ops.checks import check_operations_settings
from django_rcoord.queues.checks import check_queue_settings
from django_rcoord.semaphores.checks import check_concurrency_limits
from django_rcoord.validation import is_positive_int

# The deploy check of the server is registered from here (apps.py), and tests read its
# verdict on an INFO reply.
__all__ = ["check_redis_server", "check_settings", "server_problems"]


def check_settings(**kwargs: Any) -> list[CheckMessage]:
    """Check ``settings.RCOORD`` and the Redis connection it names."""
    user = getattr(settings, "RCOORD", {})
    if not isinstance(user, Mapping):
        return [
            Error(
                f"settings.RCOORD must be a dict, not {type(user).__name__}.",
                hint='Write it as RCOORD = {"CONNECTION": "default", ...}.',
                id="rcoord.E001",
            )
        ]
    errors = [*_unknown_keys(user), *client_problems(user)]
    prefix_problem = validate_prefix(user.get("KEY_PREFIX", DEFAULTS["KEY_PREFIX"]))
    errors.extend(_value_problems(user, prefix_problem))
    errors.extend(embedded_dir_problems(user))
    # Each capability checks its own settings.
    for check_room in (
        check_lock_settings,
        check_concurrency_limits,
        check_queue_settings,
        check_autocomplete_settings,
        check_operations_settings,
    ):
        errors.extend(check_room(user, prefix_ok=not prefix_problem))
    return errors


def _unknown_keys(user: Mapping[str, Any]) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    for name in user:
        if name not in DEFAULTS:
            close = difflib.get_close_matches(str(name), DEFAULTS, n=1)
            hint = f"Did you mean {close[0]!r}? " if close else ""
            errors.append(
                Error(
                    f"settings.RCOORD has an unknown key {name!r}.",
                    hint=hint + "Known keys: " + ", ".join(sorted(DEFAULTS)) + ".",
                    id="rcoord.E002",
                )
            )
    return errors


def _value_problems(user: Mapping[str, Any], prefix_problem: str | None) -> list[CheckMessage]:
    """ASYNC_WAIT_CONNECTIONS and KEY_PREFIX (its problem given)."""
    errors: list[CheckMessage] = []
    wait_connections = user.get("ASYNC_WAIT_CONNECTIONS", DEFAULTS["ASYNC_WAIT_CONNECTIONS"])
    if not is_positive_int(wait_connections):
        errors.append(
            Error(
                "settings.RCOORD['ASYNC_WAIT_CONNECTIONS'] must be a positive int, not "
                f"{wait_connections!r}.",
                hint="The default is 50: at most 50 locks and semaphores waited for at once "
                "per event loop, each with one blocking connection.",
                id="rcoord.E016",
            )
        )
    if prefix_problem:
        errors.append(
            Error(
                f"settings.RCOORD['KEY_PREFIX'] is not usable: {prefix_problem}.",
                hint='Use a short identifier such as "rcoord" or "myproject:rcoord".',
                id="rcoord.E006",
            )
        )
    return errors
