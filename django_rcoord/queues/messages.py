"""Task messages: JSON (never pickle), stored once per task id."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from django_rcoord.queues.keys import QueueKeys, new_task_id

#: One encoder for every message and result (it keeps no state between calls).
_ENCODER = DjangoJSONEncoder(separators=(",", ":"))


def to_json(value: Any) -> str:
    """``value`` as compact JSON, dates and decimals as Django writes them; TypeError or
    ValueError when JSON cannot carry it."""
    return _ENCODER.encode(value)


def encode_message(
    task_name: str,
    queue: str,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    extra: dict[str, Any] | None = None,
    *,
    group: str | None = None,
) -> tuple[str, str]:
    """(id, JSON) of a new message; TypeError at once for arguments JSON cannot carry.
    ``group``: the queue's group, when the caller knows it already."""
    task_id = new_task_id(group or QueueKeys.of(queue).group)
    body = {
        "id": task_id,
        "task": task_name,
        "queue": queue,
        "args": args,  # a tuple is a JSON array too: no copy
        "kwargs": kwargs,
        "enqueued_at": time.time(),
        **(extra or {}),
    }
    try:
        return task_id, _ENCODER.encode(body)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"Arguments of task {task_name!r} must be JSON-serializable "
            f"(dates, decimals and UUIDs become strings): {exc}"
        ) from exc


def decode_message(body: bytes | str | None) -> dict[str, Any] | None:
    """The message as a dict, or None when it is not a JSON object."""
    if body is None:
        return None
    try:
        # Decoded here: json.loads would first guess the encoding of bytes.
        message = json.loads(body.decode() if isinstance(body, bytes) else body)
    except (ValueError, UnicodeDecodeError):
        return None
    return message if isinstance(message, dict) else None


def as_text(value: bytes | str | None) -> str | None:
    """``value`` as text (bytes decoded, invalid UTF-8 replaced); None stays None."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value
