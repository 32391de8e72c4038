"""Redis in Action's chapter 6 algorithms, written from the book's description, as baselines.

Kept as close to the book as Python 3 and redis-py allow; where they differ it is said.
"""

from __future__ import annotations

import bisect
import json
import math
import time
import uuid
from typing import cast

import redis


def acquire_lock_with_timeout(
    conn: redis.Redis, lockname: str, acquire_timeout: float = 10, lock_timeout: float = 10
) -> str | None:
    """6.2.5: SETNX in a loop with a 1 ms sleep, then EXPIRE (two round trips when free)."""
    identifier = str(uuid.uuid4())
    lockname = "lock:" + lockname
    lock_timeout = math.ceil(lock_timeout)
    end = time.time() + acquire_timeout
    while time.time() < end:
        if conn.setnx(lockname, identifier):
            conn.expire(lockname, lock_timeout)
            return identifier
        if conn.ttl(lockname) < 0:  # the book's repair of a lock left without TTL
            conn.expire(lockname, lock_timeout)
        time.sleep(0.001)
    return None


def release_lock(conn: redis.Redis, lockname: str, identifier: str) -> bool:
    """6.2.3: WATCH, GET, compare, MULTI/DEL/EXEC (three round trips).

    The book compares the GET result with the identifier; redis-py returns
    bytes, so the identifier is encoded first.
    """
    lockname = "lock:" + lockname
    with conn.pipeline(True) as pipe:
        while True:
            try:
                pipe.watch(lockname)
                if pipe.get(lockname) == identifier.encode():
                    pipe.multi()
                    pipe.delete(lockname)
                    pipe.execute()
                    return True
                pipe.unwatch()
                break
            except redis.exceptions.WatchError:
                pass
    return False


def acquire_lock(conn: redis.Redis, lockname: str, acquire_timeout: float = 10) -> str | None:
    """6.2.3: SETNX in a loop with a 1 ms sleep, no TTL (the book's first lock)."""
    identifier = str(uuid.uuid4())
    end = time.time() + acquire_timeout
    while time.time() < end:
        if conn.setnx("lock:" + lockname, identifier):
            return identifier
        time.sleep(0.001)
    return None


def acquire_semaphore(conn: redis.Redis, semname: str, limit: int, timeout: float = 10):
    """6.3.1: the counting semaphore (client clock; two round trips when it fails)."""
    identifier = str(uuid.uuid4())
    now = time.time()
    pipeline = conn.pipeline(True)
    pipeline.zremrangebyscore(semname, "-inf", now - timeout)
    pipeline.zadd(semname, {identifier: now})
    pipeline.zrank(semname, identifier)
    if pipeline.execute()[-1] < limit:
        return identifier
    conn.zrem(semname, identifier)
    return None


def release_semaphore(conn: redis.Redis, semname: str, identifier: str) -> bool:
    return bool(conn.zrem(semname, identifier))


def acquire_fair_semaphore(conn: redis.Redis, semname: str, limit: int, timeout: float = 10):
    """6.3.2: the fair semaphore: two MULTI/EXEC round trips (three when it fails),
    one of them an O(N) ZINTERSTORE; fair only if client clocks agree."""
    identifier = str(uuid.uuid4())
    czset = semname + ":owner"
    ctr = semname + ":counter"
    now = time.time()
    pipeline = conn.pipeline(True)
    pipeline.zremrangebyscore(semname, "-inf", now - timeout)
    pipeline.zinterstore(czset, {czset: 1, semname: 0})
    pipeline.incr(ctr)
    counter = pipeline.execute()[-1]
    pipeline.zadd(semname, {identifier: now})
    pipeline.zadd(czset, {identifier: counter})
    pipeline.zrank(czset, identifier)
    if pipeline.execute()[-1] < limit:
        return identifier
    pipeline.zrem(semname, identifier)
    pipeline.zrem(czset, identifier)
    pipeline.execute()
    return None


def release_fair_semaphore(conn: redis.Redis, semname: str, identifier: str) -> bool:
    """6.3.2: ZREM from both sets in one MULTI/EXEC."""
    pipeline = conn.pipeline(True)
    pipeline.zrem(semname, identifier)
    pipeline.zrem(semname + ":owner", identifier)
    return bool(pipeline.execute()[0])


def acquire_semaphore_with_lock(conn: redis.Redis, semname: str, limit: int, timeout: float = 10):
    """6.3.5: the fair semaphore taken under the book's lock (to close its race)."""
    identifier = acquire_lock(conn, semname, acquire_timeout=0.01)
    if identifier:
        try:
            return acquire_fair_semaphore(conn, semname, limit, timeout)
        finally:
            release_lock(conn, semname, identifier)
    return None


def execute_later(conn: redis.Redis, queue: str, name: str, args, delay: float = 0) -> str:
    """6.4.2: a delayed item is a JSON list scored by its due time (client clock)."""
    identifier = str(uuid.uuid4())
    item = json.dumps([identifier, queue, name, args])
    if delay > 0:
        conn.zadd("delayed:", {item: time.time() + delay})
    else:
        conn.rpush("queue:" + queue, item)
    return identifier


