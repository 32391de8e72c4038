"""What the tasks in flight cost the server in a listpack and in the large encodings.

    python -m benchmarks.encodings [--batches B]

A worker's take and finish of 32 tasks touch two small keys per task: the queue's
in-flight ZSET (``ZADD`` the leases, ``ZMSCORE`` and ``ZREM`` them) and the group's
owners HASH (``HSET``, ``HMGET``, ``HDEL``). Redis keeps a ZSET or a HASH of short members
in a listpack up to ``zset-max-listpack-entries`` (128 by default) and
``hash-max-listpack-entries`` (128 or 512, as the server was built or configured), and
each lookup in a listpack is a scan. This runs those six commands for a batch of 32 tasks
on keys already holding the other tasks in flight (0 to 448 of them: what 1 to 15 workers
of 32 each hold), with the keys in their default encoding and
with one member longer than 64 bytes beside them (what ``_take.lua`` keeps there: a
skiplist and a hashtable), and prints what the server spent per task (``INFO
commandstats``, pipelined, ``B`` batches). Nothing is saved.
"""

from __future__ import annotations

import argparse
import uuid

from benchmarks.common import bench_redis, stop_redis

BATCH = 32
LONG_MEMBER = "~" * 80
COMMANDS = ("zadd", "zmscore", "zrem", "hset", "hmget", "hdel")


def cost_per_task(client, others: int, large: bool, batches: int) -> tuple[str, float]:
    """(the keys' encodings, the server's us per task) for a batch of ``BATCH`` beside
    ``others`` tasks in flight."""
    client.flushall()
    in_flight, owners = "bench:in-flight", "bench:owners"
    held = [uuid.uuid4().hex for _ in range(others)]
    batch = [uuid.uuid4().hex for _ in range(BATCH)]
    if held:
        client.zadd(in_flight, dict.fromkeys(held, 1.0))
        client.hset(owners, mapping=dict.fromkeys(held, "worker-1"))
    if large:
        client.zadd(in_flight, {LONG_MEMBER: float("inf")})
        client.hset(owners, LONG_MEMBER, "")
    client.config_resetstat()
    for _ in range(batches):
        with client.pipeline(transaction=False) as pipe:
            pipe.zadd(in_flight, dict.fromkeys(batch, 2.0))
            pipe.hset(owners, mapping=dict.fromkeys(batch, "worker-1"))
            pipe.zmscore(in_flight, batch)
            pipe.hmget(owners, batch)
            pipe.zrem(in_flight, *batch)
            pipe.hdel(owners, *batch)
            pipe.execute()
    encodings = "/".join(
        (client.object("encoding", key) or b"-").decode() for key in (in_flight, owners)
    )
    stats = client.info("commandstats")
    spent = sum(float(stats[f"cmdstat_{name}"]["usec"]) for name in COMMANDS)
    return encodings, spent / (batches * BATCH)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--batches", type=int, default=300)
    options = parser.parse_args(argv)
    server = bench_redis()
    try:
        server.start()
        client = server.client()
        limits = client.config_get("*-max-*-entries")
        shown = ", ".join(
            f"{k} {v}" for k, v in sorted(limits.items()) if str(k)[:4] in ("hash", "zset")
        )
        print(f"server us per task for the six commands ({options.batches} batches of {BATCH})")
        print(f"this server: {shown}")
        for others in (0, 32, 64, 96, 224, 448):
            default_encoding, default_us = cost_per_task(client, others, False, options.batches)
            large_encoding, large_us = cost_per_task(client, others, True, options.batches)
            print(
                f"{others:>4} others in flight: {default_encoding:>19} {default_us:5.2f}   "
                f"{large_encoding:>18} {large_us:5.2f}   ratio {large_us / default_us:.2f}"
            )
    finally:
        stop_redis(server)


if __name__ == "__main__":
    main()
