"""Sphinx configuration of the django-rcoord documentation.

Build it as CI does (warnings are errors, every reference must resolve):

    python -m sphinx -W -n -b html docs docs/_build/html
"""

from __future__ import annotations

import sys
from pathlib import Path

import django
from django.conf import settings

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path[:0] = [str(ROOT), str(DOCS / "_ext")]

# autodoc imports the app's modules, which read Django's settings: a minimal project,
# which never connects to Redis (nothing is called at import).
if not settings.configured:
    settings.configure(
        INSTALLED_APPS=[
            "django.contrib.admin",
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
            "django.contrib.messages",
            "django_rcoord",
        ],
        CACHES={
            "default": {
                "BACKEND": "django_redis.cache.RedisCache",
                "LOCATION": "redis://127.0.0.1:6379/0",
            }
        },
        USE_TZ=True,
    )
    django.setup()

import django_rcoord  # noqa: E402

project = "django-rcoord"
author = "django-rcoord developers"
copyright = "django-rcoord developers"
release = django_rcoord.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "rcoord_docs",
]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "screenshots/*.md", "conftest.py"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 4

html_theme = "furo"
html_title = f"django-rcoord {release}"
html_static_path = ["_static"]
html_css_files = ["rcoord.css"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented_params"

# Types of other packages named in signatures and docstrings (no intersphinx: the docs
# build offline) are not cross-referenced.
_OTHER_PACKAGES = (
    r"(redis|django|django_redis|django_tasks|asgiref|collections|typing|types|datetime|"
    r"pathlib|os|concurrent|asyncio|threading|decimal|uuid|enum|dataclasses|contextlib|"
    r"logging|_contextvars|cronsim)(\..*)?"
)
_TYPING_NAMES = (
    r"(Any|Callable|Awaitable|Iterable|Iterator|Mapping|Sequence|Coroutine|AsyncIterator|"
    r"TypeVar|ParamSpec|Self|NoneType|Literal|Optional|Union)(\[.*\])?"
)
nitpick_ignore_regex = [(r"py:.*", _OTHER_PACKAGES), (r"py:.*", _TYPING_NAMES)]
