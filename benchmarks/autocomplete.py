"""Autocomplete benchmark: query latency at 1,000 / 100,000 / 1,000,000 members.

    python -m benchmarks.autocomplete [--count QUERIES]

Beside one PING (the floor) and the book's algorithm (two sentinel ZADDs, WATCH,
two ZRANKs, MULTI/ZREM/ZRANGE/EXEC), on the same generated lower-case names
(the book only knows a-z).
"""

from __future__ import annotations

import random
import statistics
import string
import time

from benchmarks import book
from benchmarks.common import run_benchmark


def latencies(operation, queries: list[str]) -> list[float]:
    for query in queries[:50]:
        operation(query)
    samples = []
    for query in queries:
        started = time.perf_counter()
        operation(query)
        samples.append(time.perf_counter() - started)
    return samples


def scenario(client, count: int, repeats: int) -> None:
    from django_rcoord.autocomplete import autocomplete_on_prefix, join_guild

    sizes = [1000, 100_000, 1_000_000]
    generator = random.Random(7)
    print(f"\n{min(count, 2000)} queries of 1-3 letters per guild size; latency in ms")
    print(f"{'':<32} {'members':>10} {'median':>8} {'p99':>8} {'round trips':>12}")
    for size in sizes:
        client.flushdb()
        names = {
            "".join(generator.choices(string.ascii_lowercase, k=generator.randint(5, 12)))
            for _ in range(size)
        }
        names = sorted(names)
        with client.pipeline(transaction=False) as pipe:
            for index, name in enumerate(names):
                join_guild("bench", name, client=pipe)
                pipe.zadd("members:bench", {name: 0})
                if index % 10_000 == 9_999:
                    pipe.execute()
            pipe.execute()
        queries = [
            "".join(generator.choices(string.ascii_lowercase, k=generator.randint(1, 3)))
            for _ in range(min(count, 2000))
        ]
        rows = [
            ("PING (the floor)", "1", lambda q: client.ping()),
            (
                "django-rcoord (ZRANGE BYLEX)",
                "1",
                lambda q: autocomplete_on_prefix("bench", q, 10, client=client),
            ),
            (
                "the book (sentinels, WATCH)",
                "5",
                lambda q: book.autocomplete_on_prefix(client, "bench", q),
            ),
        ]
        for name, trips, operation in rows:
            samples = sorted(latencies(operation, queries))
            p99 = samples[int(len(samples) * 0.99) - 1]
            print(
                f"{name:<32} {len(names):>10,} {statistics.median(samples) * 1000:>8.3f} "
                f"{p99 * 1000:>8.3f} {trips:>12}"
            )
        ours = client.memory_usage("rcoord:guild:{bench}:members") / len(names)
        theirs = client.memory_usage("members:bench") / len(names)
        print(
            f"{'memory per member, bytes':<32} {len(names):>10,}  {ours:.0f} vs book {theirs:.0f}"
        )


if __name__ == "__main__":
    run_benchmark(__doc__.splitlines()[0], scenario)
