"""Settings for the test suite. Redis comes from the session fixture in conftest.py."""

from __future__ import annotations

import json
import os

import django

SECRET_KEY = "tests-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True

INSTALLED_APPS = [
    # Its place does not matter (the admin index links the dashboard either way).
    "django_rcoord",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # The example project's pages are tested too (mounted under /example/).
    "example_project",
    "tests",  # for tests/tasks.py, discovered by workers
]
if django.VERSION < (6, 0):
    # Django's Tasks framework: built in from Django 6.0 (django.tasks), backported to 5.2.
    INSTALLED_APPS.append("django_tasks")

# Django's Tasks framework on django-rcoord's queues (tests/framework_tasks.py).
TASKS = {
    "default": {
        "BACKEND": "django_rcoord.queues.backend.RedisTaskBackend",
        "QUEUES": ["default", "email", "slow"],
    }
}

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "tests.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
if os.environ.get("RCOORD_TEST_REFUSING_DATABASE"):
    # A worker whose database refuses every connection (tests/test_worker_outage.py).
    DATABASES["default"]["ENGINE"] = "tests.refusing_database"

# conftest.py starts a throwaway redis-server (or uses REDIS_URL) and points
# this alias at it for the whole session; processes the tests start get the
# address in RCOORD_TEST_REDIS_URL.
CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": os.environ.get(
            "RCOORD_TEST_REDIS_URL", "redis://redis-not-configured.invalid/0"
        ),
    }
}

RCOORD = {
    "CONNECTION": "default",
    # Short leases and backoff keep the queue tests quick.
    "TASK_LEASE": float(os.environ.get("RCOORD_TEST_TASK_LEASE", "60")),
    "TASK_RETRY_BACKOFF": 0.05,
    "TASK_MAX_DELIVERIES": int(os.environ.get("RCOORD_TEST_MAX_DELIVERIES", "5")),
    # How many tasks the worker processes the tests start take at a time (the default's).
    "TASK_PREFETCH": int(os.environ.get("RCOORD_TEST_TASK_PREFETCH", "32")),
    # Periodic tasks of the poller processes the tests start (JSON).
    "PERIODIC_TASKS": json.loads(os.environ.get("RCOORD_TEST_PERIODIC", "[]")),
    # Sharded queue groups of the worker processes the tests start (JSON).
    "QUEUE_SHARDS": json.loads(os.environ.get("RCOORD_TEST_QUEUE_SHARDS", "{}")),
    # How soon the worker processes the tests start say they serve nothing.
    "WORKER_IDLE_WARNING": float(os.environ.get("RCOORD_TEST_IDLE_WARNING", "60")),
    # How often the worker processes the tests start look for other layouts' groups.
    "WORKER_DISCOVERY": float(os.environ.get("RCOORD_TEST_DISCOVERY", "60")),
}
if os.environ.get("RCOORD_TEST_CLUSTER", "") not in ("", "0"):
    # The same suite against a 3-master Redis Cluster (conftest.py starts it).
    RCOORD["CLIENT_FACTORY"] = "tests.cluster.client"
    RCOORD["ASYNC_CLIENT_FACTORY"] = "tests.cluster.async_client"

STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOCMEM_MAIL = "django.core.mail.backends.locmem.EmailBackend"
if django.VERSION >= (6, 1):
    # Django 6.1 replaced EMAIL_BACKEND (deprecated there) with MAILERS.
    MAILERS = {"default": {"BACKEND": LOCMEM_MAIL}}
else:
    EMAIL_BACKEND = LOCMEM_MAIL
