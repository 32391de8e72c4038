"""Django's Tasks framework backend: ``RedisTaskBackend``, its ``RedisTask``, and
``framework_task``.

The code lives in ``django_rcoord.queues.backend``; this module keeps the documented import path.
"""

from __future__ import annotations

from django_rcoord.queues.backend import RedisTaskBackend, framework_task
from django_rcoord.queues.task_class import RedisTask

__all__ = ["RedisTask", "RedisTaskBackend", "framework_task"]
