"""Every ``pip install`` line of README and of the docs, run as written in a fresh virtualenv.

Each line gets a virtualenv of its own, made by this Python's ``venv`` (so with the pip
that Python bundles, which may be older than README's options need). ``python3 -m venv
.venv`` makes it, ``pip`` and ``.venv/bin/pip`` are its pip, and the line's commands run
in order from the checkout. ``pip install -U pip`` really runs; every other install runs
with ``--dry-run``: pip parses the line's options, resolves every requirement and builds
the checkout's metadata, which is where a line fails (an option that pip does not know,
an extra or group that does not exist), without installing the lot seven times. The
package's own name stands for this checkout (it is not published yet). Other commands
(``manage.py rundemo``, ``pytest``) are not run.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def documents() -> list[Path]:
    """README and the pages of the documentation site."""
    pages = sorted(path for path in (ROOT / "docs").rglob("*.md") if "_build" not in path.parts)
    return [ROOT / "README.md", *pages]


def install_lines() -> list[str]:
    """The shell lines of README and the docs that install something with pip, each once."""
    lines: dict[str, None] = {}
    for document in documents():
        blocks = re.findall(r"```sh\n(.*?)```", document.read_text(), re.DOTALL)
        for block in blocks:
            for line in block.splitlines():
                if "pip install" in line:
                    lines[line.strip()] = None
    return list(lines)


def test_readme_has_install_lines() -> None:
    lines = install_lines()
    assert any("--group test" in line for line in lines), lines
    assert any("--group bench" in line for line in lines), lines
    assert any(line.startswith("pip install django-rcoord") for line in lines), lines


def _commands(line: str) -> list[list[str]]:
    words = shlex.split(line, comments=True)
    commands: list[list[str]] = [[]]
    for word in words:
        if word == "&&":
            commands.append([])
        else:
            commands[-1].append(word)
    return [command for command in commands if command]


def _requirement(word: str) -> str:
    """The package's own name, with or without extras, stands for this checkout."""
    if word == "django-rcoord" or word.startswith("django-rcoord["):
        return str(ROOT) + word[len("django-rcoord") :]
    return word


@pytest.mark.slow
@pytest.mark.once  # a fresh virtualenv per line: about 45 s in all
@pytest.mark.parametrize("line", install_lines())
def test_each_install_line_works_in_a_fresh_virtualenv(line: str, tmp_path: Path) -> None:
    venv = tmp_path / ".venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    pip = str(venv / "bin" / "pip")
    for words in _commands(line):
        # `python3 -m pip` is the venv's pip too.
        command = ["pip", *words[3:]] if words[:3] == ["python3", "-m", "pip"] else words
        if command[:3] == ["python3", "-m", "venv"]:
            continue  # made above, in a place of its own
        if command[0] not in ("pip", ".venv/bin/pip"):
            continue  # not an install: the demo, the suite, the benchmarks
        assert command[1] == "install", line
        arguments = [_requirement(word) for word in command[2:]]
        upgrade_pip = arguments in (["-U", "pip"], ["--upgrade", "pip"])
        run = [pip, "install", *([] if upgrade_pip else ["--dry-run"]), *arguments]
        result = subprocess.run(
            run, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
        )
        assert result.returncode == 0, f"{line}\n{' '.join(run)}\n{result.stderr[-2000:]}"
