from __future__ import annotations

import io
import logging
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.handlers.asgi import ASGIRequest
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.http import HttpResponse
from django.test import Client, override_settings
from django.utils.http import url_has_allowed_host_and_scheme

from django_rcoord.connection import get_client
from django_rcoord.decorators import locked, rate_limited
from django_rcoord.locks import Lock
from django_rcoord.responses import error_response
from tests import views
from tests.models import Sale
from tests.procs import close_thread_connections
from tests.views import lock_is_held


@pytest.fixture
def held_item_1():
    lock = Lock("purchase:1", timeout=7, wait=0)
    assert lock.acquire()
    yield lock
    lock.release()


@pytest.mark.parametrize("url", ["/purchase/1/", "/async-purchase/1/"])
def test_view_runs_holding_the_lock_and_frees_it(client, url: str) -> None:
    response = client.get(url)
    assert response.status_code == 200
    assert response.json()["held"] is True
    assert not lock_is_held("purchase:1")


@pytest.mark.parametrize("url", ["/cbv/1/", "/async-cbv/1/"])
def test_class_based_views(client, url: str, held_item_1: Lock) -> None:
    assert client.post(url).status_code == 409
    assert client.post(url.replace("/1/", "/2/")).json() == {"item": 2, "held": True}


@pytest.mark.parametrize("url", ["/purchase/1/", "/async-purchase/1/"])
def test_grant_no_replica_acknowledged_gives_503_and_frees_the_lock(client, url: str) -> None:
    # The suite's Redis has no replicas, so a grant that must reach one is given back.
    durable = {**settings.RCOORD, "LOCK_REPLICAS": 1, "LOCK_REPLICA_TIMEOUT": 0.05}
    with override_settings(RCOORD=durable):
        response = client.get(url, HTTP_ACCEPT="application/json")
    assert response.status_code == 503
    assert response.json()["error"] == "lock_not_replicated"
    assert response["Retry-After"] == "1"
    assert not lock_is_held("purchase:1")
    assert client.get(url).status_code == 200  # without LOCK_REPLICAS it runs


@pytest.mark.parametrize("url", ["/purchase/1/", "/async-purchase/1/"])
def test_busy_gives_409_with_retry_after_and_json(client, url: str, held_item_1: Lock) -> None:
    response = client.get(url, HTTP_ACCEPT="application/json")
    assert response.status_code == 409
    assert 1 <= int(response["Retry-After"]) <= 7
    assert response.json()["error"] == "locked"
    html = client.get(url, HTTP_ACCEPT="text/html")
    assert html.status_code == 409
    assert html["Content-Type"].startswith("text/html")
    assert held_item_1.owned()


@pytest.mark.parametrize("url", ["/purchase/2/", "/async-purchase/2/"])
def test_different_keys_do_not_block_each_other(client, url: str, held_item_1: Lock) -> None:
    assert client.get(url).status_code == 200


def test_view_sees_its_lock_and_fencing_token(client) -> None:
    first = client.get("/purchase/5/").json()["token"]
    second = client.get("/purchase/5/").json()["token"]
    assert second == first + 1


@pytest.mark.parametrize("url", ["/purchase/1/?fail=1", "/async-purchase/1/?fail=1"])
def test_lock_is_freed_when_the_view_raises(client, url: str) -> None:
    with pytest.raises(RuntimeError):
        client.get(url)
    assert not lock_is_held("purchase:1")
    assert client.get(url.split("?")[0]).status_code == 200


async def test_async_view_with_async_client(async_client, held_item_1: Lock) -> None:
    assert (await async_client.get("/async-purchase/1/")).status_code == 409
    assert (await async_client.get("/async-purchase/3/")).status_code == 200


def test_missing_url_kwarg_is_improperly_configured(client) -> None:
    with pytest.raises(ImproperlyConfigured, match=r"purchase:\{missing\}.*misconfigured"):
        client.get("/misconfigured/1/")


def test_callable_key_and_on_busy(client, held_item_1: Lock) -> None:
    response = client.get("/custom-busy/1/")
    assert (response.status_code, response.content) == (423, b"later")
    assert client.get("/custom-busy/2/").status_code == 200


