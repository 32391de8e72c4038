from __future__ import annotations

import time

import pytest
from django.test import Client

from django_rcoord.connection import get_client
from django_rcoord.keys import KeySpace
from django_rcoord.ratelimit import allow_n, allow_once, hit, reset


def test_allow_once_per_window() -> None:
    assert allow_once("sms:ada", 0.3) is True
    assert allow_once("sms:ada", 0.3) is False
    assert allow_once("sms:bob", 0.3) is True
    time.sleep(0.35)
    assert allow_once("sms:ada", 0.3) is True


def test_allow_n_counts_within_the_window_and_rolls_over() -> None:
    results = [hit("downloads:ada", 5, 0.5) for _ in range(7)]
    assert [r.allowed for r in results] == [True] * 5 + [False] * 2
    assert [r.remaining for r in results] == [4, 3, 2, 1, 0, 0, 0]
    assert 0 < results[-1].retry_after <= 0.5
    time.sleep(results[-1].retry_after + 0.05)
    fresh = hit("downloads:ada", 5, 0.5)
    assert (fresh.allowed, fresh.hits) == (True, 1)


def test_window_starts_at_its_first_hit_not_at_later_ones() -> None:
    assert allow_n("edge", 2, 0.4)
    time.sleep(0.25)
    assert allow_n("edge", 2, 0.4)
    assert not allow_n("edge", 2, 0.4)
    time.sleep(0.2)  # 0.45 s after the first hit: a new window, although the last hit was recent
    assert allow_n("edge", 2, 0.4)


def test_no_window_exceeds_its_limit_across_the_edge() -> None:
    allowed_at = []
    end = time.monotonic() + 1.2
    while time.monotonic() < end:
        if allow_n("burst", 3, 0.3):
            allowed_at.append(time.monotonic())
    # Windows start at their first hit and last 0.3 s: any 3 + 1 consecutive grants
    # span at least one full window.
    assert len(allowed_at) >= 9
    for first, fourth in zip(allowed_at, allowed_at[3:], strict=False):
        assert fourth - first >= 0.29


def test_a_counter_left_without_expiry_is_repaired() -> None:
    key = KeySpace("ratelimit", "legacy").key("window")
    get_client().set(key, 99)  # e.g. INCR by a process that died before its EXPIRE
    assert not allow_n("legacy", 5, 0.2)
    assert 0 < get_client().pttl(key) <= 200
    time.sleep(0.25)
    assert allow_n("legacy", 5, 0.2)


def test_reset_and_bad_arguments() -> None:
    assert allow_once("r", 60)
    assert not allow_once("r", 60)
    reset("r")
    assert allow_once("r", 60)
    with pytest.raises(ValueError, match="limit must be a positive integer"):
        hit("r", 0, 60)
    with pytest.raises(ValueError, match="seconds must be a positive number"):
        allow_once("r", 0)


@pytest.mark.django_db
def test_rate_limited_view_gives_429_with_retry_after(client, django_user_model) -> None:
    ada = django_user_model.objects.create_user("ada", password="pw")
    bob = django_user_model.objects.create_user("bob", password="pw")
    client.force_login(ada)
    assert [client.get("/download/").status_code for _ in range(2)] == [200, 200]
    refused = client.get("/download/", HTTP_ACCEPT="application/json")
    assert refused.status_code == 429
    assert 59 <= int(refused["Retry-After"]) <= 60
    assert refused.json()["error"] == "rate_limited"
    client.force_login(bob)
    assert client.get("/download/").status_code == 200


@pytest.mark.parametrize("url", ["/download/", "/download-async/"])
def test_anonymous_users_are_limited_per_ip_not_in_one_bucket(url: str) -> None:
    first, second = Client(REMOTE_ADDR="10.0.0.1"), Client(REMOTE_ADDR="10.0.0.2")
    assert [first.get(url).status_code for _ in range(3)] == [200, 200, 429]
    assert [second.get(url).status_code for _ in range(3)] == [200, 200, 429]
    window = KeySpace("ratelimit", "download:ip:10.0.0.1").key("window")
    assert get_client().get(window) == b"3"
    assert not get_client().exists(KeySpace("ratelimit", "download:None").key("window"))


async def test_async_client_anonymous_user_is_keyed_by_its_ip(async_client) -> None:
    # (The ASGI test client always comes from 127.0.0.1; the test above runs the async
    # view for two addresses through the sync client.)
    statuses = [(await async_client.get("/download-async/")).status_code for _ in range(3)]
    assert statuses == [200, 200, 429]
    window = KeySpace("ratelimit", "download:ip:127.0.0.1").key("window")
    assert get_client().get(window) == b"3"


@pytest.mark.parametrize("url", ["/download/", "/download-async/"])
def test_429_page_is_rendered_from_templates(client, url: str) -> None:
    for _ in range(2):
        client.get(url)
    page = client.get(url)
    assert page.status_code == 429
    assert 59 <= int(page["Retry-After"]) <= 60
    assert [template.name for template in page.templates] == [
        "django_rcoord/errors/429.html",
        "django_rcoord/errors/base.html",
    ]
    assert "<h1>Too many requests</h1>" in page.content.decode()
    assert f'<a href="{url}">Try again</a>' in page.content.decode()


async def test_rate_limited_async_view(async_client) -> None:
    assert (await async_client.get("/greet/ada/")).status_code == 200
    refused = await async_client.get("/greet/ada/")
    assert refused.status_code == 429
    assert refused["Retry-After"]
    assert (await async_client.get("/greet/bob/")).status_code == 200


@pytest.mark.django_db
def test_verification_code_page_sends_one_code_a_minute(
    client, django_user_model, mailoutbox
) -> None:
    user = django_user_model.objects.create_user("ada", email="ada@example.com", password="pw")
    client.force_login(user)
    assert client.get("/example/verification-code/").status_code == 200
    first = client.post("/example/verification-code/")
    assert first.status_code == 200
    assert "on its way" in first.content.decode()
    second = client.post("/example/verification-code/")
    assert second.status_code == 429
    assert "One code a minute" in second.content.decode()
    assert len(mailoutbox) == 1
    assert mailoutbox[0].to == ["ada@example.com"]
