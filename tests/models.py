"""Models for the admin tests of the autocomplete widget (django-rcoord itself has none)."""

from __future__ import annotations

from django.db import models


class Quest(models.Model):
    title = models.CharField(max_length=100)
    leader = models.CharField(max_length=150)

    def __str__(self) -> str:
        return self.title


class QuestMember(models.Model):
    quest = models.ForeignKey(Quest, related_name="members", on_delete=models.CASCADE)
    name = models.CharField(max_length=150)

    def __str__(self) -> str:
        return self.name
