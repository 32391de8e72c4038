"""Redis in Action's chapter 6 algorithms, written from the book's description, as baselines.

Kept as close to the book as Python 3 and redis-py allow; where they differ it is said.
"""

from __future__ import annotations

import bisect
import json
import math
import time
import uuid

import redis


def acquire_lock_with_timeout(
    conn: redis.Redis, lockname: str, acquire_timeout: float = 10, lock_timeout: float = 10
) -> str | None:
    """6.2.5: SETNX in a loop with a 1 ms sleep, then EXPIRE (two round trips when free)."""
    identifier = str(uuid.uuid4())
    lockname = "lock:" + lockname
    lock_timeout = int(math.ceil(lock_timeout))
    end = time.time() + acquire_timeout
    while time.time() < end:
        if conn.setnx(lockname, identifier):
            conn.expire(lockname, lock_timeout)
            return identifier
        elif conn.ttl(lockname) < 0:  # the book's repair of a lock left without TTL
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


def poll_queue_once(conn: redis.Redis) -> bool:
    """One turn of 6.4.2's poll_queue loop: move the first due item, under a lock on it.

    The book loops forever and sleeps 10 ms when nothing is due; here a turn
    returns False instead of sleeping so the benchmark can stop.
    """
    item = conn.zrange("delayed:", 0, 0, withscores=True)
    if not item or item[0][1] > time.time():
        return False
    item = item[0][0]
    identifier, queue, function, args = json.loads(item)
    locked = acquire_lock(conn, identifier)
    if not locked:
        return True
    if conn.zrem("delayed:", item):
        conn.rpush("queue:" + queue, item)
    release_lock(conn, identifier, locked)
    return True


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
                sindex = pipe.zrank(zset_name, start)
                eindex = pipe.zrank(zset_name, end)
                erange = min(sindex + 9, eindex - 2)
                pipe.multi()
                pipe.zrem(zset_name, start, end)
                pipe.zrange(zset_name, sindex, erange)
                items = pipe.execute()[-1]
                break
            except redis.exceptions.WatchError:
                continue
    return [item.decode() for item in items if b"{" not in item]
