from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.test import Client, override_settings

from django_rcoord.semaphores import Semaphore
from tests import views
from tests.procs import close_thread_connections, wait_until

MIDDLEWARE = [*settings.MIDDLEWARE, "django_rcoord.middleware.ConcurrencyLimitMiddleware"]


def limits(*rules: dict, **extra_rcoord) -> override_settings:
    return override_settings(
        MIDDLEWARE=MIDDLEWARE,
        RCOORD={**settings.RCOORD, "CONCURRENCY_LIMITS": list(rules), **extra_rcoord},
    )


SLOW = {"name": "slow", "url_names": ["slow", "slow-async"], "limit": 2, "timeout": 10}


@pytest.fixture(autouse=True)
def _reset_gates():
    views.gate.clear()
    while views.inside.acquire(blocking=False):
        pass
    yield
    views.gate.set()
    views.async_gate = None


def in_thread(path: str, results: list, **headers) -> threading.Thread:
    def run() -> None:
        try:
            results.append(Client(raise_request_exception=False).get(path, **headers))
        finally:
            close_thread_connections()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@limits(SLOW)
def test_the_request_over_the_limit_gets_503_with_retry_after(client) -> None:
    results: list = []
    threads = [in_thread("/limited/slow/", results) for _ in range(2)]
    for _ in range(2):
        assert views.inside.acquire(timeout=10)
    refused = client.get("/limited/slow/", HTTP_ACCEPT="application/json")
    assert refused.status_code == 503
    assert refused["Retry-After"] == "1"
    assert refused.json()["error"] == "too_busy"
    page = client.get("/limited/slow/", HTTP_ACCEPT="text/html")
    assert page.status_code == 503
    assert page["Content-Type"].startswith("text/html")
    assert page.templates[0].name == "django_rcoord/errors/503.html"  # as the decorators'
    assert b'<a href="/limited/slow/">Try again</a>' in page.content
    assert client.get("/unlimited/").status_code == 200  # not covered by the rule
    views.gate.set()
    for thread in threads:
        thread.join(10)
    assert [response.status_code for response in results] == [200, 200]
    assert Semaphore("slow", 2).holders() == 0


@limits({"name": "evil", "path": "evil", "limit": 1, "timeout": 10})
def test_the_try_again_link_of_a_refused_request_stays_on_this_site(client) -> None:
    """A request for ``//evil.example/x`` used to render ``href="//evil.example/x"``: a
    protocol-relative link, to another site."""
    semaphore = Semaphore("evil", 1)
    held = semaphore.acquire()
    assert held is not None
    try:
        page = client.get("/x", PATH_INFO="//evil.example/x", QUERY_STRING="a=1&b=2")
    finally:
        semaphore.release(held)
    assert page.status_code == 503
    assert b'<a href="/evil.example/x?a=1&amp;b=2">Try again</a>' in page.content
    assert b'href="//' not in page.content


@limits(SLOW)
async def test_async_the_request_over_the_limit_gets_503(async_client) -> None:
    views.async_gate = asyncio.Event()
    first = asyncio.create_task(async_client.get("/limited/slow-async/"))
    second = asyncio.create_task(async_client.get("/limited/slow-async/"))
    semaphore = Semaphore("slow", 2)
    deadline = time.monotonic() + 10
    while semaphore.holders() < 2:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    refused = await async_client.get("/limited/slow-async/")
    assert refused.status_code == 503
    assert refused["Retry-After"] == "1"
    views.async_gate.set()
    assert [(await first).status_code, (await second).status_code] == [200, 200]
    assert semaphore.holders() == 0


@limits({"name": "all", "path": r"^/limited/", "limit": 5, "timeout": 10})
def test_a_thousand_requests_ten_percent_failing_leave_no_permit_held() -> None:
    client = Client(raise_request_exception=False)
    statuses = [
        client.get(
            "/limited/slow/", {"sleep": 0, "fail": "1" if index % 10 == 0 else ""}
        ).status_code
        for index in range(1000)
    ]
    assert statuses.count(500) == 100
    assert statuses.count(200) == 900
    assert Semaphore("all", 5).holders() == 0


