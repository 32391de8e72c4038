"""Mount with ``path("rcoord/", include("django_rcoord.urls"))``."""

from __future__ import annotations

from django.urls import path

from django_rcoord import views

app_name = "rcoord"

urlpatterns = [
    path("guilds/<str:guild>/members/", views.guild_members, name="guild-members"),
]
