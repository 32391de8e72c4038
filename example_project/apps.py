from __future__ import annotations

from django.apps import AppConfig


class ExampleConfig(AppConfig):
    name = "example_project"
    label = "example"
    verbose_name = "django-rcoord example"

    def ready(self) -> None:
        from django_rcoord.conf import conf
        from django_rcoord.embedded import EmbeddedRedis

        # Every process of the project (web server, workers, manage.py commands)
        # makes sure the embedded Redis runs; the first one starts it, the others
        # reuse it. With REDIS_URL set, EMBEDDED_REDIS_DIR is None and nothing starts.
        if conf.EMBEDDED_REDIS_DIR:
            EmbeddedRedis(conf.EMBEDDED_REDIS_DIR).start()