@limits({"name": "all", "path": r"^/limited/", "limit": 5, "timeout": 10})
async def test_async_failures_leave_no_permit_held(async_client) -> None:
    async_client.raise_request_exception = False
    statuses = []
    for batch in range(40):  # batches of 5 concurrent requests: each fits the limit
        responses = await asyncio.gather(
            *(
                async_client.get(
                    "/limited/slow-async/", {"fail": "1" if (batch * 5 + i) % 10 == 0 else ""}
                )
                for i in range(5)
            )
        )
        statuses += [response.status_code for response in responses]
    assert statuses.count(500) == 20
    assert statuses.count(200) == 180
    assert Semaphore("all", 5).holders() == 0


@pytest.mark.django_db(transaction=True)
@limits({**SLOW, "limit": 1, "scope": "user"})
def test_user_scope_keeps_users_apart(django_user_model) -> None:
    ada = django_user_model.objects.create_user("ada", password="pw")
    bob = django_user_model.objects.create_user("bob", password="pw")
    ada_client, bob_client = Client(), Client()
    ada_client.force_login(ada)
    bob_client.force_login(bob)
    results: list = []
    session = ada_client.cookies["sessionid"].value
    thread = in_thread("/limited/slow/", results, HTTP_COOKIE=f"sessionid={session}")
    assert views.inside.acquire(timeout=10)
    assert ada_client.get("/limited/slow/").status_code == 503
    refused_anonymous = Client().get("/limited/slow/?sleep=0")
    assert refused_anonymous.status_code == 200  # anonymous users are limited by IP
    assert bob_client.get("/limited/slow/", {"sleep": 0}).status_code == 200
    views.gate.set()
    thread.join(10)
    assert results[0].status_code == 200


@limits({"name": "ips", "path": "^/limited/", "limit": 1, "timeout": 10, "scope": "ip"})
def test_ip_scope() -> None:
    results: list = []
    thread = in_thread("/limited/slow/", results, REMOTE_ADDR="10.0.0.1")
    assert views.inside.acquire(timeout=10)
    assert Client(REMOTE_ADDR="10.0.0.1").get("/limited/slow/").status_code == 503
    assert Client(REMOTE_ADDR="10.0.0.2").get("/limited/slow/?sleep=0").status_code == 200
    views.gate.set()
    thread.join(10)


@limits({"name": "stream", "path": "^/limited/streaming/", "limit": 1, "timeout": 10})
def test_streaming_response_holds_its_permit_until_the_body_is_sent(client) -> None:
    response = client.get("/limited/streaming/")
    semaphore = Semaphore("stream", 1)
    chunks = iter(response.streaming_content)
    assert next(chunks) == b"chunk 0\n"
    assert semaphore.holders() == 1
    assert client.get("/limited/streaming/").status_code == 503
    assert list(chunks) == [b"chunk 1\n", b"chunk 2\n"]
    assert semaphore.holders() == 0  # released with the last chunk


@limits({"name": "stream", "path": "^/limited/streaming", "limit": 1, "timeout": 10})
def test_an_async_body_after_a_sync_middleware_releases_its_permit(client) -> None:
    # The sync test client runs the middleware sync: its permit is a sync one, released
    # when an ASGI server (here: this loop) has sent the async body.
    response = client.get("/limited/streaming-async-body/")
    semaphore = Semaphore("stream", 1)
    assert semaphore.holders() == 1

    async def read_body() -> list[bytes]:
        return [chunk async for chunk in response.streaming_content]

    assert async_to_sync(read_body)() == [b"chunk 0\n", b"chunk 1\n", b"chunk 2\n"]
    assert semaphore.holders() == 0


@limits({"name": "long", "path": "^/limited/slow/", "limit": 1, "timeout": 4.5})
def test_a_request_longer_than_the_lease_keeps_its_permit() -> None:
    results: list = []
    thread = in_thread("/limited/slow/", results)
    assert views.inside.acquire(timeout=10)  # it holds the permit, in the view
    # Past the 4.5 s lease: only refreshing (every 1.5 s, a third of it) keeps the permit,
    # with 3 s to spare for a refresher stalled on a busy machine.
    time.sleep(5.0)
    assert Client().get("/limited/slow/?sleep=0").status_code == 503
    views.gate.set()
    thread.join(10)
    assert results[0].status_code == 200
    assert Client().get("/limited/slow/?sleep=0").status_code == 200


