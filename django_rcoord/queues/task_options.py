"""Per-task options of Django's Tasks framework tasks: given on Django's decorator
(``@task(timeout=600)``, Django 6.1 and the 5.2 backport; see ``task_class``), or per task
path in the settings::

    RCOORD = {"TASK_OPTIONS": {"myapp.tasks.export": {"unique_for": 300, "timeout": 600}}}

Every option ``@task`` takes for a run (``max_retries``, ``timeout``, the retry waits,
``rate``, ``concurrency``, ``limit_key``), for uniqueness (``unique_for``,
``unique_key``) and its follow-ups (``on_success``, ``on_failure``: a ``@task``'s name or
a framework task's dotted path) can be set here.

Each known option has one entry in ``OPTIONS`` (what it must be); the system check
rcoord.E033 reports unknown options and bad values, so a new option is one entry here
and the code that reads it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from django.utils.module_loading import import_string

from django_rcoord.queues.options import RunOptions
from django_rcoord.queues.unique import Uniqueness, make_uniqueness, unique_for_problem
from django_rcoord.validation import callable_problem


def _unique_key_problem(value: Any) -> str | None:
    if callable(value):
        return None
    problem = callable_problem(value)
    return f"must be a callable or the dotted path of one; {value!r} {problem}" if problem else None


def _run_option_problem(name: str) -> Callable[[Any], str | None]:
    """A check of run option ``name`` (``RunOptions``'s own validation)."""

    def problem(value: Any) -> str | None:
        try:
            RunOptions(**{name: value})
        except (TypeError, ValueError) as exc:
            return str(exc)
        return None

    return problem


#: The run options (``RunOptions``: retries, time limit, rate and concurrency limits) a
#: framework task may set, as ``@task`` takes them.
RUN_OPTIONS = (
    "max_retries",
    "timeout",
    "retry_backoff",
    "retry_backoff_max",
    "retry_jitter",
    "rate",
    "concurrency",
    "limit_key",
)


def _follow_up_problem(value: Any) -> str | None:
    if isinstance(value, str) and value:
        return None
    return (
        f"must be the name of a @task or the dotted path of a Tasks framework task, not {value!r}"
    )


#: The options a task may have: name -> a function saying why a value is wrong (None: fine).
OPTIONS: dict[str, Callable[[Any], str | None]] = {
    # The task queued when it succeeds / fails for good (see queues.framework_runs.follow_up_of).
    "on_success": _follow_up_problem,
    "on_failure": _follow_up_problem,
    # Seconds the task stays unique at most (see django_rcoord.queues.unique).
    "unique_for": unique_for_problem,
    # A callable (or its dotted path) of the task's arguments returning a str.
    "unique_key": _unique_key_problem,
    **{name: _run_option_problem(name) for name in RUN_OPTIONS},
}


def problems(raw: object) -> Iterator[str]:
    """What is wrong with a ``TASK_OPTIONS`` value, each as the end of a sentence starting
    ``settings.RCOORD['TASK_OPTIONS']``."""
    if not isinstance(raw, Mapping):
        yield f" must be a dict of task paths to dicts of options, not {type(raw).__name__}"
        return
    for path, options in raw.items():
        where = f"[{path!r}]"
        if not isinstance(path, str) or not path:
            yield f" has the key {path!r}: keys are the dotted paths of tasks"
            continue
        if not isinstance(options, Mapping):
            yield f"{where} must be a dict of options, not {type(options).__name__}"
            continue
        unknown = sorted(str(name) for name in options if name not in OPTIONS)
        if unknown:
            yield f"{where} has unknown options {unknown} (known: {', '.join(sorted(OPTIONS))})"
        for name, problem in option_problems(options):
            yield f"{where}[{name!r}] {problem}" if name else f"{where} {problem}"


def option_problems(options: Mapping[str, Any]) -> Iterator[tuple[str | None, str]]:
    """(the option's name, what is wrong with its value) for each known option of one
    task's ``options`` with a bad value; (None, what is wrong) for options that do not go
    together. Unknown names are the caller's to report."""
    for name, check in OPTIONS.items():
        if name in options:
            problem = check(options[name])
            if problem:
                yield name, problem
    if "unique_key" in options and "unique_for" not in options:
        yield None, "has unique_key without unique_for (how long it stays unique)"


def run_options_of(options: Mapping[str, Any], max_retries: int) -> RunOptions:
    """The run options a task's ``options`` (``task_class.options_of``) give; ``max_retries``
    (the backend's ``OPTIONS["MAX_RETRIES"]``) unless they set their own."""
    given = {name: options[name] for name in RUN_OPTIONS if name in options}
    given.setdefault("max_retries", max_retries)
    return RunOptions(**given)


def uniqueness_of(options: Mapping[str, Any]) -> Uniqueness | None:
    """The uniqueness a task's ``options`` give, or None."""
    if "unique_for" not in options:
        return None
    key = options.get("unique_key")
    # Bad values raise here as @task's do (check rcoord.E033 reports them sooner).
    return make_uniqueness(options["unique_for"], _resolve(key) if isinstance(key, str) else key)


@functools.lru_cache(maxsize=256)
def _resolve(path: str) -> Callable[..., str]:
    found: Callable[..., str] = import_string(path)
    return found


def follow_up_path(options: Mapping[str, Any], succeeded: bool) -> str | None:
    """What a task's ``options`` name to follow it when it succeeded (``on_success``) or
    failed for good (``on_failure``), or None."""
    found = options.get("on_success" if succeeded else "on_failure")
    return found if isinstance(found, str) else None
