"""No-op tasks of Django's Tasks framework for the tasks benchmark: one on django-rcoord's
backend ("default"), one on django-tasks-rq's ("rq") and one on django-tasks-redis's
("streams") when they are installed."""

from __future__ import annotations

from django.conf import settings

from benchmarks import queue_tasks
from django_rcoord.queues.framework import task


@task(queue_name="bench")
def rcoord_noop() -> None:
    queue_tasks.noop()


if "rq" in settings.TASKS:

    @task(queue_name="bench", backend="rq")
    def rq_noop() -> None:
        queue_tasks.noop()


if "streams" in settings.TASKS:

    @task(queue_name="bench", backend="streams")
    def streams_noop() -> None:
        queue_tasks.noop()
