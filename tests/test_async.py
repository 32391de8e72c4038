"""Async under load: many waiters on one event loop, no thread per waiter, nothing lost.

Every test here runs the async API on redis.asyncio with the loop's default
executor cut to two threads (or refusing work altogether): a path that handed
Redis work to a thread pool would convoy or fail.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import itertools
import logging
import socket
import threading
import time
import weakref
from typing import Any

import pytest
import redis.asyncio
import redis.client
import redis.cluster
import redis.exceptions
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import AsyncClient, override_settings

from django_rcoord import ratelimit
from django_rcoord.autocomplete import (
    aadd_update_contact,
    aautocomplete_on_prefix,
    afetch_autocomplete_list,
    ais_guild_member,
    ajoin_guild,
    aleave_guild,
)
from django_rcoord.connection import get_async_client, get_client
from django_rcoord.connection.loops import loop_clients
from django_rcoord.keys import KeySpace
from django_rcoord.locks import Lock, protocol
from django_rcoord.queues import aexecute_later, queue_stats
from django_rcoord.queues.worker import Worker
from django_rcoord.semaphores import Semaphore
from django_rcoord.waiting import SignalHub, signal_hub
from tests import cluster, tasks, views
from tests.procs import await_until
from tests.test_queues import output_of, ran, start_worker

MIDDLEWARE = "django_rcoord.middleware.ConcurrencyLimitMiddleware"


class RefusingExecutor(concurrent.futures.ThreadPoolExecutor):
    """A default executor that fails every submit but asyncio's own address lookups (it
    resolves host names in the executor when a TCP connection opens): proves no Redis
    work went to a thread."""

    def submit(self, function, *args, **kwargs):  # type: ignore[override]
        if function is socket.getaddrinfo:
            return super().submit(function, *args, **kwargs)
        raise AssertionError(f"work was handed to the default executor: {function}")


def cut_default_executor(threads: int = 2) -> None:
    """Cut the running loop's default executor to ``threads`` threads."""
    asyncio.get_running_loop().set_default_executor(concurrent.futures.ThreadPoolExecutor(threads))


