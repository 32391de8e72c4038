"""System checks of the task queues' settings and the periodic schedules."""

from __future__ import annotations

import importlib
import importlib.util
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from django.core.checks import CheckMessage, Error, Warning

from django_rcoord.conf import DEFAULTS
from django_rcoord.exceptions import InvalidName
from django_rcoord.queues import schedules, task_options
from django_rcoord.queues.keys import check_queue_name, one_group
from django_rcoord.queues.registry import tasks_modules
from django_rcoord.queues.shards import MAX_SHARDS
from django_rcoord.validation import MAX_BATCH, is_number, is_positive_int


def check_queue_settings(
    user: Mapping[str, Any], *, prefix_ok: bool = True, **kwargs: Any
) -> list[CheckMessage]:
    """The task queues' settings (rcoord.E017, E020, E021, E033), the apps' tasks modules
    (E036) and PERIODIC_TASKS (E025, E029 and the schedule checks). Looking the periodic
    tasks up builds keys: not tried while KEY_PREFIX is unusable (``prefix_ok`` False;
    rcoord.E006 says why), nor when a tasks module fails to import (E036 says why)."""
    errors = check_tasks_modules()
    look_up_tasks = prefix_ok and not errors
    result_ttl = user.get("TASK_RESULT_TTL", DEFAULTS["TASK_RESULT_TTL"])
    if not is_number(result_ttl) or not result_ttl >= 1:
        errors.append(
            Error(
                "settings.RCOORD['TASK_RESULT_TTL'] must be a number of seconds of at least 1, "
                f"not {result_ttl!r}.",
                hint="The default keeps finished results for a day (86400).",
                id="rcoord.E017",
            )
        )
    errors.extend(_check_task_settings(user))
    errors.extend(
        Error(
            f"settings.RCOORD['QUEUE_SHARDS'] {problem}.",
            hint='A dict of queue group names to their number of shards, e.g. {"reports": 3}; '
            "1 is no sharding.",
            id="rcoord.E035",
        )
        for problem in _shard_problems(user.get("QUEUE_SHARDS", DEFAULTS["QUEUE_SHARDS"]))
    )
    errors.extend(
        Error(
            f"settings.RCOORD['TASK_OPTIONS']{problem}.",
            hint="A dict of Tasks framework task paths to their options, e.g. "
            '{"myapp.tasks.export": {"unique_for": 300}}; options: '
            + ", ".join(sorted(task_options.OPTIONS))
            + ".",
            id="rcoord.E033",
        )
        for problem in task_options.problems(user.get("TASK_OPTIONS", DEFAULTS["TASK_OPTIONS"]))
    )
    errors.extend(_check_options_set_twice(user.get("TASK_OPTIONS", DEFAULTS["TASK_OPTIONS"])))
    errors.extend(
        _check_periodic(
            user.get("PERIODIC_TASKS", DEFAULTS["PERIODIC_TASKS"]), look_up_tasks=look_up_tasks
        )
    )
    return errors


def check_tasks_modules() -> list[CheckMessage]:
    """rcoord.E036: an installed app's ``tasks`` module that raises when imported (a misspelt
    option on a task's decorator, a bad import). A worker imports every one at start and
    would stop there; the check says so in one line, where the error is."""

    errors: list[CheckMessage] = []
    try:
        names = tasks_modules()
    # An app that is a module, not a package, has no tasks module to look for.
    except ImportError:
        return []
    for name in names:
        try:
            importlib.import_module(name)
        # The project's own module may raise anything: a check reports, never crashes.
        except Exception as exc:  # noqa: BLE001
            errors.append(
                Error(
                    f"{name}{_where_it_raised(exc, name)} raised {type(exc).__name__} when "
                    f"imported: {exc}",
                    hint="The worker (and poll_delayed) import every app's tasks module at "
                    f"start and stop on this error. Fix it; python -c 'import {name}' shows "
                    "the traceback.",
                    id="rcoord.E036",
                )
            )
    return errors


def _where_it_raised(exc: BaseException, module_name: str) -> str:
    """`` (path, line N)``: the line of ``module_name``'s own file that raised ``exc`` (a
    task's decorator, an import), or "" when the error came from elsewhere."""
    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno:
        return f" ({exc.filename}, line {exc.lineno})"
    spec = importlib.util.find_spec(module_name)
    frames = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if spec is not None and frame.filename == spec.origin
    ]
    return f" ({frames[-1].filename}, line {frames[-1].lineno})" if frames else ""


