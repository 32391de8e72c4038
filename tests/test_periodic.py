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
from django.conf import settings
from django.test import override_settings

from django_rcoord.connection import get_client
from django_rcoord.periodic import MISSED_AFTER, Schedule, fire_due, lateness_key, schedules
from django_rcoord.queues import QueueKeys, queue_stats
from django_rcoord.scripts import run_script
from django_rcoord.worker import Worker
from tests import tasks
from tests.test_queues import output_of, ran, result_of, start_logged

pytestmark = pytest.mark.django_db(transaction=True)

PARIS = zoneinfo.ZoneInfo("Europe/Paris")
EVERY_SECOND = {"name": "beat", "task": "tests.tasks.record", "every": 1, "args": ["beat"]}


def ms(moment: datetime.datetime) -> int:
    return int(moment.timestamp() * 1000)


def server_ms() -> int:
    seconds, micros = get_client().time()
    return seconds * 1000 + micros // 1000


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


# -- firing -----------------------------------------------------------------------------
def test_the_claim_of_a_tick_is_once_and_on_the_servers_clock() -> None:
    keys = QueueKeys.of("default")
    now = server_ms()
    late = lateness_key(keys, "s")
    script_keys = [
        keys.periodic,
        keys.messages,
        keys.ready,
        keys.queues,
        keys.wake,
        keys.idle,
        late,
    ]

    def fire(tick: int, task_id: str, mode: str = "fire") -> int:
        args = ["s", tick, mode, task_id, "{}", "default", 0, 1000, 60_000, 3]
        return run_script("periodic_fire", get_client(), keys=script_keys, args=args)

    assert fire(now + 60_000, "a" * 32) == -1  # not due yet on the server's clock
    assert fire(now - 1000, "b" * 32) == 1
    assert fire(now - 1000, "c" * 32) == 0  # claimed already
    assert fire(now - 2000, "d" * 32) == 0  # an earlier tick than the last claimed
    assert queue_stats("default")["ready"] == 1
    # Every fire's lateness (server clock, claim - tick) is kept, newest first, the last 3.
    (sample,) = get_client().lrange(late, 0, -1)
    assert 1000 <= int(sample) < 1000 + 5000
    assert fire(now - 600, "e" * 32, mode="skip") == 2  # a skipped tick is no fire
    for offset, task_id in ((500, "f"), (400, "g"), (300, "h")):
        assert fire(now - offset, task_id * 32) == 1
    samples = [int(ms) for ms in get_client().lrange(late, 0, -1)]
    assert len(samples) == 3
    assert samples[0] < samples[1] < samples[2] < 1000 + 5000


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


@pytest.mark.slow
def test_three_pollers_ten_seconds_one_killed_midway_fire_every_tick_once() -> None:
    pollers = [start_poller(periodic_env(EVERY_SECOND)) for _ in range(3)]
    try:
        for poller in pollers:
            wait_for_log(poller, "poller started")
        started = server_ms()
        time.sleep(5)
        pollers[0].kill()  # SIGKILL, between ticks or in the middle of one
        time.sleep(5)
        stopped = server_ms()
    finally:
        for poller in pollers:
            poller.send_signal(signal.SIGTERM)
        outputs = [output_of(poller, 30) for poller in pollers]
    assert pollers[0].returncode == -signal.SIGKILL, outputs[0]
    assert all(poller.returncode == 0 for poller in pollers[1:]), outputs
    ticks = sorted(round(message["periodic"]["tick"]) for message in ready_messages())
    assert len(ticks) == len(set(ticks)), ticks  # no tick queued twice
    # Consecutive seconds: none skipped, also across the kill.
    assert ticks == list(range(ticks[0], ticks[0] + len(ticks))), ticks
    # Every tick of the ten seconds all three ran (the first fired on its own while the
    # others were starting), and at most one more while they stopped.
    window = [tick for tick in ticks if started <= tick * 1000 <= stopped]
    assert len(window) in (10, 11), (started, stopped, ticks)
    assert len([tick for tick in ticks if tick * 1000 > stopped]) <= 1, (stopped, ticks)
    Worker(["default"], burst=True).run()
    assert ran() == ["beat"] * len(ticks)
    lateness = [
        int(ms) for ms in get_client().lrange(lateness_key(QueueKeys.of("default"), "beat"), 0, -1)
    ]
    assert len(lateness) == len(ticks)


@pytest.mark.slow
def test_a_cron_schedule_fires_at_the_minute_boundary_on_the_servers_clock() -> None:
    minutely = {"name": "minutely", "task": "tests.tasks.record", "cron": "* * * * *"}
    schedule = Schedule("minutely", "tests.tasks.record", cron="* * * * *")
    keys = QueueKeys.of("default")
    # The schedule has run before: its latest tick is claimed, the next is the boundary.
    get_client().hset(keys.periodic, "minutely", schedule.latest_tick(server_ms()))
    boundary = schedule.next_tick(server_ms())
    assert boundary % 60_000 == 0
    poller = start_poller(periodic_env({**minutely, "args": ["minute"]}))
    try:
        deadline = time.monotonic() + 90
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
    (lateness,) = get_client().lrange(lateness_key(keys, "minutely"), 0, -1)
    # Queued on the server's clock at the boundary (not before), within a second of it.
    assert 0 <= int(lateness) < 1000, output
    assert boundary <= seen


@pytest.mark.parametrize(("catch_up", "queued"), [("skip", 0), ("once", 1)])
def test_a_missed_tick_is_skipped_or_run_once(catch_up: str, queued: int) -> None:
    # New Year's midnight: its latest tick is months behind us, and the one before it a
    # year earlier: no poller ran in between.
    schedule = Schedule("yearly", "tests.tasks.record", cron="0 0 1 1 *", catch_up=catch_up)
    now = server_ms()
    latest = schedule.latest_tick(now)
    assert now - latest > MISSED_AFTER * 1000
    keys = QueueKeys.of("default")
    get_client().hset(keys.periodic, "yearly", schedule.latest_tick(latest - 1))
    fired, next_in = fire_due(get_client(), now, [schedule])
    assert fired == queued
    assert int(get_client().hget(keys.periodic, "yearly")) == latest  # handled either way
    assert [m["periodic"]["tick"] * 1000 for m in ready_messages()] == [latest] * queued
    assert next_in == pytest.approx((schedule.next_tick(now) - now) / 1000)
    assert fire_due(get_client(), server_ms(), [schedule])[0] == 0  # not again


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