def test_url_text_cannot_escape_the_lock_namespace(client) -> None:
    lock = Lock("note:a}{b", wait=0)
    assert lock.acquire()
    assert client.get("/note/a%7D%7Bb/").status_code == 409
    assert client.get("/note/a%7D%7Bc/").json() == {"held": True}
    lock.release()


def test_overlong_url_value_is_a_400(client) -> None:
    response = client.get("/note/" + "x" * 300 + "/", HTTP_ACCEPT="application/json")
    assert response.status_code == 400
    assert response.json()["error"] == "bad_lock_key"


@pytest.mark.django_db
def test_user_attribute_in_key(client, django_user_model) -> None:
    user = django_user_model.objects.create_user("ada", password="pw")
    client.force_login(user)
    lock = Lock(f"profile:{user.pk}", wait=0)
    assert lock.acquire()
    assert client.get("/profile/").status_code == 409
    lock.release()
    assert client.get("/profile/").json() == {"held": True}


# -- Redis unreachable ----------------------------------------------------------------
@pytest.mark.parametrize("url", ["/purchase/1/", "/async-purchase/1/"])
def test_locked_fails_closed_with_503_when_redis_is_down(
    client, redis_down: str, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR):
        response = client.get(url, HTTP_ACCEPT="application/json")
    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert response.json() == {
        "error": "unavailable",
        "detail": "This service is temporarily unavailable; try again shortly.",
        "retry_after": 5,
    }
    assert "@locked on view tests.views." in caplog.text
    assert "refused a request: Redis unavailable" in caplog.text
    page = client.get(url)
    assert page.status_code == 503
    assert page["Retry-After"] == "5"
    assert page.templates[0].name == "django_rcoord/errors/503.html"


@pytest.mark.parametrize("url", ["/purchase-fail-open/1/", "/async-purchase-fail-open/1/"])
def test_locked_fail_open_runs_the_view_without_the_lock(
    client, redis_down: str, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR):
        response = client.get(url)
    assert response.status_code == 200
    assert response.json() == {"locked": False}
    assert "not applied: Redis unavailable" in caplog.text


def test_locked_fail_open_holds_the_lock_when_redis_is_up(client) -> None:
    assert client.get("/purchase-fail-open/1/").json() == {"locked": True}


@pytest.mark.parametrize("url", ["/download/", "/download-async/"])
def test_rate_limited_fails_open_by_default_when_redis_is_down(
    client, redis_down: str, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR):
        statuses = [client.get(url).status_code for _ in range(3)]
    assert statuses == [200, 200, 200]  # the limit is 2: nothing was counted
    assert "@rate_limited on view tests.views." in caplog.text
    assert "not applied: Redis unavailable" in caplog.text


@pytest.mark.parametrize("url", ["/download-strict/", "/download-strict-async/"])
def test_rate_limited_fail_open_false_gives_503(client, redis_down: str, url: str) -> None:
    response = client.get(url, HTTP_ACCEPT="application/json")
    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert response.json()["error"] == "unavailable"


async def test_async_client_gets_the_503_of_a_closed_decorator(
    async_client, redis_down: str
) -> None:
    for url in ("/async-purchase/1/", "/download-strict-async/"):
        response = await async_client.get(url, headers={"accept": "application/json"})
        assert response.status_code == 503
        assert response["Retry-After"] == "5"
        assert response.json()["error"] == "unavailable"
    assert (await async_client.get("/download-async/")).status_code == 200


