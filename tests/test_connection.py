from __future__ import annotations

import pytest
import redis
from django.test import override_settings

from django_rcoord.connection import get_client, resolve_client
from django_rcoord.exceptions import ConnectionNotConfigured, RcoordError
from tests import cluster, factories


def test_default_client_reaches_the_configured_server(redis_url: str) -> None:
    get_client().set("probe", "from get_client")
    other = cluster.client_for_url(redis_url)
    assert other.get("probe") == b"from get_client"


def test_resolve_client_prefers_the_given_one(redis_url: str) -> None:
    mine = redis.Redis.from_url(redis_url)
    assert resolve_client(mine) is mine
    assert resolve_client(None) is get_client()


def test_client_factory_overrides_connection_and_is_called_once() -> None:
    factories.calls.clear()
    with override_settings(
        RCOORD={"CONNECTION": "missing", "CLIENT_FACTORY": "tests.factories.make_client"}
    ):
        first = get_client()
        assert get_client() is first
        assert first.client_getname() == "rcoord-factory"
    assert factories.calls == ["make_client"]
    assert get_client().client_getname() != "rcoord-factory"


def test_unimportable_factory_is_a_clear_error() -> None:
    with override_settings(RCOORD={"CLIENT_FACTORY": "tests.factories.nope"}):
        with pytest.raises(ConnectionNotConfigured, match="rcoord.E005"):
            get_client()


def test_missing_alias_is_a_clear_error() -> None:
    with override_settings(RCOORD={"CONNECTION": "elsewhere"}):
        with pytest.raises(ConnectionNotConfigured, match="rcoord.E003"):
            get_client()


def test_cache_without_raw_client_is_a_clear_error() -> None:
    caches = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    }
    with override_settings(CACHES=caches, RCOORD={"CONNECTION": "default"}):
        with pytest.raises(RcoordError, match="rcoord.E004"):
            get_client()
