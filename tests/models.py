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


class Sale(models.Model):
    """One sale of an item, written by the ``@locked`` views that sell an item once
    (tests/views.py, tests/test_decorators.py)."""

    item_id = models.IntegerField()
    buyer = models.CharField(max_length=150)

    def __str__(self) -> str:
        return f"item {self.item_id} to {self.buyer}"
