from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpResponse
from django.test import AsyncRequestFactory, Client, RequestFactory

from django_rcoord.connection import get_client
from django_rcoord.decorators import rate_limited
from django_rcoord.exceptions import InvalidName
from django_rcoord.keys import KeySpace
from django_rcoord.ratelimit import (
    ALGORITHMS,
    RateLimitResult,
    aallow_n,
    ahit,
    allow_n,
    allow_once,
    areset,
    hit,
    reset,
)
from tests.procs import nap, run_in_processes, server_now, within_a_window


def test_allow_once_per_window() -> None:
    # A 1 s window: the second call must come within it (a try the test process was stalled
    # past it in is run again; a sleep only ever lasts longer, so the last call is late).
    within_a_window(once_per_window, "sms")


def once_per_window(name: str) -> None:
    assert allow_once(f"{name}:ada", 1) is True
    assert allow_once(f"{name}:ada", 1) is False
    assert allow_once(f"{name}:bob", 1) is True
    nap(1.05)
    assert allow_once(f"{name}:ada", 1) is True


def test_allow_n_counts_within_the_window_and_rolls_over() -> None:
    # Seven hits must land in one 1.5 s window (a try stalled past it is run again).
    within_a_window(n_per_window, "downloads", window_ms=1500)


def n_per_window(name: str) -> None:
    results = [hit(name, 5, 1.5) for _ in range(7)]
    assert [r.allowed for r in results] == [True] * 5 + [False] * 2
    assert [r.remaining for r in results] == [4, 3, 2, 1, 0, 0, 0]
    assert 0 < results[-1].retry_after <= 1.5
    nap(results[-1].retry_after + 0.05)
    fresh = hit(name, 5, 1.5)
    assert (fresh.allowed, fresh.hits) == (True, 1)


def test_window_starts_at_its_first_hit_not_at_later_ones() -> None:
    # A 2.5 s window, the second and third hits 0.6 s in: a stalled process has 1.9 s
    # before they would rightly fall into a new window (a try stalled so is run again).
    within_a_window(window_from_first_hit, "edge", window_ms=1900)


def window_from_first_hit(name: str) -> None:
    first = hit(name, 2, 2.5)
    assert first.allowed
    nap(0.6)
    assert allow_n(name, 2, 2.5)
    refused = hit(name, 2, 2.5)
    assert not refused.allowed
    # The window still ends where the first hit put it: the server's countdown has run on.
    assert refused.retry_after <= first.retry_after - 0.6 + 0.002  # (kept in whole ms)
    nap(refused.retry_after + 0.05)  # a new window, although the last hit was recent
    assert allow_n(name, 2, 2.5)


def test_fixed_windows_start_at_a_hit_and_do_not_overlap() -> None:
    # What the server decided, on its clock: a window starts at the hit that finds none
    # (hits == 1) and lasts 0.3 s; it holds at most 3 grants, and the next starts only
    # after it has ended, however late the client was to ask.
    calls: list[tuple[float, RateLimitResult, float]] = []
    deadline = time.monotonic() + 30
    while sum(result.hits == 1 for _, result, _ in calls) < 4:
        assert time.monotonic() < deadline
        sent = server_now()
        result = hit("burst", 3, 0.3)
        calls.append((sent, result, server_now()))
    starts = [(sent, answered) for sent, result, answered in calls if result.hits == 1]
    for (started_sent, _), (_, next_answered) in itertools.pairwise(starts):
        assert next_answered - started_sent >= 0.3 - 0.001  # expiry is kept in ms
    assert all(result.allowed == (result.hits <= 3) for _, result, _ in calls)


def test_a_counter_left_without_expiry_is_repaired() -> None:
    key = KeySpace("ratelimit", "legacy").key("window")
    get_client().set(key, 99)  # e.g. INCR by a process that died before its EXPIRE
    refused = hit("legacy", 5, 0.2)
    assert not refused.allowed
    assert refused.retry_after == 0.2  # the script gave the counter the window's expiry
    assert get_client().pttl(key) in (-2, *range(201))  # expiring (or already gone)
    time.sleep(refused.retry_after + 0.05)
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
    assert 55 <= int(refused["Retry-After"]) <= 60  # the window's rest; 5 s for a stall
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
    assert 55 <= int(page["Retry-After"]) <= 60  # the window's rest; 5 s for a stall
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


