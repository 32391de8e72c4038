"""Settings of the example project: a small site that uses every part of django-rcoord.

Redis: ``REDIS_URL`` from the environment when set; otherwise the embedded
redis-server in ``.rcoord/redis``, started by the first process that connects to
it (``rundemo`` starts it and stops it at exit; ``manage.py rcoord_redis
start|stop|status`` otherwise). With ``REDIS_CLUSTER_URL`` (any node of a Redis
Cluster) every part runs on the cluster instead.
"""

from __future__ import annotations

import os
from pathlib import Path

import django

from django_rcoord.embedded import embedded_cache

BASE_DIR = Path(__file__).resolve().parent.parent
# Database, embedded Redis data and sent mail; EXAMPLE_STATE_DIR moves them (the tests do).
STATE_DIR = Path(os.environ.get("EXAMPLE_STATE_DIR", BASE_DIR / ".rcoord"))

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-project-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "[::1]"]

INSTALLED_APPS = [
    # Before the admin: its admin/index.html links the operations dashboard.
    "django_rcoord",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "example_project",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_rcoord.middleware.ConcurrencyLimitMiddleware",
]

ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"
ASGI_APPLICATION = "example_project.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": STATE_DIR / "example.sqlite3",
    }
}

# -- Redis -------------------------------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL")
REDIS_CLUSTER_URL = os.environ.get("REDIS_CLUSTER_URL")
EMBEDDED_REDIS_DIR = None if REDIS_URL or REDIS_CLUSTER_URL else STATE_DIR / "redis"

if EMBEDDED_REDIS_DIR is not None:
    # Nothing starts here: the first process that connects to it does.
    CACHES = {"default": {**embedded_cache(EMBEDDED_REDIS_DIR), "KEY_PREFIX": "example"}}
else:
    CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": "example",
        }
    }

RCOORD = {
    "CONNECTION": "default",
    "KEY_PREFIX": "rcoord",
    "CONCURRENCY_LIMITS": [
        {"name": "slow-report", "url_names": ["slow-report"], "limit": 2, "timeout": 10},
    ],
    # /rcoord/metrics/ and /rcoord/stats/ answer to this bearer token (off when unset).
    "METRICS_TOKEN": os.environ.get("RCOORD_METRICS_TOKEN") or None,
}

# Sessions in the database (Django's default), not in Redis: with Redis out of reach a
# signed-in user's every page would be a 500 (reading the session), where the pages that
# need Redis answer a 503 and the others work.
SESSION_ENGINE = "django.contrib.sessions.backends.db"

if REDIS_CLUSTER_URL:
    # Redis Cluster: django-rcoord gets a RedisCluster from its client factory.
    # django-redis has no cluster client, so Django's own cache lives elsewhere (a local
    # cache here).
    RCOORD["CLIENT_FACTORY"] = "example_project.redis_cluster.client"
    RCOORD["ASYNC_CLIENT_FACTORY"] = "example_project.redis_cluster.async_client"
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGIN_REDIRECT_URL = "home"

# Mail is written to files in the state directory. Django 6.1 replaced EMAIL_BACKEND and
# EMAIL_FILE_PATH (deprecated there) with MAILERS.
FILE_MAIL = "django.core.mail.backends.filebased.EmailBackend"
if django.VERSION >= (6, 1):
    MAILERS = {"default": {"BACKEND": FILE_MAIL, "OPTIONS": {"file_path": STATE_DIR / "sent-mail"}}}
else:
    EMAIL_BACKEND = FILE_MAIL
    EMAIL_FILE_PATH = STATE_DIR / "sent-mail"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_rcoord": {"handlers": ["console"], "level": "INFO"}},
}