class StallWatch:
    """Ticks every 10 ms on the loop and keeps the longest gap between ticks during which
    the process itself ran: a thread beside the loop ticks too, and a gap counts only where
    that thread ticked through it. A call that blocks the loop waiting (a socket read,
    a lock, a sleep: what a sync Redis call on the loop would do) lets the thread run, so
    it counts; a whole process stalled by a busy
    machine stops both (that time is taken off), and says nothing about the code under
    test.

    It starts with a full garbage collection: the garbage earlier tests left in
    this process would otherwise make a collection of the whole heap (over 0.1 s
    here) fall into the window, which says nothing about the code under test either.
    Start it before counting threads: its thread ends in ``stop``.
    """

    def __init__(self) -> None:
        gc.collect()
        self.longest = 0.0
        self._beside: list[float] = []
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._tick_beside, name="stall-watch")
        self._thread.start()
        self._task = asyncio.get_running_loop().create_task(self._run())

    def _tick_beside(self) -> None:
        while not self._stopped.wait(0.005):
            self._beside.append(time.monotonic())

    async def _run(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gap = now - last - 0.01
            if gap > self.longest:
                # Less the longest time the thread beside did not tick (the process stood).
                points = [last, *(tick for tick in self._beside[-1000:] if last < tick < now), now]
                stood = max(b - a for a, b in itertools.pairwise(points))
                self.longest = max(self.longest, gap - max(0.0, stood - 0.02))
            last = now

    def stop(self) -> float:
        self._task.cancel()
        self._stopped.set()
        self._thread.join(5)
        return self.longest


@pytest.fixture
def sync_calls_on_the_loop(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The sync Redis commands and pipelines sent from a thread that runs an event loop (each
    blocks the loop for a round trip at least, a BLPOP for up to a second), by name, in
    order: what StallWatch can only see when it blocks long, seen every time."""
    seen: list[str] = []

    def watched(original: Any, kind: str) -> Any:
        def execute(self: Any, *args: Any, **options: Any) -> Any:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                pass
            else:
                seen.append(str(args[0]) if args else kind)
            return original(self, *args, **options)

        return execute

    for owner, name, kind in (
        (redis.Redis, "execute_command", "command"),
        (redis.client.Pipeline, "execute", "pipeline"),
        (redis.cluster.RedisCluster, "execute_command", "command"),
        (redis.cluster.ClusterPipeline, "execute", "pipeline"),
    ):
        monkeypatch.setattr(owner, name, watched(getattr(owner, name), kind))
    return seen


def hub_waiting(key: str) -> int:
    """How many tasks of this loop wait on ``key`` through its signal hub."""
    hub = loop_clients().hub
    return 0 if hub is None else hub.waiting(key)


def server_connections() -> int:
    return cluster.connections(get_client())


def command_pool_size() -> int:
    commands = loop_clients().commands
    pool = getattr(commands, "connection_pool", None)
    if pool is not None:
        return pool.max_connections
    return sum(node.max_connections for node in commands.get_nodes())  # Redis Cluster


# -- locks and semaphores: 200 waiters, one loop ----------------------------------------
async def test_two_hundred_tasks_hand_one_lock_over(sync_calls_on_the_loop: list[str]) -> None:
    cut_default_executor(2)
    lock = Lock("hot", timeout=5, wait=60)
    inside = most = 0
    tokens: list[int] = []
    watch = StallWatch()
    threads_before = threading.active_count()
    threads_seen = threads_before
    connections_before = server_connections()
    sync_calls_before = len(sync_calls_on_the_loop)

    async def use() -> None:
        nonlocal inside, most, threads_seen
        async with lock:
            inside += 1
            most = max(most, inside)
            assert lock.token is not None
            tokens.append(lock.token)
            threads_seen = max(threads_seen, threading.active_count())
            await asyncio.sleep(0.002)
            inside -= 1

    await asyncio.wait_for(asyncio.gather(*(use() for _ in range(200))), timeout=30)
    blocking = sync_calls_on_the_loop[sync_calls_before:]
    connections_during = server_connections()
    stall = watch.stop()
    assert blocking == []  # not one sync Redis call on the loop
    assert len(tokens) == 200  # none lost: every waiter got the lock, none timed out
    assert most == 1  # no two inside at once
    assert tokens == sorted(tokens)  # fencing tokens increase
    assert len(set(tokens)) == 200
    # The loop was never blocked for long (a whole-process stall is taken off; a process
    # given only part of a core still stretches the loop's own work, hence the room).
    assert stall < 0.8
    assert threads_seen == threads_before  # no thread per waiter (the watch's counted)
    # Bounded: the command pool's size (the first 200 attempts run at once) plus the one
    # blocking connection all waiters share.
    assert connections_during - connections_before <= command_pool_size() + 1


async def test_two_hundred_tasks_share_a_semaphore_of_three(
    sync_calls_on_the_loop: list[str],
) -> None:
    cut_default_executor(2)
    semaphore = Semaphore("hot", 3, timeout=5, wait=60)
    inside = most = done = 0
    watch = StallWatch()
    threads_before = threading.active_count()

    async def use() -> None:
        nonlocal inside, most, done
        async with semaphore:
            inside += 1
            most = max(most, inside)
            await asyncio.sleep(0.002)
            inside -= 1
            done += 1

    await asyncio.wait_for(asyncio.gather(*(use() for _ in range(200))), timeout=60)
    threads_after = threading.active_count()
    stall = watch.stop()
    assert sync_calls_on_the_loop == []  # not one sync Redis call on the loop
    assert done == 200
    assert most <= 3
    assert most >= 2  # the permits were really shared
    assert stall < 0.8  # see the lock's test above
    assert threads_after == threads_before
    assert await semaphore.aholders() == 0


async def test_nothing_goes_to_the_default_executor() -> None:
    asyncio.get_running_loop().set_default_executor(RefusingExecutor(1))
    lock = Lock("no-threads", timeout=5, wait=5)
    semaphore = Semaphore("no-threads", 1, timeout=5, wait=5)

    async def both() -> None:
        async with lock:
            assert await lock.aowned()
            await lock.aextend(3)
        async with semaphore as permit:
            assert await semaphore.arefresh(permit)

    await asyncio.gather(*(both() for _ in range(20)))
    assert await ratelimit.aallow_once("sms:1", 60)
    assert not await ratelimit.aallow_once("sms:1", 60)
    assert [await ratelimit.aallow_n("dl:1", 2, 60) for _ in range(3)] == [True, True, False]
    await ratelimit.areset("dl:1")
    assert (await ratelimit.ahit("dl:1", 2, 60)).hits == 1
    await ajoin_guild("g", "Emil")
    await ajoin_guild("g", "emma")
    assert await aautocomplete_on_prefix("g", "EM") == ["Emil", "emma"]
    assert await ais_guild_member("g", "emma")
    await aleave_guild("g", "emma")
    assert not await ais_guild_member("g", "emma")
    await aadd_update_contact("ann", "bob")
    await aadd_update_contact("ann", "Bea")
    assert await afetch_autocomplete_list("ann", "b") == ["Bea", "bob"]
    task_id = await tasks.record.adelay("from-async")
    later_id = await tasks.record.aschedule("later", delay=60)
    other_id = await aexecute_later("default", tasks.record.name, ["raw"], delay=0)
    assert len({task_id, later_id, other_id}) == 3
    assert queue_stats("default") == {"ready": 2, "in_flight": 0, "delayed": 1, "dead": 0}


async def test_a_thousand_waiters_share_one_blocking_connection() -> None:
    lock = Lock("crowd", timeout=10, wait=60)
    holder_ready = asyncio.Event()
    release = asyncio.Event()
    connections_before = server_connections()

    async def hold() -> None:
        async with lock:
            holder_ready.set()
            await release.wait()

    holder = asyncio.create_task(hold())
    await holder_ready.wait()
    got = 0

    async def wait_for_it() -> None:
        nonlocal got
        async with lock:
            got += 1

    waiters = [asyncio.create_task(wait_for_it()) for _ in range(1000)]
    signal_key = KeySpace("lock", "crowd").key("signal")
    for _ in range(600):  # every waiter has asked once and is in line
        hub = loop_clients().hub
        if hub is not None and hub.waiting(signal_key) == 1000:
            break
        await asyncio.sleep(0.05)
    # 1,000 waiters, all blocked: at most one blocking connection for them all.
    assert hub.waiting(signal_key) == 1000
    assert hub.blocking <= 1
    assert server_connections() - connections_before <= command_pool_size() + 1
    release.set()
    await asyncio.wait_for(asyncio.gather(holder, *waiters), timeout=60)
    assert got == 1000


async def test_wait_counts_from_the_call_and_a_cancelled_waiter_leaves_the_line() -> None:
    semaphore = Semaphore("line", 1, timeout=10)
    held = await semaphore.aacquire()
    assert held is not None
    started = time.monotonic()
    assert await semaphore.aacquire(wait=0.3) is None
    assert 0.25 <= time.monotonic() - started < 5  # (not the 30 s of the next call)
    waiters_key = KeySpace("semaphore", "line").key("waiters")
    waiter = asyncio.create_task(semaphore.aacquire(wait=30))
    await await_until(lambda: get_async_client().zcard(waiters_key))  # until it is in line
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter

    async def nobody_in_line() -> bool:
        return not await get_async_client().zcard(waiters_key)

    await await_until(nobody_in_line)  # the background release of its place in line
    assert await semaphore.arelease(held)
    # Nobody is left in line ahead of a newcomer.
    assert await semaphore.aacquire() is not None


async def test_tasks_of_one_loop_are_handed_the_lock_in_arrival_order(monkeypatch) -> None:
    monkeypatch.setattr(protocol, "RECHECK", 30.0)  # the line stands while it forms
    holder = Lock("task-line", timeout=30, wait=0)
    assert await holder.aacquire()
    first_token = holder.token
    assert first_token is not None
    order: list[tuple[int, int | None]] = []

    async def wait_in_line(tag: int) -> None:
        lock = Lock("task-line", timeout=30, wait=30)
        async with lock:
            order.append((tag, lock.token))
            await asyncio.sleep(0.005)

    tasks = []
    signal_key = KeySpace("lock", "task-line").key("signal")
    for tag in range(5):
        tasks.append(asyncio.create_task(wait_in_line(tag)))
        # Each refused and in line before the next comes.
        await await_until(lambda: hub_waiting(signal_key) == tag + 1)  # noqa: B023
    await holder.arelease()
    # Handed over, never free: a newcomer is refused.
    assert await Lock("task-line", wait=0).aacquire() is False
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)
    assert order == [(tag, first_token + 1 + tag) for tag in range(5)]


async def test_a_hand_over_whose_waiter_left_is_not_lost() -> None:
    """The loop's shared BLPOP may take a hand-over after its waiter gave up: it is
    released (handed on, or left for the next attempt), never kept by nobody."""
    holder = Lock("left-line", timeout=30, wait=0)
    assert await holder.aacquire()
    token = holder.token
    assert token is not None
    assert await Lock("left-line", timeout=30, wait=0.2).aacquire() is False
    await holder.arelease()  # the hub's BLPOP (up to 1 s) is still blocked
    newcomer = Lock("left-line", timeout=30, wait=0)
    deadline = time.monotonic() + 10  # a lost hand-over would hold it for its 30 s TTL
    while not await newcomer.aacquire():
        assert time.monotonic() < deadline, "the hand-over was lost: the lock stays held"
        await asyncio.sleep(0.01)
    assert newcomer.token is not None
    assert newcomer.token > token
    await newcomer.arelease()


# -- clients passed as client= ------------------------------------------------------------
def own_async_client(redis_url: str, **options: object) -> redis.asyncio.Redis:
    """A redis.asyncio client of the caller's own, as a project passes one as client=
    (a blocking pool: past its connections, commands queue instead of failing)."""
    pool = redis.asyncio.BlockingConnectionPool.from_url(redis_url, max_connections=20, **options)
    return redis.asyncio.Redis.from_pool(pool)


async def wait_until_in_line(hubs: list[SignalHub], key: str, count: int) -> None:
    for _ in range(400):
        if sum(hub.waiting(key) for hub in hubs) == count:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{sum(hub.waiting(key) for hub in hubs)} of {count} waiters in line")


def warnings_of_waiting(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == "django_rcoord.waiting" and record.levelno >= logging.WARNING
    ]


@pytest.mark.skipif(cluster.ENABLED, reason="per-call clients of one Redis")
async def test_per_call_clients_that_waited_on_a_lock_are_collected(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    holder = Lock("per-call", timeout=30, wait=0)
    assert await holder.aacquire()
    signal_key = KeySpace("lock", "per-call").key("signal")
    collected: list[weakref.ref[redis.asyncio.Redis]] = []
    hubs: list[SignalHub] = []

    async def wait_with_own_client() -> None:
        client = own_async_client(redis_url)
        collected.append(weakref.ref(client))
        hubs.append(signal_hub(client))
        async with Lock("per-call", timeout=30, wait=30, client=client):
            pass
        await client.aclose()

    waiters = [asyncio.create_task(wait_with_own_client()) for _ in range(40)]
    # A real wait: every one was refused and is in its hub's line when the holder releases.
    await wait_until_in_line(hubs, signal_key, 40)
    hubs.clear()
    await holder.arelease()
    await asyncio.wait_for(asyncio.gather(*waiters), timeout=30)
    del waiters
    gc.collect()
    assert [ref() for ref in collected] == [None] * 40
    assert warnings_of_waiting(caplog) == []


@pytest.mark.skipif(cluster.ENABLED, reason="per-call clients of one Redis")
async def test_hundreds_of_waiters_on_one_per_call_client(redis_url: str) -> None:
    async def crowd() -> weakref.ref[redis.asyncio.Redis]:
        client = own_async_client(redis_url)
        lock = Lock("per-call-crowd", timeout=10, wait=60, client=client)
        holder_ready = asyncio.Event()
        release = asyncio.Event()
        got = 0

        async def hold() -> None:
            async with lock:
                holder_ready.set()
                await release.wait()

        async def wait_for_it() -> None:
            nonlocal got
            async with lock:
                got += 1

        holder = asyncio.create_task(hold())
        await holder_ready.wait()
        waiters = [asyncio.create_task(wait_for_it()) for _ in range(300)]
        signal_key = KeySpace("lock", "per-call-crowd").key("signal")
        await wait_until_in_line([signal_hub(client)], signal_key, 300)
        release.set()
        await asyncio.wait_for(asyncio.gather(holder, *waiters), timeout=60)
        assert got == 300
        await client.aclose()
        return weakref.ref(client)

    collected = await crowd()
    gc.collect()
    assert collected() is None


@pytest.mark.skipif(cluster.ENABLED, reason="per-call clients of one Redis")
async def test_a_waiter_whose_client_is_closed_asks_again_and_completes(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    holder = Lock("closed-under", timeout=30, wait=0)
    assert await holder.aacquire()
    client = own_async_client(redis_url)
    waiter = asyncio.create_task(
        Lock("closed-under", timeout=30, wait=30, client=client).aacquire()
    )
    await wait_until_in_line(
        [signal_hub(client)], KeySpace("lock", "closed-under").key("signal"), 1
    )
    await client.aclose()  # its hub's BLPOP fails: "Connection closed by server"
    await asyncio.sleep(0.3)
    await holder.arelease()
    assert await asyncio.wait_for(waiter, timeout=10) is True
    assert len(warnings_of_waiting(caplog)) <= 1
    await client.aclose()


@pytest.mark.skipif(cluster.ENABLED, reason="an ACL user of one Redis")
async def test_a_waiter_whose_wait_keeps_failing_gets_the_error_once(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A client that may not BLPOP (its every wait fails at once) used to wake its waiter
    to ask again, and wait again, in a loop until the deadline, logging each turn."""
    caplog.set_level(logging.DEBUG, logger="django_rcoord.waiting")
    admin = get_client()
    admin.acl_setuser(
        "no-blpop",
        enabled=True,
        passwords=["+secret"],
        keys=["*"],
        channels=["*"],
        commands=["+@all", "-blpop"],
    )
    holder = Lock("no-blpop", timeout=30, wait=0)
    assert await holder.aacquire()
    client = own_async_client(redis_url, username="no-blpop", password="secret")
    try:
        started = time.monotonic()
        with pytest.raises(redis.exceptions.NoPermissionError):
            await Lock("no-blpop", timeout=30, wait=10, client=client).aacquire()
        assert time.monotonic() - started < 5
        messages = [r.getMessage() for r in caplog.records if r.name == "django_rcoord.waiting"]
        assert 1 <= len(messages) <= 2, messages
        assert len(warnings_of_waiting(caplog)) == 1
    finally:
        await client.aclose()
        await holder.arelease()
        admin.acl_deluser("no-blpop")


# -- one Lock object shared by threads and tasks -------------------------------------------
SHARED = Lock("shared-invoice", timeout=10, wait=60)


async def test_a_module_level_lock_excludes_threads_and_tasks_alike() -> None:
    guard = threading.Lock()
    inside = most = entries = 0

    def enter() -> None:
        nonlocal inside, most, entries
        with guard:
            inside += 1
            entries += 1
            most = max(most, inside)

    def leave() -> None:
        nonlocal inside
        with guard:
            inside -= 1

    def thread_body() -> None:
        for _ in range(15):
            with SHARED:
                enter()
                time.sleep(0.001)
                leave()

    async def task_body() -> None:
        for _ in range(3):
            async with SHARED:
                enter()
                await asyncio.sleep(0.001)
                leave()

    threads = [threading.Thread(target=thread_body) for _ in range(4)]
    for thread in threads:
        thread.start()
    await asyncio.gather(*(task_body() for _ in range(40)))
    for thread in threads:
        await asyncio.get_running_loop().run_in_executor(None, thread.join)
    assert entries == 4 * 15 + 40 * 3
    assert most == 1


async def test_a_lock_is_not_reentrant_for_one_task() -> None:
    async with SHARED:
        with pytest.raises(Exception, match="not re-entrant"):
            await SHARED.aacquire()
        assert SHARED.token is not None

        async def other_task() -> bool:
            # Another task is another holder: it cannot take the lock while it is held.
            return await SHARED.aacquire(wait=0)

        assert await asyncio.create_task(other_task()) is False
    assert SHARED.token is None


# -- through Django's ASGI handler -----------------------------------------------------
@pytest.mark.parametrize("executor_threads", [None, 2])
async def test_a_hundred_requests_to_an_async_locked_view(executor_threads) -> None:
    if executor_threads:
        cut_default_executor(executor_threads)
    views.hot_occupancy.reset()
    client = AsyncClient()
    responses = await asyncio.wait_for(
        asyncio.gather(*(client.get("/hot/") for _ in range(100))), timeout=60
    )
    assert [response.status_code for response in responses] == [200] * 100
    assert views.hot_occupancy.entries == 100
    assert views.hot_occupancy.most == 1  # one at a time


@pytest.mark.parametrize("executor_threads", [None, 2])
async def test_a_hundred_requests_under_a_middleware_rule_with_wait(executor_threads) -> None:
    if executor_threads:
        cut_default_executor(executor_threads)
    views.busy_occupancy.reset()
    rule = {"name": "busy", "path": "^/limited/busy-async/", "limit": 2, "timeout": 10}
    with override_settings(
        MIDDLEWARE=[*settings.MIDDLEWARE, MIDDLEWARE],
        RCOORD={**settings.RCOORD, "CONCURRENCY_LIMITS": [{**rule, "wait": 60}]},
    ):
        client = AsyncClient()
        responses = await asyncio.wait_for(
            asyncio.gather(*(client.get("/limited/busy-async/") for _ in range(100))),
            timeout=60,
        )
    assert [response.status_code for response in responses] == [200] * 100
    assert views.busy_occupancy.entries == 100
    assert views.busy_occupancy.most == 2  # at most two at once, and both used


@pytest.mark.django_db(transaction=True)
async def test_async_views_with_a_user_key_serve_a_signed_in_user() -> None:
    user = await get_user_model().objects.acreate(username="ann")
    client = AsyncClient()
    await client.aforce_login(user)
    response = await client.get("/profile-async/")
    assert response.status_code == 200
    assert response.json()["user"] == "ann"
    assert [(await client.get("/download-async/")).status_code for _ in range(3)] == [
        200,
        200,
        429,
    ]
    # The counter is the user's own.
    assert get_client().exists(ratelimit_key(f"download:{user.pk}"))


def ratelimit_key(name: str) -> str:
    from django_rcoord.keys import KeySpace

    return KeySpace("ratelimit", name).key("window")


@pytest.mark.django_db(transaction=True)
async def test_user_scoped_middleware_rule_on_the_async_path() -> None:
    user = await get_user_model().objects.acreate(username="bea")
    rule = {"name": "per-user", "path": "^/limited/busy-async/", "limit": 1, "timeout": 10}
    with override_settings(
        MIDDLEWARE=[*settings.MIDDLEWARE, MIDDLEWARE],
        RCOORD={**settings.RCOORD, "CONCURRENCY_LIMITS": [{**rule, "scope": "user"}]},
    ):
        client = AsyncClient()
        await client.aforce_login(user)
        semaphore = Semaphore(f"per-user:user:{user.pk}", 1, timeout=10)
        held = await semaphore.aacquire()
        assert held is not None
        assert (await client.get("/limited/busy-async/")).status_code == 503
        await semaphore.arelease(held)
        assert (await client.get("/limited/busy-async/")).status_code == 200


# -- async tasks ---------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_an_async_task_runs_in_a_worker_and_its_effect_is_seen() -> None:
    for index in range(5):
        tasks.record_async.delay(f"a{index}")
    assert Worker(["default"], burst=True).run() == 5
    assert sorted(ran()) == [f"a{index}" for index in range(5)]
    assert queue_stats("default") == {"ready": 0, "in_flight": 0, "delayed": 0, "dead": 0}


@pytest.mark.django_db(transaction=True)
def test_an_async_task_runs_in_a_worker_process() -> None:
    tasks.record_async.delay("from-a-process")
    worker = start_worker("--burst")
    output = output_of(worker, 60)
    assert worker.returncode == 0, output
    assert ran() == ["from-a-process"]
    assert "never awaited" not in output