# -- the algorithms: fixed, sliding (exact log), sliding_counter, gcra -------------------------

#: Retry-After of the third call at limit=2 per 60 s, by algorithm (whole seconds, inclusive).
#: The low bounds leave a test process stalled between its calls 5 s.
RETRY_AFTER_AT_2_PER_MINUTE = {
    "fixed": (55, 60),  # until the window (started by the first call) ends
    "sliding": (55, 60),  # until the first call leaves the window
    "sliding_counter": (30, 90),  # into the next clock-aligned window: 30 s past its end at most 90
    "gcra": (25, 30),  # one emission interval, 60 / 2
}


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_each_algorithm_allows_its_limit_then_refuses(algorithm: str) -> None:
    results = [hit("api:ada", 5, 60, algorithm=algorithm) for _ in range(7)]
    assert [r.allowed for r in results] == [True] * 5 + [False] * 2
    assert [r.hits for r in results[:5]] == [1, 2, 3, 4, 5]
    assert [r.remaining for r in results] == [4, 3, 2, 1, 0, 0, 0]
    assert all(r.hits > 5 for r in results[5:])
    assert all(r.retry_after > 0 for r in results[5:])
    assert hit("api:bob", 5, 60, algorithm=algorithm).allowed
    assert allow_n("api:cy", 1, 60, algorithm=algorithm)
    assert not allow_n("api:cy", 1, 60, algorithm=algorithm)


@pytest.mark.parametrize("algorithm", ["sliding", "sliding_counter", "gcra"])
def test_retry_after_is_zero_while_a_next_hit_would_pass(algorithm: str) -> None:
    first = hit("r", 2, 60, algorithm=algorithm)
    sent = server_now()
    second = hit("r", 2, 60, algorithm=algorithm)
    refused = hit("r", 2, 60, algorithm=algorithm)
    answered = server_now()
    assert first.allowed
    assert first.retry_after == 0
    assert second.allowed
    assert second.retry_after > 0
    assert not refused.allowed
    # Both name the same moment: they differ by the server time that passed between them
    # (retry_after is kept in us).
    assert -0.000_001 <= second.retry_after - refused.retry_after <= answered - sent + 0.000_001


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_retry_after_of_each_algorithm(algorithm: str) -> None:
    for _ in range(2):
        hit("r", 2, 60, algorithm=algorithm)
    refused = hit("r", 2, 60, algorithm=algorithm)
    low, high = RETRY_AFTER_AT_2_PER_MINUTE[algorithm]
    assert not refused.allowed
    assert low <= refused.retry_after <= high


def test_sliding_window_lets_hits_leave_one_by_one() -> None:
    # 3 per 2 s, the first hit 1 s before the other two: the fourth waits for the first to
    # leave, the fifth for the second. The bounds on retry_after come from the server's
    # clock read around each call, so a slow machine cannot break them; the 1 s gap is the
    # margin a stalled test process has before "refused" would rightly become "allowed" (a
    # try stalled so is run again).
    within_a_window(hits_leave_one_by_one, "slide", window_ms=1000)


def hits_leave_one_by_one(name: str) -> None:
    window = 2.0
    answered = []
    for pause in (1.0, 0, 0):
        assert hit(name, 3, window, algorithm="sliding").allowed
        answered.append(server_now())
        nap(pause)
    sent = server_now()
    refused = hit(name, 3, window, algorithm="sliding")
    assert not refused.allowed
    assert refused.hits == 4
    assert 0 < refused.retry_after <= answered[0] + window - sent
    nap(refused.retry_after + 0.01)
    assert hit(name, 3, window, algorithm="sliding").allowed  # the first hit has left
    sent = server_now()
    again = hit(name, 3, window, algorithm="sliding")
    assert not again.allowed  # the second has not: a fixed window would now be empty
    assert 0 < again.retry_after <= answered[1] + window - sent
    assert get_client().zcard(KeySpace("ratelimit", name).key("log")) == 3


