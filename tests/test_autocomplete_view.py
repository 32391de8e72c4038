from __future__ import annotations

import pytest
from django.conf import settings as django_settings
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_rcoord.autocomplete import join_guild

URL = "/example/rcoord/guilds/{}/members/"  # the example project mounts the app

pytestmark = pytest.mark.django_db


@pytest.fixture
def member(client, django_user_model):
    user = django_user_model.objects.create_user("Émile", password="pw")
    for name in ["Émile", "Emma", "Ezra", "Zoë"]:
        join_guild("knights", name)
    client.force_login(user)
    return user


def allow_everyone(request, guild) -> bool:
    return True


def test_anonymous_and_non_members_are_refused(client, django_user_model) -> None:
    join_guild("knights", "Emma")
    response = client.get(URL.format("knights"), {"q": "e"})
    assert response.status_code == 403
    assert response.json()["error"] == "forbidden"
    outsider = django_user_model.objects.create_user("outsider", password="pw")
    client.force_login(outsider)
    assert client.get(URL.format("knights"), {"q": "e"}).status_code == 403


def test_a_member_searches_the_guild(client, member) -> None:
    response = client.get(URL.format("knights"), {"q": "e", "limit": "1"})
    assert response.status_code == 200
    body = response.json()
    assert body == {
        "guild": "knights",
        "query": "e",
        "results": ["Emma"],
        "next": body["next"],
    }
    assert body["next"]
    following = client.get(URL.format("knights"), {"q": "e", "limit": "1", "after": body["next"]})
    # Folding keeps accents: "Émile" folds to "émile", which does not start with "e".
    assert following.json()["results"] == ["Ezra"]
    assert following.json()["next"] is None
    assert "private" in response["Cache-Control"]
    assert client.get(URL.format("knights"), {"q": "ÉM"}).json()["results"] == ["Émile"]


def test_the_permission_setting_changes_the_rule(client) -> None:
    join_guild("open", "Ada")
    with override_settings(
        RCOORD={
            **django_settings.RCOORD,
            "AUTOCOMPLETE_PERMISSION": "tests.test_autocomplete_view.allow_everyone",
        }
    ):
        assert client.get(URL.format("open"), {"q": "a"}).json()["results"] == ["Ada"]


@pytest.mark.parametrize(
    "params",
    [
        {"q": "x" * 101},
        {"q": "a\x00b"},
        {"q": "line\nbreak"},
        {"limit": "ten"},
        {"limit": "0"},
        {"limit": "51"},
        {"limit": "-1"},
        {"limit": "٣"},  # a digit, but not an ASCII one
        {"after": "%%%"},
        {"after": "YWJj"},  # valid base64, not a cursor
        {"prefix": "ma"},  # not a parameter: without q, a 400 that names q
    ],
)
def test_bad_input_is_a_400_json_error(client, member, params) -> None:
    response = client.get(URL.format("knights"), params)
    assert response.status_code == 400
    assert response.json()["error"] == "bad_request"


def test_a_guild_name_that_is_not_allowed_is_a_400(client, member) -> None:
    response = client.get(URL.format("x" * 300), {"q": "a"})
    assert response.status_code == 400


def test_only_get(client, member) -> None:
    assert client.post(URL.format("knights")).status_code == 405


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(query=st.text(max_size=120), limit=st.text(max_size=4), after=st.text(max_size=30))
def test_fuzzed_queries_never_give_a_500(client, member, query, limit, after) -> None:
    params = {"q": query, "limit": limit, "after": after}
    response = client.get(URL.format("knights"), params)
    assert response.status_code in (200, 400), response.content
    assert response["Content-Type"] == "application/json"


@pytest.mark.parametrize("limit", ["9" * 5000, "0" * 5000 + "5", "1" + "0" * 30])
def test_a_number_thousands_of_digits_long_is_a_400_for_anyone(client, limit) -> None:
    """Read with a bound before int() (which refuses over 4,300 digits with a ValueError):
    a 400, never a 500, for an anonymous client too."""
    response = client.get(URL.format("knights"), {"q": "E", "limit": limit})
    if limit.lstrip("0") == "5":  # leading zeros spell a small number: a fine limit
        assert response.status_code in (200, 403)
    else:
        assert response.status_code == 400
        assert response.json()["error"] == "bad_request"


def test_a_query_that_is_not_utf8_and_a_missing_q_are_400s_naming_q(client, member) -> None:
    response = client.get(URL.format("knights") + "?q=%ff%fe")
    assert response.status_code == 400
    assert "q must be UTF-8" in response.json()["detail"]
    response = client.get(URL.format("knights"), {"prefix": "ma"})
    assert "the query is q" in response.json()["detail"]
    # Beside q, another parameter (a cache buster) changes nothing.
    assert client.get(URL.format("knights"), {"q": "ma", "_": "17"}).status_code == 200
