"""Mount with ``path("rcoord/", include("django_rcoord.urls"))``."""

from __future__ import annotations

from django.urls import path

from django_rcoord import views
from django_rcoord.ops import dashboard
from django_rcoord.ops import views as ops_views

app_name = "rcoord"

urlpatterns = [
    path("guilds/<str:guild>/members/", views.guild_members, name="guild-members"),
    # Operations: the staff dashboard, Prometheus metrics and JSON stats (bearer token).
    path("dashboard/", dashboard.index, name="dashboard"),
    path("dashboard/lookup/", dashboard.lookup, name="dashboard-lookup"),
    path("dashboard/cancel/", dashboard.cancel_task, name="dashboard-cancel"),
    path(
        "dashboard/dead/<path:queue>/action/", dashboard.dead_action, name="dashboard-dead-action"
    ),
    path("dashboard/dead/<path:queue>/", dashboard.dead, name="dashboard-dead"),
    path(
        "dashboard/queue/<path:queue>/action/",
        dashboard.queue_action,
        name="dashboard-queue-action",
    ),
    path("metrics/", ops_views.metrics, name="metrics"),
    path("stats/", ops_views.stats, name="stats"),
]
