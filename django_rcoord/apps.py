from __future__ import annotations

from django.apps import AppConfig, apps
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
        self._link_the_admin_index()

    @staticmethod
    def _link_the_admin_index() -> None:
        """Give the admin's index a link to the dashboard, whatever the order of
        INSTALLED_APPS (an app's admin/index.html would be found only before the admin's):
        the default site's index page becomes ours, which extends "admin/index.html". A
        site with an index_template of its own keeps it."""
        if not apps.is_installed("django.contrib.admin"):
            return
        from django.contrib import admin

        if admin.site.index_template is None:
            admin.site.index_template = "django_rcoord/admin/index.html"
