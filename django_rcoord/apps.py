from __future__ import annotations

from django.apps import AppConfig
from django.core import checks


class RcoordConfig(AppConfig):
    name = "django_rcoord"
    label = "rcoord"
    verbose_name = "Redis coordination"

    def ready(self) -> None:
        from django_rcoord import connection  # noqa: F401  (connects its setting_changed receiver)
        from django_rcoord.checks import check_redis_server, check_settings

        checks.register(check_settings, "rcoord")
        # Connects to Redis: only when asked for, by check --deploy.
        checks.register(check_redis_server, "rcoord", deploy=True)
