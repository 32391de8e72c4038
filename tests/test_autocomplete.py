from __future__ import annotations

import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_rcoord.autocomplete import (
    MAX_LIMIT,
    RECENT_CONTACTS,
    add_update_contact,
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
from django_rcoord.connection import get_client
from django_rcoord.keys import KeySpace
from tests.procs import run_in_processes


def usable(text: str) -> bool:
    return bool(text.strip()) and not any(unicodedata.category(ch) in ("Cc", "Cs") for ch in text)


names = st.text(min_size=1, max_size=12).filter(usable)
prefixes = st.text(max_size=4).filter(
    lambda text: not any(unicodedata.category(ch) in ("Cc", "Cs") for ch in text)
)


def oracle(members: set[str], prefix: str, limit: int) -> list[str]:
    """Brute force: every member whose folded name starts with the folded prefix, in index order."""
    entries = sorted((fold(name) + "\x00" + name).encode() for name in members)
    matching = [e for e in entries if e.decode().split("\x00")[0].startswith(fold(prefix))]
    return [e.decode().split("\x00", 1)[1] for e in matching[:limit]]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(members=st.sets(names, min_size=0, max_size=30), data=st.data())
def test_matches_a_brute_force_oracle(members: set[str], data: st.DataObject) -> None:
    get_client().delete(KeySpace("guild", "oracle").key("members"))
    for member in members:
        join_guild("oracle", member)
    if members and data.draw(st.booleans()):  # type: ignore[arg-type]  # hypothesis' DataObject.draw is typed from @given's first strategy
        source = data.draw(st.sampled_from(sorted(members)))
        prefix = source[: data.draw(st.integers(0, len(source)))]
    else:
        prefix = data.draw(prefixes)
    limit = data.draw(st.integers(1, MAX_LIMIT))
    assert autocomplete_on_prefix("oracle", prefix, limit) == oracle(members, prefix, limit)


@given(st.text(alphabet=st.characters(max_codepoint=127)))
def test_ascii_text_folds_as_the_full_rule_folds_it(text: str) -> None:
    full = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    assert fold(text) == full


def test_guild_keys_follow_key_prefix_changes() -> None:
    from django.conf import settings
    from django.test import override_settings

    join_guild("prefixed", "Ada")
    with override_settings(RCOORD={**settings.RCOORD, "KEY_PREFIX": "other"}):
        assert autocomplete_on_prefix("prefixed", "a") == []
        join_guild("prefixed", "Ann")
        assert autocomplete_on_prefix("prefixed", "a") == ["Ann"]
        assert get_client().zcard("other:guild:{prefixed}:members") == 1
    assert autocomplete_on_prefix("prefixed", "a") == ["Ada"]


def test_case_and_accents_fold_and_display_keeps_the_spelling() -> None:
    for name in ["Émile", "emma", "Zoë", "名前", "Ωmega", "🙂smile", "a{b}", "O'Brien", "Straße"]:
        join_guild("g", name)
    for query in ["émile", "Émile", "ÉMILE", "ém"]:
        assert autocomplete_on_prefix("g", query) == ["Émile"]
    assert autocomplete_on_prefix("g", "STRASSE") == ["Straße"]
    assert autocomplete_on_prefix("g", "名") == ["名前"]
    assert autocomplete_on_prefix("g", "🙂") == ["🙂smile"]
    assert autocomplete_on_prefix("g", "a{") == ["a{b}"]
    assert autocomplete_on_prefix("g", "e") == ["emma"]  # "Émile" folds to "émile"
    assert autocomplete_on_prefix("g", "xyz") == []


def test_a_query_leaves_the_index_unchanged() -> None:
    for index in range(100):
        join_guild("still", f"member{index:03d}")
    key = KeySpace("guild", "still").key("members")
    before = get_client().zrange(key, 0, -1)
    for query in ["m", "member05", "z", "", "ä"]:
        autocomplete_page("still", query, 10)
    assert get_client().zrange(key, 0, -1) == before
    # No sentinel, no other key written (SCAN covers every primary of a cluster).
    assert list(get_client().scan_iter()) == [key.encode()]


def test_pages_with_a_cursor_cover_every_match_once() -> None:
    members = [f"anna{index:02d}" for index in range(37)] + ["bob"]
    for member in members:
        join_guild("paged", member)
    seen, cursor = [], None
    while True:
        page, cursor = autocomplete_page("paged", "ann", 10, after=cursor)
        seen += page
        if cursor is None:
            break
    assert seen == sorted(members[:-1])
    with pytest.raises(ValueError, match="malformed cursor"):
        autocomplete_page("paged", "ann", 10, after="not a cursor!")
    with pytest.raises(ValueError, match="limit must be between"):
        autocomplete_page("paged", "ann", MAX_LIMIT + 1)


def test_membership_join_leave_and_listing() -> None:
    join_guild("club", "Ada")
    join_guild("club", "Bob")
    assert is_guild_member("club", "Ada")
    assert not is_guild_member("club", "ada")
    leave_guild("club", "Ada")
    assert not is_guild_member("club", "Ada")
    assert guild_members("club") == ["Bob"]
    assert not is_guild_member("club", "bad\x00name")
    with pytest.raises(ValueError, match="control characters"):
        join_guild("club", "bad\nname")


def test_guild_names_stay_in_their_namespace() -> None:
    join_guild("a}b", "Ada")
    join_guild("a", "Bob")
    assert autocomplete_on_prefix("a}b", "") == ["Ada"]
    assert autocomplete_on_prefix("a", "") == ["Bob"]


def test_recent_contacts_most_recent_first_capped_any_script() -> None:
    for index in range(RECENT_CONTACTS + 20):
        add_update_contact("ada", f"contact{index}")
    assert get_client().llen(KeySpace("contacts", "ada").key("recent")) == RECENT_CONTACTS
    add_update_contact("ada", "contact50")  # moves to the front, no duplicate
    results = fetch_autocomplete_list("ada", "contact5")
    assert results[0] == "contact50"
    assert results.count("contact50") == 1
    for name in ["Émile", "Ömer", "Дмитрий"]:
        add_update_contact("ada", name)
    assert fetch_autocomplete_list("ada", "ém") == ["Émile"]
    assert fetch_autocomplete_list("ada", "дм") == ["Дмитрий"]
    remove_contact("ada", "Ömer")
    assert fetch_autocomplete_list("ada", "ö") == []


def churn(guild: str, rounds: int) -> int:
    for index in range(rounds):
        join_guild(guild, f"temp{index}")
        leave_guild(guild, f"temp{index}")
    return rounds


def query_while_churning(guild: str, rounds: int) -> list[str]:
    seen = set()
    for _ in range(rounds):
        for name in autocomplete_on_prefix(guild, "", MAX_LIMIT):
            seen.add(name)
    return sorted(seen)


def test_queries_during_joins_and_leaves_return_only_members() -> None:
    stable = [f"stable{index}" for index in range(20)]
    for name in stable:
        join_guild("busy", name)
    results = run_in_processes(
        run_role,
        [("churn", ("busy", 400)), ("query", ("busy", 300)), ("query", ("busy", 300))],
    )
    for seen in results[1:]:
        # Every name seen was a member at some moment (a stable one or a temporary one),
        # never junk such as a sentinel.
        assert all(name in stable or name.startswith("temp") for name in seen)
        assert set(stable) <= set(seen)  # "stable*" sorts before "temp*": always in view
    assert sorted(guild_members("busy")) == sorted(stable)


def run_role(role: str, args: tuple):
    return {"churn": churn, "query": query_while_churning}[role](*args)


def test_guild_members_lists_a_large_guild_in_index_order_page_by_page() -> None:
    names = [f"Member {number:04d}" for number in range(2500)][::-1]  # joined out of order
    for name in names:
        join_guild("large", name)
    members = guild_members("large")  # 2,500 entries: three pages of GUILD_PAGE
    assert members == sorted(names)
    assert len(members) == len(set(members)) == 2500
