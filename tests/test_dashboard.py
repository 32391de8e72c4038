"""Operations: the staff dashboard, the Prometheus metrics and the JSON stats endpoint."""

from __future__ import annotations

import json
import logging
import re
import signal
import time

import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import Client, override_settings
from django.urls import reverse

from django_rcoord.connection import get_client
from django_rcoord.keys import KeySpace
from django_rcoord.locks import Lock, new_identifier, protocol
from django_rcoord.ops.status import MAX_MESSAGE_READ, overview
from django_rcoord.queues import dead_letters, execute_later, queue_stats
from django_rcoord.queues.keys import QueueKeys
from django_rcoord.queues.messages import encode_message
from django_rcoord.queues.outcomes import Kind
from django_rcoord.queues.worker import Worker
from django_rcoord.queues.worker.jobs import Done, Outcome
from django_rcoord.responses import UNAVAILABLE_RETRY_AFTER
from django_rcoord.scripts import run_script
from django_rcoord.semaphores import Semaphore
from tests import cluster, tasks
from tests.procs import run_in_processes, wait_until
from tests.test_queues import output_of, result_of, start_worker, take

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "t0ken-for-the-tests-0123456789"


def with_rcoord(**values: object) -> override_settings:
    return override_settings(RCOORD={**settings.RCOORD, **values})


def refuse_everyone(request) -> bool:
    return False


@pytest.fixture
def staff(django_user_model):
    return django_user_model.objects.create_user("olga", password="pw", is_staff=True)


@pytest.fixture
def member(django_user_model):
    return django_user_model.objects.create_user("max", password="pw")


def make_dead_letters(count: int) -> list[str]:
    ids = [tasks.always_fail.delay(f"m{n}") for n in range(count)]
    Worker(["default"], burst=True).run()
    assert queue_stats("default")["dead"] == count
    return ids


# -- who may see and act -----------------------------------------------------------------
def test_anonymous_users_are_sent_to_the_login_page_and_cannot_act(client) -> None:
    (task_id,) = make_dead_letters(1)
    for url in (
        reverse("rcoord:dashboard"),
        reverse("rcoord:dashboard-dead", args=["default"]),
        reverse("rcoord:dashboard-lookup") + f"?task={task_id}",
    ):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("admin:login"))
    action = reverse("rcoord:dashboard-dead-action", args=["default"])
    assert client.post(action, {"action": "requeue"}).status_code == 302
    assert client.post(action, {"action": "delete", "task_id": task_id}).status_code == 302
    assert queue_stats("default") == {"ready": 0, "in_flight": 0, "delayed": 0, "dead": 1}


def test_signed_in_users_who_are_not_staff_get_403_and_cannot_act(client, member) -> None:
    make_dead_letters(2)
    client.force_login(member)
    assert client.get(reverse("rcoord:dashboard")).status_code == 403
    assert client.get(reverse("rcoord:dashboard-dead", args=["default"])).status_code == 403
    action = reverse("rcoord:dashboard-dead-action", args=["default"])
    assert client.post(action, {"action": "requeue"}).status_code == 403
    assert client.post(action, {"action": "delete"}).status_code == 403
    assert queue_stats("default")["dead"] == 2


def test_the_permission_setting_narrows_staff_down(client, staff) -> None:
    client.force_login(staff)
    assert client.get(reverse("rcoord:dashboard")).status_code == 200
    with with_rcoord(DASHBOARD_PERMISSION="tests.test_dashboard.refuse_everyone"):
        assert client.get(reverse("rcoord:dashboard")).status_code == 403
    staff.is_active = False
    staff.save()
    client.force_login(staff)
    assert client.get(reverse("rcoord:dashboard")).status_code in (302, 403)


def test_actions_need_the_csrf_token(staff) -> None:
    make_dead_letters(1)
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff)
    action = reverse("rcoord:dashboard-dead-action", args=["default"])
    assert client.post(action, {"action": "requeue"}).status_code == 403
    assert queue_stats("default")["dead"] == 1
    page = client.get(reverse("rcoord:dashboard-dead", args=["default"]))
    token = page.cookies["csrftoken"].value
    response = client.post(action, {"action": "requeue", "csrfmiddlewaretoken": token})
    assert response.status_code == 302
    assert queue_stats("default")["dead"] == 0


