"""README's Quick start, copied as written into a new project, on the embedded Redis."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from django_rcoord.embedded import EmbeddedRedis, process_alive, program_name
from tests.procs import run_python, server_program, wait_until

ROOT = Path(__file__).resolve().parent.parent


def quick_start() -> tuple[str, list[str]]:
    """From README's Quick start: the settings for the embedded Redis, and the commands."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("\n## Quick start\n") :]
    section = section[: section.index("\n## ", 1)]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, re.DOTALL)
    (settings,) = [text for lang, text in blocks if lang == "python" and "embedded_cache" in text]
    (commands,) = [text for lang, text in blocks if lang == "sh"]
    return settings, [line for line in commands.splitlines() if line.strip()]


def new_project(parent: Path, settings: str) -> Path:
    """``startproject mysite``, with django_rcoord in INSTALLED_APPS and ``settings`` at the
    end of settings.py, as the Quick start says."""
    subprocess.run(
        [sys.executable, "-m", "django", "startproject", "mysite"],
        cwd=parent,
        check=True,
        capture_output=True,
    )
    project = parent / "mysite"
    settings_py = project / "mysite" / "settings.py"
    text, added = re.subn(
        r"INSTALLED_APPS = \[\n", '\\g<0>    "django_rcoord",\n', settings_py.read_text()
    )
    assert added == 1
    settings_py.write_text(f"{text}\n{settings}")
    return project


def test_quick_start_as_written_in_a_new_project(tmp_path: Path) -> None:
    settings, commands = quick_start()
    project = new_project(tmp_path, settings)
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DJANGO_SETTINGS_MODULE", "REDIS_URL", "REDIS_CLUSTER_URL")
    }
    server = EmbeddedRedis(project / ".redis")
    outputs = []
    try:
        for line in commands:
            words = shlex.split(line, comments=True)
            assert words[:2] == ["python", "manage.py"], line
            result = run_python(*words[1:], cwd=project, env=env)
            assert result.returncode == 0, f"{line}\n{result.stdout}{result.stderr}"
            outputs.append(result.stdout)
            if words[2:4] == ["rcoord_redis", "start"]:
                pid = server.pid()
                assert pid is not None
                assert process_alive(pid)
                assert server_program() in Path(f"/proc/{pid}/cmdline").read_bytes()
    finally:
        server.stop()
    start, check, shell, stop = outputs
    assert start.startswith(f"{program_name()} started at {server.url} (pid {pid})")
    assert 'CACHES["default"] uses it.' in start
    assert "no issues" in check
    # A new name's first fencing token: the server's clock in microseconds.
    assert re.fullmatch(r"locked: True token \d{16}", shell.splitlines()[-1])
    assert stop == f"{program_name()} at {server.url} stopped\n"
    assert pid is not None
    wait_until(lambda: not process_alive(pid), timeout=10)
