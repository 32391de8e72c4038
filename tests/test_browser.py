"""The autocomplete widget in a real headless Chromium (Debian's chromium and chromium-driver).

Skipped only when no Chromium is installed; .ci/run installs it.
"""

from __future__ import annotations

import json
import shutil

import pytest

from django_rcoord.autocomplete import join_guild

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

pytestmark = [
    pytest.mark.skipif(
        not (CHROMIUM and CHROMEDRIVER), reason="needs chromium and chromedriver installed"
    ),
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    assert CHROMIUM is not None  # the module is skipped without it
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-dev-shm-usage",
        "--no-first-run",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.implicitly_wait(0)
    yield driver
    driver.quit()


def open_signed_in(browser, live_server, client, user, path: str) -> None:
    """Open ``path`` in the browser with ``user``'s session."""
    client.force_login(user)
    browser.get(live_server.url + path)  # a page of the site, so the cookie can be set
    browser.add_cookie(
        {"name": "sessionid", "value": client.cookies["sessionid"].value, "path": "/"}
    )
    browser.get(live_server.url + path)


def test_type_pick_with_the_keyboard_and_submit(browser, live_server, client, django_user_model):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    user = django_user_model.objects.create_user("ada", password="pw")
    for name in ["ada", "Émile Durand", "Emma Rossi", "Ezra Kim", "Zoë Silva"]:
        join_guild("adventurers", name)
    client.force_login(user)
    browser.get(live_server.url + "/example/")
    browser.add_cookie(
        {"name": "sessionid", "value": client.cookies["sessionid"].value, "path": "/"}
    )
    browser.get(live_server.url + "/example/guild-mail/")

    box = browser.find_element(By.ID, "id_recipient")
    assert box.get_attribute("role") == "combobox"
    assert box.get_attribute("aria-autocomplete") == "list"
    assert box.get_attribute("aria-expanded") == "false"
    listbox = browser.find_element(By.ID, box.get_attribute("aria-controls"))
    assert listbox.get_attribute("role") == "listbox"

    box.send_keys("ÉM")
    wait = WebDriverWait(browser, 10)
    wait.until(lambda _: box.get_attribute("aria-expanded") == "true")
    options = listbox.find_elements(By.CSS_SELECTOR, "[role=option]")
    assert [option.text for option in options] == ["Émile Durand"]
    live = browser.find_element(By.CSS_SELECTOR, ".rcoord-live")
    wait.until(
        lambda _: live.text == "1 suggestion" or live.get_attribute("textContent") == "1 suggestion"
    )

    box.clear()
    box.send_keys("e")
    wait.until(
        lambda _: (
            [
                o.get_attribute("textContent")
                for o in listbox.find_elements(By.CSS_SELECTOR, "[role=option]")
            ]
            == ["Emma Rossi", "Ezra Kim"]
        )
    )
    box.send_keys(Keys.ARROW_DOWN)
    box.send_keys(Keys.ARROW_DOWN)
    active = box.get_attribute("aria-activedescendant")
    assert browser.find_element(By.ID, active).get_attribute("textContent") == "Ezra Kim"
    assert browser.find_element(By.ID, active).get_attribute("aria-selected") == "true"
    box.send_keys(Keys.ARROW_UP)
    box.send_keys(Keys.ENTER)  # picks, does not submit
    assert box.get_attribute("value") == "Emma Rossi"
    assert box.get_attribute("aria-expanded") == "false"

    box.send_keys(Keys.BACKSPACE)
    wait.until(lambda _: box.get_attribute("aria-expanded") == "true")
    box.send_keys(Keys.ESCAPE)
    assert box.get_attribute("aria-expanded") == "false"
    box.send_keys("i")  # back to "Emma Rossi"

    browser.find_element(By.NAME, "message").send_keys("See you at the inn.")
    browser.find_element(By.CSS_SELECTOR, "#guild-mail button[type=submit]").click()
    wait.until(lambda _: "is on its way" in browser.page_source)
    assert "Your message to Emma Rossi is on its way." in browser.page_source


def test_two_widgets_on_one_page_keep_apart(browser, live_server, client, django_user_model):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    user = django_user_model.objects.create_user("ada", password="pw")
    for name in ["ada", "Emma Rossi", "Zoë Silva"]:
        join_guild("adventurers", name)
    client.force_login(user)
    browser.get(live_server.url + "/two-pickers/")
    browser.add_cookie(
        {"name": "sessionid", "value": client.cookies["sessionid"].value, "path": "/"}
    )
    browser.get(live_server.url + "/two-pickers/")
    first = browser.find_element(By.ID, "id_first")
    second = browser.find_element(By.ID, "id_second")
    assert first.get_attribute("aria-controls") != second.get_attribute("aria-controls")
    second.send_keys("zo")
    WebDriverWait(browser, 10).until(lambda _: second.get_attribute("aria-expanded") == "true")
    listbox = browser.find_element(By.ID, second.get_attribute("aria-controls"))
    options = listbox.find_elements(By.CSS_SELECTOR, "[role=option]")
    assert [option.get_attribute("textContent") for option in options] == ["Zoë Silva"]
    assert first.get_attribute("aria-expanded") == "false"
    first_listbox = browser.find_element(By.ID, first.get_attribute("aria-controls"))
    assert first_listbox.find_elements(By.CSS_SELECTOR, "[role=option]") == []


# -- media loaded twice, list width and scroll, the admin ------------------------------------
MEMBERS_URL = "/example/rcoord/guilds/adventurers/members/"  # what the widget queries


@pytest.fixture
def member_queries():
    """Paths of the autocomplete queries the live server received, counted on the server."""
    from django.core.signals import request_started

    paths: list[str] = []

    def record(sender, environ, **kwargs):
        if environ["PATH_INFO"] == MEMBERS_URL:
            paths.append(environ["PATH_INFO"] + "?" + environ.get("QUERY_STRING", ""))

    request_started.connect(record)
    yield paths
    request_started.disconnect(record)


def option_texts(listbox) -> list[str]:
    """The names ``listbox`` offers, read in one step (the list may be re-rendering)."""
    return listbox.parent.execute_script(
        "return Array.from(arguments[0].querySelectorAll('[role=option]'),"
        " option => option.textContent);",
        listbox,
    )


def test_media_loaded_twice_queries_once_and_the_list_fits_its_names(
    browser, live_server, client, django_user_model, member_queries
):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    user = django_user_model.objects.create_user("ada", password="pw")
    long_name = "Augustine Bartholomew Fitzwilliam-Montgomery the Third"
    endless_name = "Zacharias " * 15  # 150 characters: wider than any sensible list
    for name in ["ada", long_name, endless_name, *(f"Aria {n:02d}" for n in range(25))]:
        join_guild("adventurers", name)
    browser.set_window_size(1024, 768)
    open_signed_in(browser, live_server, client, user, "/both-media/")
    # (waited for: a loaded machine has been seen to hand back the page before its source)
    WebDriverWait(browser, 30).until(lambda _: "autocomplete.js" in browser.page_source)
    assert browser.page_source.count("autocomplete.js") == 2  # both media tags are there
    box = browser.find_element(By.ID, "id_member")
    listbox = browser.find_element(By.ID, box.get_attribute("aria-controls"))
    wait = WebDriverWait(browser, 10)

    # One burst of keystrokes, one query, though the script is loaded twice.
    box.send_keys("a")
    wait.until(lambda _: len(option_texts(listbox)) == 20)
    assert option_texts(listbox)[:2] == ["ada", "Aria 00"]
    # Scrolled to its end (it holds more than it shows), then new results come.
    scrolled = browser.execute_script(
        "arguments[0].scrollTop = arguments[0].scrollHeight; return arguments[0].scrollTop;",
        listbox,
    )
    assert scrolled > 0
    box.send_keys("r")
    wait.until(lambda _: option_texts(listbox)[:1] == ["Aria 00"])
    assert browser.execute_script("return arguments[0].scrollTop;", listbox) == 0
    wait.until(lambda _: len(member_queries) >= 2)
    assert [query.split("&")[0] for query in member_queries] == [
        f"{MEMBERS_URL}?q=a",
        f"{MEMBERS_URL}?q=ar",
    ]

    # A name longer than the input widens the list; it stays on one line, uncut.
    box.clear()
    box.send_keys("aug")
    wait.until(lambda _: option_texts(listbox) == [long_name])
    geometry = browser.execute_script(
        """
        const [box, listbox] = arguments;
        const option = listbox.querySelector("[role=option]");
        const lines = document.createRange();
        lines.selectNodeContents(option);
        return {input: box.getBoundingClientRect().width,
                list: listbox.getBoundingClientRect().width,
                left: listbox.getBoundingClientRect().left,
                inputLeft: box.getBoundingClientRect().left,
                top: listbox.getBoundingClientRect().top,
                inputBottom: box.getBoundingClientRect().bottom,
                lines: lines.getClientRects().length,
                cut: option.scrollWidth > option.clientWidth};
        """,
        box,
        listbox,
    )
    assert geometry["list"] > geometry["input"] + 50, geometry
    assert geometry["lines"] == 1, geometry
    assert not geometry["cut"], geometry
    assert geometry["left"] == geometry["inputLeft"], geometry
    assert 0 <= geometry["top"] - geometry["inputBottom"] <= 4, geometry
    # A name of 150 characters: the list stops at its maximum width and cuts the name.
    box.clear()
    box.send_keys("zach")
    wait.until(lambda _: option_texts(listbox) == [endless_name])
    widest = browser.execute_script(
        """
        const option = arguments[0].querySelector("[role=option]");
        return {list: arguments[0].getBoundingClientRect().width,
                right: arguments[0].getBoundingClientRect().right,
                view: document.documentElement.clientWidth,
                rootFont: parseFloat(getComputedStyle(document.documentElement).fontSize),
                cut: option.scrollWidth > option.clientWidth, title: option.title};
        """,
        listbox,
    )
    assert widest["list"] <= 32 * widest["rootFont"] + 0.5, widest
    assert widest["right"] <= widest["view"], widest
    assert widest["cut"], widest
    assert widest["title"] == endless_name


def test_admin_form_and_an_added_inline_row_autocomplete(
    browser, live_server, client, django_user_model
):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.models import Quest

    user = django_user_model.objects.create_superuser("ada", "ada@example.com", "pw")
    for name in ["ada", "Emma Rossi", "Ezra Kim", "Zoë Silva"]:
        join_guild("adventurers", name)
    browser.set_window_size(1024, 768)
    open_signed_in(browser, live_server, client, user, "/guild-admin/tests/quest/add/")
    wait = WebDriverWait(browser, 10)

    def pick(box, typed: str, name: str) -> None:
        """Type, see ``name`` offered on top of the page, click it."""
        box.send_keys(typed)
        wait.until(lambda _: box.get_attribute("aria-expanded") == "true")
        listbox = browser.find_element(By.ID, box.get_attribute("aria-controls"))
        (option,) = [
            option
            for option in listbox.find_elements(By.CSS_SELECTOR, "[role=option]")
            if option.get_attribute("textContent") == name
        ]
        # Not clipped by the admin's form rows (overflow: hidden) nor covered.
        on_top = browser.execute_script(
            """
            const r = arguments[0].getBoundingClientRect();
            return document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
            """,
            option,
        )
        assert on_top == option
        option.click()
        assert box.get_attribute("value") == name
        assert box.get_attribute("aria-expanded") == "false"

    browser.find_element(By.ID, "id_title").send_keys("The lost teapot")
    pick(browser.find_element(By.ID, "id_leader"), "em", "Emma Rossi")

    browser.find_element(By.CSS_SELECTOR, ".add-row a").click()  # "Add another Quest member"
    row_box = wait.until(lambda _: browser.find_elements(By.ID, "id_members-0-name"))[0]
    # formset:added set the new row up: its input controls its own list.
    assert row_box.get_attribute("aria-controls") == "id_members-0-name-listbox"
    assert browser.find_element(By.ID, "id_members-0-name-listbox").get_attribute("role") == (
        "listbox"
    )
    pick(row_box, "zo", "Zoë Silva")

    browser.find_element(By.NAME, "_save").click()
    wait.until(lambda _: Quest.objects.exists())
    quest = Quest.objects.get()
    assert (quest.title, quest.leader) == ("The lost teapot", "Emma Rossi")
    assert [member.name for member in quest.members.all()] == ["Zoë Silva"]


# -- the example project's pages ---------------------------------------------------------
def test_slow_report_button_sends_three_requests_at_once(browser, tmp_path, redis_url):
    """The example project as run (its own settings: the limit of two), in a real server."""
    import subprocess
    import sys

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from django_rcoord.embedded import free_port
    from tests.test_example_project import ROOT, example_env, redis_setting, wait_for_page

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=example_env(tmp_path, **redis_setting(redis_url)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_page(f"http://127.0.0.1:{port}/")
        browser.get(f"http://127.0.0.1:{port}/slow-report/")  # itself three seconds
        WebDriverWait(browser, 30).until(
            lambda _: "this page took three seconds" in browser.page_source
        )
        browser.find_element(By.ID, "run-three").click()
        read_statuses = (
            "return Array.from(document.querySelectorAll('#statuses li[data-status]'),"
            " item => item.dataset.status);"
        )
        wait = WebDriverWait(browser, 30)
        wait.until(lambda _: len(browser.execute_script(read_statuses)) == 3)
        statuses = browser.execute_script(read_statuses)
        assert sorted(statuses) == ["200", "200", "503"]
        shown = browser.find_element(By.ID, "statuses").text
        assert shown.count(": 200") == 2
        assert shown.count(": 503") == 1
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_list_later_lists_at_the_price_typed(browser, live_server, client, django_user_model):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from django_rcoord.connection import get_client
    from django_rcoord.queues import queue_stats
    from django_rcoord.queues.keys import QueueKeys

    user = django_user_model.objects.create_user("ada", password="pw")
    open_signed_in(browser, live_server, client, user, "/example/market/")
    (teapot,) = [
        row
        for row in browser.find_elements(By.CSS_SELECTOR, "#inventory li")
        if row.text.startswith("teapot")
    ]
    price = teapot.find_element(By.NAME, "price")  # the price box beside the item
    price.clear()
    price.send_keys("37")
    teapot.find_element(By.XPATH, ".//button[normalize-space()='List later']").click()
    WebDriverWait(browser, 10).until(
        lambda _: "goes on the market in 10 seconds" in browser.page_source
    )
    assert queue_stats("market")["delayed"] == 1
    (body,) = get_client().hvals(QueueKeys.of("market").messages)
    message = json.loads(body)
    assert message["task"] == "example.relist_item"
    assert message["args"][1:] == ["ada", 37]
    assert message["args"][0].startswith("teapot")
