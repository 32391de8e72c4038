"""The docs' task example (reference, "Task queues"), followed as written in a new
project: its tasks in an app's ``tasks.py``, ``delay()``, then ``run_email_worker --burst``
with no ``--queues``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from django_rcoord.embedded import EmbeddedRedis
from tests.procs import run_python
from tests.test_quick_start import ROOT, new_project, quick_start


def readme_tasks() -> str:
    """The first code block of the docs' "Task queues" page: ``myapp/tasks.py``."""
    section = (ROOT / "docs" / "reference" / "task-queues.md").read_text()
    block = re.findall(r"```python\n(.*?)```", section, re.DOTALL)[0]
    assert block.startswith("# myapp/tasks.py")
    return block


def test_the_task_example_runs_with_the_default_queues(tmp_path: Path) -> None:
    settings, _ = quick_start()
    project = new_project(tmp_path, settings)
    subprocess.run([sys.executable, "manage.py", "startapp", "myapp"], cwd=project, check=True)
    (project / "myapp" / "tasks.py").write_text(readme_tasks())
    settings_py = project / "mysite" / "settings.py"
    settings_py.write_text(
        settings_py.read_text().replace(
            '    "django_rcoord",\n', '    "django_rcoord",\n    "myapp",\n'
        )
    )
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DJANGO_SETTINGS_MODULE", "REDIS_URL", "REDIS_CLUSTER_URL")
    }

    def manage(*args: str) -> str:
        result = run_python("manage.py", *args, cwd=project, env=env)
        assert result.returncode == 0, f"{args}\n{result.stdout}{result.stderr}"
        return result.stdout + result.stderr

    server = EmbeddedRedis(project / ".redis")
    try:
        manage("rcoord_redis", "start")
        task_id = manage(
            "shell", "-c", "from myapp.tasks import build_report; print(build_report.delay(42))"
        ).split()[-1]
        output = manage("run_email_worker", "--burst")
        assert "watching email, reports" in output, output
        assert f"task {task_id} myapp.tasks.build_report succeeded" in output, output
        status = manage(
            "shell",
            "-c",
            f"from django_rcoord.queues import get_result; print(get_result({task_id!r}).status)",
        )
        assert status.split()[-1] == "SUCCESSFUL"
    finally:
        server.stop()
