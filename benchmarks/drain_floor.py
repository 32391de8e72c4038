"""The least a leased take and a recorded finish can cost the server: what the queue-core
issue's drain target (5x the pipelined ``LPOP``) asks of any layout.

    python -m benchmarks.drain_floor [--tasks N] [--batches 32,100,256]

Not django-rcoord's scripts: two minimal scripts that keep only what at-least-once with
results needs, run on one server beside the issue's floor, in the same run, with the
server and this process pinned to one CPU (``pinning``). The take pops a batch from a
ready ZSET, reads the batch's messages (``HMGET``) and leases them (one ``ZADD`` to an
in-flight ZSET); the finish drops the leases (``ZREM``), reads the messages, writes each
task's record as a HASH of its own with an expiry (``HSET`` + ``PEXPIRE``, the layout
every server from Redis 6.2 runs) and drops the messages (``HDEL``). It is run with those
records, with each record a field of one HASH with an expiry of its own (one ``HSETEX``
a batch, where the server has it: Redis 8.0+, Valkey 9.0+), and without records, at each
batch size, against ``LPOP`` pipelined 100 at a time (``server_cost``'s floor). No
metrics, states, owners, priorities beyond the ZSET's order, retries, unique claims or
idempotent retries of a call: the real drain does all of those, so it costs more than the
row with records. The server's CPU is read around each run as ``server_cost`` reads it.
Nothing is saved: it prints one line per row, in us per task and x the floor.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import redis

from benchmarks import server_cost_lists
from benchmarks.common import bench_redis, stop_redis
from benchmarks.pinning import pinned
from benchmarks.server_cost import per_task_us

#: Take up to ARGV[1] tasks: out of ready (KEYS[1]), their messages (KEYS[2]) read,
#: leased in the in-flight ZSET (KEYS[3]) until ARGV[2].
TAKE = """
local popped = redis.call('ZPOPMIN', KEYS[1], ARGV[1])
local ids, leases = {}, {}
for index = 1, #popped, 2 do
    ids[#ids + 1] = popped[index]
    leases[#leases + 1] = ARGV[2]
    leases[#leases + 1] = popped[index]
end
if #ids == 0 then
    return {}
end
local messages = redis.call('HMGET', KEYS[2], unpack(ids))
redis.call('ZADD', KEYS[3], unpack(leases))
return ids
"""
#: Finish the tasks ARGV: out of flight (KEYS[1]); each one's record (KEYS[3] .. id) written
#: with its message (KEYS[2]) and an expiry; the messages dropped.
FINISH = """
redis.call('ZREM', KEYS[1], unpack(ARGV))
local messages = redis.call('HMGET', KEYS[2], unpack(ARGV))
for index, id in ipairs(ARGV) do
    redis.call('HSET', KEYS[3] .. id, 's', 'SUCCESSFUL|1|2|3|w', 'v', 'null', 'm', messages[index])
    redis.call('PEXPIRE', KEYS[3] .. id, 86400000)
end
redis.call('HDEL', KEYS[2], unpack(ARGV))
return #ARGV
"""
#: The same, each record one field of one HASH (KEYS[3] .. 'all') with an expiry of its own:
#: one HSETEX for the batch (Redis 8.0+, Valkey 9.0+).
FIELD_RECORDS = """
redis.call('ZREM', KEYS[1], unpack(ARGV))
local messages = redis.call('HMGET', KEYS[2], unpack(ARGV))
local fields = {}
for index, id in ipairs(ARGV) do
    fields[#fields + 1] = id
    fields[#fields + 1] = 'SUCCESSFUL|1|2|3|w|null|' .. messages[index]
end
redis.call('HSETEX', KEYS[3] .. 'all', 'PX', 86400000, 'FIELDS', #ARGV, unpack(fields))
redis.call('HDEL', KEYS[2], unpack(ARGV))
return #ARGV
"""
WITHOUT_RECORDS = FINISH.replace(
    FINISH[FINISH.index("for index, id") : FINISH.index("redis.call('HDEL'")], ""
)
MESSAGE = (
    b'{"id":"0123456789abcdef0123456789abcdef","task":"bench.noop","queue":"cost",'
    b'"args":[],"kwargs":{},"enqueued_at":1764412345.123}'
)
KEYS = {"ready": "{floor}:ready", "messages": "{floor}:messages", "in_flight": "{floor}:in-flight"}


def fill(client: Any, count: int) -> None:
    """``count`` tasks ready, their messages stored (pipelined: not measured)."""
    client.flushdb()
    for start in range(0, count, 1000):
        with client.pipeline(transaction=False) as pipe:
            for number in range(start, min(count, start + 1000)):
                task_id = f"{number:010d}"
                pipe.hset(KEYS["messages"], task_id, MESSAGE)
                pipe.zadd(KEYS["ready"], {task_id: number})
            pipe.execute()


def drain(client: Any, count: int, batch: int, finish: Any) -> float:
    take = client.register_script(TAKE)
    fill(client, count)

    def work() -> None:
        while ids := take(
            keys=[KEYS["ready"], KEYS["messages"], KEYS["in_flight"]], args=[batch, 1]
        ):
            finish(keys=[KEYS["in_flight"], KEYS["messages"], "{floor}:r:"], args=ids)

    return per_task_us(client, count, work).cpu


def floor(client: Any, count: int) -> float:
    """``LPOP`` pipelined 100 at a time (the queue-core issue's drain floor, as
    ``server_cost`` measures it)."""
    put, take = server_cost_lists.patterns(client, count)["floor"]
    client.flushdb()
    put()
    return per_task_us(client, count, take).cpu


def measure(client: Any, count: int, batches: list[int], rounds: int) -> dict[str, list[float]]:
    """Each row's us per task, each round measuring every row once, in turn."""
    finishes = {
        "with records": client.register_script(FINISH),
        "records as fields (HSETEX)": client.register_script(FIELD_RECORDS),
        "without records": client.register_script(WITHOUT_RECORDS),
    }
    if not _has_hsetex(client):
        del finishes["records as fields (HSETEX)"]
    rows: dict[str, list[float]] = {"LPOP, pipelined 100 at a time (the floor)": []}
    for _ in range(rounds):
        rows["LPOP, pipelined 100 at a time (the floor)"].append(floor(client, count))
        for batch in batches:
            for name, finish in finishes.items():
                row = f"take + finish, batches of {batch}, {name}"
                rows.setdefault(row, []).append(drain(client, count, batch, finish))
    return rows


def _has_hsetex(client: Any) -> bool:
    """Whether the server knows ``HSETEX`` (tried on a key of the benchmark's own)."""
    try:
        client.execute_command("HSETEX", "{floor}:probe", "PX", 1000, "FIELDS", 1, "f", "v")
    except redis.ResponseError:
        return False
    return True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--batches", default="32,100,256")
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args(argv)
    server = bench_redis()
    try:
        server.start()
        client = server.client()
        with pinned(client) as where:
            rows = measure(client, options.tasks, [int(b) for b in options.batches.split(",")],
                           options.rounds)  # fmt: skip
        print(f"{options.tasks:,} tasks, medians of {options.rounds}, {where}")
        base = statistics.median(next(iter(rows.values())))
        for name, values in rows.items():
            value = statistics.median(values)
            print(f"{name:<58} {value:7.2f} us per task  {value / base:5.1f}x the floor")
    finally:
        stop_redis(server)


if __name__ == "__main__":
    main()
