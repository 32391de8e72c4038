"""``manage.py rcoord_worker``: the task worker under a general name, the same command as
``run_email_worker`` (which keeps its name: the e-mail queue is where it began)."""

from __future__ import annotations

from django_rcoord.management.worker import WorkerCommand


class Command(WorkerCommand):
    help = "The same command as run_email_worker. " + WorkerCommand.help
