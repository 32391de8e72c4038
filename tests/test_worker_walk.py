"""A job's walk through the worker, followed call by call (``docs/development.md``'s map).

A worker in this process runs one ``@task`` and one Tasks framework task while a profile
hook records every call into a module of ``django_rcoord`` made during ``_run_job`` (from
the resolve of a taken task to its hold as finished). The walk must go one way: no module
is entered again while one of its functions is still on the stack (no call back up a
layer), and both kinds of task cross the same modules of the worker.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from django_rcoord.queues.worker import Worker
from tests import framework_tasks, tasks

pytestmark = pytest.mark.django_db(transaction=True)

PACKAGE = Path(sys.modules["django_rcoord"].__file__ or "").resolve().parent


def _module(frame: FrameType | None) -> str | None:
    if frame is None:
        return None
    path = Path(frame.f_code.co_filename).resolve()
    return path.relative_to(PACKAGE).as_posix() if path.is_relative_to(PACKAGE) else None


class Walk:
    """The calls into a module of ``django_rcoord`` made inside ``_run_job``, each as
    (module entered, function, the package's modules on the stack below it, innermost
    first)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, list[str]]] = []
        self._depth = 0

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            if event == "return" and frame.f_code.co_name == "_run_job":
                self._depth -= 1
            return
        if frame.f_code.co_name == "_run_job" and _module(frame) == "queues/worker/loop.py":
            self._depth += 1
        module = _module(frame)
        if not self._depth or module is None:
            return
        below = [m for m in map(_module, _stack(frame.f_back)) if m is not None]
        if below and below[0] != module:
            self.calls.append((module, frame.f_code.co_name, below))

    def climbs(self) -> list[str]:
        return [
            f"{function} of {module}, called from {' <- '.join(dict.fromkeys(below))}"
            for module, function, below in self.calls
            if module in below
        ]

    def worker_modules(self) -> set[str]:
        return {module for module, _, _ in self.calls if module.startswith("queues/worker/")}


def _stack(frame: FrameType | None) -> list[FrameType]:
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return frames


def walk_of(enqueue: Callable[[], object]) -> Walk:
    """The walk of the one job ``enqueue`` queues, run by a burst worker in this process."""
    enqueue()
    walk = Walk()
    sys.setprofile(walk)
    try:
        ran = Worker(["default"], burst=True).run()
    finally:
        sys.setprofile(None)
    assert ran == 1
    assert walk.calls, "the profile hook saw no call inside _run_job"
    return walk


@pytest.fixture
def walks() -> dict[str, Walk]:
    return {
        "@task": walk_of(lambda: tasks.record.delay("walk")),
        "framework": walk_of(lambda: framework_tasks.add.enqueue(1, 2)),
    }


def test_a_jobs_walk_never_calls_back_into_a_module_it_came_from(walks: dict[str, Walk]) -> None:
    for kind, walk in walks.items():
        assert walk.climbs() == [], kind


def test_a_task_and_a_framework_task_cross_the_same_modules_of_the_worker(
    walks: dict[str, Walk],
) -> None:
    assert walks["@task"].worker_modules() == walks["framework"].worker_modules()
    # From the resolve to the task held finished, through its limits and its run.
    path = {"resolve.py", "gates.py", "runner.py", "holdings.py"}
    assert {f"queues/worker/{name}" for name in path} <= walks["framework"].worker_modules()