def test_a_bad_action_or_queue_is_a_4xx_not_a_500(client, staff) -> None:
    (task_id,) = make_dead_letters(1)
    client.force_login(staff)
    action = reverse("rcoord:dashboard-dead-action", args=["default"])
    assert client.post(action, {"action": "explode"}).status_code == 400
    other = QueueKeys.of("reports/pdf").name
    assert client.post(action, {"action": "delete", "task_id": "x" * 5}).status_code == 400
    response = client.post(
        reverse("rcoord:dashboard-dead-action", args=[other]),
        {"action": "delete", "task_id": task_id},  # a task of another group
    )
    assert response.status_code == 400
    assert client.get(reverse("rcoord:dashboard-dead", args=["a/"])).status_code == 404
    assert queue_stats("default")["dead"] == 1


# -- what staff see and do ----------------------------------------------------------------
def test_the_dashboard_shows_queues_workers_and_schedules(client, staff) -> None:
    for n in range(3):
        tasks.record.delay(f"r{n}")
    Worker(["default"], burst=True).run()
    tasks.record.delay("waiting")
    tasks.record.schedule("later", delay=60)
    client.force_login(staff)
    with with_rcoord(PERIODIC_TASKS=[{"name": "beat", "task": "tests.tasks.record", "every": 30}]):
        response = client.get(reverse("rcoord:dashboard"))
    assert response.status_code == 200
    assert response["Cache-Control"].startswith("max-age=0")
    (queue,) = response.context["state"]["queues"]
    assert queue["name"] == "default"
    assert queue["ready"] == 1
    assert queue["delayed"] == 1
    assert queue["finished_last_hour"] == 3
    # (In this minute, or the one before where a minute began since the run.)
    assert sum(queue["finished_per_minute"][-2:]) == 3
    page = response.content.decode()
    assert 'id="rcoord-queues"' in page
    assert "<svg" in page
    assert "<rect" in page
    assert "beat" in page  # the periodic schedule
    assert "admin/base_site.html" in [template.name for template in response.templates]


def test_dead_letters_are_paged_with_their_tracebacks(client, staff) -> None:
    make_dead_letters(30)
    client.force_login(staff)
    url = reverse("rcoord:dashboard-dead", args=["default"])
    first = client.get(url)
    assert len(first.context["letters"]) == 25
    assert first.context["pages"] == 2
    assert "ValueError: m0 always fails" in first.content.decode()
    # What the count is, said beside it (a deferred delivery is not a failed run).
    assert "Failed runs</th><td>1 " in first.content.decode()
    second = client.get(url + "?page=2")
    assert len(second.context["letters"]) == 5
    assert client.get(url + "?page=nope").context["page"] == 1
    assert client.get(url + "?page=99").context["page"] == 2
    # A page number thousands of digits long is read with a bound, not by int(): no 500.
    huge = client.get(url, {"page": "9" * 5000})
    assert huge.status_code == 200
    assert huge.context["page"] == 1
    action = reverse("rcoord:dashboard-dead-action", args=["default"])
    back = client.post(action, {"action": "requeue", "page": "9" * 5000})
    assert back.status_code == 302
    assert "page=" not in back["Location"]


def test_requeue_and_delete_one_or_all_are_logged_with_the_user(client, staff, caplog) -> None:
    ids = make_dead_letters(5)
    client.force_login(staff)
    action = reverse("rcoord:dashboard-dead-action", args=["default"])
    with caplog.at_level(logging.INFO, logger="django_rcoord.ops.dashboard"):
        client.post(action, {"action": "requeue", "task_id": ids[2]})
        assert queue_stats("default")["ready"] == 1
        assert ids[2] not in [letter["id"] for letter in dead_letters("default")]
        assert result_of(ids[2]).status == "READY"
        client.post(action, {"action": "delete", "task_id": ids[0]})
        assert [letter["id"] for letter in dead_letters("default")] == [ids[1], ids[3], ids[4]]
        assert result_of(ids[0]).status == "FAILED"  # the record stays until it expires
        client.post(action, {"action": "delete", "confirm": "yes"})
        assert queue_stats("default")["dead"] == 0
    assert [
        record.getMessage()
        for record in caplog.records
        if record.name == "django_rcoord.ops.dashboard"
    ] == [
        f"olga: requeued 1 dead letter(s) of default ({ids[2]})",
        f"olga: deleted 1 dead letter(s) of default ({ids[0]})",
        "olga: deleted 3 dead letter(s) of default",
    ]
    Worker(["default"], burst=True).run()  # the requeued task fails again: dead once more
    assert [letter["id"] for letter in dead_letters("default")] == [ids[2]]
    client.post(action, {"action": "requeue"})
    assert queue_stats("default") == {"ready": 1, "in_flight": 0, "delayed": 0, "dead": 0}


