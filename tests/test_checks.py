from __future__ import annotations

import asyncio
import os
import re
import subprocess
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_rcoord.checks import check_redis_server, check_settings, server_problems
from django_rcoord.connection import get_async_client, get_client
from django_rcoord.exceptions import ConnectionNotConfigured
from tests.procs import run_python

ROOT = Path(__file__).resolve().parent.parent

SHARDED = {
    "BACKEND": "django_redis.cache.RedisCache",
    "LOCATION": ["redis://127.0.0.1:1/0", "redis://127.0.0.1:2/0"],
    "OPTIONS": {"CLIENT_CLASS": "django_redis.client.ShardClient"},
}
LOCMEM = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
DECODING = {
    "BACKEND": "django_redis.cache.RedisCache",
    "LOCATION": "redis://127.0.0.1:1/0",
    "OPTIONS": {"CONNECTION_POOL_KWARGS": {"decode_responses": True}},
}
RULE = {"name": "api", "path": "^/api/", "limit": 5, "timeout": 30}
MIDDLEWARE = "django_rcoord.middleware.ConcurrencyLimitMiddleware"
ASYNC = {"ASYNC_CLIENT_FACTORY": "tests.factories.make_async_client"}
BEAT = {"name": "beat", "task": "tests.tasks.record", "every": 1, "args": ["b"]}
CRON = {"name": "nightly", "task": "tests.framework_tasks.add", "cron": "0 3 * * *"}


def ids(**settings) -> list[str]:
    with override_settings(**settings):
        return [str(message.id) for message in check_settings()]


