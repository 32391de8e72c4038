"""Run test code in real, separate processes (spawned, with Django set up as in the tests)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterable
from typing import Any


def _setup_django() -> None:
    # Spawned children inherit DJANGO_SETTINGS_MODULE and RCOORD_TEST_REDIS_URL
    # from the test process; tests/settings.py reads the latter.
    import django

    django.setup()


def _call(target: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    _setup_django()
    return target(*args)


def run_in_processes(target: Callable[..., Any], args_list: Iterable[tuple[Any, ...]]) -> list[Any]:
    """Run ``target(*args)`` once per item, each in its own spawned process, in parallel.

    ``target`` must be importable (a module-level function). Returns the results in order.
    """
    args_list = list(args_list)
    context = multiprocessing.get_context("spawn")
    with context.Pool(len(args_list)) as pool:
        results = [pool.apply_async(_call, (target, args)) for args in args_list]
        return [result.get(timeout=300) for result in results]


def start_process(target: Callable[..., Any], *args: Any) -> multiprocessing.Process:
    """Start ``target(*args)`` in a spawned process and return it (the caller joins or kills it)."""
    context = multiprocessing.get_context("spawn")
    process = context.Process(target=_call, args=(target, args), daemon=True)
    process.start()
    return process