def test_delete_all_asks_for_confirmation_first(client, staff, caplog) -> None:
    make_dead_letters(3)
    client.force_login(staff)
    action = reverse("rcoord:dashboard-dead-action", args=["default"])
    dead_page = client.get(reverse("rcoord:dashboard-dead", args=["default"])).content.decode()
    assert 'value="Delete all 3&hellip;"' in dead_page
    with caplog.at_level(logging.INFO, logger="django_rcoord.ops.dashboard"):
        # The first POST only asks: a confirmation page, nothing deleted.
        asked = client.post(action, {"action": "delete"})
        assert asked.status_code == 200
        assert asked.templates[0].name == "django_rcoord/dashboard/confirm_delete.html"
        assert queue_stats("default")["dead"] == 3
        page = asked.content.decode()
        assert "Delete every dead letter of default (3 now)?" in page
        assert '<input type="hidden" name="confirm" value="yes">' in page
        assert f'action="{action}"' in page
        # Anything but the confirmation field's value asks again.
        assert client.post(action, {"action": "delete", "confirm": "1"}).status_code == 200
        assert queue_stats("default")["dead"] == 3
        # The second POST, from the confirmation page's form, deletes them.
        done = client.post(action, {"action": "delete", "confirm": "yes"})
    assert done.status_code == 302
    assert done["Location"] == reverse("rcoord:dashboard-dead", args=["default"])
    assert queue_stats("default")["dead"] == 0
    assert [
        record.getMessage()
        for record in caplog.records
        if record.name == "django_rcoord.ops.dashboard"
    ] == ["olga: deleted 3 dead letter(s) of default"]


def test_the_confirmation_page_is_for_staff_only(client, member) -> None:
    make_dead_letters(1)
    action = reverse("rcoord:dashboard-dead-action", args=["default"])
    assert client.post(action, {"action": "delete"}).status_code == 302  # to the login page
    client.force_login(member)
    assert client.post(action, {"action": "delete"}).status_code == 403
    assert client.post(action, {"action": "delete", "confirm": "yes"}).status_code == 403
    assert queue_stats("default")["dead"] == 1


def test_look_up_a_task_a_lock_and_a_semaphore_by_name(client, staff) -> None:
    client.force_login(staff)
    (task_id,) = make_dead_letters(1)
    lock = Lock("invoice:7", timeout=30)
    assert lock.acquire()
    semaphore = Semaphore("reports", 2, timeout=30)
    held = [semaphore.acquire(), semaphore.acquire()]
    assert None not in held
    url = reverse("rcoord:dashboard-lookup")
    response = client.get(url, {"task": task_id, "lock": "invoice:7", "semaphore": "reports"})
    found = response.context["found"]
    assert found["task"]["record"].status == "FAILED"
    assert found["lock"]["held"]
    assert 25 < found["lock"]["ttl"] <= 30
    assert found["lock"]["token"] == lock.token
    assert found["semaphore"]["held"] == 2
    assert found["semaphore"]["waiting"] == 0
    assert {holder["id"] for holder in found["semaphore"]["holders"]} == {
        identifier[:8] for identifier in held if identifier is not None
    }
    assert lock.identifier is not None
    assert lock.identifier not in response.content.decode()  # it could release the lock
    lock.release()
    released = client.get(url, {"lock": "invoice:7", "task": "not-an-id"}).context["found"]
    assert not released["lock"]["held"]
    assert released["lock"]["token"] == int(get_client().get(lock._fence_key))
    assert released["task"]["record"] is None


