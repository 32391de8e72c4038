from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from example_project import coordination_views, guild_views, market_views, views

urlpatterns = [
    path("", views.home, name="home"),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    # Back to the example's home page (without next_page: the admin's "logged out" page).
    path("accounts/logout/", auth_views.LogoutView.as_view(next_page="home"), name="logout"),
    path("market/", market_views.market_home, name="market"),
    path("market/list/", market_views.list_item, name="market-list"),
    path("market/list-later/", market_views.list_later, name="market-list-later"),
    path("market/buy/<str:member>/", market_views.buy_item, name="market-buy"),
    path("verification-code/", coordination_views.verification_code, name="verification-code"),
    path("slow-report/", coordination_views.slow_report, name="slow-report"),
    path("guild-mail/", guild_views.guild_mail, name="guild-mail"),
    path("rcoord/", include("django_rcoord.urls")),
    path("admin/", admin.site.urls),
]
