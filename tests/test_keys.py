from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

from django_rcoord.exceptions import InvalidName, RcoordError
from django_rcoord.keys import (
    MAX_NAME_LENGTH,
    KeySpace,
    decode_name,
    encode_name,
    instance_keys,
)
from django_rcoord.queues.keys import GroupKeys, QueueKeys

HOSTILE_NAMES = [
    "a",
    "a}",
    "{a}",
    "a}:lock",
    "}:{b",
    "x:y",
    "x:y:z",
    "*",
    "a*",
    "a?",
    "[ab]",
    "a\\",
    "a b",
    "tab\there",
    "line\nbreak",
    "nul\x00",
    "%7B",
    "%",
    "Émile",
    "名前",
    "🙂{}",
    "\u3000ideographic space",
]

names = st.text(min_size=1, max_size=MAX_NAME_LENGTH).filter(
    lambda text: not any(0xD800 <= ord(ch) <= 0xDFFF for ch in text)
)


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_encoded_name_has_no_brace_or_glob_or_space(name: str) -> None:
    encoded = encode_name(name)
    assert not set(encoded) & set("{}*?[]\\ \t\n\x00\u3000")
    assert decode_name(encoded) == name


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_keys_of_one_instance_share_its_slot_and_only_its_tag(name: str) -> None:
    space = KeySpace("lock", name)
    keys = [space.key(part) for part in ("owner", "token", "signal", "a}:{b")]
    # The hash tag Redis Cluster sees is the first {...}: exactly the encoded name.
    for key in keys:
        start = key.index("{")
        assert key[start + 1 : key.index("}", start)] == space.hash_tag
    assert {key_slot(key.encode()) for key in keys} == {key_slot(space.hash_tag.encode())}


@given(first=names, second=names)
def test_distinct_names_never_share_a_key(first: str, second: str) -> None:
    if first == second:
        return
    a, b = KeySpace("guild", first), KeySpace("guild", second)
    assert a.key("members") != b.key("members")
    assert not b.key("members").startswith(a.pattern[:-1])


@given(name=names)
def test_encoding_round_trips_any_text(name: str) -> None:
    encoded = encode_name(name)
    assert "{" not in encoded
    assert "}" not in encoded
    assert decode_name(encoded) == name


def test_names_cannot_reach_another_kind_or_instance_in_redis(redis_client) -> None:
    """Write every hostile name's keys to Redis; each instance's pattern finds its own only."""
    spaces = [KeySpace(kind, name) for kind in ("lock", "guild") for name in HOSTILE_NAMES]
    for space in spaces:
        redis_client.set(space.key("value"), repr(space))
    for space in spaces:
        found = {key.decode() for key in redis_client.scan_iter(match=space.pattern, count=1000)}
        assert found == {space.key("value")}, space
        assert redis_client.get(space.key("value")).decode() == repr(space)


def test_layout_and_prefix_setting() -> None:
    assert KeySpace("lock", "x:y").key("owner") == "rcoord:lock:{x:y}:owner"
    assert KeySpace("lock", "a}b").key("owner") == "rcoord:lock:{a%7Db}:owner"
    with override_settings(RCOORD={"KEY_PREFIX": "shop:coord"}):
        assert KeySpace("lock", "x").key("owner") == "shop:coord:lock:{x}:owner"
    with (
        override_settings(RCOORD={"KEY_PREFIX": "bad{prefix"}),
        pytest.raises(ImproperlyConfigured, match=r"rcoord\.E006"),
    ):
        KeySpace("lock", "x")


@pytest.mark.parametrize(
    "bad", ["", "x" * (MAX_NAME_LENGTH + 1), 42, None, b"bytes", "lone\ud800surrogate"]
)
def test_unusable_names_raise_invalid_name(bad: object) -> None:
    with pytest.raises(InvalidName) as excinfo:
        KeySpace("lock", bad)  # type: ignore[arg-type]
    assert isinstance(excinfo.value, RcoordError)
    assert isinstance(excinfo.value, ValueError)


def test_instance_keys_are_the_key_spaces_keys_per_prefix() -> None:
    parts = ("owner", "fence")
    for name in ("x:y", "a}b", "émile"):
        space = KeySpace("lock", name)
        assert instance_keys("lock", name, parts) == (space.key("owner"), space.key("fence"))
        assert instance_keys("lock", name, parts) == (space.key("owner"), space.key("fence"))
    with override_settings(RCOORD={"KEY_PREFIX": "shop:coord"}):
        assert instance_keys("lock", "x", parts)[0] == "shop:coord:lock:{x}:owner"
    assert instance_keys("lock", "x", parts)[0] == "rcoord:lock:{x}:owner"
    with (
        override_settings(RCOORD={"KEY_PREFIX": "bad{prefix"}),
        pytest.raises(ImproperlyConfigured, match=r"rcoord\.E006"),
    ):
        instance_keys("lock", "x", parts)


@pytest.mark.parametrize(
    "bad", ["", "x" * (MAX_NAME_LENGTH + 1), 42, None, b"bytes", ["list"], "lone\ud800surrogate"]
)
def test_instance_keys_refuse_unusable_names_every_time(bad: object) -> None:
    for _ in range(2):  # a refusal is not cached as an answer
        with pytest.raises(InvalidName):
            instance_keys("lock", bad, ("owner",))  # type: ignore[arg-type]


def test_kind_is_checked() -> None:
    with pytest.raises(ValueError, match="kind must match"):
        KeySpace("Lock:{x}", "name")


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_a_queue_groups_keys_share_its_slot_whatever_the_worker_or_task_id(name: str) -> None:
    group = GroupKeys.of("reports")
    queue = QueueKeys.of("reports/pdf")
    # A queue's keys hold its group's, as the group's own keys name them.
    assert {part: getattr(queue, part) for part in vars(group)} == vars(group)
    assert (queue.messages, queue.results, queue.metrics) == (
        group.messages,
        group.results,
        group.metrics,
    )
    keys = [group.heartbeat(name), group.exchange(name), group.stop(name), group.workers]
    assert len({group.heartbeat(name), group.exchange(name), group.stop(name)}) == 3
    assert {key_slot(key.encode()) for key in keys} == {key_slot(group.hash_tag.encode())}
    # A worker or task id cannot name another group's key, nor another part of this one.
    assert group.heartbeat(name) != GroupKeys.of(name).heartbeat("reports")
    assert group.heartbeat(name) not in {group.messages, group.owners, group.workers}


def test_a_groups_keys_follow_the_key_prefix() -> None:
    with override_settings(RCOORD={"KEY_PREFIX": "other"}):
        assert GroupKeys.of("main").workers.startswith("other:queue:")
    assert not GroupKeys.of("main").workers.startswith("other:")
