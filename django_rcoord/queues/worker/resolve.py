"""A taken task's one look-up: its message becomes a ``Call`` (the function, its arguments,
options and follow-ups, the Tasks framework's hooks) or a ``Refusal`` (why it cannot run
here), once, before its limits (``gates``), its process (``isolation``) and its run
(``runner``) see it. The message chooses the resolver: a ``@task`` registered here, else
the Tasks framework task a ``RedisTaskBackend`` enqueued (``framework_runs``)."""

from __future__ import annotations

from typing import Any

from django_rcoord.queues.arguments import argument_problem
from django_rcoord.queues.registry import Task, get_task
from django_rcoord.queues.worker.jobs import Call, FollowUps, Job, Refusal

__all__ = ["resolve"]


def resolve(job: Job) -> Call | Refusal:
    """What runs ``job``, or why it cannot run here; never raises (what a look-up raises,
    an import of the task's module for one, refuses it here: a newer worker may run it)."""
    message = job.message
    if message is None or not isinstance(message.get("task"), str):
        reason = "undecodable message (not a JSON object with a task name)"
        return Refusal(reason, anywhere=True)
    name = message["task"]
    try:
        registered = get_task(name)
        if registered is not None:
            return _registered_call(registered, message)
        if message.get("backend"):
            # Imported here: it imports the Tasks framework, which a project may not have.
            from django_rcoord.queues.framework_runs import framework_call

            return framework_call(job, message, name)
    except Exception as exc:  # noqa: BLE001 - a task's module, a backend: refused, not raised
        return Refusal(f"the worker could not run it: {exc!r}")
    return Refusal(f"unknown task {name!r} (not registered here)")


def _registered_call(registered: Task, message: dict[str, Any]) -> Call | Refusal:
    args, kwargs = message.get("args", []), message.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        return Refusal("args must be a JSON list and kwargs a JSON object", anywhere=True)
    problem = argument_problem(registered.signature, args, kwargs)
    if problem is not None:
        return Refusal(f"the task does not accept these arguments: {problem}", anywhere=True)
    follow_ups = FollowUps(registered.follow_up_task(True), registered.follow_up_task(False))
    return Call(registered.function, args, kwargs, registered.options, follow_ups)
