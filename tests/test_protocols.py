"""Script protocols across releases on one Redis: the long-running commands announce this
release's and refuse to start beside a release they do not run beside (a rolling deploy)."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_rcoord.connection import get_client
from django_rcoord.protocols import (
    OLDEST_COMPATIBLE,
    PROTOCOLS,
    ProtocolMismatch,
    announce,
    protocols_key,
)


def announced() -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in get_client().hgetall(protocols_key()).items()}


def ours() -> dict[str, str]:
    return {family: f"{v}:{OLDEST_COMPATIBLE[family]}" for family, v in PROTOCOLS.items()}


def test_a_first_start_announces_this_releases_protocols() -> None:
    call_command("poll_delayed", "--once")
    assert announced() == ours()
    assert get_client().ttl(protocols_key()) == -1  # one small key per prefix, kept


def test_the_previous_release_and_this_one_run_side_by_side() -> None:
    # The release before announced nothing: its protocols are 1 everywhere.
    get_client().hset(protocols_key(), mapping=dict.fromkeys(PROTOCOLS, "1:1"))
    announce()
    assert announced() == ours()


def test_a_newer_release_that_does_not_run_beside_this_one_is_refused() -> None:
    get_client().hset(protocols_key(), "lock", f"{PROTOCOLS['lock'] + 2}:{PROTOCOLS['lock'] + 1}")
    with pytest.raises(CommandError, match="a newer release announced lock protocol"):
        call_command("run_email_worker", "--burst", "--queues", "default")
    # --upgrade-protocols is for an older release: a newer one still refuses this one, and
    # its announcement stays.
    with pytest.raises(CommandError, match="upgrade this process"):
        call_command("poll_delayed", "--once", "--upgrade-protocols")
    assert announced()["lock"] == f"{PROTOCOLS['lock'] + 2}:{PROTOCOLS['lock'] + 1}"


def test_an_older_release_this_one_does_not_run_beside_is_refused_until_upgraded() -> None:
    get_client().hset(protocols_key(), "lock", "0:0")
    with pytest.raises(ProtocolMismatch, match="stop that release's processes"):
        announce()
    call_command("poll_delayed", "--once", "--upgrade-protocols")
    assert announced() == ours()
    announce()  # from now on, a plain start goes
