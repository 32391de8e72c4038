"""The settings django-stubs' mypy plugin reads (``[tool.django-stubs]`` in pyproject.toml).

The tests' settings, plus the names that only the example project's settings define and its
code reads (its pages and commands are checked with the rest). Nothing runs with these.
"""

from example_project.settings import BASE_DIR, REDIS_CLUSTER_URL, STATE_DIR  # noqa: F401
from tests.settings import *  # noqa: F403