def test_test_settings_are_clean() -> None:
    assert check_settings() == []
    call_command("check")


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"RCOORD": "default"}, ["rcoord.E001"]),
        ({"RCOORD": {"CONECTION": "default"}}, ["rcoord.E002"]),
        ({"RCOORD": {"CONNECTION": "nowhere"}}, ["rcoord.E003"]),
        ({"RCOORD": {"CONNECTION": 3}}, ["rcoord.E003"]),
        ({"RCOORD": {"CONNECTION": "local"}, "CACHES": {"local": LOCMEM}}, ["rcoord.E004"]),
        ({"RCOORD": {"CONNECTION": "shards"}, "CACHES": {"shards": SHARDED}}, ["rcoord.E004"]),
        (
            {"RCOORD": {"CONNECTION": "x"}, "CACHES": {"x": {"BACKEND": "no.such.Backend"}}},
            ["rcoord.E004"],
        ),
        ({"RCOORD": {"CLIENT_FACTORY": "tests.factories.missing", **ASYNC}}, ["rcoord.E005"]),
        (
            {"RCOORD": {"CLIENT_FACTORY": "tests.factories.not_callable", **ASYNC}},
            ["rcoord.E005"],
        ),
        ({"RCOORD": {"CLIENT_FACTORY": 42, **ASYNC}}, ["rcoord.E005"]),
        ({"RCOORD": {"ASYNC_CLIENT_FACTORY": "tests.factories.missing"}}, ["rcoord.E015"]),
        ({"RCOORD": {"ASYNC_CLIENT_FACTORY": "tests.factories.not_callable"}}, ["rcoord.E015"]),
        ({"RCOORD": {"ASYNC_WAIT_CONNECTIONS": 0}}, ["rcoord.E016"]),
        ({"RCOORD": {"TASK_RESULT_TTL": 0}}, ["rcoord.E017"]),
        ({"RCOORD": {"TASK_RESULT_TTL": "1 day"}}, ["rcoord.E017"]),
        ({"RCOORD": {"ASYNC_WAIT_CONNECTIONS": "50"}}, ["rcoord.E016"]),
        ({"RCOORD": {"TASK_LEASE": 0}}, ["rcoord.E020"]),
        ({"RCOORD": {"TASK_LEASE": "60"}}, ["rcoord.E020"]),
        ({"RCOORD": {"TASK_RETRY_BACKOFF": -1}}, ["rcoord.E020"]),
        ({"RCOORD": {"TASK_RETRY_BACKOFF_MAX": None}}, ["rcoord.E020"]),
        ({"RCOORD": {"TASK_RETRY_BACKOFF": 5, "TASK_RETRY_BACKOFF_MAX": 1}}, ["rcoord.E020"]),
        ({"RCOORD": {"TASK_MAX_DELIVERIES": 0}}, ["rcoord.E020"]),
        ({"RCOORD": {"TASK_MAX_DELIVERIES": 2.5}}, ["rcoord.E020"]),
        ({"RCOORD": {"TASK_PREFETCH": 0}}, ["rcoord.E020"]),
        ({"RCOORD": {"TASK_PREFETCH": 1001}}, ["rcoord.E020"]),
        ({"RCOORD": {"TASK_STOP_CHECK": 0}}, ["rcoord.E020"]),
        ({"RCOORD": {"TASK_STOP_CHECK": "2"}}, ["rcoord.E020"]),
        ({"RCOORD": {"MAX_MESSAGE_BYTES": 0}}, ["rcoord.E020"]),
        ({"RCOORD": {"MAX_MESSAGE_BYTES": "10MB"}}, ["rcoord.E020"]),
        ({"RCOORD": {"PERIODIC_TASKS": {"name": "x"}}}, ["rcoord.E023"]),
        ({"RCOORD": {"PERIODIC_TASKS": [{**BEAT, "colour": 1}]}}, ["rcoord.E023"]),
        ({"RCOORD": {"PERIODIC_TASKS": [BEAT, BEAT]}}, ["rcoord.E023"]),
        ({"RCOORD": {"PERIODIC_TASKS": [{**BEAT, "args": "x"}]}}, ["rcoord.E023"]),
        ({"RCOORD": {"PERIODIC_TASKS": [{**BEAT, "catch_up": "all"}]}}, ["rcoord.E023"]),
        ({"RCOORD": {"PERIODIC_TASKS": [{**BEAT, "cron": "* * * * *"}]}}, ["rcoord.E024"]),
        ({"RCOORD": {"PERIODIC_TASKS": [{"name": "n", "task": "t.t"}]}}, ["rcoord.E024"]),
        ({"RCOORD": {"PERIODIC_TASKS": [{**CRON, "cron": "61 * * * *"}]}}, ["rcoord.E024"]),
        ({"RCOORD": {"PERIODIC_TASKS": [{**BEAT, "every": 0.5}]}}, ["rcoord.E024"]),
        ({"RCOORD": {"PERIODIC_TASKS": [{**BEAT, "task": "no.such.task"}]}}, ["rcoord.E025"]),
        ({"RCOORD": {"EMAIL_QUEUES": []}}, ["rcoord.E021"]),
        ({"RCOORD": {"EMAIL_QUEUES": "email"}}, ["rcoord.E021"]),
        ({"RCOORD": {"EMAIL_QUEUES": ["email", "reports/pdf"]}}, ["rcoord.E021"]),
        ({"RCOORD": {"EMAIL_QUEUES": ["reports/"]}}, ["rcoord.E021"]),
        (
            {"RCOORD": {"CONNECTION": "text"}, "CACHES": {"text": DECODING}},
            ["rcoord.E022"],
        ),
        ({"RCOORD": {"KEY_PREFIX": "has{brace}"}}, ["rcoord.E006"]),
        ({"RCOORD": {"KEY_PREFIX": ""}}, ["rcoord.E006"]),
        ({"RCOORD": {"EMBEDDED_REDIS_DIR": 5}}, ["rcoord.E007"]),
        ({"RCOORD": {"AUTOCOMPLETE_LIMIT": 51}}, ["rcoord.E012"]),
        ({"RCOORD": {"AUTOCOMPLETE_PERMISSION": "tests.factories.nope"}}, ["rcoord.E013"]),
        ({"RCOORD": {"DASHBOARD_PERMISSION": "tests.factories.nope"}}, ["rcoord.E026"]),
        ({"RCOORD": {"DASHBOARD_PERMISSION": 7}}, ["rcoord.E026"]),
        ({"RCOORD": {"METRICS_TOKEN": "short"}}, ["rcoord.E027"]),
        ({"RCOORD": {"METRICS_TOKEN": 1234567890123456789}}, ["rcoord.E027"]),
        ({"RCOORD": {"LOCK_REPLICAS": -1}}, ["rcoord.E014"]),
        ({"RCOORD": {"LOCK_REPLICAS": True}}, ["rcoord.E014"]),
        ({"RCOORD": {"LOCK_REPLICAS": 1, "LOCK_REPLICA_TIMEOUT": 0}}, ["rcoord.E014"]),
        ({"RCOORD": {"CONCURRENCY_LIMITS": {"name": "x"}}}, ["rcoord.E008"]),
        ({"RCOORD": {"CONCURRENCY_LIMITS": [{**RULE, "colour": 1}]}}, ["rcoord.E008"]),
        ({"RCOORD": {"CONCURRENCY_LIMITS": [RULE, RULE]}}, ["rcoord.E008"]),
        ({"RCOORD": {"CONCURRENCY_LIMITS": [{**RULE, "name": ""}]}}, ["rcoord.E008"]),
        ({"RCOORD": {"CONCURRENCY_LIMITS": [{**RULE, "path": None}]}}, ["rcoord.E009"]),
        ({"RCOORD": {"CONCURRENCY_LIMITS": [{**RULE, "path": "(unclosed"}]}}, ["rcoord.E009"]),
        ({"RCOORD": {"CONCURRENCY_LIMITS": [{**RULE, "url_names": "home"}]}}, ["rcoord.E009"]),
        ({"RCOORD": {"CONCURRENCY_LIMITS": [{**RULE, "limit": 0}]}}, ["rcoord.E010"]),
        ({"RCOORD": {"CONCURRENCY_LIMITS": [{**RULE, "timeout": "5"}]}}, ["rcoord.E010"]),
        ({"RCOORD": {"CONCURRENCY_LIMITS": [{**RULE, "wait": -1}]}}, ["rcoord.E010"]),
        ({"RCOORD": {"CONCURRENCY_LIMITS": [{**RULE, "scope": "planet"}]}}, ["rcoord.E010"]),
        ({"RCOORD": {"CONCURRENCY_LIMITS": [{**RULE, "fail_open": "yes"}]}}, ["rcoord.E010"]),
        (
            {
                "RCOORD": {"CONCURRENCY_LIMITS": [{**RULE, "scope": "user"}]},
                "MIDDLEWARE": [
                    MIDDLEWARE,
                    "django.contrib.auth.middleware.AuthenticationMiddleware",
                ],
            },
            ["rcoord.E011"],
        ),
    ],
)
def test_each_check_id(settings: dict, expected: list[str]) -> None:
    assert ids(**settings) == expected
    with override_settings(**settings), pytest.raises(SystemCheckError) as excinfo:
        # Limited to this app's tag: Django's own cache check cannot import a
        # missing backend either, and would fail first on that case.
        call_command("check", tags=["rcoord"])
    assert expected[0] in str(excinfo.value)


