from __future__ import annotations

from django.urls import include, path

from tests import views
from tests.admin import guild_admin

urlpatterns = [
    path("purchase/<int:item_id>/", views.purchase, name="purchase"),
    path("counter/<str:name>/", views.bump_counter),
    path("profile/", views.profile, name="profile"),
    path("misconfigured/<int:item_id>/", views.misconfigured),
    path("custom-busy/<int:item_id>/", views.custom_busy),
    path("async-purchase/<int:item_id>/", views.async_purchase),
    path("note/<str:slug>/", views.note),
    path("cbv/<int:item_id>/", views.PurchaseView.as_view()),
    path("async-cbv/<int:item_id>/", views.AsyncPurchaseView.as_view()),
    path("download/", views.download),
    path("download-async/", views.download_async),
    path("hot/", views.hot),
    path("profile-async/", views.profile_async),
    path("limited/busy-async/", views.busy_async),
    path("greet/<str:name>/", views.async_greet),
    path("limited/slow/", views.slow, name="slow"),
    path("limited/slow-async/", views.slow_async, name="slow-async"),
    path("limited/streaming/", views.streaming),
    path("limited/streaming-async-body/", views.streaming_async_body),
    path("unlimited/", views.unlimited, name="unlimited"),
    path("two-pickers/", views.two_pickers),
    path("purchase-fail-open/<int:item_id>/", views.purchase_fail_open),
    path("async-purchase-fail-open/<int:item_id>/", views.async_purchase_fail_open),
    path("download-strict/", views.download_strict),
    path("download-strict-async/", views.download_strict_async),
    path("outlive/", views.outlive),
    path("outlive-async/", views.outlive_async),
    path("misdecorated/", views.MisdecoratedView.as_view()),
    path("async-misdecorated/", views.AsyncMisdecoratedView.as_view()),
    path("both-media/", views.both_media),
    path("sell/<int:item_id>/", views.sell),
    path("sell-autocommit/<int:item_id>/", views.sell_autocommit),
    path("sale-page/<int:item_id>/", views.sale_page),
    path("async-sale-page/<int:item_id>/", views.async_sale_page),
    path("async-sell/<int:item_id>/", views.async_sell),
    path("sell-cbv/<int:item_id>/", views.SellView.as_view()),
    path("sell-cbv-dispatch/<int:item_id>/", views.SellDispatchView.as_view()),
    path("sell-cbv-autocommit/<int:item_id>/", views.SellAutocommitView.as_view()),
    path("guild-admin/", guild_admin.urls),
    path("example/", include("example_project.urls")),
]
