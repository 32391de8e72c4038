"""Autocomplete benchmark: query latency and memory per member at 1,000 / 100,000 /
1,000,000 members (1,000 / 100,000 with --quick).

    python -m benchmarks.autocomplete [--quick] [--repeats R]

Four indexes of the same generated lower-case names (the book only knows a-z),
queried with the same 1-3 letter prefixes, up to 10 results:

- django-rcoord: one ``ZRANGE BYLEX LIMIT`` on its folded index;
- the book (6.1.2): two sentinel ZADDs, WATCH, two ZRANKs, MULTI/ZREM/ZRANGE/EXEC;
- ZSCAN MATCH on the book's sorted set (round trips vary: counted);
- a SET per prefix: SMEMBERS of the prefix's set, sorted client side.

Memory per member is the growth of the server's ``used_memory`` while one index
is built, divided by the members.
"""

from __future__ import annotations

import random
import statistics
import string
import time
from collections.abc import Callable

from benchmarks import book
from benchmarks.common import (
    TURN,
    Bench,
    Measurement,
    ScenarioResult,
    Table,
    percentile,
)
from benchmarks.runner import run_benchmark

NAME = "autocomplete"
GUILD = "bench"
BATCH = 10_000
# Above this size the set-per-prefix index is built for 1-3 letter prefixes only (the ones
# queried); its memory for longer prefixes is extrapolated from the largest full build.
FULL_PREFIX_INDEX_UP_TO = 100_000
# ZSCAN queries per repeat at 100,000 members and more (each is up to size/1000 round trips).
ZSCAN_QUERIES = 200
ZSCAN_QUERIES_QUICK = 100


def generate_names(size: int, generator: random.Random) -> list[str]:
    names: set[str] = set()
    while len(names) < size:
        names.add("".join(generator.choices(string.ascii_lowercase, k=generator.randint(5, 12))))
    return sorted(names)


def used_memory(client) -> int:
    return int(client.info("memory")["used_memory"])


def build(client, names: list[str], add: Callable[[object, list[str]], None]) -> float:
    """Run ``add(pipeline, chunk)`` over the names in batches; returns bytes per member."""
    before = used_memory(client)
    for start in range(0, len(names), BATCH):
        with client.pipeline(transaction=False) as pipe:
            add(pipe, names[start : start + BATCH])
            pipe.execute()
    return (used_memory(client) - before) / len(names)


def latencies(operation: Callable[[str], object], queries: list[str]) -> list[float]:
    samples = []
    for query in queries:
        started = time.perf_counter()
        operation(query)
        samples.append(time.perf_counter() - started)
    return samples