def _grants(check: Callable[[], bool], count: int) -> list[tuple[float, float]]:
    """Call ``check`` until it has said True ``count`` times; for each True, the server's
    time just before the call was sent and just after it was answered: the server decided
    in between, on the same clock (a client's clock may run apart from the server's by more
    than a test's margin, and a stalled client reads it late)."""
    grants: list[tuple[float, float]] = []
    deadline = time.monotonic() + 30
    while len(grants) < count:
        assert time.monotonic() < deadline
        sent = server_now()
        if check():
            grants.append((sent, server_now()))
    return grants


def test_sliding_window_never_passes_more_than_its_limit_in_any_window() -> None:
    grants = _grants(lambda: allow_n("burst", 3, 0.3, algorithm="sliding"), 9)
    for (first_sent, _), (_, fourth_answered) in zip(grants, grants[3:], strict=False):
        assert fourth_answered - first_sent >= 0.3


def test_gcra_allows_a_burst_then_spaces_hits_by_the_emission_interval() -> None:
    # 5 per 5 s: bursts of 5 after a quiet 5 s, then one hit a second. The interval is the
    # margin a stalled process has before a hit meant to be refused would rightly be
    # allowed: a try stalled past it is run again.
    within_a_window(gcra_burst, "g-burst")

    # What the server decided, on its own clock: each grant moves the stored arrival time
    # (us) on by exactly one emission interval, and none came before its turn (the stored
    # time, less the window) had come on the server's clock. A grant may come late (the
    # client was slow to ask): the next one may then follow sooner, as GCRA allows, but
    # turns never come closer than the interval. The bucket is drained by a burst first.
    assert all(allow_n("g", 5, 5, algorithm="gcra") for _ in range(5))
    key = KeySpace("ratelimit", "g").key("tat")
    client = get_client()
    turns: list[int] = []
    deadline = time.monotonic() + 30
    while len(turns) < 3:
        assert time.monotonic() < deadline
        if allow_n("g", 5, 5, algorithm="gcra"):
            arrival = int(client.get(key))
            turns.append(arrival)
            assert server_now() * 1_000_000 >= arrival - 5_000_000
    assert [b - a for a, b in itertools.pairwise(turns)] == [1_000_000] * 2


def gcra_burst(name: str) -> None:
    burst = [hit(name, 5, 5, algorithm="gcra") for _ in range(6)]
    assert [r.allowed for r in burst] == [True] * 5 + [False]
    assert 0 < burst[-1].retry_after <= 1.0
    nap(burst[-1].retry_after)
    assert hit(name, 5, 5, algorithm="gcra").allowed
    refused = hit(name, 5, 5, algorithm="gcra")
    assert not refused.allowed
    assert 0 < refused.retry_after <= 1.0


def test_gcra_refills_one_cell_per_interval_while_quiet() -> None:
    # 5 per 10 s: one cell every 2 s. After 4.4 s two cells are back and the third comes at
    # 6 s: a stalled process has 1.6 s before the refused hit would pass (and a burst of 5
    # stalled for 2 s would move the bucket on by a cell; a try stalled so is run again).
    within_a_window(refills_while_quiet, "quiet", window_ms=1600)


def refills_while_quiet(name: str) -> None:
    for _ in range(5):
        assert allow_n(name, 5, 10, algorithm="gcra")
    nap(4.4)
    assert [allow_n(name, 5, 10, algorithm="gcra") for _ in range(3)] == [True, True, False]
    key = KeySpace("ratelimit", name).key("tat")
    assert 0 < get_client().pttl(key) <= 10_000  # the bucket is full again when it expires


def _sleep_into_a_new_window(window: float, offset: float = 0.01) -> None:
    """Sleep until ``offset`` after the start of the next window of the server's clock."""
    nap(window - server_now() % window + offset)


