from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_rcoord.conf import conf, get


def test_defaults_when_unset() -> None:
    with override_settings(RCOORD={}):
        assert conf.CONNECTION == "default"
        assert conf.KEY_PREFIX == "rcoord"
        assert conf.CLIENT_FACTORY is None
        assert conf.EMBEDDED_REDIS_DIR is None


def test_read_at_call_time() -> None:
    with override_settings(RCOORD={"CONNECTION": "other", "KEY_PREFIX": "p"}):
        assert conf.CONNECTION == "other"
        assert conf.KEY_PREFIX == "p"
    assert conf.CONNECTION == "default"


def test_not_a_dict_is_a_clear_error() -> None:
    with (
        override_settings(RCOORD=["CONNECTION"]),
        pytest.raises(ImproperlyConfigured, match="must be a dict"),
    ):
        _ = conf.CONNECTION


def test_unknown_name_is_refused() -> None:
    with pytest.raises(KeyError):
        get("CONECTION")