def test_unknown_key_hint_names_the_close_match() -> None:
    with override_settings(RCOORD={"CONECTION": "default"}):
        (message,) = check_settings()
    assert "'CONNECTION'" in str(message.hint)


def test_factory_replaces_the_connection_check() -> None:
    assert (
        ids(
            RCOORD={
                "CONNECTION": "nowhere",
                "CLIENT_FACTORY": "tests.factories.make_client",
                **ASYNC,
            }
        )
        == []
    )


def test_a_client_factory_without_an_async_one_is_a_warning() -> None:
    assert ids(RCOORD={"CLIENT_FACTORY": "tests.factories.make_client"}) == ["rcoord.W002"]


def test_every_error_has_a_hint() -> None:
    with override_settings(RCOORD={"CONECTION": 1, "CONNECTION": "x", "KEY_PREFIX": "{"}):
        messages = check_settings()
    assert len(messages) == 3
    assert all(message.hint for message in messages)


def test_rules_without_the_middleware_are_a_warning() -> None:
    with override_settings(RCOORD={"CONCURRENCY_LIMITS": [RULE]}):
        (message,) = check_settings()
    assert message.id == "rcoord.W001"
    with override_settings(
        RCOORD={"CONCURRENCY_LIMITS": [{**RULE, "scope": "user"}]},
        MIDDLEWARE=[*settings.MIDDLEWARE, MIDDLEWARE],
    ):
        assert check_settings() == []