def _shard_problems(raw: object) -> list[str]:
    """What is wrong with a ``QUEUE_SHARDS`` value (rcoord.E035)."""
    if not isinstance(raw, Mapping):
        return [f"must be a dict, not {type(raw).__name__}"]
    problems = []
    for group, count in raw.items():
        try:
            if not isinstance(group, str):
                raise InvalidName(f"a name must be a str, not {type(group).__name__}")
            check_queue_name(f"{group}/q")
        except InvalidName as exc:
            problems.append(f"has {group!r}, which is not a queue group name: {exc}")
            continue
        if not is_positive_int(count) or count > MAX_SHARDS:
            problems.append(
                f"gives group {group!r} {count!r} shards, not an int from 1 to {MAX_SHARDS}"
            )
    return problems


def _check_options_set_twice(raw: object) -> list[CheckMessage]:
    """rcoord.W005: an option set on a task's decorator and in TASK_OPTIONS (settings win)."""
    if not isinstance(raw, Mapping) or not raw:
        return []
    try:
        from django_rcoord.queues.task_class import declared_options
    except ImportError:  # no Tasks framework installed: no decorator options either
        return []
    messages: list[CheckMessage] = []
    for path, configured in raw.items():
        if not isinstance(path, str) or not isinstance(configured, Mapping):
            continue  # rcoord.E033's to report
        try:
            declared = dict(declared_options(path))
        except Exception:  # noqa: BLE001 - a module that fails to import: not this check's
            continue
        both = sorted(set(declared) & set(configured))
        if both:
            messages.append(
                Warning(
                    f"{path} sets {', '.join(both)} on its decorator and in "
                    "settings.RCOORD['TASK_OPTIONS']: the settings' value is used.",
                    hint="Keep each option in one place (the decorator, next to the "
                    "function; TASK_OPTIONS, for a value that differs per deployment).",
                    id="rcoord.W005",
                )
            )
    return messages


def _seconds_at_least(low: float) -> Callable[[Any], bool]:
    return lambda value: is_number(value) and value >= low


#: The queue's own settings: (name, whether a value is good, what it must be, a hint).
_TASK_SETTINGS: tuple[tuple[str, Callable[[Any], bool], str, str], ...] = (
    (
        "TASK_LEASE",
        _seconds_at_least(0.1),
        "a number of seconds of at least 0.1",
        (
            "How long a worker holds a task before another may take it (renewed while the "
            "task runs); the default is 60."
        ),
    ),
    (
        "TASK_RETRY_BACKOFF",
        _seconds_at_least(0),
        "a number of seconds of 0 or more",
        "The default is 1.0.",
    ),
    (
        "TASK_RETRY_BACKOFF_MAX",
        _seconds_at_least(0),
        "a number of seconds of 0 or more",
        "The default is 600.",
    ),
    (
        "TASK_MAX_DELIVERIES",
        is_positive_int,
        "a positive int",
        (
            "A task whose worker dies while running it this many times becomes a dead letter; "
            "the default is 5."
        ),
    ),
    (
        "TASK_PREFETCH",
        lambda value: is_positive_int(value) and value <= MAX_BATCH,
        f"an int from 1 to {MAX_BATCH}",
        "The most tasks a worker takes in one call; 1 takes them one by one. The default is 32.",
    ),
    (
        "MAX_MESSAGE_BYTES",
        lambda value: value is None or is_positive_int(value),
        "None or a positive int",
        (
            "The largest task message accepted at enqueue, in bytes; the default is "
            "10485760 (10 MiB; None: no limit)."
        ),
    ),
    (
        "MAX_RESULT_BYTES",
        lambda value: value is None or is_positive_int(value),
        "None or a positive int",
        (
            "The largest return value a task may leave, as JSON, in bytes; the default is "
            "500000 (None: no limit). Above 500000, raise the server's proto-max-bulk-len "
            "to at least twice it."
        ),
    ),
    (
        "TASK_STOP_CHECK",
        lambda value: value is None or _seconds_at_least(0.1)(value),
        "None or a number of seconds of at least 0.1",
        (
            "How often a worker running a task asks whether cancel() asked it to stop; "
            "the default is 2.0 (None: only when it renews the task's lease)."
        ),
    ),
    (
        "WORKER_DISCOVERY",
        lambda value: value is None or _seconds_at_least(0.1)(value),
        "None or a number of seconds of at least 0.1",
        (
            "How often a worker process looks for queue groups of other shard layouts to "
            "serve; the default is 60.0 (None: only at start)."
        ),
    ),
    (
        "WORKER_IDLE_WARNING",
        lambda value: value is None or _seconds_at_least(0.1)(value),
        "None or a number of seconds of at least 0.1",
        (
            "How long a worker takes no task, while queues no worker watches fill, before "
            "it warns; the default is 60.0 (None: it never warns)."
        ),
    ),
)


