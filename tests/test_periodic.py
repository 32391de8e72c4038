"""Periodic tasks: ticks, exactly-once firing by many poller processes, catch-up, checks."""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import time
import zoneinfo
from pathlib import Path

import pytest
from cronsim import CronSimError
from django.conf import settings
from django.test import override_settings

from django_rcoord.connection import get_client
from django_rcoord.queues import periodic, queue_stats
from django_rcoord.queues.keys import QueueKeys
from django_rcoord.queues.periodic import MISSED_AFTER, claim_key, fire_due, lateness_key
from django_rcoord.queues.schedules import Schedule, schedules
from django_rcoord.queues.worker import Worker
from django_rcoord.scripts import run_script
from tests import tasks
from tests.procs import server_ms, wait_until
from tests.test_queues import output_of, ran, result_of, start_logged

pytestmark = pytest.mark.django_db(transaction=True)

PARIS = zoneinfo.ZoneInfo("Europe/Paris")
EVERY_SECOND = {"name": "beat", "task": "tests.tasks.record", "every": 1, "args": ["beat"]}


def ms(moment: datetime.datetime) -> int:
    return int(moment.timestamp() * 1000)


def ready_messages(queue: str = "default") -> list[dict]:
    keys = QueueKeys.of(queue)
    client = get_client()
    return [
        json.loads(client.hget(keys.messages, task_id))
        for task_id in client.zrange(keys.ready, 0, -1)
    ]


# -- ticks ------------------------------------------------------------------------------
def test_every_ticks_at_multiples_of_itself_since_the_epoch() -> None:
    schedule = Schedule("s", "t", every=2.5)
    assert schedule.latest_tick(10_000) == 10_000
    assert schedule.latest_tick(12_499) == 10_000
    assert schedule.next_tick(10_000) == 12_500


@override_settings(TIME_ZONE="Europe/Paris")
def test_cron_is_read_in_the_time_zone_across_daylight_saving() -> None:
    hourly = Schedule("s", "t", cron="0 * * * *")
    ten = datetime.datetime(2026, 11, 23, 10, 0, tzinfo=PARIS)
    assert hourly.latest_tick(ms(ten)) == ms(ten)
    assert hourly.next_tick(ms(ten)) == ms(ten + datetime.timedelta(hours=1))
    nightly = Schedule("s", "t", cron="30 2 * * *")
    # 2:30 does not exist on 29 March 2026 in Paris: that day's run is at 3:00.
    spring = nightly.next_tick(ms(datetime.datetime(2026, 3, 28, 12, 0, tzinfo=PARIS)))
    assert spring == ms(datetime.datetime(2026, 3, 29, 3, 0, tzinfo=PARIS))
    # 2:30 happens twice on 25 October 2026: it runs once, at the first.
    autumn = nightly.next_tick(ms(datetime.datetime(2026, 10, 24, 12, 0, tzinfo=PARIS)))
    assert autumn == ms(datetime.datetime(2026, 10, 25, 2, 30, tzinfo=PARIS).replace(fold=0))
    after = nightly.next_tick(autumn)
    assert after == ms(datetime.datetime(2026, 10, 26, 2, 30, tzinfo=PARIS))


def test_the_latest_tick_of_a_cron_with_seconds_is_to_the_second() -> None:
    every_twenty = Schedule("s", "t", cron="*/20 * * * * *")
    try:
        every_twenty.next_tick(0)
    except CronSimError:
        pytest.skip("this cronsim reads five fields only (before 2.7)")
    at = ms(datetime.datetime(2026, 11, 23, 10, 0, 20, tzinfo=PARIS))
    assert every_twenty.latest_tick(at) == at
    assert every_twenty.latest_tick(at + 19_999) == at
    assert every_twenty.latest_tick(at - 1) == at - 20_000


