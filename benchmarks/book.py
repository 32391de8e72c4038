"""Redis in Action's chapter 6 algorithms, written from the book's description, as baselines.

Kept as close to the book as Python 3 and redis-py allow; where they differ it is said.
"""

from __future__ import annotations

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
