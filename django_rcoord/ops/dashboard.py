"""The staff dashboard (``rcoord:dashboard``): queues, workers, dead letters, task records,
schedules, locks and semaphores, in the Django admin's look.

Only active staff for whom ``RCOORD["DASHBOARD_PERMISSION"]`` says yes see it or act on
it; others are sent to the admin's login (anonymous) or refused (403). Every page reads
with bounded work: a few reads per queue group, queue and live worker, dead letters a
page at a time, locks and semaphores looked up by name. Actions (requeue or delete dead
letters, pause or resume a queue, cancel a task) are POSTs (CSRF-checked) and are logged
with the staff user; deleting every dead letter of a queue, and cancelling a
queued or delayed task (from its record on the look-up page), take a second POST from a
confirmation page.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import django
from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, reverse
from django.utils.http import urlencode
from django.utils.module_loading import import_string
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from django_rcoord.conf import conf
from django_rcoord.connection.errors import REDIS_UNAVAILABLE
from django_rcoord.exceptions import InvalidName
from django_rcoord.locks import lock_status
from django_rcoord.ops.status import overview
from django_rcoord.queues.cancel import cancel
from django_rcoord.queues.fan_in import fan_in_status
from django_rcoord.queues.keys import QueueKeys, group_of_task_id
from django_rcoord.queues.pause import pause_queue, resume_queue
from django_rcoord.queues.records import dead_letters, delete_dead, queue_stats, requeue_dead
from django_rcoord.queues.results import READY, get_result
from django_rcoord.queues.shards import logical_group
from django_rcoord.responses import error_response, refused_unavailable
from django_rcoord.semaphores import semaphore_status
from django_rcoord.validation import parse_int_in

logger = logging.getLogger(__name__)

#: Dead letters shown per page.
DEAD_PER_PAGE = 25
#: The largest page number read from a request (a page past the last shows the last).
MAX_PAGE = 10**9
#: Chart size (px) of the finished-per-minute bars: 60 bars of 2 px with 1 px gaps.
CHART_WIDTH, CHART_HEIGHT = 180, 28


def default_permission(request: HttpRequest) -> bool:
    """Every active staff member may use the dashboard (replace it to narrow that down,
    e.g. ``lambda request: request.user.is_superuser``)."""
    return True


def _allowed(request: HttpRequest) -> bool:
    user = request.user
    if not (user.is_active and user.is_staff):
        return False
    return bool(import_string(conf.DASHBOARD_PERMISSION)(request))


def staff_only(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Anonymous users go to the login page; signed-in users the permission refuses get a
    403; Redis out of reach is a 503, not a 500."""

    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path(), _login_url())
        if not _allowed(request):
            raise PermissionDenied("The rcoord dashboard is for staff.")
        try:
            return view(request, *args, **kwargs)
        except REDIS_UNAVAILABLE as exc:
            return refused_unavailable(request, exc, what="The rcoord dashboard")

    return never_cache(wrapped)


def _login_url() -> str:
    try:
        return reverse("admin:login")
    except NoReverseMatch:
        return str(settings.LOGIN_URL)


def _context(
    request: HttpRequest,
    title: str,
    crumbs: Sequence[tuple[str | None, str]] = (),
    **extra: Any,
) -> dict[str, Any]:
    """The admin's own template context (site header, user links), when the admin is on.
    ``crumbs``: (URL or None, label) after the dashboard's own, drawn as the admin of this
    Django draws its breadcrumbs (a list from Django 6.1, a line before)."""
    context: dict[str, Any] = {
        "title": title,
        "crumbs": list(crumbs),
        "crumbs_as_list": django.VERSION >= (6, 1),
    }
    try:
        from django.contrib import admin

        context.update(admin.site.each_context(request))
    except (ImportError, RuntimeError):  # the admin is not installed
        pass
    context.update(extra)
    return context


def _queue(name: str) -> QueueKeys:
    try:
        return QueueKeys.of(name)
    except InvalidName as exc:
        raise Http404(str(exc)) from exc