# -- firing -----------------------------------------------------------------------------
def test_the_claim_of_a_tick_is_once_and_on_the_servers_clock() -> None:
    claim, late = claim_key("s"), lateness_key("s")
    now = server_ms()

    def claim_tick(tick: int, task_id: str, mode: str = "fire") -> int:
        args = [tick, mode, "default", 0, task_id, "{}", 60_000]
        return run_script("periodic_claim", get_client(), keys=[claim], args=args)

    def confirm(tick: int, queued_at: int) -> int:
        args = [tick, queued_at, 3, 60_000]
        return run_script("periodic_confirm", get_client(), keys=[claim, late], args=args)

    assert claim_tick(now + 60_000, "a" * 32) == -1  # not due yet on the server's clock
    assert claim_tick(now - 1000, "b" * 32) == 1
    assert claim_tick(now - 1000, "c" * 32) == 0  # claimed already
    assert claim_tick(now - 2000, "d" * 32) == 0  # an earlier tick than the last claimed
    # The claimed tick keeps its message until confirmed queued; no later tick meanwhile.
    pending = get_client().hmget(claim, ["pending", "id", "queue"])
    assert pending == [str(now - 1000).encode(), b"b" * 32, b"default"]
    assert claim_tick(now - 500, "e" * 32) == 3
    assert confirm(now - 2000, 0) == 0  # another tick: still pending
    assert confirm(now - 1000, now) == 1
    assert get_client().hget(claim, "pending") is None
    # Every fire's lateness (queued - tick, server clock) is kept, newest first, the last 3.
    assert [int(ms) for ms in get_client().lrange(late, 0, -1)] == [1000]
    assert claim_tick(now - 600, "f" * 32, mode="skip") == 2  # a skipped tick: no message
    assert get_client().hget(claim, "pending") is None
    for offset in (500, 400, 300):
        assert claim_tick(now - offset, "g" * 32) == 1
        confirm(now - offset, now)
    assert [int(ms) for ms in get_client().lrange(late, 0, -1)] == [300, 400, 500]


def test_a_groups_record_queues_a_claimed_tick_once() -> None:
    keys = QueueKeys.of("default")
    script_keys = [keys.periodic, keys.messages, keys.ready, keys.queues, keys.incoming, keys.idle]

    def queue(tick: int, task_id: str) -> list[int]:
        args = ["s", tick, task_id, "{}", "default", 0, 60_000]
        return run_script("periodic_queue", get_client(), keys=script_keys, args=args)

    now = server_ms()
    status, queued_at = queue(now - 1000, "a" * 32)
    assert status == 2  # the group's list of queues was new
    assert now <= queued_at < now + 5000  # the server's clock
    assert queue(now - 1000, "a" * 32) == [0, queued_at]  # the same tick again: a no-op
    assert queue(now - 2000, "b" * 32) == [0, 0]  # an earlier one
    assert queue(now, "c" * 32)[0] == 1
    assert queue_stats("default")["ready"] == 2


def periodic_env(*entries: dict) -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "RCOORD_TEST_PERIODIC": json.dumps(list(entries)),
    }


def start_poller(env: dict[str, str]) -> subprocess.Popen:
    return start_logged([sys.executable, "manage.py", "poll_delayed"], env)


