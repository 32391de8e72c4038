"""Autocomplete: a user's recent contacts, and the members of a guild (Redis in Action 6.1).

Recent contacts are a LIST per user, most recent first, capped at 100; adding
or moving a contact to the front is one MULTI/EXEC.

Guild members are a sorted set per guild used as a lexicographic index: every
member is stored as ``<folded name> NUL <name as written>`` with score 0, where
the folded name is NFKC-normalised and case-folded. A query folds its prefix
the same way and asks for the range ``[prefix, prefix + 0xFF)`` with
``ZRANGE ... BYLEX LIMIT``: one read-only round trip, whatever the guild's size
and whoever else queries or joins meanwhile. No sentinel members, no WATCH, no
writes (the book's version adds and removes two sentinels per query and only
knows a-z). "émile", "Émile" and "ÉMILE" all find "Émile"; names in any script,
with digits, punctuation, braces or emoji work (they are values, not key parts;
guild names go through the key layer).

Every service has an async twin on ``redis.asyncio`` (``ajoin_guild``,
``aautocomplete_page``, ``aautocomplete_on_prefix``, ``ais_guild_member``,
``aadd_update_contact``, ``afetch_autocomplete_list``...), one round trip each
like its sync one.
"""

from __future__ import annotations

import base64
import binascii
import unicodedata
from typing import Any

from django_rcoord.connection.clients import resolve_client
from django_rcoord.connection.loops import aresolve_client
from django_rcoord.keys import encoded_instance_keys, instance_keys

#: Contacts kept per user.
RECENT_CONTACTS = 100
#: Largest number of suggestions one query returns.
MAX_LIMIT = 50
#: Longest member name accepted.
MAX_MEMBER_LENGTH = 150

_SEPARATOR = "\x00"
# 0xFF never occurs in UTF-8: every string that starts with a prefix sorts below prefix + 0xFF.
_AFTER_ALL = b"\xff"


def fold(text: str) -> str:
    """The form names are matched in: NFKC, then case-folded (then NFKC again)."""
    if text.isascii():  # NFKC leaves ASCII as it is, and casefold() of ASCII is lower()
        return text.lower()
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())


def _check_member(name: str) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ValueError("a member name must be a non-empty str")
    if len(name) > MAX_MEMBER_LENGTH:
        raise ValueError(f"a member name must be at most {MAX_MEMBER_LENGTH} characters")
    if any(unicodedata.category(ch) in ("Cc", "Cs") for ch in name):
        raise ValueError("a member name must not hold control characters")
    return name


def _entry(name: str) -> bytes:
    name = _check_member(name)
    return (fold(name) + _SEPARATOR + name).encode("utf-8")


def _displays(entries: list[bytes]) -> list[str]:
    """The names as written of index entries, in three C calls: names and folded names
    hold no control character, so NUL only ever separates the two halves of an entry."""
    return b"\x00".join(entries).decode().split("\x00")[1::2]


_MEMBERS = ("members",)


def _members_key(guild: str) -> str:
    return instance_keys("guild", guild, _MEMBERS)[0]


# -- guild members ---------------------------------------------------------------------
def join_guild(guild: str, user: str, *, client: Any = None) -> None:
    """Add ``user`` (a display name) to ``guild``'s index."""
    resolve_client(client).zadd(_members_key(guild), {_entry(user): 0})


async def ajoin_guild(guild: str, user: str, *, client: Any = None) -> None:
    client = await aresolve_client(client)
    await client.zadd(_members_key(guild), {_entry(user): 0})


def leave_guild(guild: str, user: str, *, client: Any = None) -> None:
    resolve_client(client).zrem(_members_key(guild), _entry(user))


async def aleave_guild(guild: str, user: str, *, client: Any = None) -> None:
    client = await aresolve_client(client)
    await client.zrem(_members_key(guild), _entry(user))


def _entry_or_none(user: str) -> bytes | None:
    try:
        return _entry(user)
    except ValueError:
        return None


def is_guild_member(guild: str, user: str, *, client: Any = None) -> bool:
    entry = _entry_or_none(user)
    if entry is None:
        return False
    return resolve_client(client).zscore(_members_key(guild), entry) is not None


async def ais_guild_member(guild: str, user: str, *, client: Any = None) -> bool:
    entry = _entry_or_none(user)
    if entry is None:
        return False
    client = await aresolve_client(client)
    return await client.zscore(_members_key(guild), entry) is not None


def _page_query(
    guild: str, prefix: str, limit: int, after: str | None, *, with_cursor: bool = True
) -> tuple[Any, ...]:
    """The ``ZRANGE key low high BYLEX LIMIT 0 n`` command of a page, sent as it is
    (``execute_command``: redis-py's ``zrange()`` sorts out options that a lexicographic
    range never uses). With a cursor, one more than asked tells
    whether there is a next page."""
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be between 1 and {MAX_LIMIT}")
    folded = fold(prefix).encode("utf-8")
    low = b"[" + folded
    if after is not None:
        position = decode_cursor(after)
        if not position.startswith(folded):
            raise ValueError("the cursor does not belong to this query")
        low = b"(" + position
    high = b"(" + folded + _AFTER_ALL
    count = limit + 1 if with_cursor else limit
    key = encoded_instance_keys("guild", guild, _MEMBERS)[0]
    # Arguments as bytes: redis-py sends them as they are (a str or int is encoded anew).
    return ("ZRANGE", key, low, high, b"BYLEX", b"LIMIT", b"0", _COUNTS[count])


