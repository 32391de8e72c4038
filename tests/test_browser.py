"""The autocomplete widget in a real headless Chromium (Debian's chromium and chromium-driver).

Skipped only when no Chromium is installed; .ci/run installs it.
"""

from __future__ import annotations

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
