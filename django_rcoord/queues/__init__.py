"""Task queues that lose nothing: the public API of the producer side.

Redis in Action 6.4.1 done right. A task message is JSON (never pickle)
stored once under its id; queues hold ids. Taking a task moves its id, in one
script, from its queue into the queue's in-flight set with a lease; the worker
renews the lease while the task runs and acknowledges it when done. A task
whose lease runs out (its worker died) goes back to the front of its queue.
Failures are retried with exponential backoff, then kept as dead letters. The
consuming loop is in ``worker``.

The pieces live in this package's modules (``keys``: where queues live;
``messages``: encoding; ``registry``: ``@task``; ``producer``: enqueueing;
``results``: a task's record; ``records``: recovery, counts, dead letters;
``unique``: unique tasks; ``cancel``: cancelling a task before it runs; ``pause``:
pausing a queue for every worker; ``worker``: the
consuming loop; ``delayed``, ``schedules`` and ``periodic``: the poller's work;
``backend``, ``framework`` and ``framework_runs``: Django's Tasks framework); this module
gathers the names users call.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from django_rcoord.connection.clients import resolve_client
from django_rcoord.exceptions import TaskCancelled
from django_rcoord.queues.cancel import (
    acancel,
    astop_requested,
    cancel,
    current_task_id,
    stop_requested,
)
from django_rcoord.queues.fan_in import (
    FanIn,
    FanInStatus,
    cancel_fan_in,
    fan_in_status,
    group,
    task_run,
)
from django_rcoord.queues.in_script import ScriptedEnqueue, enqueue_in_script
from django_rcoord.queues.pause import apause_queue, aresume_queue, pause_queue, resume_queue
from django_rcoord.queues.producer import aexecute_later, enqueue_many, execute_later, send_message
from django_rcoord.queues.records import (
    dead_letters,
    delete_dead,
    queue_stats,
    recover_and_promote,
    requeue_dead,
)
from django_rcoord.queues.registry import PermanentFailure, Task, task
from django_rcoord.queues.results import TaskRecord, get_result

__all__ = [
    "FanIn",
    "FanInStatus",
    "PermanentFailure",
    "ScriptedEnqueue",
    "Task",
    "TaskCancelled",
    "TaskRecord",
    "acancel",
    "aexecute_later",
    "apause_queue",
    "aresume_queue",
    "astop_requested",
    "cancel",
    "cancel_fan_in",
    "current_task_id",
    "dead_letters",
    "delete_dead",
    "enqueue_in_script",
    "enqueue_many",
    "execute_later",
    "fan_in_status",
    "get_result",
    "group",
    "pause_queue",
    "queue_stats",
    "recover_and_promote",
    "requeue_dead",
    "resume_queue",
    "send_sold_email_via_queue",
    "stop_requested",
    "task",
    "task_run",
]


#: What this package exported before its public surface was cut to what users call: the
#: key layout, the message codec, the registry's look-ups, the operators' listings and
#: constants. Still importable from here, with a DeprecationWarning, until 0.2.
_MOVED = {
    "DEFAULT_GROUP": "keys",
    "WAKE_TOKEN_MS": "keys",
    "QueueKeys": "keys",
    "same_group": "keys",
    "decode_message": "messages",
    "encode_message": "messages",
    "RunOptions": "options",
    "LATENESS_SAMPLES": "records",
    "known_groups": "records",
    "known_queues": "records",
    "autodiscover_tasks": "registry",
    "get_task": "registry",
}


def __getattr__(name: str) -> Any:
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    home = f"{__name__}.{module}"
    warnings.warn(
        f"{__name__}.{name} is not public API and will be removed in 0.2; it lives in {home}.",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(home), name)


# -- the sold-item email (Redis in Action 6.4.1) -------------------------------------
def send_sold_email_via_queue(
    seller: str, item: str, price: Any, buyer: str, *, client: Any = None
) -> str:
    """Queue the e-mail telling ``seller`` that ``buyer`` bought ``item`` for ``price``."""
    # The task is defined in the app's tasks module, which itself imports this package.
    from django_rcoord.tasks import send_sold_email

    run = send_sold_email.enqueue_request((seller, item, price, buyer), {})
    return send_message(resolve_client(client), run).task_id
