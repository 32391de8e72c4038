"""Resharding as an operator does it (docs/howto/resharding.md): one group taken from no
shards to 3, 6, then 2 (``RCOORD["QUEUE_SHARDS"]``) under a steady stream of plain and
unique tasks, each change a rolling deploy of two producers and two workers, restarted one
by one while the stream runs. Nothing is lost, no plain task runs twice (no worker is
killed: at-least-once's window never opens), and each unique key runs once per claim.
Real processes, on one Redis and, with RCOORD_TEST_CLUSTER=1, on a 3-primary cluster."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

from django_rcoord.queues import get_result, queue_stats
from django_rcoord.queues.results import SUCCESSFUL
from tests.procs import wait_until
from tests.test_queues import log_of, output_of, ran, start_logged, start_worker
from tests.test_shard_layouts import layout

pytestmark = pytest.mark.django_db(transaction=True)

#: The layouts, in the order the operator deploys them.
LAYOUTS: list[dict[str, int]] = [{}, {"main": 3}, {"main": 6}, {"main": 2}]
#: The unique keys the producers rotate over (few, so that claims are often held).
UNIQUE_KEYS = ("u0", "u1", "u2")
#: Seconds a producer waits between two tasks: a steady stream of about 20 a second from
#: each of the two, light enough for a 2-core machine running six processes.
PRODUCER_PAUSE = 0.05
#: Seconds a unique task waits (delayed) before it runs: its claim holds that long at
#: least, so that producers of two layouts side by side often meet the same key's claim.
UNIQUE_DELAY = 1.0

#: A producer process: queues plain tasks ``record("<name>-<n>")`` and, every third, a
#: unique ``unique_report(<key>)`` due ``UNIQUE_DELAY`` seconds later, until SIGTERM. It
#: pushes each task it queued (once ``delay()`` returned) to the list the tasks push their
#: runs to, ``"queued <kind> <marker> <id>"``: one list on one server, so its order says
#: which runs came before which claims.
PRODUCER = """
import signal, sys, threading, django
django.setup()
from django_rcoord.connection import get_client
from tests import tasks
name, pause, delay, keys = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
n = 0
while not stop.wait(pause):
    marker = f"{name}-{n}"
    get_client().rpush(tasks.RAN, f"queued plain {marker} {tasks.record.delay(marker)}")
    if n % 3 == 0:
        key = keys[n // 3 % len(keys)]
        task_id = tasks.unique_report.schedule(key, delay=delay)
        get_client().rpush(tasks.RAN, f"queued unique {key} {task_id}")
    n += 1
"""


def environment(shards: dict[str, int]) -> dict[str, str]:
    """A process's environment on layout ``shards`` (workers discover every 0.5 s)."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "RCOORD_TEST_QUEUE_SHARDS": json.dumps(shards),
        "RCOORD_TEST_DISCOVERY": "0.5",
    }


def start_producer(name: str, shards: dict[str, int]) -> subprocess.Popen:
    """Producer ``name`` on layout ``shards``, once it has queued its first task."""
    command = [sys.executable, "-c", PRODUCER, name, str(PRODUCER_PAUSE), str(UNIQUE_DELAY)]
    process = start_logged([*command, *UNIQUE_KEYS], environment(shards))
    stream(name, 1, why=lambda: log_of(process))
    return process


def stream(name: str, count: int = 20, why: Callable[[], Any] | None = None) -> None:
    """Wait until producer ``name`` has queued ``count`` plain tasks: the stream runs on
    between two restarts."""
    wait_until(lambda: len(queued("plain", f"{name}-")) >= count, timeout=60, why=why)


def queued(kind: str, prefix: str = "") -> list[list[str]]:
    """The tasks of ``kind`` (``plain``, ``unique``) the producers queued, whose marker
    starts with ``prefix``: [marker, id] each."""
    entries = (entry.split()[1:] for entry in ran() if entry.startswith("queued "))
    return [entry[1:] for entry in entries if entry[0] == kind and entry[1].startswith(prefix)]


