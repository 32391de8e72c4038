"""Client factories named by RCOORD["CLIENT_FACTORY"] in the tests."""

from __future__ import annotations

import os

import redis
import redis.asyncio

calls: list[str] = []


def make_client() -> redis.Redis:
    calls.append("make_client")
    return redis.Redis.from_url(os.environ["RCOORD_TEST_REDIS_URL"], client_name="rcoord-factory")


def make_async_client() -> redis.asyncio.Redis:
    calls.append("make_async_client")
    return redis.asyncio.Redis.from_url(
        os.environ["RCOORD_TEST_REDIS_URL"], client_name="rcoord-async-factory"
    )


def make_decoding_client() -> redis.Redis:
    return redis.Redis.from_url(os.environ["RCOORD_TEST_REDIS_URL"], decode_responses=True)


def make_decoding_async() -> redis.asyncio.Redis:
    return redis.asyncio.Redis.from_url(os.environ["RCOORD_TEST_REDIS_URL"], decode_responses=True)


not_callable = "a string, not a function"
