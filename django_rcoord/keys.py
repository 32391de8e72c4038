"""How keys are named. Every Redis key of django-rcoord is built here.

Layout: ``<prefix>:<kind>:{<name>}:<part>``. The braces make ``<name>`` the
Redis Cluster hash tag, so all keys of one primitive instance (one lock, one
guild, one queue group...) live in one hash slot and a script may touch them
together.

Names often come from users (guild names, URL parts in lock keys), so they are
encoded before they become key parts: ``%``, ``{``, ``}``, the glob characters
``* ? [ ] \\``, whitespace and control characters are percent-encoded. The
encoding is one-to-one, leaves every other character (any script, ``:``,
emoji) as it is, and guarantees an encoded name holds no brace: a name can
neither move its key to another slot nor spell another instance's key, and an
instance's key pattern matches its own keys only.
"""

from __future__ import annotations

import functools
import re
from urllib.parse import quote, unquote

from django.core.exceptions import ImproperlyConfigured

from django_rcoord.conf import conf
from django_rcoord.exceptions import InvalidName

#: Longest name accepted, in characters, before encoding.
MAX_NAME_LENGTH = 200

_UNSAFE_CHARACTERS = re.compile(r"[%{}*?\[\]\\\s\x00-\x1f\x7f-\x9f]")
_KIND = re.compile(r"[a-z][a-z0-9_-]*\Z")
_PREFIX = re.compile(r"[A-Za-z0-9_.-]+(:[A-Za-z0-9_.-]+)*\Z")


def _percent_encode(match: re.Match[str]) -> str:
    return quote(match.group(), safe="")


def encode_name(name: str) -> str:
    """Return ``name`` as a key part, or raise ``InvalidName``.

    A name must be a non-empty ``str`` of at most ``MAX_NAME_LENGTH``
    characters that can be written as UTF-8 (no lone surrogates).
    """
    if not isinstance(name, str):
        raise InvalidName(f"a name must be a str, not {type(name).__name__}")
    if not name:
        raise InvalidName("a name must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidName(f"a name must be at most {MAX_NAME_LENGTH} characters, not {len(name)}")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidName("a name must be valid Unicode text (it holds a lone surrogate)") from None
    return _UNSAFE_CHARACTERS.sub(_percent_encode, name)


def decode_name(encoded: str) -> str:
    """Invert ``encode_name``."""
    return unquote(encoded, errors="strict")


def validate_prefix(prefix: object) -> str | None:
    """Return why ``prefix`` cannot be a key prefix, or None when it can."""
    if not isinstance(prefix, str) or not _PREFIX.match(prefix):
        return (
            "KEY_PREFIX must be a non-empty string of letters, digits, '_', '.', '-', "
            f"in segments separated by single ':' (got {prefix!r})"
        )
    return None


@functools.lru_cache(maxsize=16)
def _checked_prefix(prefix: str) -> str:
    problem = validate_prefix(prefix)
    if problem:
        raise ImproperlyConfigured(f'RCOORD["KEY_PREFIX"]: {problem} (see check rcoord.E006).')
    return prefix


class KeySpace:
    """The keys of one primitive instance, e.g. ``KeySpace("lock", "purchase:42")``.

    ``key(part)`` names one of its keys; ``hash_tag`` is what Redis Cluster
    hashes; ``pattern`` is a SCAN/KEYS pattern matching this instance's keys and
    no other's.
    """

    __slots__ = ("_base", "encoded_name", "kind", "name")

    def __init__(self, kind: str, name: str, *, prefix: str | None = None) -> None:
        if not _KIND.match(kind):
            raise ValueError(f"kind must match {_KIND.pattern!r}, not {kind!r}")
        self.kind = kind
        self.name = name
        self.encoded_name = encode_name(name)
        prefix = _checked_prefix(conf.KEY_PREFIX if prefix is None else prefix)
        self._base = f"{prefix}:{kind}:{{{self.encoded_name}}}:"

    def key(self, part: str) -> str:
        """Return the key of ``part`` (parts are encoded like names)."""
        return self._base + encode_name(part)

    @property
    def hash_tag(self) -> str:
        return self.encoded_name

    @property
    def pattern(self) -> str:
        return self._base + "*"

    def __repr__(self) -> str:
        return f"KeySpace({self.kind!r}, {self.name!r})"


def instance_keys(kind: str, name: str, parts: tuple[str, ...]) -> tuple[str, ...]:
    """``tuple(KeySpace(kind, name).key(part) for part in parts)``, built once per (kind,
    name, ``KEY_PREFIX``, parts) and then looked up: a primitive made per call (a ``Lock``
    per request) does not check and encode the same name again. The prefix is read at
    every call, so ``override_settings`` still changes the keys."""
    return _keys_of(kind, name, parts)[0]


def encoded_instance_keys(kind: str, name: str, parts: tuple[str, ...]) -> tuple[bytes, ...]:
    """``instance_keys`` as UTF-8 bytes, for the hot commands: redis-py sends bytes as they
    are, and encodes every str argument again on every call."""
    return _keys_of(kind, name, parts)[1]


def _keys_of(
    kind: str, name: str, parts: tuple[str, ...]
) -> tuple[tuple[str, ...], tuple[bytes, ...]]:
    if type(name) is not str:  # not hashable, or a str subclass: checked (and refused) anew
        return _build_keys(kind, name, None, parts)
    return _cached_keys(kind, name, conf.KEY_PREFIX, parts)


def _build_keys(
    kind: str, name: str, prefix: str | None, parts: tuple[str, ...]
) -> tuple[tuple[str, ...], tuple[bytes, ...]]:
    space = KeySpace(kind, name, prefix=prefix)
    keys = tuple(space.key(part) for part in parts)
    return keys, tuple(key.encode() for key in keys)


_cached_keys = functools.lru_cache(maxsize=4096)(_build_keys)