def run(bench: Bench) -> ScenarioResult:
    from django_rcoord.autocomplete import autocomplete_on_prefix, join_guild

    client = bench.client
    sizes = bench.pick(quick=[1000, 100_000], full=[1000, 100_000, 1_000_000])
    query_count = bench.pick(quick=200, full=1000)
    repeats = bench.repeats_or(3)
    zscan_queries = bench.pick(quick=ZSCAN_QUERIES_QUICK, full=ZSCAN_QUERIES)
    generator = random.Random(7)
    tables: list[Table] = []
    memory_rows: dict[str, Measurement] = {}
    long_prefix_bytes = None  # per member, from the largest full set-per-prefix build

    for size in sizes:
        client.flushdb()
        names = generate_names(size, generator)

        def rcoord_add(pipe, chunk: list[str]) -> None:
            for name in chunk:
                join_guild(GUILD, name, client=pipe)

        def book_add(pipe, chunk: list[str]) -> None:
            pipe.zadd("members:" + GUILD, dict.fromkeys(chunk, 0))

        def short_prefixes_add(pipe, chunk: list[str]) -> None:
            for name in chunk:
                book.add_to_prefix_index(pipe, GUILD, name, 1, 3)

        def long_prefixes_add(pipe, chunk: list[str]) -> None:
            for name in chunk:
                book.add_to_prefix_index(pipe, GUILD, name, 4)

        memory = {
            "django-rcoord (ZSET, folded + original)": build(client, names, rcoord_add),
            "book ZSET (also scanned by ZSCAN)": build(client, names, book_add),
        }
        short = build(client, names, short_prefixes_add)
        if size <= FULL_PREFIX_INDEX_UP_TO:
            long_prefix_bytes = build(client, names, long_prefixes_add)
            memory["SET per prefix"] = short + long_prefix_bytes
            prefix_note = ""
        else:
            memory["SET per prefix"] = short + (long_prefix_bytes or 0)
            prefix_note = (
                f"at {size:,}: prefixes of 1-3 letters built and measured ({short:.0f} B), "
                f"4+ letters estimated from the {FULL_PREFIX_INDEX_UP_TO:,} build "
                f"({long_prefix_bytes:.0f} B; an upper bound, longer prefixes share more "
                "as the guild grows); building them all would take about 9 SADDs per member"
            )
        for index_name, per_member in memory.items():
            row = memory_rows.setdefault(index_name, Measurement(index_name, "-", []))
            row.extra[f"{size:,}"] = round(per_member, 1)
            if index_name == "SET per prefix" and prefix_note:
                row.note = prefix_note

        queries = [
            "".join(generator.choices(string.ascii_lowercase, k=generator.randint(1, 3)))
            for _ in range(query_count)
        ]
        zscan_calls: list[int] = []

        def zscan(query: str, zscan_calls: list[int] = zscan_calls) -> None:
            zscan_calls.append(book.autocomplete_zscan(client, GUILD, query)[1])

        methods = [
            ("PING (the floor)", "1", lambda q: client.ping(), queries),
            (
                "django-rcoord (ZRANGE BYLEX)",
                "1",
                lambda q: autocomplete_on_prefix(GUILD, q, 10, client=client),
                queries,
            ),
            (
                "book (sentinels, WATCH)",
                "5",
                lambda q: book.autocomplete_on_prefix(client, GUILD, q),
                queries,
            ),
            (
                "ZSCAN MATCH, COUNT 1000",
                "",
                zscan,
                queries if size < 100_000 else queries[:zscan_queries],
            ),
            (
                "SET per prefix (SMEMBERS, sort)",
                "1",
                lambda q: book.autocomplete_prefix_sets(client, GUILD, q),
                queries,
            ),
        ]
        for _, _, operation, method_queries in methods:
            latencies(operation, method_queries[:30])  # warm up
        zscan_calls.clear()
        medians: list[list[float]] = [[] for _ in methods]
        p99s: list[list[float]] = [[] for _ in methods]
        for _ in range(repeats):
            # Interleaved: the methods take turns every TURN queries, so drift and a noisy
            # neighbour's bursts hit every method alike.
            samples: list[list[float]] = [[] for _ in methods]
            for start in range(0, len(queries), TURN):
                for index, (_, _, operation, method_queries) in enumerate(methods):
                    turn = method_queries[start : start + TURN]
                    samples[index].extend(latencies(operation, turn))
            for index, method_samples in enumerate(samples):
                medians[index].append(1000 * statistics.median(method_samples))
                p99s[index].append(1000 * percentile(method_samples, 0.99))
        rows = []
        for index, (name, trips, _, method_queries) in enumerate(methods):
            note, row_trips = "", trips
            if name.startswith("ZSCAN"):
                mean = statistics.mean(zscan_calls)
                row_trips = f"{min(zscan_calls)}-{max(zscan_calls)}, mean {mean:.0f}"
                note = "any 10 matches, not the first 10"
                if len(method_queries) < len(queries):
                    note += f"; {len(method_queries)} queries per repeat"
            row = Measurement(name, row_trips, medians[index], note=note)
            row.extra["p99 ms"] = statistics.median(p99s[index])
            rows.append(row)
        tables.append(
            Table(
                f"{size:,} members: query latency, {repeats} x {len(queries)} queries",
                "ms",
                rows,
                floor=rows[0].name,
                lower_is_better=True,
                extra_columns=("p99 ms",),
            )
        )
    client.flushdb()

    # Memory is measured once per size (it does not vary between repeats).
    for row in memory_rows.values():
        row.values = [row.extra[f"{sizes[-1]:,}"]]
    tables.append(
        Table(
            f"Memory per member (bytes; used_memory growth while building), chart at {sizes[-1]:,}",
            "bytes/member",
            list(memory_rows.values()),
            lower_is_better=True,
            extra_columns=[f"{size:,}" for size in sizes],
            note="measured once: memory does not vary between repeats",
        )
    )
    return ScenarioResult(
        NAME,
        "Autocomplete",
        tables,
        params={"sizes": sizes, "queries": query_count, "zscan_queries_large": zscan_queries},
        repeats=repeats,
    )


if __name__ == "__main__":
    run_benchmark(NAME, __doc__.splitlines()[0])
