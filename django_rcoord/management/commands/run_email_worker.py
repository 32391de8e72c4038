"""``manage.py run_email_worker``: run queued tasks (the sold-item e-mails first)."""

from __future__ import annotations

from django_rcoord.management.worker import WorkerCommand


class Command(WorkerCommand):
    pass