@pytest.mark.parametrize(
    ("url_name", "expected"),
    [
        ("slow", []),  # a URL's name
        ("admin:index", []),  # a namespaced name
        ("tests.views.hot", []),  # an unnamed URL's view name: its view's dotted path
        ("slwo", ["rcoord.W006"]),
        ("index", []),  # the admin's, without its namespace (the middleware matches both)
        ("nowhere:index", ["rcoord.W006"]),
    ],
)
def test_a_url_name_no_url_has_is_a_warning(url_name: str, expected: list[str]) -> None:
    rule = {**RULE, "path": None, "url_names": ["slow-async", url_name]}
    with override_settings(
        RCOORD={"CONCURRENCY_LIMITS": [rule]}, MIDDLEWARE=[*settings.MIDDLEWARE, MIDDLEWARE]
    ):
        messages = check_settings()
    assert [message.id for message in messages] == expected
    for message in messages:
        assert repr(url_name) in message.msg
        assert "never matches" in message.msg


def test_a_misspelt_url_name_hint_names_the_close_match() -> None:
    rule = {**RULE, "path": None, "url_names": ["slwo"]}
    with override_settings(
        RCOORD={"CONCURRENCY_LIMITS": [rule]}, MIDDLEWARE=[*settings.MIDDLEWARE, MIDDLEWARE]
    ):
        (message,) = check_settings()
    assert "Did you mean 'slow'?" in (message.hint or "")


def test_a_urlconf_that_fails_to_import_is_not_this_checks_to_report() -> None:
    # Django's own URL checks report a URLconf that raises; ours adds nothing, and no crash.
    rule = {**RULE, "path": None, "url_names": ["slow"]}
    with override_settings(
        RCOORD={"CONCURRENCY_LIMITS": [rule]},
        MIDDLEWARE=[*settings.MIDDLEWARE, MIDDLEWARE],
        ROOT_URLCONF="tests.broken",
    ):
        assert check_settings() == []


def test_the_rule_keys_hint_lists_every_rule_key() -> None:
    from django_rcoord.semaphores.rules import RULE_KEYS

    with override_settings(RCOORD={"CONCURRENCY_LIMITS": [{**RULE, "colour": 1}]}):
        (message,) = check_settings()
    assert message.id == "rcoord.E008"
    hint = message.hint or ""
    assert all(f" {key}," in hint or f" {key}." in hint for key in RULE_KEYS)
    assert "max_hold" in hint


def test_the_periodic_hint_lists_every_entry_key() -> None:
    from django_rcoord.queues.schedules import KEYS

    with override_settings(RCOORD={"PERIODIC_TASKS": [{**BEAT, "colour": 1}]}):
        (message,) = check_settings()
    assert message.id == "rcoord.E023"
    assert all(key in (message.hint or "") for key in KEYS)


def test_a_factory_client_that_decodes_replies_is_refused_with_the_reason() -> None:
    cases = [
        ("CLIENT_FACTORY", "tests.factories.make_decoding_client", get_client),
        (
            "ASYNC_CLIENT_FACTORY",
            "tests.factories.make_decoding_async",
            lambda: asyncio.run(_async_client()),
        ),
    ]
    for setting, factory, get in cases:
        factories = {"CLIENT_FACTORY": "tests.factories.make_client", **ASYNC, setting: factory}
        with (
            override_settings(RCOORD={**settings.RCOORD, **factories}),
            pytest.raises(ConnectionNotConfigured, match="decode_responses"),
        ):
            get()