_COUNTS = [str(count).encode() for count in range(MAX_LIMIT + 2)]


#: A page of names, and the cursor of the next page (None: the last page).
Page = tuple[list[str], str | None]


def _page(entries: list[bytes], limit: int) -> Page:
    names = _displays(entries[:limit])
    cursor = encode_cursor(entries[limit - 1]) if len(entries) > limit else None
    return names, cursor


def autocomplete_page(
    guild: str, prefix: str, limit: int = 10, *, after: str | None = None, client: Any = None
) -> Page:
    """Members of ``guild`` whose folded name starts with the folded ``prefix``, in index order.

    Returns (names, cursor): pass the cursor as ``after`` for the next page (None
    when there is none). One read-only ``ZRANGE ... BYLEX LIMIT`` round trip.
    """
    command = _page_query(guild, prefix, limit, after)
    return _page(resolve_client(client).execute_command(*command), limit)


async def aautocomplete_page(
    guild: str, prefix: str, limit: int = 10, *, after: str | None = None, client: Any = None
) -> Page:
    """``autocomplete_page`` for async code."""
    command = _page_query(guild, prefix, limit, after)
    client = await aresolve_client(client)
    return _page(await client.execute_command(*command), limit)


def autocomplete_on_prefix(
    guild: str, prefix: str, limit: int = 10, *, client: Any = None
) -> list[str]:
    """The book's autocomplete_on_prefix: the first ``limit`` members matching ``prefix``."""
    command = _page_query(guild, prefix, limit, None, with_cursor=False)
    return _displays(resolve_client(client).execute_command(*command))


async def aautocomplete_on_prefix(
    guild: str, prefix: str, limit: int = 10, *, client: Any = None
) -> list[str]:
    command = _page_query(guild, prefix, limit, None, with_cursor=False)
    client = await aresolve_client(client)
    return _displays(await client.execute_command(*command))


def guild_members(guild: str, *, client: Any = None) -> list[str]:
    """Every member of ``guild`` in index order (for administration; O(N), read in pages
    of 1,000 with ``ZRANGE BYLEX``, so a large guild never blocks Redis long)."""
    client = resolve_client(client)
    key = _members_key(guild)
    members: list[str] = []
    start: bytes | str = "-"
    while True:
        page = client.zrangebylex(key, start, "+", start=0, num=GUILD_PAGE)
        members.extend(_displays(page))
        if len(page) < GUILD_PAGE:
            return members
        start = b"(" + page[-1]


#: Index entries one call of ``guild_members`` reads per round trip.
GUILD_PAGE = 1000


def encode_cursor(entry: bytes) -> str:
    return base64.urlsafe_b64encode(entry).decode("ascii").rstrip("=")


def decode_cursor(cursor: str) -> bytes:
    """The index entry a cursor stands for; ValueError for a malformed cursor."""
    try:
        entry = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        entry.decode("utf-8")
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise ValueError("malformed cursor") from None
    if _SEPARATOR.encode() not in entry:
        raise ValueError("malformed cursor")
    return entry


# -- recent contacts -----------------------------------------------------------------------
_RECENT = ("recent",)


def _contacts_key(user: str) -> str:
    return instance_keys("contacts", user, _RECENT)[0]


def add_update_contact(user: str, contact: str, *, client: Any = None) -> None:
    """Put ``contact`` at the front of ``user``'s recent contacts (one MULTI/EXEC)."""
    with resolve_client(client).pipeline(transaction=True) as pipe:
        _queue_contact_update(pipe, user, contact)
        pipe.execute()


async def aadd_update_contact(user: str, contact: str, *, client: Any = None) -> None:
    client = await aresolve_client(client)
    async with client.pipeline(transaction=True) as pipe:
        _queue_contact_update(pipe, user, contact)
        await pipe.execute()


def _queue_contact_update(pipe: Any, user: str, contact: str) -> None:
    key = _contacts_key(user)
    pipe.lrem(key, 0, contact)
    pipe.lpush(key, contact)
    pipe.ltrim(key, 0, RECENT_CONTACTS - 1)


def remove_contact(user: str, contact: str, *, client: Any = None) -> None:
    resolve_client(client).lrem(_contacts_key(user), 0, contact)


async def aremove_contact(user: str, contact: str, *, client: Any = None) -> None:
    client = await aresolve_client(client)
    await client.lrem(_contacts_key(user), 0, contact)


def fetch_autocomplete_list(user: str, prefix: str, *, client: Any = None) -> list[str]:
    """``user``'s recent contacts starting with ``prefix`` (any script and case), newest first."""
    return _matching(resolve_client(client).lrange(_contacts_key(user), 0, -1), prefix)


async def afetch_autocomplete_list(user: str, prefix: str, *, client: Any = None) -> list[str]:
    client = await aresolve_client(client)
    contacts = await client.lrange(_contacts_key(user), 0, -1)
    return _matching(contacts, prefix)


def _matching(contacts: list[bytes], prefix: str) -> list[str]:
    folded = fold(prefix)
    names = [contact.decode("utf-8") for contact in contacts]
    return [name for name in names if fold(name).startswith(folded)]