def _check_task_settings(user: Mapping[str, Any]) -> list[CheckMessage]:
    """The queue's settings: lease, retry backoff, deliveries, the e-mail worker's queues."""

    def value(name: str) -> Any:
        return user.get(name, DEFAULTS[name])

    def bad(name: str, wanted: str, hint: str) -> CheckMessage:
        return Error(
            f"settings.RCOORD[{name!r}] must be {wanted}, not {value(name)!r}.",
            hint=hint,
            id="rcoord.E020",
        )

    errors = [
        bad(name, wanted, hint)
        for name, good, wanted, hint in _TASK_SETTINGS
        if not good(value(name))
    ]
    backoff, backoff_max = value("TASK_RETRY_BACKOFF"), value("TASK_RETRY_BACKOFF_MAX")
    if is_number(backoff) and is_number(backoff_max) and 0 <= backoff_max < backoff:
        errors.append(
            bad(
                "TASK_RETRY_BACKOFF_MAX",
                f"at least TASK_RETRY_BACKOFF ({backoff!r})",
                "It caps the doubling retry delay.",
            )
        )
    return errors + _check_email_queues(value("EMAIL_QUEUES"))


def _check_email_queues(queues: Any) -> list[CheckMessage]:
    hint = (
        'A non-empty list of queue names of one queue group, e.g. ["email"] or '
        '["mail/urgent", "mail/bulk"] (one worker watches one group).'
    )
    if not isinstance(queues, (list, tuple)) or not queues:
        message = f"settings.RCOORD['EMAIL_QUEUES'] must be a non-empty list, not {queues!r}."
        return [Error(message, hint=hint, id="rcoord.E021")]
    try:
        one_group(list(queues))
    except (InvalidName, ValueError) as exc:
        message = f"settings.RCOORD['EMAIL_QUEUES'] cannot be watched by one worker: {exc}"
        return [Error(message, hint=hint, id="rcoord.E021")]
    return []


def _check_periodic(raw: object, *, look_up_tasks: bool = True) -> list[CheckMessage]:
    """The schedules' shape and timing, then whether each names a task. Looking a task up
    imports every app's ``tasks`` module, whose ``@task`` builds keys: with an unusable
    KEY_PREFIX (``look_up_tasks`` False; rcoord.E006 says why) that is not tried."""
    hint = (
        f"Keys: {', '.join(sorted(schedules.KEYS))}. For example "
        '{"name": "digest", "task": "myapp.tasks.send_digest", "cron": "0 7 * * *"}, or '
        '"every": seconds (1 or more) for "cron"; "catch_up" is "skip" or "once".'
    )
    errors: list[CheckMessage] = [
        Error(f"settings.RCOORD['PERIODIC_TASKS']{text}.", hint=hint, id=check_id)
        for check_id, text in schedules.problems(raw)
    ]
    if errors or not look_up_tasks:
        return errors
    try:
        unknown = schedules.unknown_tasks(raw)
    # The project's own modules may raise anything on import: a check reports, never crashes.
    except Exception as exc:  # noqa: BLE001
        return [
            Error(
                "settings.RCOORD['PERIODIC_TASKS'] could not be checked: looking its tasks up "
                f"(importing each app's tasks module) raised {type(exc).__name__}: {exc}",
                hint="Fix the error (python -c 'import myapp.tasks' shows its traceback); "
                "the worker and poll_delayed import the same modules at start.",
                id="rcoord.E029",
            )
        ]
    for task in unknown:
        errors.append(
            Error(
                f"settings.RCOORD['PERIODIC_TASKS'] names the task {task!r}, which is neither "
                "a registered @task nor a Tasks framework task on a RedisTaskBackend.",
                hint="Use the @task's name (its module path and function name by default) "
                "or the dotted path of a django.tasks @task.",
                id="rcoord.E025",
            )
        )
    return errors
