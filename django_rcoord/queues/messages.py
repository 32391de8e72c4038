"""Task messages: JSON (never pickle), stored once per task id."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Sequence
from json.encoder import encode_basestring_ascii
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from django_rcoord.conf import conf
from django_rcoord.exceptions import MessageTooLarge, ResultTooLarge
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
    ``group``: the queue's group, when the caller knows it already. The JSON is the
    object {"id", "task", "queue", "args", "kwargs", "enqueued_at", then ``extra``'s
    fields} as ``to_json`` writes it. MessageTooLarge when it is longer than
    ``RCOORD["MAX_MESSAGE_BYTES"]``."""
    task_id = new_task_id(group or QueueKeys.of(queue).group)
    try:
        args_json = to_json(args)  # a tuple is a JSON array too: no copy
        # Most tasks take no keyword arguments.
        kwargs_json = "{}" if type(kwargs) is dict and not kwargs else to_json(kwargs)
        extra_json = f",{to_json(extra)[1:-1]}" if extra else ""
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"Arguments of task {task_name!r} must be JSON-serializable "
            f"(dates, decimals and UUIDs become strings): {exc}"
        ) from exc
    # Written out: the encoder's own cost per call is more than the members it writes.
    body = (
        f'{{"id":{encode_basestring_ascii(task_id)},{_message_head(task_name, queue)}'
        f'"args":{args_json},"kwargs":{kwargs_json},"enqueued_at":{time.time()!r}{extra_json}}}'
    )
    limit = conf.MAX_MESSAGE_BYTES
    if limit is not None and len(body) > limit:  # ASCII JSON: as many bytes as characters
        raise MessageTooLarge(
            f"The message of task {task_name!r} is {len(body):,} bytes, over "
            f"RCOORD['MAX_MESSAGE_BYTES'] ({limit:,}): pass a reference to the data (a file "
            f"name, a database id) instead of the data, or raise the setting."
        )
    return task_id, body


def wire_json(record: dict[str, Any]) -> bytes:
    """``record`` as UTF-8 JSON for ``cjson``. Text that cannot be UTF-8 (a lone surrogate,
    as ``surrogateescape`` decoding leaves in an error's text or a task's name) is replaced:
    ``cjson`` refuses such an escape, and the call would fail every time it was sent."""
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "replace")


def check_result_size(task_name: str, value_json: str) -> None:
    """ResultTooLarge when ``value_json``, a return value of task ``task_name`` as
    ``to_json`` writes it (ASCII: as many bytes as characters), is longer than
    ``RCOORD["MAX_RESULT_BYTES"]``."""
    limit = conf.MAX_RESULT_BYTES
    if limit is not None and len(value_json) > limit:
        raise ResultTooLarge(
            f"the return value of task {task_name!r} is {len(value_json):,} bytes as JSON, "
            f"over RCOORD['MAX_RESULT_BYTES'] ({limit:,}): return a reference to the data "
            f"(a file name, a database id) instead of the data, or raise the setting"
        )


@functools.lru_cache(maxsize=1024)
def _message_head(task_name: str, queue: str) -> str:
    """The "task" and "queue" members of a message of ``task_name`` on ``queue``, and the
    comma after them."""
    return to_json({"task": task_name, "queue": queue})[1:-1] + ","


def decode_message(body: bytes | str | None) -> dict[str, Any] | None:
    """The message as a dict, or None when it is not a JSON object."""
    if body is None:
        return None
    try:
        # Decoded here: json.loads would first guess the encoding of bytes.
        text = body.decode() if isinstance(body, bytes) else body
        try:
            # json.loads without its scans for whitespace, which a message as to_json
            # writes it has none of: a third of the cost (reading a result decodes one).
            message, end = _raw_decode(text)
        except ValueError:
            end = -1
        if end != len(text):  # whitespace around it, more after it: json.loads decides
            message = json.loads(text)
    except (ValueError, UnicodeDecodeError):
        return None
    return message if isinstance(message, dict) else None


_raw_decode = json.JSONDecoder().raw_decode


def as_text(value: bytes | str | None) -> str | None:
    """``value`` as text (bytes decoded, invalid UTF-8 replaced); None stays None."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value


def check_priority(priority: Any) -> int:
    """``priority`` if it is a whole number in -100..100 (the Tasks framework's range)."""
    if isinstance(priority, bool) or not isinstance(priority, int) or not -100 <= priority <= 100:
        raise ValueError(f"a task priority is an int from -100 to 100, not {priority!r}")
    return priority
