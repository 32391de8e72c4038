"""``manage.py seed_guild``: fill the example guild with members in several scripts."""

from __future__ import annotations

import random
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_rcoord.autocomplete import join_guild
from example_project.guild_views import GUILD
from example_project.management.commands.seed_demo import DEMO_USERS

FIRST = [
    "Émile",
    "Emma",
    "Ezra",
    "Zoë",
    "Ólafur",
    "Søren",
    "Łukasz",
    "Ağan",
    "Chloé",
    "Inès",
    "Иван",
    "Дмитрий",
    "Анна",
    "Γιώργος",
    "Ελένη",
    "أحمد",
    "فاطمة",
    "יוסף",
    "שרה",
    "अर्जुन",
    "प्रिया",
    "李伟",
    "王芳",
    "さくら",
    "健太",
    "민준",
    "서연",
    "Nguyễn",
    "Mateo",
    "Aarav",
]
LAST = [
    "Durand",
    "Müller",
    "O'Brien",
    "García",
    "Kowalski",
    "Nakamura",
    "Петров",
    "Παππάς",
    "Smith",
    "Rossi",
    "Silva",
    "Kim",
    "Lefèvre",
    "Öztürk",
    "Novák",
]


class Command(BaseCommand):
    help = f"Add the demo users and COUNT generated names to the guild {GUILD!r} (idempotent)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--count", type=int, default=3000)

    def handle(self, *args: Any, count: int, **options: Any) -> None:
        generator = random.Random(6)  # the same names on every run
        names = set(DEMO_USERS)
        while len(names) < count + len(DEMO_USERS):
            names.add(
                f"{generator.choice(FIRST)} {generator.choice(LAST)} {generator.randint(1, 999)}"
            )
        for name in names:
            join_guild(GUILD, name)
        self.stdout.write(f"{len(names)} members in {GUILD!r}")