async def _async_client() -> object:
    return get_async_client()


def test_good_periodic_tasks_pass_the_checks() -> None:
    assert ids(RCOORD={**settings.RCOORD, "PERIODIC_TASKS": [BEAT, CRON]}) == []


def test_a_metrics_token_without_prometheus_client_is_a_warning(monkeypatch) -> None:
    import importlib.util

    assert ids(RCOORD={"METRICS_TOKEN": "a-long-enough-token-1234"}) == []
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "prometheus_client" else find_spec(name, *args),
    )
    assert ids(RCOORD={"METRICS_TOKEN": "a-long-enough-token-1234"}) == ["rcoord.W004"]


# -- a check never crashes ----------------------------------------------------------------
def test_a_bad_prefix_with_periodic_tasks_is_e006_not_a_crash() -> None:
    # Looking the schedule's task up imports the apps' tasks modules, whose @task builds
    # keys with the prefix: that raised ImproperlyConfigured out of the check.
    bad = {**settings.RCOORD, "KEY_PREFIX": "my app", "PERIODIC_TASKS": [BEAT]}
    assert ids(RCOORD=bad) == ["rcoord.E006"]
    with override_settings(RCOORD=bad), pytest.raises(SystemCheckError, match=r"rcoord\.E006"):
        call_command("check")


def check_in_a_fresh_process(tmp_path, settings_text: str) -> subprocess.CompletedProcess[str]:
    """``python -m django check`` in a new process, with ``settings_text`` as its settings
    module (written under ``tmp_path``), as a newcomer runs it."""
    (tmp_path / "fresh_settings.py").write_text(settings_text)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "fresh_settings",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
    }
    return run_python("-m", "django", "check", cwd=ROOT, env=env)


def test_manage_py_check_with_a_bad_prefix_exits_1_without_a_traceback(tmp_path) -> None:
    # A fresh process, as a newcomer runs it: tests.tasks is imported by the check itself.
    result = check_in_a_fresh_process(
        tmp_path,
        "from tests.settings import *  # noqa: F403\n\n"
        "RCOORD = {**RCOORD, 'KEY_PREFIX': 'my app', 'PERIODIC_TASKS': "
        f"[{BEAT!r}]}}  # noqa: F405\n",
    )
    assert result.returncode == 1, result.stderr
    assert "rcoord.E006" in result.stderr
    assert "Traceback" not in result.stderr
    assert "ImproperlyConfigured" not in result.stderr


TYPO_TASKS = """\
try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task


@task(timout=60)
def export(report_id):
    return report_id
"""


@pytest.mark.parametrize("periodic", [False, True])
def test_a_misspelt_option_on_djangos_task_decorator_is_e036_in_one_line(
    tmp_path, periodic: bool
) -> None:
    """``manage.py check`` imports every app's tasks module, as the worker does at start,
    with or without PERIODIC_TASKS: the worker's 54-line traceback is one check error that
    names the file and line (with PERIODIC_TASKS, not also rcoord.E029)."""
    app = tmp_path / "typoapp"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "tasks.py").write_text(TYPO_TASKS)
    schedule = f"RCOORD = {{**RCOORD, 'PERIODIC_TASKS': [{BEAT!r}]}}  # noqa: F405\n"
    result = check_in_a_fresh_process(
        tmp_path,
        "from tests.settings import *  # noqa: F403\n\n"
        "INSTALLED_APPS = [*INSTALLED_APPS, 'typoapp']  # noqa: F405\n"
        + (schedule if periodic else ""),
    )
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("rcoord.E036") == 1, result.stderr
    assert "typoapp.tasks" in result.stderr
    assert f"{app / 'tasks.py'}, line 7" in result.stderr  # the decorator's line
    assert "'timout'" in result.stderr
    assert "rcoord.E029" not in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("setting", "check_id"),
    [
        ({"PERIODIC_TASKS": [{**BEAT, "task": "tests.broken.job"}]}, "rcoord.E029"),
        ({"DASHBOARD_PERMISSION": "tests.broken.allowed"}, "rcoord.E026"),
        ({"AUTOCOMPLETE_PERMISSION": "tests.broken.allowed"}, "rcoord.E013"),
        ({"CLIENT_FACTORY": "tests.broken.make_client", **ASYNC}, "rcoord.E005"),
    ],
)
def test_a_module_that_raises_on_import_is_reported_with_the_setting_id(
    setting: dict, check_id: str
) -> None:
    with override_settings(RCOORD={**settings.RCOORD, **setting}):
        (message,) = check_settings()
    assert message.id == check_id
    assert "RuntimeError: tests.broken raises on import" in message.msg
    assert message.hint


