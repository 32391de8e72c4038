"""Autocomplete: a user's recent contacts, and the members of a guild (Redis in Action 6.1).

The prefix search is in ``search``; its settings' checks in ``checks``.
"""

from __future__ import annotations

from django_rcoord.autocomplete.search import (
    MAX_LIMIT,
    RECENT_CONTACTS,
    aadd_update_contact,
    aautocomplete_on_prefix,
    aautocomplete_page,
    add_update_contact,
    afetch_autocomplete_list,
    ais_guild_member,
    ajoin_guild,
    aleave_guild,
    aremove_contact,
    autocomplete_on_prefix,
    autocomplete_page,
    fetch_autocomplete_list,
    fold,
    guild_members,
    is_guild_member,
    join_guild,
    leave_guild,
    remove_contact,
)

__all__ = [
    "MAX_LIMIT",
    "RECENT_CONTACTS",
    "aadd_update_contact",
    "aautocomplete_on_prefix",
    "aautocomplete_page",
    "add_update_contact",
    "afetch_autocomplete_list",
    "ais_guild_member",
    "ajoin_guild",
    "aleave_guild",
    "aremove_contact",
    "autocomplete_on_prefix",
    "autocomplete_page",
    "fetch_autocomplete_list",
    "fold",
    "guild_members",
    "is_guild_member",
    "join_guild",
    "leave_guild",
    "remove_contact",
]
