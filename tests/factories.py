"""Client factories named by RCOORD["CLIENT_FACTORY"] in the tests."""

from __future__ import annotations

import os

import redis

calls: list[str] = []


def make_client() -> redis.Redis:
    calls.append("make_client")
    return redis.Redis.from_url(os.environ["RCOORD_TEST_REDIS_URL"], client_name="rcoord-factory")


not_callable = "a string, not a function"
