"""Tasks framework tasks with our options on Django's own decorator (Django 6.1 and the
django-tasks backport; imported only there: Django 6.0's decorator refuses them)."""

from __future__ import annotations

import time

from django_rcoord.connection import get_client
from django_rcoord.queues.framework import task

RAN = "test:decorated-ran"

# django-stubs types Django 6.1's decorator without the keyword arguments it hands to the
# backend's task_class (the backport's types have them): hence the ignores below.


@task(timeout=1)  # type: ignore[call-overload, unused-ignore]
def sleeps(seconds: float) -> None:
    time.sleep(seconds)
    get_client().rpush(RAN, f"slept {seconds}")


@task(unique_for=60)  # type: ignore[call-overload, unused-ignore]
def once(marker: str) -> None:
    get_client().rpush(RAN, marker)


@task(max_retries=2, retry_backoff=0.01, retry_jitter=0)  # type: ignore[call-overload, unused-ignore]
def fails(marker: str) -> None:
    get_client().rpush(RAN, marker)
    raise ValueError(f"{marker} fails")
