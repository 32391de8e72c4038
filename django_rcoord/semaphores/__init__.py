"""Counting and fair semaphores, and the rules of the concurrency-limit middleware.

The semaphore is in ``semaphore``; ``rules`` reads ``RCOORD["CONCURRENCY_LIMITS"]``
for ``django_rcoord.middleware.ConcurrencyLimitMiddleware``.
"""

from __future__ import annotations

from django_rcoord.exceptions import SemaphoreTimeout
from django_rcoord.semaphores.semaphore import (
    Semaphore,
    acquire_fair_semaphore,
    acquire_semaphore,
    acquire_semaphore_with_lock,
    refresh_fair_semaphore,
    release_fair_semaphore,
    release_semaphore,
    semaphore_status,
)

__all__ = [
    "Semaphore",
    "SemaphoreTimeout",
    "acquire_fair_semaphore",
    "acquire_semaphore",
    "acquire_semaphore_with_lock",
    "refresh_fair_semaphore",
    "release_fair_semaphore",
    "release_semaphore",
    "semaphore_status",
]
