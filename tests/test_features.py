"""A command form an older server lacks (``connection.features``): the fallback is used, and
it is said once per process, at DEBUG, in words that do not read as an error (a benchmark run
on Redis 8.2 printed "the server refused it (syntax error)" about 30 times)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import redis
from redis.exceptions import ResponseError

from django_rcoord.connection.features import SET_IFEQ, Feature
from django_rcoord.embedded import EmbeddedRedis
from tests import cluster
from tests.procs import run_python
from tests.test_locks import has_compare_and_set

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def two_servers_without_ifeq(redis_url: str, tmp_path: Path):
    """The URLs of the suite's server and of one more, both real; skipped, honestly, where
    the suite's server has SET ... IFEQ (Redis 8.4+, Valkey 8.1+): nothing refuses it there."""
    if cluster.ENABLED:
        pytest.skip("two plain servers: a cluster's nodes are one server to the feature")
    suite = redis.Redis.from_url(redis_url)
    try:
        if has_compare_and_set(suite):
            pytest.skip("the suite's server has SET ... IFEQ: nothing refuses it")
    finally:
        suite.close()
    other = EmbeddedRedis(tmp_path / "other").start()
    try:
        yield [redis_url, other.url]
    finally:
        other.stop()


def set_ifeq_refusal(client: redis.Redis) -> ResponseError:
    """The server's own answer to the newer form."""
    client.set("feature:key", "a")
    with pytest.raises(ResponseError) as excinfo:
        client.execute_command("SET", "feature:key", "b", "IFEQ", "a", "PX", 1000)
    return excinfo.value


def test_a_refusal_is_remembered_per_server_and_said_once_per_process(
    two_servers_without_ifeq, caplog
) -> None:
    # A Feature of its own: the process-wide SET_IFEQ may have met this server already.
    feature = Feature(SET_IFEQ.name, SET_IFEQ.refusal, SET_IFEQ.since)
    caplog.set_level(logging.DEBUG, logger="django_rcoord")
    for url in two_servers_without_ifeq:
        client = redis.Redis.from_url(url)
        assert feature.usable(client)
        assert feature.refused(client, set_ifeq_refusal(client))
        assert not feature.usable(client)  # the fallback from now on, for this server
        assert feature.refused(client, set_ifeq_refusal(client))  # (a retry's refusal)
        client.close()
    (record,) = [r for r in caplog.records if r.name == "django_rcoord.connection.features"]
    assert record.levelno == logging.DEBUG
    message = record.getMessage()
    assert "SET ... IFEQ" in message
    assert "Redis 8.4+" in message
    assert "refused" not in message
    assert "error" not in message.lower()


def test_any_other_error_is_the_callers(two_servers_without_ifeq, caplog) -> None:
    feature = Feature(SET_IFEQ.name, SET_IFEQ.refusal, SET_IFEQ.since)
    client = redis.Redis.from_url(two_servers_without_ifeq[0])
    client.set("feature:list", "x")
    with pytest.raises(ResponseError) as excinfo:
        client.lpush("feature:list", "y")  # WRONGTYPE: not a refusal of the form
    assert not feature.refused(client, excinfo.value)
    assert feature.usable(client)
    assert caplog.records == []
    client.close()


SCRIPT = """
import logging
import sys

import django
import redis

django.setup()
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
logging.getLogger("django_rcoord").setLevel(logging.DEBUG)

from django_rcoord.locks import Lock

for url in sys.argv[1:]:
    client = redis.Redis.from_url(url)
    for number in range(3):
        lock = Lock(f"feature-log:{number}", timeout=5, wait=0, client=client)
        assert lock.acquire()
        lock.extend(10)  # SET ... IFEQ, refused by the server: the script instead
        lock.release()
"""


def test_locks_extended_on_two_older_servers_say_it_once(two_servers_without_ifeq) -> None:
    """A fresh process, as a worker or a benchmark runs: six extends on two servers lacking
    the form, one DEBUG line."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    result = run_python("-c", SCRIPT, *two_servers_without_ifeq, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "IFEQ" in line]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("DEBUG django_rcoord.connection.features: SET ... IFEQ")
    assert "refused" not in lines[0]
