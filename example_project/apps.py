from __future__ import annotations

from django.apps import AppConfig


class ExampleConfig(AppConfig):
    name = "example_project"
    label = "example"
    verbose_name = "django-rcoord example"