def test_the_lock_look_up_shows_its_state_and_its_waiters(client, staff) -> None:
    """Held with a waiter in line, handed over to it and not confirmed yet ("granted"), held
    by it, then free: the page says which, and how many wait (the scripts are run as a
    waiter runs them, so no waiter has to block meanwhile)."""
    client.force_login(staff)
    name = "invoice:8"
    keys = [KeySpace("lock", name).key(part) for part in protocol.KEY_PARTS]
    holder, waiter = new_identifier(), new_identifier()
    redis_client = get_client()

    def ask(identifier: str, block_ms: int) -> int:
        args = protocol.acquire_args(identifier, 30_000, block_ms, False)
        return int(run_script("lock_acquire", redis_client, keys=keys, args=args))

    assert ask(holder, 0) > 0
    assert ask(waiter, 5000) < 0  # in line

    def shown() -> tuple[str, str]:
        page = client.get(reverse("rcoord:dashboard-lookup"), {"lock": name}).content.decode()
        state = re.search(r'<td class="state">([^<]*)</td>', page)
        waiting = re.search(r'<td class="waiting">([^<]*)</td>', page)
        assert state is not None
        assert waiting is not None
        return state[1], waiting[1]

    assert shown() == ("held", "1")
    release = protocol.release_args(holder, 30_000, 0)  # fair: handed over to the waiter
    assert run_script("lock_release", redis_client, keys=keys, args=release) == 1
    state, waiting = shown()
    # The waiter served leaves the line when it confirms the hand-over.
    assert state.startswith("granted (handed over")
    assert waiting == "1"
    popped = redis_client.blpop([keys[protocol.KEY_PARTS.index("signal")]], timeout=5)
    assert popped is not None  # as the waiter takes its grant
    grant = protocol.handover(popped[1])
    assert grant is not None
    args = protocol.confirm_args(grant[0], 30_000, waiter)
    assert run_script("lock_acquire", redis_client, keys=keys, args=args) == grant[1]
    assert shown() == ("held", "0")
    redis_client.delete(*keys)
    assert shown() == ("free", "0")


@pytest.mark.parametrize("rcoord_first", [True, False])
def test_the_admin_index_links_the_dashboard(client, staff, rcoord_first: bool) -> None:
    # The Quick start appends django_rcoord to INSTALLED_APPS, after the admin.
    installed = [app for app in settings.INSTALLED_APPS if app != "django_rcoord"]
    if rcoord_first:
        installed.insert(0, "django_rcoord")
    else:
        installed.append("django_rcoord")
    client.force_login(staff)
    with override_settings(INSTALLED_APPS=installed):
        page = client.get(reverse("admin:index")).content.decode()
    assert page.count(f'href="{reverse("rcoord:dashboard")}"') == 1
    assert 'id="rcoord-admin-link"' in page
    assert "Site administration" in page  # the admin's own index, extended