@pytest.mark.parametrize("url", ["/outlive/", "/outlive-async/"])
def test_redis_lost_while_the_view_runs_keeps_its_response(
    client, redis_to_stop, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    views.while_locked[:] = [redis_to_stop.stop]
    try:
        with caplog.at_level(logging.ERROR):
            response = client.get(url)
    finally:
        views.while_locked.clear()
    assert (response.status_code, response.content) == (200, b"done")
    assert "could not release its lock 'outlive'" in caplog.text


def test_fail_open_must_be_a_bool() -> None:
    with pytest.raises(ImproperlyConfigured, match="fail_open must be True or False"):
        locked("x", fail_open="no")  # type: ignore[arg-type]
    with pytest.raises(ImproperlyConfigured, match="fail_open must be True or False"):
        rate_limited("x", limit=1, seconds=1, fail_open=None)  # type: ignore[arg-type]


# -- anonymous users ----------------------------------------------------------------
@pytest.mark.parametrize("url", ["/profile/", "/profile-async/"])
def test_anonymous_users_of_a_user_key_are_keyed_by_ip(url: str) -> None:
    lock = Lock("profile:ip:10.0.0.1", wait=0)
    assert lock.acquire()
    try:
        assert Client(REMOTE_ADDR="10.0.0.1").get(url).status_code == 409
        assert Client(REMOTE_ADDR="10.0.0.2").get(url).status_code == 200
    finally:
        lock.release()
    assert not lock_is_held("profile:None")


# -- error pages ------------------------------------------------------------------------
ERROR_TEMPLATES = ["django_rcoord/errors/409.html", "django_rcoord/errors/base.html"]


@pytest.mark.parametrize("url", ["/purchase/1/", "/async-purchase/1/"])
def test_busy_page_is_rendered_from_templates_with_a_way_back(
    client, url: str, held_item_1: Lock
) -> None:
    page = client.get(url, HTTP_REFERER="http://testserver/shop/?page=2")
    assert page.status_code == 409
    assert [template.name for template in page.templates] == ERROR_TEMPLATES
    html = page.content.decode()
    assert "Someone else is working on this right now" in html
    assert '<a href="http://testserver/shop/?page=2">Go back</a>' in html
    assert f'<a href="{url}">Try again</a>' in html
    assert page["Cache-Control"] == "no-store"


async def test_async_busy_page_is_rendered_from_templates(async_client, held_item_1) -> None:
    page = await async_client.get("/async-purchase/1/")
    assert page.status_code == 409
    assert [template.name for template in page.templates] == ERROR_TEMPLATES
    assert '<a href="/">Go to the home page</a>' in page.content.decode()


def test_error_page_links_home_instead_of_to_another_site(client, held_item_1: Lock) -> None:
    page = client.get("/purchase/1/", HTTP_REFERER="https://evil.example/phish")
    assert "evil.example" not in page.content.decode()
    assert '<a href="/">Go to the home page</a>' in page.content.decode()


@pytest.mark.parametrize(
    ("path", "retry_url"),
    [
        ("//evil.example/x", "/evil.example/x?a=1"),
        ("///evil.example/x", "/evil.example/x?a=1"),
        ("http://evil.example/x", "/http://evil.example/x?a=1"),  # an ASGI path may be any text
        ("/\\evil.example/x", "/%5Cevil.example/x?a=1"),  # a backslash escaped
        ("/shop/items/", "/shop/items/?a=1"),
    ],
)
def test_the_try_again_link_is_a_path_of_this_site(path: str, retry_url: str) -> None:
    scope = {
        "type": "http",
        "method": "GET",
        "path": path,
        "query_string": b"a=1",
        "headers": [(b"host", b"testserver"), (b"accept", b"text/html")],
    }
    response = error_response(ASGIRequest(scope, io.BytesIO()), 409, "locked", "Busy.")
    assert f'<a href="{retry_url}">Try again</a>' in response.content.decode()
    assert url_has_allowed_host_and_scheme(retry_url, allowed_hosts=None)


def test_a_refused_post_offers_no_link_that_would_resend_it(client, held_item_1: Lock) -> None:
    page = client.post("/cbv/1/")
    assert page.status_code == 409
    assert "Try again" not in page.content.decode()


@pytest.mark.parametrize("url", ["/purchase/1/", "/async-purchase/1/"])
def test_a_project_overrides_the_error_templates(
    client, url: str, held_item_1: Lock, tmp_path
) -> None:
    errors = tmp_path / "django_rcoord" / "errors"
    errors.mkdir(parents=True)
    (errors / "409.html").write_text("Our own page: {{ error }}, back to {{ back_url }}")
    templates = [{**settings.TEMPLATES[0], "DIRS": [tmp_path]}]
    with override_settings(TEMPLATES=templates):
        page = client.get(url)
    assert page.status_code == 409
    assert page.content == b"Our own page: locked, back to /"
    assert client.get(url, HTTP_ACCEPT="application/json").json()["error"] == "locked"


def test_error_pages_render_without_app_template_loaders(client, held_item_1: Lock) -> None:
    with override_settings(TEMPLATES=[]):
        page = client.get("/purchase/1/")
    assert page.status_code == 409
    assert [template.name for template in page.templates] == ERROR_TEMPLATES


# -- decorators on methods ----------------------------------------------------------------
@pytest.mark.parametrize("url", ["/misdecorated/", "/async-misdecorated/"])
@pytest.mark.parametrize(("method", "name"), [("get", "locked"), ("post", "rate_limited")])
def test_a_method_decorated_without_method_decorator_is_a_type_error(
    client, url: str, method: str, name: str
) -> None:
    message = (
        f"{name} didn't receive an HttpRequest. If you are decorating a method, "
        "be sure to use @method_decorator."
    )
    with pytest.raises(TypeError, match=re.escape(message)):
        getattr(client, method)(url)


# -- the request's transaction ------------------------------------------------------------
# A @locked view holds its lock until the request's transaction has committed or rolled
# back (ATOMIC_REQUESTS included), and a TemplateResponse is rendered inside the lock.
SELLING_VIEWS = ["/sell/1/", "/sell-cbv/1/", "/sell-cbv-dispatch/1/"]


@pytest.fixture
def atomic_requests() -> Iterator[None]:
    """ATOMIC_REQUESTS on the default database; Django reads it at each request."""
    config = connections.settings[DEFAULT_DB_ALIAS]  # the connection's own settings_dict
    config["ATOMIC_REQUESTS"] = True
    try:
        yield
    finally:
        config["ATOMIC_REQUESTS"] = False


@pytest.fixture
def second_database() -> Iterator[str]:
    """A second database, "other" (SQLite in memory, no tables), with ATOMIC_REQUESTS."""
    configured = connections.configure_settings(
        {
            DEFAULT_DB_ALIAS: dict(connections.settings[DEFAULT_DB_ALIAS]),
            "other": {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": ":memory:",
                "ATOMIC_REQUESTS": True,
            },
        }
    )
    connections.settings["other"] = configured["other"]
    # Connected here: a test case refuses to open connections to databases it was not
    # set up with.
    connections["other"].connect()
    try:
        yield "other"
    finally:
        # Closed for real: SQLite's close() keeps an in-memory database's connection open.
        BaseDatabaseWrapper.close(connections["other"])
        del connections["other"]
        del connections.settings["other"]


@pytest.fixture
def commits() -> Iterator[list[dict]]:
    """What the selling views' on_commit callbacks saw (tests/views.py)."""
    views.commits.clear()
    yield views.commits
    views.commits.clear()


@pytest.fixture
def rollbacks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each rollback (or rollback to a savepoint) of the default database's connection
    in this thread, as "held" or "free": the state of the lock "sale:1" when it ran."""
    connection = connections[DEFAULT_DB_ALIAS]
    seen: list[str] = []
    for name in ("rollback", "savepoint_rollback"):
        original = getattr(connection, name)

        def spy(*args: object, _original: Any = original) -> Any:
            seen.append("held" if lock_is_held("sale:1") else "free")
            return _original(*args)

        monkeypatch.setattr(connection, name, spy)
    return seen


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("url", SELLING_VIEWS)
def test_atomic_requests_commit_while_the_lock_is_held(
    client, atomic_requests: None, commits: list[dict], url: str
) -> None:
    assert client.post(url).json() == {"sold": True}
    assert commits == [{"item": 1, "alias": "default", "held": True}]
    assert not lock_is_held("sale:1")
    assert client.post(url).status_code == 409  # sold: the next request saw the commit
    assert Sale.objects.count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("url", SELLING_VIEWS)
def test_a_view_that_raises_under_atomic_requests_rolls_back_then_frees_its_lock(
    atomic_requests: None, commits: list[dict], rollbacks: list[str], url: str
) -> None:
    client = Client(raise_request_exception=False)
    assert client.post(f"{url}?fail=1").status_code == 500
    # The view's writes were undone (a rollback, or one to a savepoint of the request's
    # transaction) while the lock was held; then it was freed, at once.
    assert rollbacks[0] == "held"
    assert not lock_is_held("sale:1")
    assert commits == []
    assert not Sale.objects.exists()
    assert client.post(url).json() == {"sold": True}


@pytest.mark.django_db(transaction=True)
def test_every_database_with_atomic_requests_commits_inside_the_lock(
    client, atomic_requests: None, second_database: str, commits: list[dict]
) -> None:
    assert client.post("/sell/1/").json() == {"sold": True}
    assert sorted(commits, key=lambda commit: commit["alias"]) == [
        {"item": 1, "alias": "default", "held": True},
        {"item": 1, "alias": "other", "held": True},
    ]
    assert not lock_is_held("sale:1")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("url", ["/sell-autocommit/1/", "/sell-cbv-autocommit/1/"])
def test_a_view_opted_out_of_atomic_requests_runs_in_autocommit(
    client, atomic_requests: None, commits: list[dict], url: str
) -> None:
    with pytest.raises(RuntimeError):
        client.post(f"{url}?fail=1")
    assert commits == []  # no transaction: each query committed as it ran
    assert Sale.objects.count() == 1  # so the raise did not undo the write
    assert not lock_is_held("sale:1")


@pytest.mark.django_db(transaction=True)
def test_without_atomic_requests_the_view_runs_in_autocommit(client, commits: list[dict]) -> None:
    assert client.post("/sell/1/").json() == {"sold": True}
    assert commits == []
    assert not lock_is_held("sale:1")
    assert Sale.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_inside_a_callers_transaction_the_lock_is_held_until_it_commits(
    rf, commits: list[dict]
) -> None:
    with transaction.atomic():
        assert views.sell(rf.post("/sell/1/"), item_id=1).status_code == 200
        assert lock_is_held("sale:1")
    assert commits == [{"item": 1, "alias": "default", "held": True}]
    assert not lock_is_held("sale:1")


@pytest.mark.django_db
@pytest.mark.parametrize("url", SELLING_VIEWS)
def test_a_test_case_transaction_never_commits_so_the_lock_is_freed_with_the_response(
    client, atomic_requests: None, url: str
) -> None:
    assert client.post(url).json() == {"sold": True}
    assert not lock_is_held("sale:1")


@pytest.mark.parametrize("url", ["/sale-page/1/", "/async-sale-page/1/"])
def test_a_template_response_is_rendered_holding_the_lock(client, url: str) -> None:
    response = client.get(url)
    assert response.content == b"held=True"
    assert not lock_is_held("sale:1")


async def test_an_async_template_response_is_rendered_holding_the_lock(async_client) -> None:
    assert (await async_client.get("/async-sale-page/1/")).content == b"held=True"
    assert not lock_is_held("sale:1")


@pytest.mark.django_db(transaction=True)
async def test_an_async_view_holds_the_lock_through_its_own_transaction(
    async_client, atomic_requests: None, commits: list[dict]
) -> None:
    assert (await async_client.post("/async-sell/1/")).json() == {"sold": True}
    assert commits == [{"item": 1, "alias": "default", "held": True}]
    assert not lock_is_held("sale:1")


@pytest.mark.django_db(transaction=True)
def test_an_async_view_under_atomic_requests_must_opt_out_as_django_asks(
    client, atomic_requests: None
) -> None:
    with pytest.raises(RuntimeError, match="You cannot use ATOMIC_REQUESTS with async views"):
        client.get("/async-sale-page/1/")
    assert not lock_is_held("sale:1")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("url", SELLING_VIEWS)
def test_two_concurrent_buyers_under_atomic_requests_buy_once(
    atomic_requests: None, monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    # Each commit takes 0.3 s (a busy disk, a synchronous replica): had the first buyer
    # released the lock before committing, the second would read the item unsold
    # meanwhile and sell it again (on SQLite: fail on the table the first one locked).
    wrapper_class = type(connections[DEFAULT_DB_ALIAS])
    commit = wrapper_class.commit

    def slow_commit(self: Any) -> None:
        time.sleep(0.3)
        commit(self)

    monkeypatch.setattr(wrapper_class, "commit", slow_commit)
    answers: list[bytes] = []

    def buy(buyer: str) -> None:
        try:
            response = Client(raise_request_exception=False).post(f"{url}?buyer={buyer}")
            answers.append(b"%d %s" % (response.status_code, response.content[:20]))
        finally:
            close_thread_connections()

    buyers = [threading.Thread(target=buy, args=(name,)) for name in ("ada", "bob")]
    for thread in buyers:
        thread.start()
    for thread in buyers:
        thread.join(30)
    # The second buyer waited for the lock, then saw the sale.
    assert sorted(answers) == [b'200 {"sold": true}', b'409 {"sold": false}']
    assert Sale.objects.count() == 1
    # Free for the next buyer (its owner key may stand for a hand-over to the second
    # buyer's expired wait, which the next acquire takes).
    next_buyer = Lock("sale:1", wait=0)
    assert next_buyer.acquire()
    next_buyer.release()


def _in_transaction(request: Any) -> HttpResponse:
    return HttpResponse(str(connections[DEFAULT_DB_ALIAS].in_atomic_block))


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("decorate", "in_transaction"),
    [
        (locked("x"), b"True"),
        (lambda view: transaction.non_atomic_requests(locked("x")(view)), b"False"),
        (lambda view: locked("x")(transaction.non_atomic_requests(view)), b"False"),
    ],
    ids=["atomic", "opted-out-above", "opted-out-below"],
)
def test_non_atomic_requests_above_or_below_locked_is_kept(
    rf, atomic_requests: None, decorate: Any, in_transaction: bytes
) -> None:
    view = decorate(_in_transaction)
    assert view(rf.get("/")).content == in_transaction


def test_a_locked_views_non_atomic_requests_names_its_databases_and_nothing_else() -> None:
    # Django's handler reads it to know on which databases to open no ATOMIC_REQUESTS
    # transaction around the view: every one (@locked opens them inside the lock), and it
    # is an ordinary set of them, as transaction.non_atomic_requests leaves one.
    def view(request: Any) -> HttpResponse:
        return HttpResponse()

    marks = locked("x")(view)._non_atomic_requests  # type: ignore[attr-defined]
    assert set(marks) == set(connections)
    assert "no-such-database" not in marks
    assert not hasattr(view, "_non_atomic_requests")  # the view's own are left alone


@pytest.mark.parametrize(("holder_timeout", "most"), [(6, 6), (30, 30)])
def test_busy_retry_after_is_the_holders_remaining_ttl(client, holder_timeout, most) -> None:
    # The view's own lock timeout is 10 s: the answer is the holder's, an upper bound. The
    # low bound leaves 5 s for a test stalled on a busy machine and still tells 30 from 10.
    holder = Lock("note:ttl", timeout=holder_timeout, wait=0)
    assert holder.acquire()
    try:
        response = client.get("/note/ttl/", HTTP_ACCEPT="application/json")
        assert response.status_code == 409
        seconds = int(response["Retry-After"])
        assert most - 5 <= seconds <= most
        assert response.json()["retry_after"] == seconds
        assert f"within {seconds} s at the latest" in response.json()["detail"]
        page = client.get("/note/ttl/", HTTP_ACCEPT="text/html").content.decode()
        assert "at the latest, usually sooner" in page
        assert "Please try again in" not in page  # an upper bound, not a promise
    finally:
        holder.release()


def test_locked_takes_a_non_fair_lock_when_asked(client) -> None:
    first = client.get("/counter/visits/").json()
    second = client.get("/counter/visits/").json()
    assert first["fair"] is False
    assert second["token"] > first["token"]


@pytest.mark.django_db
@pytest.mark.parametrize("prefix", ["dl", "dl-by-username"])
def test_a_user_cannot_spell_another_clients_key(prefix: str, django_user_model) -> None:
    """A user named ``ip`` asks for item ``127.0.0.1:victim-item`` of ``"dl:{user}:{item_id}"``
    (or ``{user.username}``): before, both filled in to the anonymous visitor's key for item
    ``victim-item`` (``dl:ip:127.0.0.1:victim-item``) and spent its limit. Each value is
    escaped, and ``{user}`` is ``user:<pk>`` for a signed-in user."""
    sneaky = Client()
    sneaky.force_login(django_user_model.objects.create_user("ip", password="pw"))
    assert sneaky.get(f"/{prefix}/127.0.0.1:victim-item/").status_code == 200
    assert sneaky.get(f"/{prefix}/127.0.0.1:victim-item/").status_code == 429  # its own limit
    visitor = Client(REMOTE_ADDR="127.0.0.1")
    assert visitor.get(f"/{prefix}/victim-item/").status_code == 200
    assert visitor.get(f"/{prefix}/victim-item/").status_code == 429
    keys = list(get_client().scan_iter(match="*ratelimit*"))
    assert len(keys) == 2, keys  # one each
