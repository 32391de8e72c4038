from __future__ import annotations

from django.apps import AppConfig, apps
from django.conf import settings
from django.core import checks


class RcoordConfig(AppConfig):
    name = "django_rcoord"
    label = "rcoord"
    verbose_name = "Redis coordination"

    def ready(self) -> None:
        from django_rcoord import connection  # noqa: F401  (connects its setting_changed receiver)
        from django_rcoord.checks import check_redis_server, check_settings
        from django_rcoord.embedded.checks import check_embedded_in_deploy, check_embedded_server

        checks.register(check_settings, "rcoord")
        checks.register(check_embedded_server, "rcoord")
        # Connects to Redis: only when asked for, by check --deploy.
        checks.register(check_redis_server, "rcoord", deploy=True)
        checks.register(check_embedded_in_deploy, "rcoord", deploy=True)
        self._register_the_task_backends_checks()
        self._link_the_admin_index()

    @staticmethod
    def _register_the_task_backends_checks() -> None:
        """The Tasks framework registers its check (which runs each backend's ``check()``,
        ours among them: rcoord.E018, E019, W003) only once its package is imported. A
        project whose ``TASKS`` names our backend gets it under ``manage.py check`` even if
        nothing imported the framework yet (a misspelt option would otherwise pass)."""

        tasks = getattr(settings, "TASKS", None)
        if not isinstance(tasks, dict):
            return
        ours = ("django_rcoord.task_backend.", "django_rcoord.queues.backend.")
        if any(
            isinstance(alias, dict) and str(alias.get("BACKEND", "")).startswith(ours)
            for alias in tasks.values()
        ):
            from django_rcoord.queues.framework import register_checks

            register_checks()

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