def minute_chart(per_minute: list[int]) -> dict[str, Any]:
    """Bars of an inline SVG: one per minute of the last hour (oldest first, now at the
    right), their heights in proportion to the busiest minute's, which fills the chart. A
    track behind them and a baseline show the whole hour, however few minutes had work."""
    top = max(per_minute, default=0) or 1
    step = CHART_WIDTH // max(1, len(per_minute))
    bars = []
    for index, count in enumerate(per_minute):
        # In proportion, but a minute with work is never drawn as none.
        height = 0 if not count else max(1, round(count / top * CHART_HEIGHT))
        bars.append({"x": index * step, "y": CHART_HEIGHT - height, "height": height, "n": count})
    return {
        "bars": bars,
        "top": top,
        "bar_width": max(1, step - 1),
        "width": CHART_WIDTH,
        "height": CHART_HEIGHT,
        "minutes": len(per_minute),
    }


@require_GET
@staff_only
def index(request: HttpRequest) -> HttpResponse:
    state = overview()
    for queue in state["queues"]:
        queue["chart"] = minute_chart(queue["finished_per_minute"])
    return TemplateResponse(
        request,
        "django_rcoord/dashboard/index.html",
        _context(request, "Queues, workers and locks", state=state),
    )


@require_GET
@staff_only
def dead(request: HttpRequest, queue: str) -> HttpResponse:
    keys = _queue(queue)
    total = queue_stats(keys.name)["dead"]
    pages = max(1, math.ceil(total / DEAD_PER_PAGE))
    page = min(parse_int_in(request.GET.get("page", "1"), 1, MAX_PAGE) or 1, pages)
    letters = dead_letters(keys.name, limit=DEAD_PER_PAGE, offset=(page - 1) * DEAD_PER_PAGE)
    return TemplateResponse(
        request,
        "django_rcoord/dashboard/dead.html",
        _context(
            request,
            f"Dead letters of {keys.name}",
            [(None, f"Dead letters of {keys.name}")],
            queue=keys.name,
            letters=letters,
            total=total,
            page=page,
            pages=pages,
            previous_page=page - 1 if page > 1 else None,
            next_page=page + 1 if page < pages else None,
        ),
    )


@require_POST
@staff_only
def dead_action(request: HttpRequest, queue: str) -> HttpResponse:
    keys = _queue(queue)
    action = request.POST.get("action")
    task_id = request.POST.get("task_id") or None
    if action not in ("requeue", "delete"):
        return error_response(request, 400, "bad_request", "action must be requeue or delete")
    # A task of a queue with shards is of one of them (RCOORD["QUEUE_SHARDS"]).
    if task_id is not None and logical_group(group_of_task_id(task_id) or "") != keys.group:
        return error_response(request, 400, "bad_request", f"{task_id!r} is no task of {queue}")
    if action == "delete" and task_id is None and request.POST.get("confirm") != "yes":
        # Deleting every dead letter cannot be undone: it takes a second POST that says so.
        return _confirm_delete_all(request, keys)
    act = requeue_dead if action == "requeue" else delete_dead
    count = act(keys.name, task_id)
    logger.info(
        "%s: %s %d dead letter(s) of %s%s",
        request.user.get_username(),
        "requeued" if action == "requeue" else "deleted",
        count,
        keys.name,
        f" ({task_id})" if task_id else "",
    )
    _message(request, f"{'Requeued' if action == 'requeue' else 'Deleted'} {count} dead letter(s).")
    back = reverse("rcoord:dashboard-dead", args=[keys.name])
    page = parse_int_in(request.POST.get("page", ""), 1, MAX_PAGE)
    if page is not None:
        back += f"?page={page}"
    return redirect(back)


def _confirm_delete_all(request: HttpRequest, keys: QueueKeys) -> HttpResponse:
    return TemplateResponse(
        request,
        "django_rcoord/dashboard/confirm_delete.html",
        _context(
            request,
            f"Delete every dead letter of {keys.name}?",
            [
                (
                    reverse("rcoord:dashboard-dead", args=[keys.name]),
                    f"Dead letters of {keys.name}",
                ),
                (None, "Delete all"),
            ],
            queue=keys.name,
            total=queue_stats(keys.name)["dead"],
        ),
    )


