"""The floor: what one round trip costs on this machine, and one command without it.

    python -m benchmarks.floor [--quick]

Sequential PINGs (one round trip each) and PINGs sent in pipelines of 100
(one round trip per 100 commands). Every other scenario measures its own
floor beside its rows; this one says how far round trips are from Redis's
own speed.
"""

from __future__ import annotations

from benchmarks.common import Bench, Measurement, ScenarioResult, Table, measure
from benchmarks.runner import run_benchmark

NAME = "floor"
PIPELINE = 100


def run(bench: Bench) -> ScenarioResult:
    client = bench.client
    count = bench.pick(quick=2000, full=10000)
    repeats = bench.repeats_or(5)

    def pipelined() -> None:
        with client.pipeline(transaction=False) as pipe:
            for _ in range(PIPELINE):
                pipe.ping()
            pipe.execute()

    sequential = measure("PING, one per round trip", "1", client.ping, count=count, repeats=repeats)
    batches = measure(
        f"PING in pipelines of {PIPELINE}",
        f"1 per {PIPELINE}",
        pipelined,
        count=max(1, count // PIPELINE * 4),
        repeats=repeats,
    )
    per_command = Measurement(
        batches.name, batches.round_trips, [rate * PIPELINE for rate in batches.values]
    )
    table = Table(
        f"Commands per second, {repeats} x {count} sequential / "
        f"{repeats} x {count // PIPELINE * 4} pipelines",
        "commands/s",
        [sequential, per_command],
        floor=sequential.name,
    )
    return ScenarioResult(
        NAME,
        "Floor: one round trip against pipelined commands",
        [table],
        params={"count": count, "pipeline": PIPELINE},
        repeats=repeats,
    )


if __name__ == "__main__":
    run_benchmark(NAME, __doc__.splitlines()[0])
