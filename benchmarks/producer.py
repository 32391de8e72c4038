"""Producer benchmark: what ``delay()`` costs beside a bare EVALSHA of its script.

    python -m benchmarks.producer [--quick] [--repeats R]

Every ``@task``'s ``delay()`` is one EVALSHA of ``task_enqueue.lua``; the Python around
it checks the arguments against the function's signature, builds the message (a fresh
id, JSON), and picks the script's keys and arguments. This measures that Python, side by
side (interleaved) with:

- PING, the floor of one round trip;
- the same EVALSHA sent bare, each call with a fresh id and message prepared beforehand
  (what the script costs with no Python of ours around it);
- ``delay()`` and ``execute_later()`` (the book's call, by task name).

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
TASK = "bench.produced"


def produced(number: int) -> None:
    """The task queued (never run here)."""


def bare_evalsha(bench: Bench, prepared: int) -> Callable[[], object]:
    """EVALSHA of the enqueue script with keys and arguments built beforehand, a fresh task
    id and message per call (``prepared`` of them, reused round-robin after)."""
    from django_rcoord.queues.producer import Enqueue, enqueue_call
    from django_rcoord.scripts import get_script

    calls = [enqueue_call(Enqueue(TASK, QUEUE, (number,), {})) for number in range(prepared)]
    sha = get_script("task_enqueue").sha
    client = bench.client
    prepared_calls = [(len(keys), *keys, *argv) for _, _, keys, argv in calls]

    def cycle() -> Iterator[tuple]:
        while True:
            yield from prepared_calls

    turns = cycle()

    def evalsha() -> object:
        return client.evalsha(sha, *next(turns))

    return evalsha


def run(bench: Bench) -> ScenarioResult:
    configure_django(bench.url)
    from django_rcoord.queues import execute_later, task

    count = bench.pick(quick=300, full=3000)
    repeats = bench.repeats_or(bench.pick(quick=3, full=5))
    job = task(name=TASK, queue=QUEUE)(produced)
    job.delay(0)  # the group registered, the script loaded
    operations = [
        ping_operation(bench.client, 1),
        ("bare EVALSHA of task_enqueue (arguments prepared)", "1", bare_evalsha(bench, count)),
        ("@task delay()", "1", lambda: job.delay(1)),
        ("execute_later() (by name)", "1", lambda: execute_later(QUEUE, TASK, [1])),
    ]
    rows: list[Measurement] = measure_side_by_side(operations, count=count, repeats=repeats)
    bare = rows[1]
    for row in rows[2:]:
        if bare.median:
            row.extra["vs bare EVALSHA"] = f"{row.median / bare.median:.2f}x"
    bench.client.flushdb()
    table = Table(
        f"Enqueue: one task per call, {repeats} x {count}",
        "tasks/s",
        rows,
        floor=rows[0].name,
        extra_columns=("vs bare EVALSHA",),
        note="vs bare EVALSHA = the row's tasks/s / the bare EVALSHA's: what our Python costs",
    )
    return ScenarioResult(
        NAME,
        "Producer: delay() beside a bare EVALSHA of its script",
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
