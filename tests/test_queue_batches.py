"""A batch of tasks shares its commands: the take and the finish of many tasks run the
commands of one task, each with more members, plus the record each finished task writes
(its own key: one HSET and one PEXPIRE). A batch larger than Lua passes to one command
(unpack takes some 8,000 values) is sent in parts."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from django_rcoord.connection import get_client
from django_rcoord.queues.keys import QueueKeys
from django_rcoord.queues.outcomes import Kind
from django_rcoord.queues.records import queue_stats
from django_rcoord.queues.worker.finish import FinishProtocol
from django_rcoord.queues.worker.jobs import Done, Job, Outcome
from django_rcoord.scripts import run_script
from tests import cluster, tasks
from tests.test_queues import result_of

pytestmark = pytest.mark.django_db(transaction=True)

TASK = "tests.tasks.record"


def exchange(protocol: FinishProtocol, done: list[Done], take: int) -> list[Job]:
    """One finish-and-take call of ``protocol``'s worker; the jobs it took."""
    keys, args = protocol.call(done, take, lease_ms=60_000)
    _, taken = run_script("task_finish", get_client(), keys=keys, args=args)
    return protocol.jobs(taken)


def acked(jobs: list[Job]) -> list[Done]:
    return [Done(job, Outcome(Kind.ACK, TASK, value_json="7"), 1.0) for job in jobs]


def commands_run(work: Any) -> Counter[str]:
    """The commands the server ran for ``work()``, by name (a script's own commands
    included), from its INFO commandstats."""

    def calls() -> Counter[str]:
        stats = get_client().info("commandstats")
        return Counter({name: int(value["calls"]) for name, value in stats.items()})

    before = calls()
    work()
    spent = calls() - before
    del spent["cmdstat_info"]
    return spent


@pytest.mark.skipif(cluster.ENABLED, reason="reads one server's command counters")
@pytest.mark.parametrize("queued", [tasks.record, tasks.unique_report], ids=["plain", "unique"])
def test_a_batch_runs_the_commands_of_one_task_and_two_per_record(queued: Any) -> None:
    """Taking 1 task or 40 runs the same commands; finishing 40 runs those of finishing 1,
    and one HSET and one PEXPIRE more per task (each writes its own record). Unique tasks
    too: their claims are read and dropped by one HMGET and one HDEL for the batch."""
    protocol = FinishProtocol("batcher", [QueueKeys.of("default")])
    exchange(protocol, [], 0)  # the server has the script from now on
    costs = {}
    for size in (1, 40):
        for number in range(size):
            queued.delay(f"b{size}-{number}")
        taken: list[Job] = []
        took = commands_run(
            lambda size=size, taken=taken: taken.extend(exchange(protocol, [], size))
        )
        assert len(taken) == size
        finished = commands_run(lambda taken=taken: exchange(protocol, acked(taken), 0))
        costs[size] = (took, finished)
    assert costs[40][0] == costs[1][0]
    more = costs[40][1]
    more.subtract(costs[1][1])
    # The metrics HASH's expiry is renewed by the first finish of each minute: one PEXPIRE
    # more or less when a minute began during either call.
    assert abs(more.pop("cmdstat_pexpire") - 39) <= 1
    assert +more == Counter({"cmdstat_hset": 39})
    assert queue_stats("default") == {"ready": 0, "in_flight": 0, "delayed": 0, "dead": 0}
    assert get_client().hkeys(QueueKeys.of("default").results) == []


def test_a_batch_larger_than_lua_unpacks_is_taken_and_finished_in_parts() -> None:
    """4,500 tasks taken and acknowledged in one call each: their leases and owners (two
    values a task) are more than one unpack passes to one command."""
    count = 4500
    ids = [tasks.record.delay(f"big-{number}") for number in range(count)]
    protocol = FinishProtocol("big-batch", [QueueKeys.of("default")])
    jobs = exchange(protocol, [], count)
    assert sorted(job.id for job in jobs) == sorted(ids)
    assert queue_stats("default")["in_flight"] == count
    assert exchange(protocol, acked(jobs), 0) == []
    assert queue_stats("default") == {"ready": 0, "in_flight": 0, "delayed": 0, "dead": 0}
    for task_id in (ids[0], ids[-1]):
        record = result_of(task_id)
        assert (record.status, record.return_value) == ("SUCCESSFUL", 7)
