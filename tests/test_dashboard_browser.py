"""The staff dashboard in a real headless Chromium: sign in, read a dead letter's traceback,
requeue it, see the counts change.

``RCOORD_SCREENSHOTS=<dir>`` saves the pages as PNG files there (the docs' pictures,
docs/screenshots/).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from django.conf import settings
from django.test import override_settings

from django_rcoord.locks import Lock
from django_rcoord.ops.status import overview
from django_rcoord.queues import queue_stats
from django_rcoord.queues.worker import Worker
from tests import tasks
from tests.test_browser import CHROMEDRIVER, CHROMIUM, browser  # noqa: F401 (the fixture)

pytestmark = [
    pytest.mark.skipif(
        not (CHROMIUM and CHROMEDRIVER), reason="needs chromium and chromedriver installed"
    ),
    pytest.mark.django_db(transaction=True),
]


def screenshot(driver, name: str, tmp_path: Path) -> Path:
    folder = Path(os.environ.get("RCOORD_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    driver.set_window_size(1100, 600)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1100, max(600, min(int(height) + 140, 1600)))
    path = folder / f"{name}.png"
    assert driver.save_screenshot(str(path))
    return path


def test_staff_sign_in_read_a_traceback_and_requeue_it(
    browser,  # noqa: F811
    live_server,
    django_user_model,
    tmp_path,
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    django_user_model.objects.create_user("olga", password="a-long-pw-1", is_staff=True)
    for n in range(12):
        tasks.record.delay(f"r{n}")
    tasks.always_fail.delay("broken invoice 17")
    Worker(["default"], burst=True).run()
    tasks.record.delay("waiting")
    tasks.record.schedule("later", delay=300)
    lock = Lock("invoice:17", timeout=60)
    assert lock.acquire()
    worker = Worker(["email"])  # alive (heartbeat), idle, for the workers table
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    schedule = [{"name": "nightly-digest", "task": "tests.tasks.record", "cron": "0 7 * * *"}]
    wait = WebDriverWait(browser, 10)
    try:
        with override_settings(RCOORD={**settings.RCOORD, "PERIODIC_TASKS": schedule}):
            browser.set_window_size(1100, 900)
            browser.get(f"{live_server.url}/example/rcoord/dashboard/")
            # Not signed in: the admin's login page, which comes back here.
            wait.until(ready.presence_of_element_located((By.ID, "id_username")))
            browser.find_element(By.ID, "id_username").send_keys("olga")
            browser.find_element(By.ID, "id_password").send_keys("a-long-pw-1")
            browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
            table = wait.until(ready.presence_of_element_located((By.ID, "rcoord-queues")))
            assert "Redis coordination" in browser.find_element(By.CLASS_NAME, "breadcrumbs").text
            row = table.find_element(By.XPATH, ".//tbody/tr[td[1][text()='default']]")
            cells = [cell.text for cell in row.find_elements(By.TAG_NAME, "td")]
            assert cells[1:5] == ["1", "0", "1", "1"]  # ready, in flight, delayed, dead
            assert cells[5] == "0"  # cancelled
            assert cells[8] == "13"  # finished in the last hour
            # The per-minute chart sits under its header and is drawn to scale: a track
            # for the whole hour, the busiest minute filling its height.
            chart = row.find_element(By.CSS_SELECTOR, "svg.chart")
            header = table.find_element(By.XPATH, ".//thead//th[10]")
            assert header.text.lower() == "per minute"
            assert abs(chart.location["x"] - header.location["x"]) <= 12
            assert chart.location["x"] + chart.size["width"] <= (
                header.location["x"] + header.size["width"] + 12
            )
            track = chart.find_element(By.CSS_SELECTOR, "rect.track")
            assert track.size["width"] == chart.size["width"] == 180
            # The 13 finished in one minute or, when the burst crossed a minute's end, in
            # two: a bar for each minute the server counted, the busiest one full height.
            (counted,) = [q for q in overview()["queues"] if q["name"] == "default"]
            minutes = [n for n in counted["finished_per_minute"] if n]
            assert sum(minutes) == 13
            bars = chart.find_elements(By.CSS_SELECTOR, "rect.bar")
            assert len(bars) == len(minutes)
            heights = [bar.size["height"] for bar in bars]
            assert max(heights) == chart.size["height"]
            assert heights.index(max(heights)) == minutes.index(max(minutes))
            scale = row.find_element(By.CLASS_NAME, "chart-scale").text
            assert f"top {max(minutes)}/min" in scale
            workers = browser.find_element(By.ID, "rcoord-workers").text
            assert worker.id in workers
            assert "idle" in workers
            assert "nightly-digest" in browser.find_element(By.ID, "rcoord-periodic").text
            screenshot(browser, "dashboard", tmp_path)

            row.find_element(By.CLASS_NAME, "dead-count").click()
            letter = wait.until(ready.presence_of_element_located((By.CLASS_NAME, "dead-letter")))
            traceback = letter.find_element(By.CLASS_NAME, "traceback").text
            assert "Traceback (most recent call last)" in traceback
            assert "ValueError: broken invoice 17 always fails" in traceback
            assert browser.find_element(By.ID, "rcoord-dead-total").text.startswith("1 dead")
            screenshot(browser, "dead-letters", tmp_path)

            letter.find_element(By.CLASS_NAME, "requeue-one").click()
            wait.until(ready.text_to_be_present_in_element((By.ID, "rcoord-dead-total"), "0 dead"))
            assert (
                "Requeued 1 dead letter" in browser.find_element(By.CLASS_NAME, "messagelist").text
            )
            assert queue_stats("default") == {"ready": 2, "in_flight": 0, "delayed": 1, "dead": 0}

            browser.find_element(By.LINK_TEXT, "Redis coordination").click()
            table = wait.until(ready.presence_of_element_located((By.ID, "rcoord-queues")))
            row = table.find_element(By.XPATH, ".//tbody/tr[td[1][text()='default']]")
            cells = [cell.text for cell in row.find_elements(By.TAG_NAME, "td")]
            assert cells[1] == "2"
            assert cells[4] == "0"

            browser.find_element(By.ID, "rcoord-lock").send_keys("invoice:17")
            browser.find_element(By.CSS_SELECTOR, ".lookup input[type=submit]").click()
            found = wait.until(
                ready.presence_of_element_located((By.ID, "rcoord-lock-status"))
            ).text
            assert found.split("Last fencing token")[1].strip() == str(lock.token)
            screenshot(browser, "lookup", tmp_path)
    finally:
        worker.stop()
        thread.join(10)
        lock.release()


def test_staff_cancel_a_queued_task_from_its_record(
    browser,  # noqa: F811
    live_server,
    django_user_model,
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    from django_rcoord.queues import get_result

    django_user_model.objects.create_user("olga", password="a-long-pw-1", is_staff=True)
    task_id = tasks.record.schedule("the export", delay=300)
    wait = WebDriverWait(browser, 10)
    browser.set_window_size(1100, 900)
    browser.get(f"{live_server.url}/example/rcoord/dashboard/lookup/?task={task_id}")
    wait.until(ready.presence_of_element_located((By.ID, "id_username")))
    browser.find_element(By.ID, "id_username").send_keys("olga")
    browser.find_element(By.ID, "id_password").send_keys("a-long-pw-1")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    record = wait.until(ready.presence_of_element_located((By.ID, "rcoord-task-record")))
    assert record.find_element(By.CLASS_NAME, "status").text == "READY"
    browser.find_element(By.ID, "rcoord-cancel-task").click()
    # A confirmation page first: nothing is cancelled yet.
    question = wait.until(ready.presence_of_element_located((By.ID, "rcoord-confirm-cancel")))
    assert f"Cancel task {task_id}" in question.text
    assert queue_stats("default")["delayed"] == 1
    browser.find_element(By.ID, "rcoord-confirm-cancel-task").click()
    record = wait.until(ready.presence_of_element_located((By.ID, "rcoord-task-record")))
    assert record.find_element(By.CLASS_NAME, "status").text == "CANCELLED"
    assert f"Cancelled task {task_id}." in browser.find_element(By.CLASS_NAME, "messagelist").text
    assert not browser.find_elements(By.ID, "rcoord-cancel-task")
    assert queue_stats("default") == {"ready": 0, "in_flight": 0, "delayed": 0, "dead": 0}
    assert get_result(task_id).status == "CANCELLED"  # type: ignore[union-attr]
    browser.find_element(By.LINK_TEXT, "Redis coordination").click()
    table = wait.until(ready.presence_of_element_located((By.ID, "rcoord-queues")))
    row = table.find_element(By.XPATH, ".//tbody/tr[td[1][text()='default']]")
    assert row.find_element(By.CLASS_NAME, "cancelled-count").text == "1"
