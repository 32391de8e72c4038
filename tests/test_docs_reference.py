"""The reference pages of the documentation (docs/reference/) against the code: every
setting, system check, management command option, public name, constant and metric the
code has is listed, with the value the code has, and every test the guarantees page names
exists. Reads files and imports modules only: no Sphinx, no Redis."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path
from typing import Any

import pytest
from django.core.management import load_command_class

import django_rcoord
from django_rcoord.conf import DEFAULTS

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
REFERENCE = DOCS / "reference"
PACKAGE = ROOT / "django_rcoord"

# Modules whose __all__ is public API, and the names of DESIGN.md's contract (section 5)
# in modules without an __all__.
PUBLIC_MODULES = (
    "locks",
    "semaphores",
    "autocomplete",
    "queues",
    "delayed",
    "ratelimit",
    "task_backend",
    "embedded",
)
CONTRACT = {
    "exceptions": (
        "RcoordError",
        "LockTimeout",
        "LockLost",
        "SemaphoreTimeout",
        "InvalidName",
        "ConnectionNotConfigured",
        "EmbeddedRedisError",
        "LockNotReplicated",
        "TaskNotRunnable",
        "WorkerLost",
        "RedisUnavailable",
    ),
    "decorators": ("locked", "rate_limited"),
    "middleware": ("ConcurrencyLimitMiddleware",),
    "forms": ("GuildMemberWidget", "GuildMemberField"),
    "connection": ("get_client", "get_async_client", "slot_pipeline"),
    "queues": ("task", "execute_later", "send_sold_email_via_queue", "get_result"),
    "delayed": ("poll_queue", "DelayQueue"),
    "ratelimit": ("allow_once", "allow_n"),
    "conf": ("DEFAULTS",),
}


def page(name: str) -> str:
    return (REFERENCE / name).read_text()


def table_rows(text: str) -> list[list[str]]:
    """The cells of every Markdown table row of ``text``, header and rule rows included."""
    return [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("|")
    ]


def code(cell: str) -> str:
    """The text of a cell that is one inline code span: `x` -> x."""
    match = re.fullmatch(r"`([^`]*)`", cell)
    assert match, cell
    return match.group(1)


def test_every_setting_is_in_the_reference_with_its_default() -> None:
    documented = {
        code(row[0]): row[1] for row in table_rows(page("settings.md")) if row[0].startswith("`")
    }
    for key, default in DEFAULTS.items():
        assert key in documented, f"RCOORD[{key!r}] is missing from docs/reference/settings.md"
        assert ast.literal_eval(code(documented[key])) == default, key


def check_ids_in_code() -> set[str]:
    source = "".join(path.read_text() for path in PACKAGE.rglob("*.py"))
    return set(re.findall(r"rcoord\.[EW]\d{3}", source))


def test_every_check_id_is_in_the_reference_and_no_other() -> None:
    listed = {
        code(row[0]) for row in table_rows(page("checks.md")) if row[0].startswith("`rcoord.")
    }
    in_code = check_ids_in_code()
    assert in_code - listed == set(), "missing from docs/reference/checks.md"
    assert listed - in_code == set(), "listed in docs/reference/checks.md, gone from the code"


def commands() -> list[str]:
    return sorted(
        path.stem
        for path in PACKAGE.rglob("management/commands/*.py")
        if not path.stem.startswith("_")
    )


def command_section(name: str) -> str:
    text = page("commands.md")
    start = text.index(f"\n## `{name}`\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


DJANGO_OPTIONS = {
    "--version",
    "--verbosity",
    "--settings",
    "--pythonpath",
    "--traceback",
    "--no-color",
    "--force-color",
    "--skip-checks",
    "--help",
}


@pytest.mark.parametrize("name", commands())
def test_every_command_option_is_in_the_reference(name: str) -> None:
    assert f"\n## `{name}`\n" in page("commands.md"), f"{name} has no section"
    section = command_section(name)
    parser = load_command_class("django_rcoord", name).create_parser("manage.py", name)
    for action in parser._actions:
        long_options = [
            option
            for option in action.option_strings
            if option.startswith("--") and option not in DJANGO_OPTIONS
        ]
        if not action.option_strings:  # a positional argument, by its name
            assert f"`{action.dest}`" in section, (name, action.dest)
            for choice in action.choices or ():
                assert f"`{choice}`" in section, (name, choice)
        for option in long_options:
            assert f"`{option}" in section, (name, option)


def public_names() -> list[str]:
    names: set[str] = set()
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(f"django_rcoord.{module_name}")
        names.update(f"django_rcoord.{module_name}.{name}" for name in module.__all__)
    for module_name, contract in CONTRACT.items():
        names.update(f"django_rcoord.{module_name}.{name}" for name in contract)
    return sorted(names)


def test_every_public_name_is_in_the_api_reference() -> None:
    api = page("api.md")
    missing = [name for name in public_names() if name not in api]
    assert missing == [], "missing from docs/reference/api.md"
    for name in public_names():  # each is importable from where the reference says
        module_name, _, attribute = name.rpartition(".")
        assert hasattr(importlib.import_module(module_name), attribute), name


def package_constants() -> dict[str, list[Any]]:
    """Every module-level UPPER_CASE value of the package, by name, wherever it lives."""
    found: dict[str, list[Any]] = {}
    for info in pkgutil.walk_packages(django_rcoord.__path__, "django_rcoord."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if name.isupper() and isinstance(value, (int, float, str, tuple)):
                found.setdefault(name, []).append(value)
    return found


def test_every_constant_in_the_reference_has_the_codes_value() -> None:
    text = page("settings.md")
    section = text[text.index("\n## Constants\n") :]
    rows = [row for row in table_rows(section) if row[0].startswith("`")]
    assert len(rows) >= 20
    constants = package_constants()
    for row in rows:
        name, value = code(row[0]), ast.literal_eval(code(row[1]))
        assert name in constants, f"{name} is not in the package any more"
        assert value in constants[name], (name, value, constants[name])


def test_every_metric_is_in_the_reference_with_its_type() -> None:
    source = "".join(path.read_text() for path in PACKAGE.rglob("*.py"))
    families = re.findall(r'(Gauge|Counter|Histogram)MetricFamily\(\s*"(rcoord_[a-z_]+)"', source)
    assert len(families) >= 8
    rows = {
        code(row[0]): row[1]
        for row in table_rows(page("metrics.md"))
        if re.fullmatch(r"`rcoord_\w+`", row[0])
    }
    for kind, name in families:
        exposed = f"{name}_total" if kind == "Counter" else name  # as Prometheus shows it
        assert exposed in rows, f"{exposed} is missing from docs/reference/metrics.md"
        assert rows[exposed] == kind.lower(), exposed


def named_tests() -> list[tuple[str, str]]:
    """Every ``tests/<file>.py::<test>`` the documentation names."""
    named: set[tuple[str, str]] = set()
    for document in DOCS.rglob("*.md"):
        if "_build" not in document.parts:
            named.update(re.findall(r"(tests/\w+\.py)::(\w+)", document.read_text()))
    return sorted(named)


def test_the_tests_the_docs_name_exist() -> None:
    assert len(named_tests()) >= 30
    for path, test in named_tests():
        source = (ROOT / path).read_text()
        assert re.search(rf"^(async )?def {test}\(", source, re.MULTILINE), f"{path}::{test}"
