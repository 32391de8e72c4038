"""Every documented name imports from its documented path.

The names of DESIGN.md's public API contract are listed here; every dotted
``django_rcoord.<module>.<name>`` the README or the docs mention is read from
them. Modules moved inside the package (the capability subpackages) keep these
paths by re-exporting, and this test is what holds them to it.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: The contract: module -> the names users import from it.
CONTRACT: dict[str, tuple[str, ...]] = {
    "django_rcoord.exceptions": (
        "RcoordError",
        "LockTimeout",
        "LockLost",
        "SemaphoreTimeout",
        "InvalidName",
        "RedisUnavailable",
        "TaskNotRunnable",
        "WorkerLost",
        "TaskCancelled",
    ),
    "django_rcoord.locks": (
        "Lock",
        "LockTimeout",
        "LockLost",
        "acquire_lock",
        "release_lock",
        "lock_status",
    ),
    "django_rcoord.decorators": ("locked", "rate_limited"),
    "django_rcoord.semaphores": (
        "Semaphore",
        "SemaphoreTimeout",
        "acquire_semaphore",
        "release_semaphore",
        "acquire_fair_semaphore",
        "release_fair_semaphore",
        "refresh_fair_semaphore",
        "acquire_semaphore_with_lock",
        "semaphore_status",
    ),
    "django_rcoord.middleware": ("ConcurrencyLimitMiddleware",),
    "django_rcoord.autocomplete": (
        "join_guild",
        "leave_guild",
        "autocomplete_on_prefix",
        "is_guild_member",
        "add_update_contact",
        "remove_contact",
        "fetch_autocomplete_list",
    ),
    "django_rcoord.forms": ("GuildMemberWidget", "GuildMemberField"),
    "django_rcoord.queues": (
        "task",
        "execute_later",
        "aexecute_later",
        "enqueue_in_script",
        "send_sold_email_via_queue",
        "queue_stats",
        "dead_letters",
        "requeue_dead",
        "get_result",
        "PermanentFailure",
        "cancel",
        "acancel",
        "TaskCancelled",
    ),
    "django_rcoord.delayed": ("poll_queue", "DelayQueue", "DueTaskPromoter"),
    "django_rcoord.ratelimit": ("allow_once", "allow_n", "hit", "ahit", "aallow_once", "aallow_n"),
    "django_rcoord.connection": ("get_client", "get_async_client", "slot_pipeline"),
    "django_rcoord.task_backend": ("RedisTaskBackend",),
    "django_rcoord.periodic": ("MISSED_AFTER",),
    "django_rcoord.views": ("default_permission", "guild_members"),
    "django_rcoord.dashboard": ("default_permission",),
    "django_rcoord.embedded": ("EmbeddedRedis", "EmbeddedCluster"),
    "django_rcoord.embedded.caches": ("EmbeddedConnectionFactory",),
}

#: The management commands of the contract.
COMMANDS = ("run_email_worker", "poll_delayed", "rcoord_status", "rcoord_redis")


@pytest.mark.parametrize("module", sorted(CONTRACT))
def test_the_contract_imports_from_its_documented_path(module: str) -> None:
    imported = importlib.import_module(module)
    missing = [name for name in CONTRACT[module] if not hasattr(imported, name)]
    assert not missing, f"{module} lacks {missing}"


def test_each_exception_is_importable_where_it_is_raised() -> None:
    from django_rcoord import exceptions, locks, semaphores

    assert locks.LockTimeout is exceptions.LockTimeout
    assert locks.LockLost is exceptions.LockLost
    assert semaphores.SemaphoreTimeout is exceptions.SemaphoreTimeout


def test_the_management_commands_exist() -> None:
    from django.core.management import get_commands

    commands = get_commands()
    assert all(commands.get(name) == "django_rcoord" for name in COMMANDS)


def resolve(dotted: str) -> object:
    """Import the longest module prefix of ``dotted``, then walk the attributes after it."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(dotted)


def documented_paths() -> list[str]:
    """Every ``django_rcoord.x.y`` written in README.md, CHANGELOG.md and docs/."""
    pages = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
    pages += sorted((ROOT / "docs").rglob("*.rst"))
    found = set()
    for page in pages:
        if page.exists() and "_build" not in page.parts:
            found.update(re.findall(r"\bdjango_rcoord(?:\.[A-Za-z_]\w*)+", page.read_text()))
    return sorted(found)


def test_every_dotted_path_the_documentation_names_resolves() -> None:
    paths = documented_paths()
    assert "django_rcoord.task_backend.RedisTaskBackend" in paths
    broken = []
    for dotted in paths:
        try:
            resolve(dotted)
        except (ImportError, AttributeError) as exc:
            broken.append(f"{dotted}: {exc}")
    assert not broken, "\n".join(broken)


def test_a_name_queues_no_longer_exports_still_imports_with_a_deprecation_warning() -> None:
    from django_rcoord import queues
    from django_rcoord.queues import keys

    assert "QueueKeys" not in queues.__all__
    with pytest.warns(DeprecationWarning, match=r"django_rcoord\.queues\.keys"):
        from django_rcoord.queues import QueueKeys
    assert QueueKeys is keys.QueueKeys
    with pytest.raises(AttributeError):
        queues.no_such_name  # noqa: B018
