"""Argument checks shared by the parts and the system checks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core.checks import CheckMessage, Error
from django.utils.module_loading import import_string

from django_rcoord.conf import DEFAULTS


def is_number(value: object) -> bool:
    """An int or float, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_positive_int(value: object) -> bool:
    """An int (not a bool) of at least 1."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def parse_int_in(raw: str, low: int, high: int) -> int | None:
    """The int ``raw`` spells in ASCII digits if it lies from ``low`` to ``high``, else None.
    Its length is checked before ``int()`` reads it: a number thousands of digits long from
    a query string is refused, never converted (Python refuses over 4,300 digits with a
    ValueError, and spends time on fewer)."""
    digits = raw.lstrip("0") or "0"  # int() counts leading zeros against its limit too
    if not raw.isascii() or not raw.isdigit() or len(digits) > len(str(high)):
        return None
    value = int(digits)
    return value if low <= value <= high else None


def named_dicts(
    raw: object, keys: set[str] | frozenset[str], check_id: str, label: str = ""
) -> tuple[list[tuple[str, Mapping[str, Any], str | None]], list[tuple[str, str]]]:
    """Read a setting that is a list of dicts, each with a unique non-empty ``name`` and
    only ``keys``: its entries, each as (where, the dict, its name or None when the name is
    missing or repeated), and the (``check_id``, message) of each problem of that shape.
    ``label`` begins each entry's "where" (``CONCURRENCY_LIMITS`` gives
    ``CONCURRENCY_LIMITS[0]``); the caller checks each entry's own fields."""
    if not isinstance(raw, (list, tuple)):
        return [], [
            (check_id, f"{label} must be a list of dicts, not {type(raw).__name__}".lstrip())
        ]
    entries: list[tuple[str, Mapping[str, Any], str | None]] = []
    problems: list[tuple[str, str]] = []
    names: set[str] = set()
    for index, entry in enumerate(raw):
        where = f"{label}[{index}]"
        if not isinstance(entry, Mapping):
            problems.append((check_id, f"{where} must be a dict, not {type(entry).__name__}"))
            continue
        unknown = sorted(set(entry) - keys)
        if unknown:
            problems.append((check_id, f"{where} has unknown keys {unknown}"))
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            problems.append((check_id, f"{where} needs a 'name' (a non-empty str)"))
            name = None
        elif name in names:
            problems.append((check_id, f"{where} repeats the name {name!r}"))
            name = None
        else:
            names.add(name)
        entries.append((where, entry, name))
    return entries, problems


#: Most items one script call may move: a call's work (and Redis's pause while it runs)
#: stays bounded, and Lua's unpack() stays far below its limit (about 8,000 values).
MAX_BATCH = 1000


def check_batch(value: object, name: str) -> int:
    """``value`` if it is an int from 1 to ``MAX_BATCH``; ValueError naming ``name`` otherwise."""
    if not is_positive_int(value) or value > MAX_BATCH:  # type: ignore[operator]
        raise ValueError(
            f"{name} must be an int from 1 to {MAX_BATCH} (one script call's work), "
            f"not {value!r}; call again for more"
        )
    return value  # type: ignore[return-value]


def check_timeout_and_wait(timeout: float, wait: float) -> None:
    """The argument checks of locks and semaphores."""
    if not timeout > 0:
        raise ValueError("timeout must be a positive number of seconds")
    if wait < 0:
        raise ValueError("wait must be zero or a positive number of seconds")


def callable_problem(path: object) -> str | None:
    """Why ``path`` is not the dotted path of an importable callable, or None when it is."""
    try:
        found = import_string(path) if isinstance(path, str) else None
    except ImportError:
        found = None
    # Importing the project's module may raise anything: a check reports, never crashes.
    except Exception as exc:  # noqa: BLE001
        return f"cannot be imported: {type(exc).__name__}: {exc}"
    return None if callable(found) else "is not an importable callable"


def setting_callable_errors(
    user: Mapping[str, Any], name: str, hint: str, check_id: str
) -> list[CheckMessage]:
    """An error unless ``RCOORD[name]`` is the dotted path of an importable callable."""
    path = user.get(name, DEFAULTS[name])
    problem = callable_problem(path)
    if problem is None:
        return []
    return [Error(f"settings.RCOORD[{name!r}] {path!r} {problem}.", hint=hint, id=check_id)]
