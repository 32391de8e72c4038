"""The consuming side of the task queues: a worker that loses nothing.

A ``Worker`` (``loop``) watches queues of one group in priority order. It takes
tasks in one script call (moving them into the queue's in-flight set under a
lease; ``session``), runs each (``runner``) while its keeper (``keeper``, a job of
the process's renewer) renews the leases of what it holds (``holdings``), then
finishes them and takes the next ones in one more call, as many as the
``prefetch`` policy says. Idle, it blocks on the group's wake-up list (no
polling) and, at most once a second, puts back tasks whose lease ran out and
promotes due retries. Bad messages become dead letters; the worker itself never
crashes on one. ``async def`` tasks are awaited on an event loop of the runner's
own, so async code in them (``get_async_client()``, ``aacquire``) works as in an
ASGI view.
"""

from __future__ import annotations

from django_rcoord.queues.worker.loop import Worker

__all__ = ["Worker"]