def poll_queue_once(conn: redis.Redis, on_moved=None) -> bool:
    """One turn of 6.4.2's poll_queue loop: move the first due item, under a lock on it.

    Returns False when nothing is due (where the book sleeps 10 ms). ``on_moved(item,
    due)`` is the benchmark's hook to time a promotion; the book has none.
    """
    # (redis-py types a reply for every client set-up, bytes or str, pipelined or not;
    # the casts here give the one these functions see: a bytes client, no pipeline.)
    first = cast("list[tuple[bytes, float]]", conn.zrange("delayed:", 0, 0, withscores=True))
    if not first or first[0][1] > time.time():
        return False
    item, due = first[0]
    identifier, queue, _function, _args = json.loads(item)
    locked = acquire_lock(conn, identifier)
    if not locked:
        return True
    if conn.zrem("delayed:", item):
        conn.rpush("queue:" + queue, item)
        if on_moved is not None:
            on_moved(item, due)
    release_lock(conn, identifier, locked)
    return True


def poll_queue(conn: redis.Redis, stop, on_moved=None) -> None:
    """6.4.2's poll_queue: loop until ``stop`` (a threading.Event; the book loops until
    QUIT), sleeping 10 ms whenever nothing is due."""
    while not stop.is_set():
        if not poll_queue_once(conn, on_moved):
            time.sleep(0.01)


VALID_CHARACTERS = "`abcdefghijklmnopqrstuvwxyz{"


def find_prefix_range(prefix: str) -> tuple[str, str]:
    """6.1.2: the names just before and after every name starting with ``prefix`` (a-z only)."""
    posn = bisect.bisect_left(VALID_CHARACTERS, prefix[-1:])
    suffix = VALID_CHARACTERS[(posn or 1) - 1]
    return prefix[:-1] + suffix + "{", prefix + "{"


def autocomplete_on_prefix(conn: redis.Redis, guild: str, prefix: str) -> list[str]:
    """6.1.2: add two sentinel members, WATCH, find their ranks, then MULTI/ZREM/ZRANGE/EXEC.

    Up to 10 results; retried on WATCH conflicts, as in the book.
    """
    start, end = find_prefix_range(prefix)
    identifier = str(uuid.uuid4())
    start += identifier
    end += identifier
    zset_name = "members:" + guild
    conn.zadd(zset_name, {start: 0, end: 0})
    with conn.pipeline(True) as pipe:
        while True:
            try:
                pipe.watch(zset_name)
                sindex = cast(int, pipe.zrank(zset_name, start))  # WATCHing: run at once
                eindex = cast(int, pipe.zrank(zset_name, end))
                erange = min(sindex + 9, eindex - 2)
                pipe.multi()
                pipe.zrem(zset_name, start, end)
                pipe.zrange(zset_name, sindex, erange)
                items = pipe.execute()[-1]
                break
            except redis.exceptions.WatchError:
                continue
    return [item.decode() for item in items if b"{" not in item]


# -- Two other prefix indexes, from the description beside the book's ----------------------
# Neither is in Redis in Action; both are described in the project's notes as the
# usual alternatives. Written from that description, on the same a-z names.


def autocomplete_zscan(
    conn: redis.Redis, guild: str, prefix: str, limit: int = 10, count: int = 1000
) -> tuple[list[str], int]:
    """ZSCAN the book's members ZSET with MATCH ``prefix*`` until ``limit`` names are found
    or the cursor comes back to 0. Returns (names, ZSCAN round trips).

    The description asks for COUNT 5; at a million members that would be up to
    200,000 round trips per query, so COUNT is 1000 here. Also, ZSCAN returns
    matches in hash order: these are *some* ``limit`` names with the prefix, not
    the first ``limit`` in order (finding those needs a full scan), which
    flatters this method.
    """
    zset_name = "members:" + guild
    pattern = prefix.replace("\\", "\\\\").replace("*", "\\*").replace("?", "\\?") + "*"
    found: list[str] = []
    cursor, calls = 0, 0
    while True:
        cursor, items = cast(
            "tuple[int, list[tuple[bytes, float]]]",
            conn.zscan(zset_name, cursor, match=pattern, count=count),
        )
        calls += 1
        found.extend(member.decode() for member, _ in items)
        if len(found) >= limit or cursor == 0:
            return found[:limit], calls


def prefix_set_key(guild: str, prefix: str) -> str:
    return f"prefixes:{guild}:{prefix}"


def add_to_prefix_index(
    conn: redis.Redis, guild: str, name: str, shortest: int = 1, longest: int | None = None
) -> None:
    """The set-per-prefix index: SADD ``name`` to one SET per prefix of it.

    ``shortest``/``longest`` limit which prefix lengths are written (the benchmark
    builds the long prefixes separately to measure their memory; a real index
    writes them all). One SADD per prefix: about nine per name of 5-12 letters.
    """
    for length in range(shortest, min(len(name), longest or len(name)) + 1):
        conn.sadd(prefix_set_key(guild, name[:length]), name)


def autocomplete_prefix_sets(conn: redis.Redis, guild: str, prefix: str, limit: int = 10):
    """One SMEMBERS of the prefix's SET, then sort and cut client side (the same
    answer as the sorted-set indexes: the first ``limit`` names in order).

    The whole set crosses the network: at a million members a one-letter prefix
    has about 38,000 of them.
    """
    members = cast("set[bytes]", conn.smembers(prefix_set_key(guild, prefix)))
    return sorted(member.decode() for member in members)[:limit]