# -- the server (check --deploy) ----------------------------------------------------------
def test_deploy_check_passes_against_the_suite_redis() -> None:
    assert check_redis_server() == []
    call_command("check", "--deploy", tags=["rcoord"])


def test_deploy_check_reports_a_dead_redis(redis_down: str) -> None:
    (message,) = check_redis_server()
    assert message.id == "rcoord.E030"
    assert "CACHES['elsewhere']" in message.msg
    assert message.hint
    with pytest.raises(SystemCheckError, match=r"rcoord\.E030"):
        call_command("check", "--deploy", tags=["rcoord"])
    call_command("check", tags=["rcoord"])  # connects only under --deploy


def test_deploy_check_reports_a_dead_redis_named_by_caches() -> None:
    # As a project writes it: CACHES at a dead address with a short socket timeout.
    caches = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://:hunter2-secret@127.0.0.1:1/0",
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.5, "SOCKET_TIMEOUT": 0.5},
        }
    }
    rcoord = {"CONNECTION": "default"}
    with override_settings(CACHES=caches, RCOORD=rcoord):
        with pytest.raises(SystemCheckError, match=r"rcoord\.E030") as excinfo:
            call_command("check", "--deploy", tags=["rcoord"])
        assert "hunter2" not in str(excinfo.value)  # check output ends up in CI logs
        assert "redis://:***@127.0.0.1:1/0" in str(excinfo.value)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("noeviction", []),
        ("allkeys-lru", ["rcoord.E032"]),
        ("allkeys-random", ["rcoord.E032"]),
        ("volatile-lru", ["rcoord.W030"]),
        ("volatile-ttl", ["rcoord.W030"]),
    ],
)
def test_deploy_check_reports_an_evicting_server(redis_to_stop, policy, expected) -> None:
    client = redis.Redis.from_url(redis_to_stop.url)
    client.config_set("maxmemory", "100mb")
    client.config_set("maxmemory-policy", policy)
    client.close()
    messages = check_redis_server()
    assert [message.id for message in messages] == expected
    assert all(policy in message.msg and message.hint for message in messages)


def test_a_server_older_than_6_2_is_an_error(redis_client) -> None:
    # The server's own INFO, as an older one would answer it (only its version differs).
    info = {**redis_client.info(), "redis_version": "6.0.16"}
    (message,) = server_problems(info, "The Redis server")
    assert message.id == "rcoord.E031"
    assert "6.0.16" in message.msg
    assert server_problems({**info, "redis_version": "6.2.0"}, "The Redis server") == []
    assert server_problems({**info, "redis_version": "7.4.1"}, "The Redis server") == []


def test_the_reference_lists_every_check_id() -> None:
    readme = (ROOT / "docs" / "reference" / "checks.md").read_text()
    package = ROOT / "django_rcoord"
    paths = [*package.rglob("checks.py"), package / "queues" / "backend.py"]
    source = "".join(path.read_text() for path in paths)
    for check_id in sorted(set(re.findall(r'id="(rcoord\.[EW]\d{3})"', source))):
        assert f"| `{check_id}` |" in readme, check_id


