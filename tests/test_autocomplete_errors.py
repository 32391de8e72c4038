"""The autocomplete endpoint and the widget's form when things go wrong: Redis out of
reach, a parameter given twice."""

from __future__ import annotations

import logging

import pytest
from django import forms
from django.conf import settings
from django.test import override_settings

from django_rcoord.autocomplete import join_guild
from django_rcoord.forms import GuildMemberField

URL = "/example/rcoord/guilds/{}/members/"  # the example project mounts the app

pytestmark = pytest.mark.django_db


@pytest.fixture
def member(client, django_user_model):
    user = django_user_model.objects.create_user("Émile", password="pw")
    join_guild("knights", "Émile")
    join_guild("knights", "Emma")
    client.force_login(user)
    return user


def allow_everyone(request, guild) -> bool:
    return True


@pytest.mark.parametrize("accept", ["application/json", "text/html", "*/*"])
def test_the_endpoint_answers_503_json_when_redis_is_down(
    client, member, redis_down: str, accept: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Always JSON (a browser's Accept too), in the shape of @locked's 503."""
    with caplog.at_level(logging.ERROR):
        response = client.get(URL.format("knights"), {"q": "e"}, HTTP_ACCEPT=accept)
    assert response.status_code == 503
    assert response["Content-Type"] == "application/json"
    assert response["Retry-After"] == "5"
    assert response.json() == {
        "error": "unavailable",
        "detail": "This service is temporarily unavailable; try again shortly.",
        "retry_after": 5,
    }
    assert "no-store" in response["Cache-Control"]
    assert "Guild member search refused a request: Redis unavailable" in caplog.text


def test_the_search_itself_answers_503_when_redis_is_down(client, redis_down: str) -> None:
    """A permission that does not ask Redis: the search is what meets the outage."""
    permission = "tests.test_autocomplete_errors.allow_everyone"
    with override_settings(RCOORD={**settings.RCOORD, "AUTOCOMPLETE_PERMISSION": permission}):
        response = client.get(URL.format("knights"), {"q": "e"})
    assert response.status_code == 503
    assert response.json()["error"] == "unavailable"


@pytest.mark.parametrize(
    ("query", "name"),
    [("q=a&q=b", "q"), ("q=e&limit=1&limit=2", "limit"), ("q=e&after=x&after=y", "after")],
)
def test_a_parameter_given_twice_is_a_400_naming_it(client, member, query, name) -> None:
    response = client.get(URL.format("knights") + "?" + query)
    assert response.status_code == 400
    assert response.json() == {
        "error": "bad_request",
        "detail": f"{name} must be given once (got 2)",
    }


class MailForm(forms.Form):
    to = GuildMemberField(guild="knights")


def test_the_widgets_field_is_invalid_not_a_500_when_redis_is_down(
    redis_down: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The form is shown again with the field's error (what was typed kept); a view that
    prefers a 503 asks for the error's code."""
    form = MailForm({"to": "Emma"})
    with caplog.at_level(logging.ERROR):
        assert not form.is_valid()
    assert form.has_error("to", "unavailable")
    assert form.errors["to"] == [
        "Members of knights cannot be checked right now; try again shortly."
    ]
    assert form.data["to"] == "Emma"
    assert "Members of 'knights' not checked: Redis unavailable" in caplog.text


def test_the_widgets_field_still_refuses_an_empty_value_without_asking(redis_down: str) -> None:
    form = MailForm({"to": ""})
    assert not form.is_valid()
    assert form.has_error("to", "required")