def wait_for_log(process: subprocess.Popen, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while text not in Path(process.log_path).read_text():  # type: ignore[attr-defined]
        assert process.poll() is None, Path(process.log_path).read_text()  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, f"no {text!r} within {timeout} s"
        time.sleep(0.05)


def all_started(pollers: list[subprocess.Popen]) -> int:
    """Wait until each of ``pollers`` has started; the server's clock then, in ms."""
    for poller in pollers:
        wait_for_log(poller, "poller started")
    return server_ms()


def ticks_within(started_ms: int, stopped_ms: int, every: int) -> list[int]:
    """The ticks (whole seconds) of an ``every``-second schedule in a span of the server's
    clock."""
    first = -(-started_ms // 1000)
    return [tick for tick in range(first, stopped_ms // 1000 + 1) if tick % every == 0]


#: A tick every 2 s in the tests of several pollers: fewer fires to tell apart. (A stall of
#: every process at once on a busy machine makes ticks late, not missed: a pass fires each
#: due tick.)
EVERY_TWO_SECONDS = {**EVERY_SECOND, "every": 2}


@pytest.mark.slow
def test_three_pollers_ten_seconds_one_killed_midway_fire_every_tick_once() -> None:
    pollers = [start_poller(periodic_env(EVERY_TWO_SECONDS)) for _ in range(3)]
    try:
        started = all_started(pollers)
        time.sleep(5)
        pollers[0].kill()  # SIGKILL, between ticks or in the middle of one
        time.sleep(5)
        stopped = server_ms()
        # Every tick due by now is fired by the pollers left, however long this machine
        # stalls them (a pass fires each due tick): waited for, not assumed done.
        due = ticks_within(started, stopped, 2)
        wait_until(lambda: due[-1] in fired_ticks(), timeout=60)
    finally:
        for poller in pollers:
            poller.send_signal(signal.SIGTERM)
        signalled = server_ms()
        outputs = [output_of(poller, 30) for poller in pollers]
    assert pollers[0].returncode == -signal.SIGKILL, outputs[0]
    assert all(poller.returncode == 0 for poller in pollers[1:]), outputs
    ticks = fired_ticks()
    assert len(ticks) == len(set(ticks)), ticks  # no tick queued twice
    # Consecutive ticks: none skipped, also across the kill.
    assert ticks == list(range(ticks[0], ticks[0] + 2 * len(ticks), 2)), ticks
    # Every tick of the ten seconds (or longer, for a stalled test) all three ran; the
    # first fired on its own while the others were starting. At most one came after they
    # were told to stop.
    assert set(due) <= set(ticks), (started, stopped, ticks)
    assert len([tick for tick in ticks if tick * 1000 > signalled]) <= 1, (signalled, ticks)
    Worker(["default"], burst=True).run()
    assert ran() == ["beat"] * len(ticks)
    # One record per fire: a lateness sample, or a catch-up (a tick due before the poller
    # that fired it made its first pass: at most one per poller start).
    lateness = [int(ms) for ms in get_client().lrange(lateness_key("beat"), 0, -1)]
    catch_ups = int(get_client().hget(claim_key("beat"), "catch_ups") or 0)
    assert len(lateness) + catch_ups == len(ticks)
    # A catch-up fire is of a tick due before its poller's first pass: before they had all
    # started (a pass fires each tick its pollers' pause left, so there may be several).
    assert catch_ups <= len([tick for tick in ticks if tick * 1000 < started]), ticks


@pytest.mark.slow
def test_pollers_paused_together_fire_each_tick_of_the_pause_when_they_go_on() -> None:
    """Every poller stopped (SIGSTOP) for more than three periods, as a frozen host or a
    deploy that holds them all would: the first pass after it fires each tick that fell
    due meanwhile, oldest first, late. None is dropped (a pass fired the latest only)."""
    pollers = [start_poller(periodic_env(EVERY_SECOND)) for _ in range(2)]
    try:
        started = all_started(pollers)
        time.sleep(1.2)
        for poller in pollers:
            os.kill(poller.pid, signal.SIGSTOP)
        paused = server_ms()
        time.sleep(3.5)
        resumed = server_ms()
        for poller in pollers:
            os.kill(poller.pid, signal.SIGCONT)
        wait_until(lambda: resumed // 1000 in fired_ticks(), timeout=30)
    finally:
        for poller in pollers:
            os.kill(poller.pid, signal.SIGCONT)
            poller.send_signal(signal.SIGTERM)
        outputs = [output_of(poller, 30) for poller in pollers]
    assert all(poller.returncode == 0 for poller in pollers), outputs
    ticks = fired_ticks()
    assert ticks == list(range(ticks[0], ticks[-1] + 1)), ticks  # each once, none skipped
    during = range(paused // 1000 + 1, resumed // 1000 + 1)  # due while they were stopped
    assert len(during) >= 3
    assert set(during) <= set(ticks), (paused, resumed, ticks)
    # Fired by running pollers: lateness samples (a catch-up is only a first pass's).
    lateness = [int(ms) for ms in get_client().lrange(lateness_key("beat"), 0, -1)]
    catch_ups = int(get_client().hget(claim_key("beat"), "catch_ups") or 0)
    assert len(lateness) + catch_ups == len(ticks)
    assert catch_ups <= len([tick for tick in ticks if tick * 1000 < started]), ticks


def fired_ticks() -> list[int]:
    """The ticks (whole seconds) of the queued fires of the schedule "beat", in order."""
    return sorted(round(message["periodic"]["tick"]) for message in ready_messages())


@pytest.mark.slow
@pytest.mark.once  # it waits for the next minute: up to 60 s
def test_a_cron_schedule_fires_at_the_minute_boundary_on_the_servers_clock() -> None:
    minutely = {"name": "minutely", "task": "tests.tasks.record", "cron": "* * * * *"}
    schedule = Schedule("minutely", "tests.tasks.record", cron="* * * * *")
    # The schedule has run before: the tick before the boundary is claimed. The boundary is
    # at least 15 s away, so the poller has started well before it (a boundary inside its
    # start-up would be a catch-up fire, not a fire on time).
    boundary = schedule.next_tick(server_ms() + 15_000)
    get_client().hset(claim_key("minutely"), "tick", boundary - 60_000)
    assert boundary % 60_000 == 0
    poller = start_poller(periodic_env({**minutely, "args": ["minute"]}))
    try:
        deadline = time.monotonic() + 120
        while not ready_messages():
            assert time.monotonic() < deadline
            assert poller.poll() is None
            time.sleep(0.05)
        seen = server_ms()
    finally:
        poller.send_signal(signal.SIGTERM)
        output = output_of(poller, 30)
    assert poller.returncode == 0, output
    (message,) = ready_messages()
    assert message["periodic"] == {"name": "minutely", "tick": boundary / 1000}
    (lateness,) = get_client().lrange(lateness_key("minutely"), 0, -1)
    # Queued on the server's clock at the boundary (not before), soon after it: the poller
    # sleeps until the boundary; 10 s is room for one stalled on a busy machine, and far
    # from a missed tick (60 s).
    assert 0 <= int(lateness) < 10_000, output
    assert boundary <= seen


@pytest.mark.parametrize(("catch_up", "queued"), [("skip", 0), ("once", 1)])
def test_a_missed_tick_is_skipped_or_run_once(catch_up: str, queued: int) -> None:
    # New Year's midnight: its latest tick is months behind us, and the one before it a
    # year earlier: no poller ran in between.
    schedule = Schedule("yearly", "tests.tasks.record", cron="0 0 1 1 *", catch_up=catch_up)
    now = server_ms()
    latest = schedule.latest_tick(now)
    assert now - latest > MISSED_AFTER * 1000
    get_client().hset(claim_key("yearly"), "tick", schedule.latest_tick(latest - 1))
    fired, next_in = fire_due(get_client(), now, [schedule])
    assert fired == queued
    assert int(get_client().hget(claim_key("yearly"), "tick")) == latest  # handled either way
    assert [m["periodic"]["tick"] * 1000 for m in ready_messages()] == [latest] * queued
    assert next_in == pytest.approx((schedule.next_tick(now) - now) / 1000)
    assert fire_due(get_client(), server_ms(), [schedule])[0] == 0  # not again


def test_ticks_a_pause_of_every_poller_left_are_all_fired_oldest_first() -> None:
    # The last pass fired a tick 5 s ago; every poller paused since (a stall, a failover).
    schedule = Schedule("beat", "tests.tasks.record", every=1, args=["beat"])
    now = server_ms()
    latest = schedule.latest_tick(now)
    get_client().hset(claim_key("beat"), "tick", latest - 5000)
    fired, _ = fire_due(get_client(), now, [schedule], started_ms=now - 60_000)
    assert fired == 5
    ticks = [round(m["periodic"]["tick"] * 1000) for m in ready_messages()]
    assert ticks == list(range(latest - 4000, latest + 1, 1000))
    # Fires of a running poller: each one's lateness is a sample, none is a catch-up.
    assert get_client().llen(lateness_key("beat")) == 5
    assert get_client().hget(claim_key("beat"), "catch_ups") is None
    assert fire_due(get_client(), now, [schedule])[0] == 0  # not again


@pytest.mark.parametrize("catch_up", ["skip", "once"])
def test_a_pause_past_missed_after_fires_the_recent_ticks_and_handles_the_missed_as_one(
    catch_up: str,
) -> None:
    schedule = Schedule("tens", "tests.tasks.record", every=10, catch_up=catch_up)
    now = server_ms()
    latest = schedule.latest_tick(now)
    get_client().hset(claim_key("tens"), "tick", latest - 120_000)
    due = range(latest - 110_000, latest + 1, 10_000)
    recent = [tick for tick in due if now - tick <= MISSED_AFTER * 1000]
    missed = [tick for tick in due if now - tick > MISSED_AFTER * 1000]
    fired, _ = fire_due(get_client(), now, [schedule], started_ms=now - 600_000)
    expected = ([missed[-1]] if catch_up == "once" else []) + recent
    assert fired == len(expected)
    assert [round(m["periodic"]["tick"] * 1000) for m in ready_messages()] == expected
    assert int(get_client().hget(claim_key("tens"), "tick")) == latest


def test_a_new_schedule_fires_its_next_tick_not_its_past_ones() -> None:
    schedule = Schedule("fresh", "tests.tasks.record", every=3600, args=["x"])
    now = server_ms()
    fired, next_in = fire_due(get_client(), now, [schedule])
    recent = now - schedule.latest_tick(now) <= MISSED_AFTER * 1000
    assert fired == (1 if recent else 0)
    assert next_in == pytest.approx((schedule.next_tick(now) - now) / 1000)


def test_a_framework_task_runs_on_schedule_with_a_result() -> None:
    schedule = Schedule("adder", "tests.framework_tasks.add", every=1, args=[2, 3])
    now = server_ms()
    fired, _ = fire_due(get_client(), schedule.latest_tick(now) + 1, [schedule])
    assert fired == 1
    (message,) = ready_messages()
    assert message["backend"] == "default"
    assert message["task"] == "tests.framework_tasks.add"
    Worker(["default"], burst=True).run()
    assert result_of(message["id"]).return_value == 5


def test_a_tick_of_a_unique_task_still_queued_queues_nothing_and_counts_as_fired() -> None:
    schedule = Schedule("report", "tests.tasks.unique_report", every=1, args=["r"])
    client = get_client()
    first = schedule.latest_tick(server_ms())
    assert fire_due(client, first + 1, [schedule])[0] == 1
    (queued,) = ready_messages()
    # The next tick finds that run still queued: nothing more, and the tick is done.
    wait_until(lambda: schedule.latest_tick(server_ms()) > first, timeout=3)
    second = schedule.latest_tick(server_ms())
    assert fire_due(client, second + 1, [schedule])[0] == 0
    assert [m["id"] for m in ready_messages()] == [queued["id"]]
    assert int(client.hget(claim_key("report"), "tick")) == second
    assert fire_due(client, second + 1, [schedule])[0] == 0  # not queued later either
    # Once that run has ended, the next tick queues again.
    assert Worker(["default"], burst=True).run() == 1
    wait_until(lambda: schedule.latest_tick(server_ms()) > second, timeout=3)
    assert fire_due(client, server_ms(), [schedule])[0] == 1
    assert ran() == ["r"]


def test_a_unique_task_cannot_be_queued_by_a_projects_own_script() -> None:
    from django_rcoord.queues import enqueue_in_script

    with pytest.raises(ValueError, match=r"cannot keep 'tests\.tasks\.unique_report' unique"):
        enqueue_in_script(tasks.unique_report, ("x",))


def test_a_project_task_keeps_its_queue_and_priority() -> None:
    schedule = Schedule("urgent", "tests.tasks.record_urgent", every=1, args=["u"])
    tasks.record.delay("plain")
    now = server_ms()
    fire_due(get_client(), schedule.latest_tick(now) + 1, [schedule])
    Worker(["default"], burst=True).run()
    assert ran() == ["u", "plain"]


def test_schedules_are_read_from_settings_and_shown_by_rcoord_status(capsys) -> None:
    from django.core.management import call_command

    with override_settings(RCOORD={**settings.RCOORD, "PERIODIC_TASKS": [EVERY_SECOND]}):
        assert schedules() == [Schedule("beat", "tests.tasks.record", every=1, args=["beat"])]
        call_command("poll_delayed", "--once")
        call_command("rcoord_status")
    out = capsys.readouterr().out
    assert "periodic task" in out
    assert "beat" in out
    with override_settings(RCOORD={**settings.RCOORD, "PERIODIC_TASKS": [EVERY_SECOND]}):
        call_command("rcoord_status", "--json")
    state = json.loads(capsys.readouterr().out)
    (row,) = state["periodic"]
    assert row["name"] == "beat"
    assert row["next_tick"]


# -- across queue groups: a rolling deploy moves a schedule's task ------------------------
# The old release queues the schedule's task in group "main", the new one in "elsewhere"
# (another Redis Cluster slot); the claim of a tick must not depend on the group.
OLD_RELEASE = Schedule("beat", "tests.tasks.record", every=1, args=["beat"])
NEW_RELEASE = Schedule("beat", "tests.tasks.record_elsewhere", every=1, args=["beat"])


def queued_ticks() -> dict[str, list[int]]:
    """The ticks (ms) queued in each group, in queue order."""
    return {
        queue: [round(message["periodic"]["tick"] * 1000) for message in ready_messages(queue)]
        for queue in ("default", "elsewhere/default")
    }


def test_a_tick_is_fired_once_whichever_group_its_task_maps_to() -> None:
    # Pollers of both releases look at each of ten ticks, in either order.
    start = OLD_RELEASE.latest_tick(server_ms() - 20_000)
    for second in range(10):
        now = start + second * 1000 + 1
        releases = (OLD_RELEASE, NEW_RELEASE) if second % 2 else (NEW_RELEASE, OLD_RELEASE)
        fired = [fire_due(get_client(), now, [release])[0] for release in releases]
        assert fired == [1, 0], (second, fired)
    by_group = queued_ticks()
    assert by_group["default"], by_group  # each release fired some ticks
    assert by_group["elsewhere/default"], by_group
    ticks = sorted(by_group["default"] + by_group["elsewhere/default"])
    assert ticks == [start + second * 1000 for second in range(10)]


def fail_once(monkeypatch: pytest.MonkeyPatch, script: str, *, after_running: bool) -> None:
    """The next call of ``script`` by a poller fails, before it ran or (a reply lost)
    after: the poller's pass raises there, as a poller killed at that point stops."""
    real = periodic.run_script

    def run(name: str, *args, **kwargs):
        if name != script:
            return real(name, *args, **kwargs)
        monkeypatch.setattr(periodic, "run_script", real)
        if after_running:
            real(name, *args, **kwargs)
        raise ConnectionError(f"lost while running {name}")

    monkeypatch.setattr(periodic, "run_script", run)


@pytest.mark.parametrize(
    ("script", "after_running"),
    [("periodic_queue", False), ("periodic_queue", True), ("periodic_confirm", False)],
)
def test_a_poller_lost_between_claim_and_confirm_costs_no_tick_and_no_second_fire(
    monkeypatch: pytest.MonkeyPatch, script: str, after_running: bool
) -> None:
    tick = OLD_RELEASE.latest_tick(server_ms() - 5000)
    fail_once(monkeypatch, script, after_running=after_running)
    with pytest.raises(ConnectionError):
        fire_due(get_client(), tick + 1, [OLD_RELEASE])  # the old release claims the tick
    assert get_client().hget(claim_key("beat"), "pending") == str(tick).encode()
    # The next pass of a poller of the new release queues the claimed message where it was
    # claimed for (the old release's group), then claims and queues the next tick.
    fired, _ = fire_due(get_client(), tick + 1001, [NEW_RELEASE])
    queued_before = 0 if script == "periodic_queue" and not after_running else 1
    assert fired == 2 - queued_before
    for release in (OLD_RELEASE, NEW_RELEASE):
        assert fire_due(get_client(), tick + 1002, [release])[0] == 0
    assert queued_ticks() == {"default": [tick], "elsewhere/default": [tick + 1000]}
    assert get_client().hget(claim_key("beat"), "pending") is None
    assert get_client().llen(lateness_key("beat")) == 2  # one sample per fire
    (message,) = ready_messages("default")  # the message the claim stored, as it was
    assert message["task"] == "tests.tasks.record"


def test_a_tick_the_previous_release_queued_from_its_groups_claim_is_not_queued_again() -> None:
    # Releases before the claim moved to the schedule's slot claimed ticks in the group's
    # periodic HASH (<name> -> last tick); the group still records its ticks there.
    tick = OLD_RELEASE.latest_tick(server_ms() - 5000)
    get_client().hset(QueueKeys.of("default").periodic, "beat", tick)
    assert fire_due(get_client(), tick + 1, [OLD_RELEASE])[0] == 0
    assert fire_due(get_client(), tick + 1001, [OLD_RELEASE])[0] == 1
    assert queued_ticks()["default"] == [tick + 1000]


@pytest.mark.slow
def test_two_releases_of_pollers_with_the_task_in_different_groups_fire_each_tick_once() -> None:
    moved = {"name": "beat", "task": "tests.tasks.moved", "every": 2, "args": ["beat"]}
    old, new = periodic_env(moved), periodic_env(moved)
    new["RCOORD_TEST_MOVED_QUEUE"] = "elsewhere/default"
    pollers = [start_poller(old), start_poller(new)]
    try:
        started = all_started(pollers)
        time.sleep(6)
        stopped = server_ms()
        # Each tick due by now is fired, however long this machine stalls the pollers.
        due = [tick * 1000 for tick in ticks_within(started, stopped, 2)]
        wait_until(lambda: any(due[-1] in ticks for ticks in queued_ticks().values()), timeout=60)
    finally:
        for poller in pollers:
            poller.send_signal(signal.SIGTERM)
        outputs = [output_of(poller, 30) for poller in pollers]
    assert all(poller.returncode == 0 for poller in pollers), outputs
    by_group = queued_ticks()
    ticks = sorted(by_group["default"] + by_group["elsewhere/default"])
    assert len(ticks) == len(set(ticks)), by_group  # no tick queued in both groups
    assert ticks == list(range(ticks[0], ticks[0] + 2000 * len(ticks), 2000)), by_group
    assert set(due) <= set(ticks), (started, stopped, by_group)


# -- lateness: catch-up fires apart, statistics with their sample count ---------------------
def test_the_catch_up_fire_at_a_pollers_start_is_not_lateness() -> None:
    # A poller starts 52 s after the tick of an hourly schedule that ran before: it fires
    # that tick (under MISSED_AFTER old), as a catch-up, not as 52 s of lateness.
    hourly = {"name": "hourly", "task": "tests.tasks.record", "every": 3600}
    schedule = Schedule("hourly", "tests.tasks.record", every=3600)
    tick = schedule.latest_tick(server_ms())
    get_client().hset(claim_key("hourly"), "tick", tick - 3_600_000)
    started = tick + 52_000
    assert fire_due(get_client(), started, [schedule], started_ms=started)[0] == 1
    assert get_client().llen(lateness_key("hourly")) == 0
    with override_settings(RCOORD={**settings.RCOORD, "PERIODIC_TASKS": [hourly]}):
        (row,) = periodic.schedule_status(get_client(), server_ms())
        assert row["last_fire"] == "catch-up"
        assert row["lateness_ms"] is None  # the 52 s are not shown as lateness
        assert (row["catch_up_fires"], row["lateness_samples"]) == (1, 0)
        assert row["lateness_p50_ms"] is None
        # The same tick fired by a poller that was running when it fell due: lateness.
        get_client().hset(claim_key("hourly"), "tick", tick - 3_600_000)
        get_client().delete(QueueKeys.of("default").periodic)  # the group's record of it
        assert fire_due(get_client(), started, [schedule], started_ms=tick - 1)[0] == 1
        (row,) = periodic.schedule_status(get_client(), server_ms())
    assert row["last_fire"] == "on time"
    assert (row["catch_up_fires"], row["lateness_samples"]) == (1, 1)
    assert row["lateness_ms"] is not None
    assert row["lateness_p50_ms"] == row["lateness_p99_ms"] == row["lateness_max_ms"]


def test_a_poller_labels_its_first_fire_a_catch_up_and_counts_the_next() -> None:
    from django_rcoord.queues.delayed import DueTaskPromoter

    with override_settings(RCOORD={**settings.RCOORD, "PERIODIC_TASKS": [EVERY_SECOND]}):
        promoter = DueTaskPromoter()
        promoter.run_once()  # its first pass: the latest tick fell due before it
        assert promoter.started_ms is not None
        next_tick = Schedule("beat", "t", every=1).next_tick(promoter.started_ms)
        while server_ms() < next_tick:
            time.sleep(0.02)
        promoter.run_once()
        (row,) = periodic.schedule_status(get_client(), server_ms())
    assert row["catch_up_fires"] == 1
    # The second pass fired the tick after the first, and each one that fell due while
    # this process paused (a busy machine): a running poller's fires, lateness all.
    assert row["lateness_samples"] == len(ready_messages()) - 1 >= 1


def test_lateness_statistics_say_how_many_samples_they_rest_on(capsys) -> None:
    from django.core.management import call_command

    get_client().lpush(lateness_key("beat"), 52_486, 1)  # two fires: 1 ms and 52 s late
    get_client().hset(claim_key("beat"), mapping={"tick": 1000, "late": 1, "at": 1001})
    with override_settings(RCOORD={**settings.RCOORD, "PERIODIC_TASKS": [EVERY_SECOND]}):
        (row,) = periodic.schedule_status(get_client(), server_ms())
        call_command("rcoord_status")
    assert row["lateness_samples"] == 2
    # Nearest rank: of two samples the median is the lower (was the upper: 52,486 ms).
    assert (row["lateness_p50_ms"], row["lateness_max_ms"]) == (1, 52_486)
    out = capsys.readouterr().out
    assert "1/52486/52486 ms (of 2)" in out
