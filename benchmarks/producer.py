"""Producer benchmark: what ``delay()`` costs beside the bare command it sends.

    python -m benchmarks.producer [--quick] [--repeats R]

A plain ``@task``'s ``delay()`` is one ``RPUSH`` of an entry to its group's incoming list
while a worker of this release serves the group, else one EVALSHA of
``task_enqueue.lua``; the Python around it checks the arguments against the function's
signature, builds the message (a fresh id, JSON), and the entry or the script's keys and
arguments. This measures that Python, side by side (interleaved) with:

- PING, the floor of one round trip;
- the same RPUSH and EVALSHA sent bare, each call with a fresh id and message prepared
  beforehand (what the command costs with no Python of ours around it);
- ``delay()`` on a group a worker serves (its ``serving`` key set, as a worker's heartbeat
  sets it: the RPUSH), on a group none serves (the script), and ``execute_later()`` (the
  book's call, by task name, on the served group).

The queue is emptied between tables; each call queues a real task (the work a producer
does in production).

One path of the producer goes past a library's public API, and is kept only while it
pays: a second table measures it beside the public call it replaces, in the same run (a
script run as EVALSHA from its cached SHA1, against redis-py's ``Script.__call__``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from benchmarks.common import (
    Bench,
    Measurement,
    ScenarioResult,
    Table,
    configure_django,
    measure_side_by_side,
    ping_operation,
)
from benchmarks.runner import run_benchmark

NAME = "producer"
QUEUE = "bench"
ALONE = "unserved/bench"  # a group no worker serves
TASK = "bench.produced"


def produced(number: int) -> None:
    """The task queued (never run here)."""


def bare_calls(bench: Bench, prepared: int, queue: str) -> tuple[Callable[[], object], ...]:
    """The bare RPUSH of an incoming entry and the bare EVALSHA of the enqueue script, each
    call with a fresh task id and message built beforehand (``prepared`` of them, reused
    round-robin after)."""
    from django_rcoord.queues.incoming import entry
    from django_rcoord.queues.producer import Enqueue, new_message, task_enqueue_call
    from django_rcoord.scripts import get_script

    runs = [Enqueue(TASK, queue, (number,), {}) for number in range(prepared)]
    messages = [new_message(run) for run in runs]
    pushes = [(message.keys.incoming, entry(message.keys, message.task_id, message.body, 0))
              for message in messages]  # fmt: skip
    calls = [task_enqueue_call(message, run) for message, run in zip(messages, runs, strict=True)]
    sha = get_script("task_enqueue").sha
    prepared_calls = [(len(keys), *keys, *argv) for keys, argv in calls]
    client = bench.client
    push_turns, call_turns = _cycle(pushes), _cycle(prepared_calls)

    def rpush() -> object:
        return client.rpush(*next(push_turns))

    def evalsha() -> object:
        return client.evalsha(sha, *next(call_turns))

    return rpush, evalsha


def _cycle(items: list[tuple]) -> Iterator[tuple]:
    while True:
        yield from items


def run(bench: Bench) -> ScenarioResult:
    configure_django(bench.url)
    from django_rcoord.queues import execute_later, task
    from django_rcoord.queues.keys import QueueKeys

    count = bench.pick(quick=300, full=3000)
    repeats = bench.repeats_or(bench.pick(quick=3, full=5))
    served = task(name=TASK, queue=QUEUE)(produced)
    alone = task(name=f"{TASK}.alone", queue=ALONE)(produced)
    # A worker of this release serves QUEUE's group (what its heartbeat keeps), none ALONE's.
    bench.client.set(QueueKeys.of(QUEUE).serving, 1, ex=3600)
    served.delay(0)  # the group registered, the script loaded, the serving key read
    alone.delay(0)
    rpush, evalsha = bare_calls(bench, count, QUEUE)
    operations = [
        ping_operation(bench.client, 1),
        ("bare RPUSH of an incoming entry (prepared)", "1", rpush),
        ("@task delay(), a worker serves the group (RPUSH)", "1", lambda: served.delay(1)),
        ("execute_later() (by name), the same group", "1", lambda: execute_later(QUEUE, TASK, [1])),
        ("bare EVALSHA of task_enqueue (arguments prepared)", "1", evalsha),
        ("@task delay(), no worker serves the group (script)", "1", lambda: alone.delay(1)),
    ]
    rows: list[Measurement] = measure_side_by_side(operations, count=count, repeats=repeats)
    for bare, paired in ((rows[1], rows[2:4]), (rows[4], rows[5:])):
        for row in paired:
            if bare.median:
                row.extra["vs bare"] = f"{row.median / bare.median:.2f}x"
    bench.client.flushdb()
    table = Table(
        f"Enqueue: one task per call, {repeats} x {count}",
        "tasks/s",
        rows,
        floor=rows[0].name,
        extra_columns=("vs bare",),
        note="vs bare = the row's tasks/s / the bare command's above it: what our Python costs",
    )
    return ScenarioResult(
        NAME,
        "Producer: delay() beside the bare command it sends",
        [table, script_table(bench, count, repeats)],
        params={"count": count},
        repeats=repeats,
    )


def script_table(bench: Bench, count: int, repeats: int) -> Table:
    """One script call: ``run_script`` (EVALSHA from the cached SHA1 as bytes, through
    ``execute_command``) beside redis-py's ``Script.__call__``, the same script and
    arguments (``lock_extend`` on a lock nobody holds: it reads, and writes nothing)."""
    from django_rcoord.scripts import get_script, run_script

    client = bench.client
    name, keys, args = "lock_extend", ("bench:no-lock",), ("nobody", 30_000)
    script = get_script(name)
    operations = [
        ("Script.__call__ (public)", "1", lambda: script(keys=keys, args=args, client=client)),
        (
            "run_script (EVALSHA, cached SHA1)",
            "1",
            lambda: run_script("lock_extend", client, keys, args),
        ),
    ]
    return Table(
        f"One script call, {repeats} x {count}",
        "calls/s",
        measure_side_by_side(operations, count=count, repeats=repeats),
        floor=operations[0][0],
        note="vs floor = the private path's speed / the public path's, in the same run",
    )


if __name__ == "__main__":
    run_benchmark(NAME, __doc__.splitlines()[0])
