"""What the distribution says about itself: version, license, extras, supported versions."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

import django_rcoord

ROOT = Path(__file__).resolve().parent.parent


def test_version_is_the_installed_distributions() -> None:
    assert django_rcoord.__version__ == importlib.metadata.version("django-rcoord")


def test_version_matches_pyproject() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert django_rcoord.__version__ == project["version"]


def test_version_without_an_installed_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    try:
        assert importlib.reload(django_rcoord).__version__ == "0+unknown"
    finally:
        monkeypatch.undo()
        importlib.reload(django_rcoord)
    assert django_rcoord.__version__ == importlib.metadata.version("django-rcoord")


def test_importing_the_package_imports_no_django() -> None:
    probe = "import sys, django_rcoord; print(django_rcoord.__version__, 'django' in sys.modules)"
    run = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert run.stdout.split() == [django_rcoord.__version__, "False"]


def test_published_extras_hold_no_development_tools() -> None:
    metadata = importlib.metadata.metadata("django-rcoord")
    assert sorted(metadata.get_all("Provides-Extra") or []) == [
        "embedded",
        "hiredis",
        "metrics",
        "otel",
        "tasks",
    ]
    requirements = " ".join(metadata.get_all("Requires-Dist") or []).lower()
    for tool in ("pytest", "ruff", "mypy", "selenium", "hypothesis"):
        assert tool not in requirements


def test_license_file_is_mit_and_shipped() -> None:
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    metadata = importlib.metadata.metadata("django-rcoord")
    assert metadata["License-Expression"] == "MIT"
    assert "LICENSE" in (metadata.get_all("License-File") or [])


def test_ci_runs_the_readme_test_command_as_written() -> None:
    readme = (ROOT / "README.md").read_text()
    after = readme.split("Run the test suite", 1)[1]
    command = after.split("```sh\n", 1)[1].split("\n```", 1)[0]
    assert command.endswith("-m pytest"), command
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert command in ci_lines


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def spoken(versions: set[str]) -> str:
    """'6.2, 7.0 or 8.0', as README's Requirements lists versions."""
    *first, last = sorted(versions, key=version_key)
    return f"{', '.join(first)} or {last}" if first else last


def version_matrix() -> list[tuple[str, str, str, str]]:
    """(Python, Django, server, server version) of each test session in noxfile.py."""
    combos = []
    for node in ast.walk(ast.parse((ROOT / "noxfile.py").read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Combo":
            python, django_version, (server, server_version) = (
                ast.literal_eval(argument) for argument in node.args[:3]
            )
            combos.append((python, django_version, server, server_version))
    return combos


def test_requirements_and_classifiers_say_what_the_version_matrix_tests() -> None:
    combos = version_matrix()
    pythons = {python for python, *_ in combos}
    djangos = {django_version for _, django_version, *_ in combos}
    redis = {version for _, _, server, version in combos if server != "valkey"}
    valkey = {version for _, _, server, version in combos if server == "valkey"}

    metadata = importlib.metadata.metadata("django-rcoord")
    classifiers = metadata.get_all("Classifier") or []
    prefix = "Programming Language :: Python :: 3."
    assert {"3." + c.removeprefix(prefix) for c in classifiers if c.startswith(prefix)} == pythons
    prefix = "Framework :: Django :: "
    assert {c.removeprefix(prefix) for c in classifiers if c.startswith(prefix)} == djangos
    assert metadata["Requires-Python"] == f">={min(pythons, key=version_key)}"

    readme = (ROOT / "README.md").read_text()
    requirements = readme.split("\n## Requirements\n", 1)[1].split("\n## ", 1)[0]
    lines = requirements.replace("\n  ", " ").splitlines()
    assert f"- Python {spoken(pythons)}" in lines, requirements
    django_line = f"- Django {spoken(djangos)} ".replace("5.2", "5.2 LTS", 1)
    assert any(line.startswith(django_line) for line in lines), requirements
    servers = f"- Redis {spoken(redis)}, or Valkey {spoken(valkey)} "
    assert any(line.startswith(servers) for line in lines), requirements
