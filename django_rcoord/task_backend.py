"""Django's Tasks framework backend: ``RedisTaskBackend``, and ``framework_task``.

The code lives in ``django_rcoord.queues.backend``; this module keeps the documented import path.
"""

from __future__ import annotations

from django_rcoord.queues.backend import RedisTaskBackend, framework_task

__all__ = ["RedisTaskBackend", "framework_task"]