def test_task_checks_its_queue_name_at_import_but_builds_no_key() -> None:
    from django_rcoord.exceptions import InvalidName
    from django_rcoord.queues import registry, task

    try:
        with override_settings(RCOORD={**settings.RCOORD, "KEY_PREFIX": "my app"}):
            # A project's tasks module imports: the bad prefix is rcoord.E006's to report.
            registered = task("tests.checks.prefix_probe", queue="main/reports")(print)
            assert registered.queue == "main/reports"
            with pytest.raises(InvalidName):
                task("tests.checks.bad_queue_probe", queue="reports/")(print)
    finally:
        registry._registry.pop("tests.checks.prefix_probe", None)


def test_a_misspelt_task_backend_option_is_reported_though_nothing_imported_the_framework(
    tmp_path, redis_url: str
) -> None:
    """``manage.py check`` in a project whose settings name our Tasks backend and import
    nothing of the framework (Django registers its tasks check when ``django.tasks`` is
    imported; the backport, when its app is installed): the typo is rcoord.E018."""
    result = check_in_a_fresh_process(
        tmp_path,
        "SECRET_KEY = 'x'\n"
        "INSTALLED_APPS = ['django_rcoord']\n"
        "CACHES = {'default': {'BACKEND': 'django_redis.cache.RedisCache', "
        f"'LOCATION': {redis_url!r}}}}}\n"
        "TASKS = {'default': {'BACKEND': 'django_rcoord.task_backend.RedisTaskBackend', "
        "'OPTIONS': {'RETRIES': 2}}}\n",
    )
    assert result.returncode == 1, result.stderr
    assert "rcoord.E018" in result.stderr
    assert "'RETRIES'" in result.stderr


def test_deploy_check_warns_on_the_embedded_development_server(tmp_path) -> None:
    from django_rcoord.embedded import embedded_cache
    from django_rcoord.embedded.checks import check_embedded_in_deploy

    assert check_embedded_in_deploy() == []  # the suite's own Redis
    with override_settings(CACHES={"default": embedded_cache(tmp_path / "redis")}):
        (message,) = check_embedded_in_deploy()
    assert message.id == "rcoord.W031"
    assert "embedded_cache()" in message.msg


def test_embedded_cache_without_a_server_binary_is_one_clear_error(tmp_path, monkeypatch) -> None:
    from django_rcoord.embedded import embedded_cache
    from django_rcoord.embedded.checks import check_embedded_server

    with override_settings(CACHES={"default": embedded_cache(tmp_path / "redis")}):
        assert check_embedded_server() == []  # this machine has one
        monkeypatch.setenv("RCOORD_REDIS_SERVER", str(tmp_path / "no-such-redis-server"))
        (message,) = check_embedded_server()
    assert message.id == "rcoord.E034"
    assert "no redis-server to start" in message.msg


@pytest.mark.parametrize(
    ("bulk", "max_result", "expected"),
    [
        ("1mb", 500_000, []),  # the default fits the least a server can be set to
        ("1mb", 600_000, ["rcoord.E037"]),
        ("1mb", None, ["rcoord.E037"]),
        ("8mb", 4_000_000, []),
    ],
)
def test_deploy_check_reports_results_the_server_would_refuse(
    redis_to_stop, bulk, max_result, expected
) -> None:
    client = redis.Redis.from_url(redis_to_stop.url)
    client.config_set("proto-max-bulk-len", bulk)
    client.close()
    with override_settings(RCOORD={**settings.RCOORD, "MAX_RESULT_BYTES": max_result}):
        messages = [m for m in check_redis_server() if m.id == "rcoord.E037"]
    assert [message.id for message in messages] == expected
    assert all("proto-max-bulk-len" in message.msg and message.hint for message in messages)
