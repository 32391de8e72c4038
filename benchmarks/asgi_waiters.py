"""1,000 async waiters on one Lock in one process: hand-off latency, threads, connections.

    python -m benchmarks.asgi_waiters REDIS_URL [--waiters N] [--time-limit S]

Prints one JSON object. The ASGI benchmark runs it twice: with this checkout's
django_rcoord and with the thread-executor one from before native async (the
same script works with both: it uses one ``Lock`` object per waiter and only
``async with``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--waiters", type=int, default=1000)
    parser.add_argument("--time-limit", type=float, default=60)
    options = parser.parse_args()

    from benchmarks.common import configure_django

    configure_django(options.url)
    from django_rcoord.connection import get_client

    sync_client = get_client()
    sync_client.flushdb()
    baseline_threads = threading.active_count()
    baseline_connections = len(sync_client.client_list())
    peaks = {"threads": 0, "connections": 0}
    sampling = threading.Event()

    def sample() -> None:
        # Its own thread and connection, subtracted below.
        while not sampling.wait(0.05):
            peaks["threads"] = max(peaks["threads"], threading.active_count())
            peaks["connections"] = max(peaks["connections"], len(sync_client.client_list()))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    result = asyncio.run(crowd(options.waiters, options.time_limit))
    sampling.set()
    sampler.join()
    result["threads"] = max(0, peaks["threads"] - baseline_threads - 1)
    result["connections"] = max(0, peaks["connections"] - baseline_connections)
    print(json.dumps(result))


async def crowd(waiters: int, time_limit: float) -> dict:
    from django_rcoord.locks import Lock

    entered: list[float] = []
    left: list[float] = []
    errors: list[str] = []
    inside = 0
    most = 0

    async def one() -> None:
        nonlocal inside, most
        try:
            async with Lock("crowd", timeout=10, wait=time_limit):
                entered.append(time.perf_counter())
                inside += 1
                most = max(most, inside)
                await asyncio.sleep(0.001)
                inside -= 1
                left.append(time.perf_counter())
        except Exception as exc:  # noqa: BLE001  (LockTimeout, LockLost, socket timeouts: counted)
            errors.append(type(exc).__name__)

    started = time.perf_counter()
    tasks = [asyncio.ensure_future(one()) for _ in range(waiters)]
    _, pending = await asyncio.wait(tasks, timeout=time_limit + 5)
    for task in pending:
        task.cancel()
    elapsed = time.perf_counter() - started
    # A hand-off: from a holder starting its release to the next holder inside.
    handoffs = sorted(
        (entry - exit_) * 1000 for exit_, entry in zip(left, entered[1:], strict=False)
    )
    return {
        "waiters": waiters,
        "completed": len(left),
        "errors": len(errors) + len(pending),
        "error_kinds": sorted(set(errors)) + (["unfinished"] if pending else []),
        "seconds": round(elapsed, 3),
        "most_inside": most,
        "handoff_median_ms": round(statistics.median(handoffs), 3) if handoffs else None,
        "handoff_p99_ms": round(handoffs[int(len(handoffs) * 0.99) - 1], 3) if handoffs else None,
        "handoff_max_ms": round(handoffs[-1], 3) if handoffs else None,
    }


if __name__ == "__main__":
    main()
