"""No task output can stop a worker from taking new work: a return value over
``RCOORD["MAX_RESULT_BYTES"]`` makes a dead letter that says so, an error of any length is
kept at its start and end, and the call that records a task's end stays within the least
``proto-max-bulk-len`` a server accepts (1 MiB), which the test server is set to. Real
worker processes, on one Redis and (RCOORD_TEST_CLUSTER=1) on the cluster."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from redis.cluster import RedisCluster

from django_rcoord.connection import get_client
from django_rcoord.queues import queue_stats
from django_rcoord.queues.worker.jobs import MAX_ERROR_CHARS
from tests import tasks
from tests.test_queues import output_of, ran, result_of, start_worker

pytestmark = pytest.mark.django_db(transaction=True)

#: The least proto-max-bulk-len Redis and Valkey accept (1mb).
LEAST_BULK = 1024 * 1024


def config(client: Any, name: str, value: str | None = None) -> str:
    """Read (or set, on every node of a cluster) a server setting."""
    nodes = {"target_nodes": RedisCluster.ALL_NODES} if isinstance(client, RedisCluster) else {}
    if value is not None:
        client.config_set(name, value, **nodes)
    found = client.config_get(name, **nodes)
    if isinstance(client, RedisCluster) and name not in found:  # {node: {name: value}}
        found = next(iter(found.values()))
    return str(found[name])


@pytest.fixture
def least_bulk() -> Iterator[None]:
    """The server accepts no argument over 1 MiB, as long as the test runs."""
    client = get_client()
    before = config(client, "proto-max-bulk-len")
    config(client, "proto-max-bulk-len", str(LEAST_BULK))
    try:
        yield
    finally:
        config(client, "proto-max-bulk-len", before)


def drained() -> str:
    worker = start_worker("--burst", "--max-outage", "20")
    output = output_of(worker, 120)
    assert worker.returncode == 0, output
    return output


def test_a_return_value_over_the_bound_is_a_dead_letter_and_the_worker_goes_on(
    least_bulk: None,
) -> None:
    # 300,000 quotes: 600,002 bytes of JSON, 1.2 MB inside the finish call's record.
    too_big = tasks.returns_quotes.delay(300_000)
    # Just under the default bound: 499,982 bytes, about 1,000,000 in the record.
    largest = tasks.returns_quotes.delay(249_990)
    tasks.record.delay("after")
    drained()
    record = result_of(too_big)
    assert record.status == "FAILED"
    assert record.errors[-1]["exception_class_path"] == "django_rcoord.exceptions.ResultTooLarge"
    assert "600,002 bytes" in record.errors[-1]["traceback"]
    assert "MAX_RESULT_BYTES" in record.errors[-1]["traceback"]
    assert result_of(largest).return_value == '"' * 249_990
    assert ran() == ["after"]
    assert queue_stats("default")["dead"] == 1


def test_an_error_of_any_length_is_kept_at_its_start_and_end(least_bulk: None) -> None:
    # Two million control characters: 12 MB as JSON, more again inside the record.
    long = tasks.raises_at_length.delay(2_000_000)
    after = tasks.record.delay("after")
    drained()
    (error,) = result_of(long).errors
    assert error["exception_class_path"] == "builtins.ValueError"
    assert "characters left out" in error["traceback"]
    assert len(error["traceback"]) <= MAX_ERROR_CHARS + 100
    assert error["traceback"].rstrip().endswith("\x01")  # the end of the message is kept
    assert result_of(after).status == "SUCCESSFUL"
