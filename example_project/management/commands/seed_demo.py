"""``manage.py seed_demo``: the example project's demo accounts (idempotent)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

DEMO_USERS = ("alice", "bob", "carol")
#: A staff account, for the operations dashboard and the admin.
DEMO_STAFF = "operator"
DEMO_PASSWORD = "rcoord-demo"


class Command(BaseCommand):
    help = (
        "Create the demo accounts alice, bob, carol and the staff account operator "
        "(password rcoord-demo)."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        users = get_user_model()
        for username in (*DEMO_USERS, DEMO_STAFF):
            user, created = users.objects.get_or_create(
                username=username,
                defaults={"email": f"{username}@example.com", "is_staff": username == DEMO_STAFF},
            )
            if created:
                user.set_password(DEMO_PASSWORD)
                user.save()
                self.stdout.write(f"created {username}")