@require_POST
@staff_only
def queue_action(request: HttpRequest, queue: str) -> HttpResponse:
    """Pause or resume ``queue`` for every worker (``pause_queue``, ``resume_queue``): 400
    for an action that is neither, or a value that is no queue name."""
    action = request.POST.get("action")
    if action not in ("pause", "resume"):
        return error_response(request, 400, "bad_request", "action must be pause or resume")
    try:
        name = QueueKeys.of(queue).name
    except InvalidName as exc:
        return error_response(request, 400, "bad_request", str(exc))
    changed = (pause_queue if action == "pause" else resume_queue)(name)
    done = "paused" if action == "pause" else "resumed"
    logger.info("%s: %s queue %s", request.user.get_username(), done, name)
    _message(request, f"Queue {name} {done}." if changed else f"Queue {name} was {done} already.")
    return redirect("rcoord:dashboard")


@require_POST
@staff_only
def cancel_task(request: HttpRequest) -> HttpResponse:
    """Cancel a queued or delayed task (``queues.cancel``): a first POST shows a confirmation
    page, the second (``confirm=yes``) cancels. 400 for a value that is no task id; 409 when
    the task is not queued or delayed (any more): running (``cancel`` then asked it to
    stop), finished, a dead letter, or unknown."""
    task_id = request.POST.get("task_id", "").strip()
    if group_of_task_id(task_id) is None:
        return error_response(request, 400, "bad_request", f"{task_id!r} is not a task id")
    if request.POST.get("confirm") != "yes":
        record = get_result(task_id)
        if record is None or record.status != READY:
            return _not_cancellable(request, task_id, record.status if record else None)
        return TemplateResponse(
            request,
            "django_rcoord/dashboard/confirm_cancel.html",
            _context(
                request,
                f"Cancel task {task_id}?",
                [
                    (
                        f"{reverse('rcoord:dashboard-lookup')}?{urlencode({'task': task_id})}",
                        f"Task {task_id}",
                    ),
                    (None, "Cancel"),
                ],
                record=record,
            ),
        )
    if not cancel(task_id):
        record = get_result(task_id)
        return _not_cancellable(request, task_id, record.status if record else None)
    logger.info("%s: cancelled task %s", request.user.get_username(), task_id)
    _message(request, f"Cancelled task {task_id}.")
    return redirect(f"{reverse('rcoord:dashboard-lookup')}?{urlencode({'task': task_id})}")


def _not_cancellable(request: HttpRequest, task_id: str, status: str | None) -> HttpResponse:
    if status is None:
        why = "no such task is known (or its record has expired)"
    elif status == "RUNNING":
        why = "it is running: it was asked to stop (its code checks stop_requested())"
    else:
        why = f"it is {status}, not queued or delayed"
    detail = f"Task {task_id} was not cancelled: {why}."
    return error_response(request, 409, "not_cancellable", detail)


def _message(request: HttpRequest, text: str) -> None:
    try:
        from django.contrib import messages

        messages.info(request, text, fail_silently=True)
    except ImportError:  # the messages app is not installed
        pass


@require_GET
@staff_only
def lookup(request: HttpRequest) -> HttpResponse:
    """A task's record by id (and a fan-in's progress, by its callback's id), a lock or a
    semaphore by name."""
    found: dict[str, Any] = {}
    task_id = request.GET.get("task", "").strip()
    if task_id:
        known = group_of_task_id(task_id) is not None
        record = get_result(task_id) if known else None
        # A fan-in's id is its callback's: its progress, whether the callback is queued yet.
        fan_in = fan_in_status(task_id) if known else None
        found["task"] = {"id": task_id, "record": record, "fan_in": fan_in}
    for kind, status in (("lock", lock_status), ("semaphore", semaphore_status)):
        name = request.GET.get(kind, "").strip()
        if name:
            try:
                found[kind] = status(name)
            except InvalidName as exc:
                found[kind] = {"name": name, "error": str(exc)}
    return TemplateResponse(
        request,
        "django_rcoord/dashboard/lookup.html",
        _context(
            request,
            "Look up a task, a lock or a semaphore",
            [(None, "Look up")],
            found=found,
            query=request.GET,
        ),
    )
