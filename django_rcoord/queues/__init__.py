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
``records``: task records, recovery, counts, dead letters; ``unique``: unique tasks;
``cancel``: cancelling a task before it runs; ``worker``: the
consuming loop; ``delayed`` and ``periodic``: the poller's work; ``backend`` and
``framework``: Django's Tasks framework); this module gathers the names users
import.
"""

from __future__ import annotations

from typing import Any

from django_rcoord.connection import resolve_client
from django_rcoord.exceptions import TaskCancelled
from django_rcoord.queues.cancel import (
    acancel,
    astop_requested,
    cancel,
    current_task_id,
    stop_requested,
)
from django_rcoord.queues.keys import DEFAULT_GROUP, WAKE_TOKEN_MS, QueueKeys, same_group
from django_rcoord.queues.messages import decode_message, encode_message
from django_rcoord.queues.options import RunOptions
from django_rcoord.queues.producer import (
    ScriptedEnqueue,
    aexecute_later,
    enqueue_in_script,
    enqueue_many,
    execute_later,
    send_message,
)
from django_rcoord.queues.records import (
    LATENESS_SAMPLES,
    TaskRecord,
    dead_letters,
    delete_dead,
    get_result,
    known_groups,
    known_queues,
    queue_stats,
    recover_and_promote,
    requeue_dead,
)
from django_rcoord.queues.registry import PermanentFailure, Task, autodiscover_tasks, get_task, task

__all__ = [
    "DEFAULT_GROUP",
    "LATENESS_SAMPLES",
    "WAKE_TOKEN_MS",
    "PermanentFailure",
    "QueueKeys",
    "RunOptions",
    "ScriptedEnqueue",
    "Task",
    "TaskCancelled",
    "TaskRecord",
    "acancel",
    "aexecute_later",
    "astop_requested",
    "autodiscover_tasks",
    "cancel",
    "current_task_id",
    "dead_letters",
    "decode_message",
    "delete_dead",
    "encode_message",
    "enqueue_in_script",
    "enqueue_many",
    "execute_later",
    "get_result",
    "get_task",
    "known_groups",
    "known_queues",
    "queue_stats",
    "recover_and_promote",
    "requeue_dead",
    "same_group",
    "send_sold_email_via_queue",
    "stop_requested",
    "task",
]


# -- the sold-item email (Redis in Action 6.4.1) -------------------------------------
def send_sold_email_via_queue(
    seller: str, item: str, price: Any, buyer: str, *, client: Any = None
) -> str:
    """Queue the e-mail telling ``seller`` that ``buyer`` bought ``item`` for ``price``."""
    # The task is defined in the app's tasks module, which itself imports this package.
    from django_rcoord.tasks import send_sold_email

    run = send_sold_email.enqueue_request((seller, item, price, buyer), {})
    return send_message(resolve_client(client), run).task_id