@pytest.mark.parametrize(("fail_open", "status"), [(True, 200), (False, 503)])
def test_fail_open_with_redis_down(
    redis_down: str, fail_open: bool, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    rule = {"name": "down", "path": "^/limited/", "limit": 1, "timeout": 5, "fail_open": fail_open}
    with limits(rule), caplog.at_level(logging.ERROR):
        response = Client().get("/limited/slow/?sleep=0", HTTP_ACCEPT="application/json")
    assert response.status_code == status
    assert "Concurrency limit 'down'" in caplog.text
    assert "Redis unavailable" in caplog.text
    if not fail_open:
        assert response["Retry-After"] == "5"
        assert response.json()["error"] == "unavailable"


@pytest.mark.parametrize("fail_open", [True, False])
async def test_async_fail_open_with_redis_down(
    redis_down: str, fail_open: bool, async_client
) -> None:
    rule = {"name": "down", "path": "^/limited/", "limit": 1, "timeout": 5, "fail_open": fail_open}
    with limits(rule):
        response = await async_client.get("/limited/slow-async/")
    assert response.status_code == (200 if fail_open else 503)
    if not fail_open:
        assert response["Retry-After"] == "5"
        assert [t.name for t in response.templates] == [
            "django_rcoord/errors/503.html",
            "django_rcoord/errors/base.html",
        ]


class UnreachableUserBackend(ModelBackend):
    """An auth backend whose user look-up fails (the database down while the session's user
    loads): the request's user raises when the middleware's "user" rule reads it."""

    def get_user(self, user_id: object) -> None:
        raise RuntimeError("the users' database is down")

    async def aget_user(self, user_id: object) -> None:
        raise RuntimeError("the users' database is down")


RAISING_USER = override_settings(AUTHENTICATION_BACKENDS=[f"{__name__}.UnreachableUserBackend"])
GLOBAL_THEN_USER = (
    {"name": "site", "path": "^/limited/", "limit": 3, "timeout": 0.6},
    {"name": "per-user", "path": "^/limited/", "limit": 1, "timeout": 0.6, "scope": "user"},
)


@pytest.mark.django_db(transaction=True)
@RAISING_USER
@limits(*GLOBAL_THEN_USER)
def test_a_user_rule_whose_look_up_raises_gives_back_the_permits_taken_before(
    django_user_model,
) -> None:
    """The global rule's permit was taken, then the user rule's look-up raised: the permit
    goes back with the error (before, it stayed held and refreshed for the process's life)."""
    user = django_user_model.objects.create_user("ada", password="pw")
    client = Client(raise_request_exception=False)
    client.force_login(user, backend=f"{__name__}.UnreachableUserBackend")
    for _ in range(5):  # more than the global limit: each would have kept one
        assert client.get("/limited/slow/", {"sleep": 0}).status_code == 500
    assert Semaphore("site", 3).holders() == 0
    assert Client().get("/limited/slow/", {"sleep": 0}).status_code == 200


@pytest.mark.django_db(transaction=True)
@RAISING_USER
@limits(*GLOBAL_THEN_USER)
async def test_async_a_user_rule_whose_look_up_raises_gives_back_the_permits_taken_before(
    django_user_model, async_client
) -> None:
    user = await django_user_model.objects.acreate_user("bob", password="pw")
    await async_client.aforce_login(user, backend=f"{__name__}.UnreachableUserBackend")
    async_client.raise_request_exception = False
    for _ in range(5):
        response = await async_client.get("/limited/slow-async/")
        assert response.status_code == 500
    assert await Semaphore("site", 3).aholders() == 0


@limits(
    {"name": "stream", "path": "^/limited/streaming", "limit": 1, "timeout": 1.5, "max_hold": 1.5}
)
def test_a_permit_is_refreshed_no_longer_than_its_max_hold(client) -> None:
    """A client that reads only the start of a streaming body keeps its permit refreshed
    while the body is pending; ``max_hold`` caps that: past it the permit is no longer
    refreshed and its lease ends (the server's clock decides), body read or not."""
    response = client.get("/limited/streaming/")
    chunks = iter(response.streaming_content)
    assert next(chunks) == b"chunk 0\n"
    semaphore = Semaphore("stream", 1)
    assert semaphore.holders() == 1
    # Refreshed every 0.5 s until 1.5 s, then its last lease (1.5 s) runs out.
    wait_until(lambda: semaphore.holders() == 0, timeout=10)
    assert client.get("/limited/streaming/").status_code == 200
    assert list(chunks) == [b"chunk 1\n", b"chunk 2\n"]  # the slow reader still gets its body