def runs() -> list[str]:
    """The markers of the runs, in the order they ran."""
    return [entry for entry in ran() if not entry.startswith("queued ")]


def claims_broken() -> list[str]:
    """Where a unique key had two claims at once: in the one list (one server's order) where
    producers log the ids ``delay()`` returned and runs log their key, a run's claim is
    released after its run logged it, so a new id comes after the runs of all earlier
    ones; at every point, the ids logged of a key are at most its runs so far, plus one."""
    seen: dict[str, set[str]] = {key: set() for key in UNIQUE_KEYS}
    done = Counter[str]()
    broken = []
    for entry in ran():
        words = entry.split()
        if words[:2] == ["queued", "unique"]:
            seen[words[2]].add(words[3])
            if len(seen[words[2]]) > done[words[2]] + 1:
                broken.append(f"{words[2]}: {len(seen[words[2]])} ids after {done[words[2]]} runs")
        elif entry in seen:
            done[entry] += 1
    return broken


def start_layout_worker(shards: dict[str, int]) -> subprocess.Popen:
    worker = start_worker(env=environment(shards))
    wait_until(lambda: "watching" in log_of(worker), timeout=60, why=lambda: log_of(worker))
    return worker


def stop(process: subprocess.Popen) -> str:
    """SIGTERM ``process`` (a worker finishes its task first) and its output; it exits 0."""
    process.send_signal(signal.SIGTERM)
    output = output_of(process, 60)
    assert process.returncode == 0, output
    return output


def status(shards: dict[str, int]) -> str:
    """What ``manage.py rcoord_status`` prints on layout ``shards``."""
    out = StringIO()
    with layout(shards):
        call_command("rcoord_status", stdout=out)
    return out.getvalue()


def test_a_rolling_deploy_through_every_layout_loses_nothing_and_runs_nothing_twice() -> None:
    producers = [start_producer(f"p{n}-0", LAYOUTS[0]) for n in (1, 2)]
    workers = [start_layout_worker(LAYOUTS[0]) for _ in (1, 2)]
    for step, shards in enumerate(LAYOUTS[1:], start=1):
        # The deploy's order: producer 1, worker 1, producer 2, worker 2, the stream on.
        for which in range(2):
            stop(producers[which])
            producers[which] = start_producer(f"p{which + 1}-{step}", shards)
            stream(f"p{which + 1}-{step}")
            stop(workers[which])
            workers[which] = start_layout_worker(shards)
        print(status(shards))  # shown with pytest -s, and when the test fails
    for producer in producers:
        stop(producer)
    plain = [marker for marker, _ in queued("plain")]
    unique = queued("unique")
    claims = {task_id for _, task_id in unique}
    # The final drain: the workers of the last layout serve what every earlier one left.
    wait_until(
        lambda: len(runs()) >= len(plain) + len(claims),
        timeout=60,
        why=lambda: (status(LAYOUTS[-1]), [log_of(worker) for worker in workers]),
    )
    print(status(LAYOUTS[-1]))
    for worker in workers:
        stop(worker)
    ran_times = Counter(runs())
    # No task lost, none run twice (no worker was killed: at-least-once never ran one again).
    assert {marker: ran_times[marker] for marker in plain} == dict.fromkeys(plain, 1)
    assert set(ran_times) == {*plain, *UNIQUE_KEYS}
    # Each unique key had one claim at a time; each claim (a new id) ran once, and a
    # delay() that met a held claim returned that claim's id.
    assert claims_broken() == []
    for key in UNIQUE_KEYS:
        ids = {task_id for marker, task_id in unique if marker == key}
        assert ran_times[key] == len(ids), (key, ids)
    for task_id in claims:
        record = get_result(task_id)
        assert record is not None, task_id
        assert record.status == SUCCESSFUL, (task_id, record)
        assert record.attempts == 1, record
    assert len(unique) > len(claims)  # some delay() met a held claim
    with layout(LAYOUTS[-1]):
        stats = queue_stats("default")
    assert [stats[count] for count in ("ready", "in_flight", "delayed", "dead")] == [0, 0, 0, 0]
