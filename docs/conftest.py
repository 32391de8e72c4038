"""Every Python example of the documentation runs, in order, page by page, against the
test suite's throwaway Redis (``tests/conftest.py``): ``python -m pytest docs``.

The examples of one page share their names, as a reader's session would. An example that
is only a fragment of a file (settings, URLs) is marked ``% skip: next`` with the reason.
Redis is flushed when a page begins.
"""

from __future__ import annotations

import pytest
from sybil import Sybil
from sybil.parsers.myst import PythonCodeBlockParser, SkipParser

from django_rcoord.connection import get_client
from tests.conftest import _use_test_redis, redis_server, redis_url  # noqa: F401

_pages_begun: set[str] = set()


@pytest.fixture
def _docs_redis(request: pytest.FixtureRequest, _use_test_redis: None) -> None:  # noqa: F811
    page = str(request.node.path)
    if page not in _pages_begun:
        _pages_begun.add(page)
        get_client().flushdb()


pytest_collect_file = Sybil(
    parsers=[PythonCodeBlockParser(), SkipParser()],
    patterns=["*.md"],
    excludes=["_build/*"],
    fixtures=["_docs_redis", "db"],
).pytest()