def test_sliding_counter_weights_the_previous_window() -> None:
    # 4 per 4 s windows of the server's clock. Each step below has a second or more of
    # margin before a stalled process would rightly see the other answer (a try stalled so
    # is run again), but the last (checked so).
    within_a_window(weights_the_previous_window, "sc", window_ms=1000)


def weights_the_previous_window(name: str) -> None:
    window = 4.0
    _sleep_into_a_new_window(window)
    full = int(server_now() // window)  # the window the four hits fill (or a later one)
    assert [allow_n(name, 4, window, algorithm="sliding_counter") for _ in range(4)] == [True] * 4
    refused = hit(name, 4, window, algorithm="sliding_counter")
    # This window is full: the next must be a quarter in before 4 x 3/4 + 1 <= 4.
    assert not refused.allowed
    assert 0 < refused.retry_after <= 1.25 * window
    nap(refused.retry_after + 0.01)
    sent = server_now()
    assert hit(name, 4, window, algorithm="sliding_counter").allowed
    again = hit(name, 4, window, algorithm="sliding_counter")
    answered = server_now()
    # Now 4 x 0.74 + 1 + 1 > 4, until the previous window weighs 2: half-way in. Asked of
    # a test process stalled past half-way, or into a later window (the server's clock
    # around the two hits says so), it would rightly be allowed.
    same_window = int(sent // window) == int(answered // window) == full + 1
    if same_window and answered % window < window / 2:
        assert not again.allowed
        assert 0 < again.retry_after <= 0.25 * window


def _hit_at_the_gate(algorithms: list[str], gate: str, processes: int, attempts: int) -> dict:
    """In each of several processes: wait for all of them, then hit every algorithm's key."""
    client = get_client()
    client.incr(gate)
    deadline = time.monotonic() + 60
    while int(client.get(gate)) < processes:
        assert time.monotonic() < deadline, "the other processes did not come"
        time.sleep(0.001)
    allowed = dict.fromkeys(algorithms, 0)
    for _ in range(attempts):
        for algorithm in algorithms:
            allowed[algorithm] += allow_n(f"shared:{algorithm}", 50, 3600, algorithm=algorithm)
    return allowed


def test_exact_limit_under_concurrent_hits_from_several_processes() -> None:
    processes = 4
    counts = run_in_processes(
        _hit_at_the_gate, [(list(ALGORITHMS), "test:gate", processes, 40)] * processes
    )
    for algorithm in ALGORITHMS:
        assert sum(count[algorithm] for count in counts) == 50, algorithm
    assert get_client().zcard(KeySpace("ratelimit", "shared:sliding").key("log")) == 50


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_async_exact_limit_under_hundreds_of_concurrent_tasks(algorithm: str) -> None:
    results = await asyncio.gather(
        *(ahit("many", 100, 3600, algorithm=algorithm) for _ in range(300))
    )
    allowed = [result for result in results if result.allowed]
    assert len(allowed) == 100
    assert sorted(result.hits for result in allowed) == list(range(1, 101))
    assert await aallow_n("many", 100, 3600, algorithm=algorithm) is False
    await areset("many")
    assert await aallow_n("many", 100, 3600, algorithm=algorithm) is True


def test_reset_forgets_every_algorithm() -> None:
    for algorithm in ALGORITHMS:
        assert allow_n("all", 1, 60, algorithm=algorithm)
        assert not allow_n("all", 1, 60, algorithm=algorithm)
    reset("all")
    assert all(allow_n("all", 1, 60, algorithm=algorithm) for algorithm in ALGORITHMS)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_bad_names_stay_in_their_own_key(algorithm: str) -> None:
    part = {"fixed": "window", "sliding": "log", "sliding_counter": "counters", "gcra": "tat"}
    client = get_client()
    for name in ["a}:log", "a", "{a}", "*", "x y\n", "ratelimit:{a}:tat"]:
        assert allow_n(name, 1, 60, algorithm=algorithm)
        (key,) = client.scan_iter(match=KeySpace("ratelimit", name).pattern, count=1000)
        assert key.decode() == KeySpace("ratelimit", name).key(part[algorithm])
        assert key.decode().count("{") == key.decode().count("}") == 1
    # Six names, six keys: none reached another's.
    assert len(list(client.scan_iter(match="rcoord:ratelimit:*", count=1000))) == 6
    with pytest.raises(InvalidName):
        hit("", 1, 60, algorithm=algorithm)
    with pytest.raises(InvalidName):
        hit("x" * 201, 1, 60, algorithm=algorithm)


def test_unknown_algorithms_and_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown rate-limit algorithm 'leaky'"):
        hit("x", 1, 60, algorithm="leaky")
    with pytest.raises(ImproperlyConfigured, match="unknown rate-limit algorithm 'leaky'"):
        rate_limited("x", limit=1, seconds=60, algorithm="leaky")
    for algorithm in ALGORITHMS:
        with pytest.raises(ValueError, match="limit must be a positive integer"):
            hit("x", 0, 60, algorithm=algorithm)
        with pytest.raises(ValueError, match="seconds must be a positive number"):
            hit("x", 1, 0, algorithm=algorithm)


def _views(algorithm: str) -> tuple:
    @rate_limited("algo:{name}", limit=2, seconds=60, algorithm=algorithm)
    def sync_view(request, name):
        return HttpResponse("ok")

    @rate_limited("algo:{name}", limit=2, seconds=60, algorithm=algorithm)
    async def async_view(request, name):
        return HttpResponse("ok")

    return sync_view, async_view


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_rate_limited_sync_view_gives_429_and_retry_after_per_algorithm(algorithm: str) -> None:
    view, _ = _views(algorithm)
    request = RequestFactory().get("/", HTTP_ACCEPT="application/json")
    assert [view(request, name="ada").status_code for _ in range(2)] == [200, 200]
    refused = view(request, name="ada")
    low, high = RETRY_AFTER_AT_2_PER_MINUTE[algorithm]
    assert refused.status_code == 429
    assert low <= int(refused["Retry-After"]) <= high
    assert json.loads(refused.content)["error"] == "rate_limited"
    assert json.loads(refused.content)["retry_after"] == int(refused["Retry-After"])
    assert view(request, name="bob").status_code == 200
    assert view(request, name="x" * 300).status_code == 400  # a name too long for a key


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_rate_limited_async_view_gives_429_and_retry_after_per_algorithm(
    algorithm: str,
) -> None:
    _, view = _views(algorithm)
    request = AsyncRequestFactory().get("/", HTTP_ACCEPT="application/json")
    assert [(await view(request, name="ada")).status_code for _ in range(2)] == [200, 200]
    refused = await view(request, name="ada")
    low, high = RETRY_AFTER_AT_2_PER_MINUTE[algorithm]
    assert refused.status_code == 429
    assert low <= int(refused["Retry-After"]) <= high
    assert (await view(request, name="bob")).status_code == 200


def test_sliding_counter_keeps_two_windows_and_expires_after_them() -> None:
    key = KeySpace("ratelimit", "two").key("counters")
    for _ in range(4):  # hits in four windows of 0.1 s
        assert allow_n("two", 100, 0.1, algorithm="sliding_counter")
        assert get_client().hlen(key) <= 2
        assert get_client().pttl(key) in (-2, *range(201))  # expiring (or already gone)
        time.sleep(0.1)
    time.sleep(0.15)
    assert not get_client().exists(key)


@pytest.mark.parametrize("algorithm", ["sliding", "sliding_counter", "gcra"])
async def test_rate_limited_fails_open_or_closed_with_every_algorithm(
    algorithm: str, redis_down: str
) -> None:
    @rate_limited("down", limit=1, seconds=60, algorithm=algorithm)
    def open_view(request):
        return HttpResponse("ok")

    @rate_limited("down", limit=1, seconds=60, algorithm=algorithm, fail_open=False)
    async def closed_view(request):
        return HttpResponse("ok")

    request = AsyncRequestFactory().get("/", HTTP_ACCEPT="application/json")
    assert [open_view(request).status_code for _ in range(2)] == [200, 200]
    closed = await closed_view(request)
    assert closed.status_code == 503
    assert closed["Retry-After"] == "5"