# -- metrics and stats --------------------------------------------------------------------
@pytest.mark.parametrize("name", ["rcoord:metrics", "rcoord:stats"])
def test_metrics_and_stats_need_the_token(client, staff, name) -> None:
    url = reverse(name)
    assert client.get(url).status_code == 404  # no token configured: off
    with with_rcoord(METRICS_TOKEN=TOKEN):
        assert client.get(url).status_code == 403
        assert client.get(url, HTTP_AUTHORIZATION=f"Bearer {TOKEN}x").status_code == 403
        assert client.get(url, HTTP_AUTHORIZATION=f"Basic {TOKEN}").status_code == 403
        client.force_login(staff)  # a session is no substitute for the token
        assert client.get(url).status_code == 403
        response = client.get(url, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
        assert response.status_code == 200
        assert client.post(url, HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 405


def test_stats_is_the_document_rcoord_status_prints(client, capsys) -> None:
    tasks.record.delay("a")
    with with_rcoord(METRICS_TOKEN=TOKEN):
        stats = client.get(reverse("rcoord:stats"), HTTP_AUTHORIZATION=f"Bearer {TOKEN}").json()
    call_command("rcoord_status", "--json")
    printed = json.loads(capsys.readouterr().out)
    assert stats.keys() == printed.keys()
    stats.pop("time"), printed.pop("time")
    for queue in stats["queues"] + printed["queues"]:
        queue.pop("oldest_ready_age")
    assert stats == printed
    assert stats["queues"][0]["ready"] == 1


def command_calls(redis_client) -> dict[str, int]:
    """Calls of each command on the server since its statistics were reset."""
    return {
        name.removeprefix("cmdstat_"): stats["calls"]
        for name, stats in redis_client.info("commandstats").items()
    }


@pytest.mark.skipif(cluster.ENABLED, reason="the command statistics of one server")
def test_the_overview_writes_nothing_and_reads_running_tasks_together(redis_client) -> None:
    for index in range(30):
        tasks.record.delay(f"ov{index}")
    execute_later("reports/pdf", "tests.tasks.record", ["grouped"])
    worker = Worker(["default"])
    worker.session.heartbeat(0, time.time())
    for _ in range(3):
        take(worker)  # none finished: all three in flight (with any prefetched beside them)
    owned = redis_client.hgetall(KeySpace("queue", "main").key("owners")).items()
    owners = [task_id for task_id, owner in owned if owner == worker.id.encode()]
    assert len(owners) >= 3
    workers_key = KeySpace("queue", "main").key("workers")
    redis_client.sadd(workers_key, "gone-worker")  # died without signing off
    command_flags = {name: set(info["flags"]) for name, info in redis_client.command().items()}
    stats = queue_stats("default")
    redis_client.config_resetstat()
    state = overview()
    calls = command_calls(redis_client)
    assert {name for name in calls if "write" in command_flags.get(name, set())} == set()
    # The tasks running and the queues' next tasks: one HMGET per group (both have some).
    assert "hget" not in calls
    assert calls["hmget"] == len(state["groups"]) == 2
    assert redis_client.sismember(workers_key, "gone-worker")  # left, not shown
    queues = {queue["name"]: queue for queue in state["queues"]}
    assert {key: queues["default"][key] for key in stats} == stats
    assert queues["default"]["oldest_ready_age"] >= 0
    assert queues["reports/pdf"]["ready"] == 1
    (seen,) = state["workers"]
    assert seen["id"] == worker.id
    assert sorted(seen["running"], key=lambda task: task["id"]) == [
        {"id": task_id.decode(), "task": "tests.tasks.record"} for task_id in sorted(owners)
    ]
    assert state["worker_counts"] == {"main": 1, "reports": 0}
    worker.session.sign_off()  # also drops the members of workers gone without signing off
    assert redis_client.smembers(workers_key) == set()
    assert overview()["workers"] == []


def test_the_overview_reads_no_message_bigger_than_its_bound(redis_client) -> None:
    """A task given a big argument heads its queue: the overview asks its message's length
    and leaves it unread (before, every scrape and page decoded it whole)."""
    tasks.record.delay("x" * (MAX_MESSAGE_READ + 1))
    queues = {queue["name"]: queue for queue in overview()["queues"]}
    assert queues["default"]["ready"] == 1
    assert queues["default"]["oldest_ready_age"] is None  # unread, so unknown
    # One just under the bound is read, and its age known (200 bytes spare for the parts
    # of a message whose length varies: the time written, options a task adds).
    redis_client.flushdb()
    overhead = len(encode_message("tests.tasks.record", "default", [""], {})[1])
    tasks.record.delay("x" * (MAX_MESSAGE_READ - overhead - 200))
    queues = {queue["name"]: queue for queue in overview()["queues"]}
    assert queues["default"]["oldest_ready_age"] is not None


@pytest.mark.slow
def test_prometheus_reads_counters_that_two_worker_processes_add_up(client) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    workers = [start_worker() for _ in range(2)]
    try:
        # Both running before there is work (a burst worker that started late would find
        # the queue drained by the other).
        registered = KeySpace("queue", QueueKeys.of("default").group).key("workers")
        wait_until(lambda: get_client().scard(registered) == 2, timeout=60)
        # One task each, held until both run (a worker stalled through the whole run would
        # otherwise leave every task to the other): a fresh worker takes one task at first.
        ids = [tasks.record_when_released.delay(f"both{n}") for n in range(2)]
        started = lambda: get_client().lrange("test:started", 0, -1)  # noqa: E731
        wait_until(lambda: len({entry.split(b":")[1] for entry in started()}) == 2, timeout=60)
        for n in range(2):
            tasks.release(f"both{n}")
        ids += [tasks.record_slowly.delay(f"s{n}", 0.05) for n in range(40)]
        ids += [tasks.always_fail.delay(f"f{n}") for n in range(6)]
        wait_until(lambda: all(result_of(task_id).is_finished for task_id in ids), timeout=120)
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        outputs = [output_of(worker, 60) for worker in workers]
    assert all(worker.returncode == 0 for worker in workers), outputs
    # Both processes took part.
    assert len({result_of(task_id).worker_ids[0] for task_id in ids}) == 2
    with with_rcoord(METRICS_TOKEN=TOKEN):
        response = client.get(reverse("rcoord:metrics"), HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
        assert response["Content-Type"].startswith("text/plain; version=0.0.4")
        openmetrics = client.get(
            reverse("rcoord:metrics"),
            HTTP_AUTHORIZATION=f"Bearer {TOKEN}",
            HTTP_ACCEPT="application/openmetrics-text; version=1.0.0",
        )
    assert openmetrics["Content-Type"].startswith("application/openmetrics-text")
    families = {
        family.name: family for family in text_string_to_metric_families(response.content.decode())
    }
    finished = {
        (sample.labels["task"], sample.labels["outcome"]): sample.value
        for sample in families["rcoord_tasks_finished"].samples
        if sample.name == "rcoord_tasks_finished_total"
    }
    assert finished == {
        ("tests.tasks.record_when_released", "succeeded"): 2,
        ("tests.tasks.record_slowly", "succeeded"): 40,
        ("tests.tasks.always_fail", "failed"): 6,
    }
    durations = {
        (sample.name, sample.labels["task"], sample.labels.get("le")): sample.value
        for sample in families["rcoord_task_duration_seconds"].samples
    }
    slow = "tests.tasks.record_slowly"
    assert durations[("rcoord_task_duration_seconds_count", slow, None)] == 40
    assert durations[("rcoord_task_duration_seconds_bucket", slow, "0.025")] == 0
    assert durations[("rcoord_task_duration_seconds_bucket", slow, "+Inf")] == 40
    assert 40 * 0.05 <= durations[("rcoord_task_duration_seconds_sum", slow, None)] < 40
    states = {
        sample.labels["state"]: sample.value
        for sample in families["rcoord_queue_tasks"].samples
        if sample.labels["queue"] == "default"
    }
    assert states == {"ready": 0, "in_flight": 0, "delayed": 0, "dead": 6}
    assert "rcoord_workers" in families
    assert "rcoord_delayed_lateness_seconds" in families


def test_a_retry_is_counted_as_retried(client) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    tasks.fail_then_succeed.delay("once", 1)
    for _ in range(200):  # the retry is due 0.05 s later (TASK_RETRY_BACKOFF)
        Worker(["default"], burst=True).run()
        if not queue_stats("default")["delayed"]:
            break
    with with_rcoord(METRICS_TOKEN=TOKEN):
        text = client.get(
            reverse("rcoord:metrics"), HTTP_AUTHORIZATION=f"Bearer {TOKEN}"
        ).content.decode()
    outcomes = {
        sample.labels["outcome"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "rcoord_tasks_finished_total"
    }
    assert outcomes == {"retried": 1, "succeeded": 1}


def test_metrics_and_stats_answer_503_when_redis_is_down(client, redis_down) -> None:
    """The 503 of every other surface (``@locked``'s, the autocomplete endpoint's): code
    ``unavailable``, ``Retry-After``."""
    with with_rcoord(METRICS_TOKEN=TOKEN):
        for name in ("rcoord:metrics", "rcoord:stats"):
            response = client.get(reverse(name), HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
            assert response.status_code == 503
            assert response.json()["error"] == "unavailable"
            assert response["Retry-After"] == str(UNAVAILABLE_RETRY_AFTER)


def test_the_dashboard_answers_503_when_redis_is_down(client, staff, redis_down) -> None:
    client.force_login(staff)
    page = client.get(reverse("rcoord:dashboard"))
    assert page.status_code == 503
    assert page["Retry-After"] == str(UNAVAILABLE_RETRY_AFTER)
    as_json = client.get(reverse("rcoord:dashboard"), HTTP_ACCEPT="application/json")
    assert (as_json.status_code, as_json.json()["error"]) == (503, "unavailable")


def test_metrics_without_prometheus_client_is_a_501_not_a_500(client, monkeypatch) -> None:
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "prometheus_client" else find_spec(name, *args),
    )
    with with_rcoord(METRICS_TOKEN=TOKEN):
        response = client.get(reverse("rcoord:metrics"), HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
        assert response.status_code == 501
        assert "django-rcoord[metrics]" in response.json()["detail"]
        stats = client.get(reverse("rcoord:stats"), HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
        assert stats.status_code == 200


def test_the_per_minute_chart_is_drawn_to_scale() -> None:
    from django_rcoord.ops.dashboard import CHART_HEIGHT, CHART_WIDTH, minute_chart

    chart = minute_chart([0] * 56 + [1, 0, 2, 8])
    heights = [bar["height"] for bar in chart["bars"]]
    assert heights == [0] * 56 + [round(CHART_HEIGHT / 8), 0, round(CHART_HEIGHT / 4), CHART_HEIGHT]
    assert chart["top"] == 8
    assert all(bar["y"] + bar["height"] == CHART_HEIGHT for bar in chart["bars"])
    # The hour spans the chart: the oldest minute at the left edge, now at the right.
    assert chart["bars"][0]["x"] == 0
    assert chart["bars"][-1]["x"] + chart["bar_width"] <= CHART_WIDTH
    assert chart["bars"][-1]["x"] + chart["bar_width"] >= CHART_WIDTH - 3
    assert minute_chart([0] * 60)["top"] == 1  # nothing done: no bar, no division by zero


# -- cancellations ----------------------------------------------------------------------
def _cancel_every(task_ids: list[str], processes: int) -> int:
    """In its own process: once ``processes`` processes are here, try to cancel every one of
    ``task_ids`` (in an order of its own); how many it cancelled."""
    import random

    from django_rcoord.queues import cancel

    redis = get_client()
    redis.incr("test:cancel-arrived")
    while int(redis.get("test:cancel-arrived")) < processes:
        time.sleep(0.001)
    order = list(task_ids)
    random.shuffle(order)
    return sum(cancel(task_id) for task_id in order)


def prometheus_samples(client, name: str, *labels: str) -> dict[tuple[str, ...], float]:
    from prometheus_client.parser import text_string_to_metric_families

    with with_rcoord(METRICS_TOKEN=TOKEN):
        text = client.get(
            reverse("rcoord:metrics"), HTTP_AUTHORIZATION=f"Bearer {TOKEN}"
        ).content.decode()
    return {
        tuple(sample.labels[label] for label in labels): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


def test_cancellations_are_counted_per_queue_once_each_across_processes(client, capsys) -> None:
    from django_rcoord.queues import cancel

    queued = [tasks.record.delay(f"q{n}") for n in range(6)]
    delayed = [tasks.record.schedule(f"d{n}", delay=300) for n in range(3)]
    other = execute_later("reports/pdf", "tests.tasks.add", [1, 2])
    worker = Worker(["default"])
    job = take(worker)
    assert job.id == queued[0]
    # Four processes race to cancel the same tasks: each is cancelled (and counted) once.
    cancelled = run_in_processes(_cancel_every, [([*queued, *delayed], 4)] * 4)
    assert sum(cancelled) == 8  # not the one running (asked to stop instead)
    assert cancel(other)
    assert not cancel(other)  # cancelled already: not counted again
    assert not cancel("0" * 32)
    queues = {queue["name"]: queue for queue in overview()["queues"]}
    assert queues["default"]["cancelled"] == 8
    assert queues["reports/pdf"]["cancelled"] == 1
    assert queues["default"]["ready"] == 0
    samples = prometheus_samples(client, "rcoord_tasks_cancelled_total", "queue", "task")
    assert samples == {
        ("default", "tests.tasks.record"): 8,
        ("reports/pdf", "tests.tasks.add"): 1,
    }
    # A task that ran is not a cancellation, whatever cancel() asked of it.
    worker.session.finish(Done(job, Outcome(Kind.ACK, "tests.tasks.record"), 1.0))
    finished = prometheus_samples(client, "rcoord_tasks_finished_total", "queue", "task", "outcome")
    assert finished == {("default", "tests.tasks.record", "succeeded"): 1}
    assert queues["default"]["cancelled"] == overview()["queues"][0]["cancelled"]
    call_command("rcoord_status")
    header, *rows = capsys.readouterr().out.splitlines()
    column = header.split().index("cancelled") - 1  # "in flight" is two words in the header
    (default,) = [row for row in rows if row.startswith("default ")]
    assert default.split()[column] == "8"


def test_the_dashboard_shows_cancelled_tasks_per_queue(client, staff) -> None:
    from django_rcoord.queues import cancel

    for n in range(3):
        assert cancel(tasks.record.delay(f"c{n}"))
    tasks.record.delay("kept")
    client.force_login(staff)
    page = client.get(reverse("rcoord:dashboard")).content.decode()
    assert '<th class="num">Cancelled</th>' in page
    assert '<td class="num cancelled-count">3</td>' in page


def test_staff_cancel_a_queued_task_from_its_record_after_confirming(client, staff, caplog) -> None:
    task_id = tasks.record.delay("to cancel")
    later = tasks.record.schedule("later", delay=300)
    client.force_login(staff)
    lookup = reverse("rcoord:dashboard-lookup")
    action = reverse("rcoord:dashboard-cancel")
    page = client.get(lookup, {"task": task_id}).content.decode()
    assert 'id="rcoord-cancel-task"' in page
    assert f'action="{action}"' in page
    assert f'<input type="hidden" name="task_id" value="{task_id}">' in page
    with caplog.at_level(logging.INFO, logger="django_rcoord.ops.dashboard"):
        # The first POST only asks.
        asked = client.post(action, {"task_id": task_id})
        assert asked.status_code == 200
        assert asked.templates[0].name == "django_rcoord/dashboard/confirm_cancel.html"
        assert f"Cancel task {task_id} (tests.tasks.record on default" in asked.content.decode()
        assert '<input type="hidden" name="confirm" value="yes">' in asked.content.decode()
        assert queue_stats("default")["ready"] == 1
        done = client.post(action, {"task_id": task_id, "confirm": "yes"})
        assert done.status_code == 302
        assert done["Location"] == f"{lookup}?task={task_id}"
        assert client.post(action, {"task_id": later, "confirm": "yes"}).status_code == 302
    assert queue_stats("default") == {"ready": 0, "in_flight": 0, "delayed": 0, "dead": 0}
    after = client.get(lookup, {"task": task_id})
    assert after.context["found"]["task"]["record"].status == "CANCELLED"
    assert 'id="rcoord-cancel-task"' not in after.content.decode()  # nothing left to cancel
    assert f"Cancelled task {task_id}." in after.content.decode()
    assert [
        record.getMessage()
        for record in caplog.records
        if record.name == "django_rcoord.ops.dashboard"
    ] == [f"olga: cancelled task {task_id}", f"olga: cancelled task {later}"]
    Worker(["default"], burst=True).run()
    assert get_client().lrange(tasks.RAN, 0, -1) == []  # neither ran


def test_the_cancel_action_is_for_staff_with_csrf_and_refuses_bad_input_with_a_4xx(
    client, staff, member
) -> None:
    task_id = tasks.record.delay("kept")
    action = reverse("rcoord:dashboard-cancel")
    confirmed = {"task_id": task_id, "confirm": "yes"}
    assert client.post(action, confirmed).status_code == 302  # to the login page
    client.force_login(member)
    assert client.post(action, confirmed).status_code == 403
    checked = Client(enforce_csrf_checks=True)
    checked.force_login(staff)
    assert checked.post(action, confirmed).status_code == 403  # no CSRF token
    assert queue_stats("default")["ready"] == 1
    client.force_login(staff)
    assert client.get(action, {"task_id": task_id}).status_code == 405
    as_json = {"HTTP_ACCEPT": "application/json"}
    for bad in ("", "not-an-id", "x" * 5000, "a/" + "0" * 32 + "/b"):
        response = client.post(action, {"task_id": bad, "confirm": "yes"}, **as_json)
        assert response.status_code == 400, bad
        assert response.json()["error"] == "bad_request"
    unknown = client.post(action, {"task_id": "0" * 32}, **as_json)
    assert unknown.status_code == 409
    assert "no such task" in unknown.json()["detail"]
    # Running: not cancelled, but asked to stop, and told so.
    worker = Worker(["default"])
    job = take(worker)
    running = client.post(action, confirmed, **as_json)
    assert running.status_code == 409
    assert running.json()["error"] == "not_cancellable"
    assert "it is running: it was asked to stop" in running.json()["detail"]
    assert client.post(action, {"task_id": task_id}).status_code == 409  # no confirmation page
    worker.session.finish(Done(job, Outcome(Kind.ACK, "tests.tasks.record"), 1.0))
    finished = client.post(action, confirmed)
    assert finished.status_code == 409
    assert "it is SUCCESSFUL, not queued or delayed" in finished.content.decode()
    assert queue_stats("default") == {"ready": 0, "in_flight": 0, "delayed": 0, "dead": 0}


def test_breadcrumbs_are_drawn_as_this_djangos_admin_draws_them(client, staff) -> None:
    """A list from Django 6.1 (its admin styles only ``ol.breadcrumbs``), a line before."""
    import django

    make_dead_letters(1)
    client.force_login(staff)
    page = client.get(reverse("rcoord:dashboard-dead", args=["default"])).content.decode()
    if django.VERSION >= (6, 1):
        assert '<ol class="breadcrumbs">' in page
        assert '<li aria-current="page">Dead letters of default</li>' in page
    else:
        assert '<div class="breadcrumbs">' in page
        assert "&rsaquo; Dead letters of default" in page
