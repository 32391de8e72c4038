"""A lock is live as well as safe: a grant nobody confirms ends with its lease, a waiter asks
again within ``protocol.RECHECK``, a retried call answers the grant it already got, and no key
of a lock stays without a TTL. Each case here left a live waiter without the lock for the
holder's whole timeout before (issue "The seams")."""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest
import redis
from redis.backoff import ConstantBackoff
from redis.retry import Retry

from django_rcoord.connection import get_client
from django_rcoord.embedded import EmbeddedRedis, free_port
from django_rcoord.locks import Lock, lock_status, new_identifier, protocol
from django_rcoord.scripts import run_script
from tests import cluster
from tests.procs import server_now, start_process, wait_until
from tests.test_locks import (
    blocked_clients,
    blocked_count_is,
    lock_key,
    patient_client,
    waiter_asks,
)

#: The holder's TTL in these tests: a stranded lock shows as a wait of this long.
TIMEOUT = 30
#: What a live waiter may take after a release before a test calls the lock stranded. The
#: bound by design is GRANT_LEASE + RECHECK (2 s); 8 s more is slack for a busy or paused
#: machine (the waiter is already started and blocked: what is left is waking a process and
#: two round trips). It stays well under what a stranded lock costs a waiter: the holder's
#: TTL (30 s), or, for a waiter rescued only when its block ends, the cap its socket
#: timeout sets (``patient_client``: 59.75 s; through the fault proxy, 29.75 s; an async
#: waiter's shared BLPOP blocks 1 s at a time whatever the timeout, ``waiting.HUB_BLOCK``).
LIVE_BOUND = protocol.GRANT_LEASE + protocol.RECHECK + 8


def keys_of(name: str) -> list[str]:
    return [lock_key(name, part) for part in protocol.KEY_PARTS]


# -- code run in child processes -------------------------------------------------
def take_the_handover_then_hang(name: str, fair: bool) -> None:
    """A waiter, as Redis sees one, that takes what a release pushes and never answers: it
    asks (raising the "someone waits" flag), blocks, and once it has the hand-over (or the
    wake-up) it says so and hangs until it is killed."""
    client = get_client()
    args = protocol.acquire_args(new_identifier(), TIMEOUT * 1000, TIMEOUT * 1000, False)
    assert int(run_script("lock_acquire", client, keys=keys_of(name), args=args)) < 0
    popped = client.blpop([lock_key(name, "signal")], timeout=TIMEOUT)
    assert popped is not None
    client.set("test:popped", popped[1])
    time.sleep(3600)


def wait_for_lock(name: str, fair: bool) -> None:
    """A live waiter: takes the lock, notes the server's time it got it, gives it back."""
    client = get_client()
    lock = Lock(name, timeout=TIMEOUT, wait=TIMEOUT * 2, fair=fair, client=patient_client())
    assert lock.acquire()
    client.set("test:got-at", repr(server_now(client)))
    client.set("test:got-token", lock.token)
    lock.release()


# -- a grant that nobody confirms ------------------------------------------------
@pytest.mark.parametrize("fair", [True, False], ids=["fair", "non-fair"])
def test_a_waiter_killed_after_redis_popped_the_hand_over_does_not_strand_the_lock(
    fair: bool,
) -> None:
    """The waiter blocked first takes the release's hand-over (or wake-up) into its socket and
    is SIGKILLed; the live waiter behind it holds the lock within the grant's lease and one
    recheck, not the holder's TTL."""
    client = get_client()
    name = f"killed-taker-{fair}"
    holder = Lock(name, timeout=TIMEOUT, wait=0, fair=fair)
    assert holder.acquire()
    first_token = holder.token
    assert first_token is not None
    signal_key = lock_key(name, "signal")
    taker = start_process(take_the_handover_then_hang, name, fair)
    waiter = None
    try:
        wait_until(functools.partial(blocked_count_is, signal_key, 1))
        waiter = start_process(wait_for_lock, name, fair)
        wait_until(functools.partial(blocked_count_is, signal_key, 2))
        released_at = server_now()
        holder.release()
        wait_until(lambda: client.exists("test:popped"))
        if fair:  # it took the grant itself, under its lease (not the releaser's TTL)
            popped = protocol.handover(client.get("test:popped"))
            assert popped is not None
            assert popped[2] == protocol.GRANT_LEASE * 1000
        taker.kill()  # SIGKILL, with the hand-over in its socket
        waiter.join(TIMEOUT * 2)
        assert waiter.exitcode == 0
    finally:
        taker.kill()
        if waiter is not None:
            waiter.kill()
    gap = float(client.get("test:got-at")) - released_at
    print(f"\nlive waiter held the lock {gap * 1000:.0f} ms after the release")
    assert gap < LIVE_BOUND
    assert int(client.get("test:got-token")) > first_token


async def test_async_waiters_behind_a_taker_that_never_confirms_all_get_the_lock() -> None:
    """A hundred async waiters of one loop wait behind a waiter that took the hand-over and
    never confirmed it: the grant lapses and they hold the lock one after another."""
    client = get_client()
    name = "async-behind-taker"
    holder = Lock(name, timeout=TIMEOUT, wait=0)
    assert holder.acquire()
    signal_key = lock_key(name, "signal")
    args = protocol.acquire_args(new_identifier(), TIMEOUT * 1000, TIMEOUT * 1000, False)
    assert int(run_script("lock_acquire", client, keys=keys_of(name), args=args)) < 0
    # The taker, blocked first: it pops the hand-over and goes silent.
    popped: list[object] = []
    taker = threading.Thread(
        target=lambda: popped.append(get_client().blpop([signal_key], timeout=TIMEOUT))
    )
    taker.start()
    wait_until(functools.partial(blocked_count_is, signal_key, 1))
    lock = Lock(name, timeout=TIMEOUT, wait=TIMEOUT * 2)
    held: list[int] = []
    first_in: list[float] = []
    inside = 0

    async def section() -> None:
        nonlocal inside
        async with lock:
            if not first_in:
                first_in.append(time.monotonic())
            inside += 1
            assert inside == 1
            assert lock.token is not None
            held.append(lock.token)
            await asyncio.sleep(0)
            inside -= 1

    tasks = [asyncio.ensure_future(section()) for _ in range(100)]
    # The loop's shared BLPOP is blocked behind the taker.
    await asyncio.to_thread(wait_until, lambda: blocked_clients(signal_key) == 2)
    released_at = time.monotonic()
    holder.release()
    await asyncio.wait_for(asyncio.gather(*tasks), TIMEOUT * 2)
    done_at = time.monotonic()
    taker.join(TIMEOUT)
    assert not taker.is_alive()
    (popped_reply,) = popped
    assert protocol.handover(popped_reply[1]) is not None  # type: ignore[index]
    assert len(held) == 100
    assert held == sorted(set(held))  # tokens strictly increase
    print(f"\n100 async waiters done {(done_at - released_at) * 1000:.0f} ms after the release")
    # The first waiter in is what the taker's silence could hold up (for the grant's lease).
    assert first_in[0] - released_at < LIVE_BOUND
    # The 99 hand-overs after it are some 300 round trips, which a busy machine stretches to
    # seconds; a lost one would cost the lock's whole 30 s TTL.
    assert done_at - released_at < TIMEOUT / 2


# -- a call whose reply was lost ---------------------------------------------------
def test_an_acquire_retried_with_its_identifier_answers_the_grant_it_already_got() -> None:
    """redis-py resends a call whose reply a stall cut: the caller gets the lock it holds,
    with the same token, instead of waiting for itself until the TTL."""
    client = get_client()
    identifier = new_identifier()
    args = protocol.acquire_args(identifier, 20_000, 0, False)
    token = int(run_script("lock_acquire", client, keys=keys_of("retried"), args=args))
    assert token > 0
    client.pexpire(lock_key("retried", "owner"), 5000)  # time passed before the resend
    again = int(run_script("lock_acquire", client, keys=keys_of("retried"), args=args))
    assert again == token
    assert client.get(lock_key("retried", "owner")).decode() == identifier
    # The TTL asked for (not the 5 s grant lease), read a moment later on a busy machine.
    assert 10_000 < client.pttl(lock_key("retried", "owner")) <= 20_000
    # Another caller is still refused.
    other = protocol.acquire_args(new_identifier(), 20_000, 0, False)
    assert int(run_script("lock_acquire", client, keys=keys_of("retried"), args=other)) < 0


# -- a release with nobody left to take it -----------------------------------------
def test_a_hand_over_nobody_takes_holds_the_lock_for_its_lease_only() -> None:
    """The last waiter was handed the lock and released it while the "someone waits" flag
    still stood: the hand-over goes to nobody, and the lock is reported held for the grant's
    lease at most (before: the releaser's whole TTL), and a newcomer claims it at once."""
    holder = Lock("nobody-left", timeout=TIMEOUT, wait=0)
    assert holder.acquire()
    assert waiter_asks("nobody-left", 5000, woken=False) < 0  # raises the flag (for 6 s)
    released = server_now()
    holder.release()
    status = lock_status("nobody-left")
    # Held by the hand-over for its lease at most (read within it, unless the test stalled).
    assert status["held"] or server_now() - released >= protocol.GRANT_LEASE
    assert status["ttl"] is None or status["ttl"] <= protocol.GRANT_LEASE
    newcomer = Lock("nobody-left", timeout=TIMEOUT, wait=0)
    assert newcomer.acquire()
    assert lock_status("nobody-left")["ttl"] > TIMEOUT - 10  # its own; a hand-over's is 1 s
    newcomer.release()


def test_a_waiter_refused_blocks_no_longer_than_a_recheck() -> None:
    """The flag a waiter raises, and so how long a release hands over to nobody, is bounded by
    the recheck, not by the holder's TTL or the caller's wait."""
    client = get_client()
    holder = Lock("short-flag", timeout=600, wait=0)
    assert holder.acquire()
    now = time.monotonic()
    block = protocol.block_ms(now + 300, now)  # a caller with five minutes left to wait
    args = protocol.acquire_args(new_identifier(), 600_000, block, False)
    assert int(run_script("lock_acquire", client, keys=keys_of("short-flag"), args=args)) < 0
    assert client.pttl(lock_key("short-flag", "waiting")) <= (protocol.RECHECK + 1) * 1000 + 1
    holder.release()


# -- keys that expire once idle ----------------------------------------------------
def test_every_key_of_a_lock_expires_once_idle_and_tokens_still_increase() -> None:
    """A name used once leaves no key without a TTL (before: the fencing counter stayed for
    good, one key per name a client could make up). A counter that expired starts again from
    the server's clock, above every token granted before."""
    client = get_client()
    tokens = []
    for _ in range(3):
        lock = Lock("idle-keys", timeout=30, wait=0)
        assert lock.acquire()
        assert Lock("idle-keys", timeout=2, wait=0.01).acquire() is False
        assert lock.token is not None
        tokens.append(lock.token)
        lock.release()
        for key in client.keys("*idle-keys*"):
            assert client.pttl(key) != -1, key  # expiring (or expired since KEYS)
        # The counter expires (as it does once idle): the next token is still larger.
        client.delete(lock_key("idle-keys", "fence"))
        time.sleep(0.002)  # the server's clock moves on by more than a grant
    assert tokens == sorted(set(tokens))
    assert tokens[0] > 10**15  # microseconds of the server's clock


def test_a_counter_from_before_keeps_counting_and_gets_a_ttl() -> None:
    client = get_client()
    client.set(lock_key("old-counter", "fence"), 41)
    lock = Lock("old-counter", timeout=5, wait=0)
    assert lock.acquire()
    assert lock.token == 42
    assert client.pttl(lock_key("old-counter", "fence")) > 0
    lock.release()


# -- a holder paused past its lease ------------------------------------------------
def hold_and_report(name: str, renew: bool) -> None:
    """Hold the lock (a 1 s TTL), say so, and once resumed report whether it still held it
    and how its release went."""
    client = get_client()
    lost: list[bool] = []
    lock = Lock(name, timeout=1, wait=0, auto_renew=renew, on_lost=lambda _: lost.append(True))
    assert lock.acquire()
    client.set("test:paused-token", lock.token)
    client.set("test:holding", 1)
    while not client.exists("test:resumed"):
        time.sleep(0.01)
    try:
        lock.release()
        client.set("test:release", "released")
    except Exception as exc:  # noqa: BLE001 (what the release raised is the result)
        client.set("test:release", type(exc).__name__)


@pytest.mark.parametrize("renew", [False, True], ids=["plain", "auto_renew"])
def test_a_holder_paused_past_its_lease_loses_the_lock_to_a_live_waiter(renew: bool) -> None:
    """SIGSTOP past the lease (its renewal thread stops with it): a live waiter holds the lock
    once the lease ends, with a larger token; resumed, the paused holder's release says the
    lock was lost, and takes nothing from the new holder."""
    client = get_client()
    name = f"paused-holder-{renew}"
    holder = start_process(hold_and_report, name, renew)
    try:
        wait_until(lambda: client.exists("test:holding"))
        os.kill(holder.pid, signal.SIGSTOP)  # type: ignore[arg-type]
        waiter = Lock(name, timeout=TIMEOUT, wait=TIMEOUT)
        started = time.monotonic()
        assert waiter.acquire()
        waited = time.monotonic() - started
        # The lease (1 s, renewed by a paused thread no more) and a recheck, and slack.
        assert waited < 1 + LIVE_BOUND
        assert waiter.token is not None
        assert waiter.token > int(client.get("test:paused-token"))
        os.kill(holder.pid, signal.SIGCONT)  # type: ignore[arg-type]
        client.set("test:resumed", 1)
        holder.join(TIMEOUT)
        assert holder.exitcode == 0
        assert client.get("test:release") == b"LockLost"
        assert waiter.owned()  # the resumed holder took nothing from it
        waiter.release()
    finally:
        holder.kill()


# -- a Redis restart under a blocked waiter ---------------------------------------
def wait_on_a_plain_client(port: int, name: str) -> None:
    """A live waiter on ``redis.Redis(host, port, retry=...)``, as a user builds one: blocked
    in BLPOP when the server goes away, it must ask again once the server is back, not wait
    out a block begun before the restart. Its retries (every 0.1 s for 30 s) outlast a
    restart slowed by a busy machine, which redis-py's default budget (a few seconds,
    jittered) may not."""
    client = redis.Redis(host="127.0.0.1", port=port, retry=Retry(ConstantBackoff(0.1), 300))
    lock = Lock(name, timeout=TIMEOUT, wait=TIMEOUT * 2, client=client)
    assert lock.acquire()
    client.set("test:got-at", repr(server_now(client)))
    lock.release()


@pytest.mark.skipif(cluster.ENABLED, reason="one server of the test's own, restarted")
@pytest.mark.parametrize("data", ["kept", "lost"])
def test_a_waiter_on_a_plain_client_holds_the_lock_soon_after_a_redis_restart(
    tmp_path: Path, data: str
) -> None:
    """The server restarts under a waiter blocked for the lock. "kept": the server comes back
    with its data (the AOF) and the holder releases; "lost": it comes back empty (a new node,
    a failover to a replica that had not seen the lock) and the lock is free. Either way the
    waiter holds it within the live bound of that moment, not after the holder's TTL."""
    port = free_port()
    server = EmbeddedRedis(tmp_path / "redis", port=port).start()
    try:
        client = redis.Redis(host="127.0.0.1", port=port)
        name = f"restart-{data}"
        holder = Lock(name, timeout=TIMEOUT, wait=0, client=client)
        assert holder.acquire()
        waiter = start_process(wait_on_a_plain_client, port, name)
        try:
            wait_until(lambda: int(client.info("clients")["blocked_clients"]) == 1)
            server.stop()
            if data == "lost":
                shutil.rmtree(tmp_path / "redis")
            server.start()
            if data == "kept":
                assert client.exists(lock_key(name, "owner"))
                free_at = server_now(client)
                holder.release()
            else:
                assert not client.exists(lock_key(name, "owner"))
                free_at = server_now(client)
            wait_until(lambda: client.exists("test:got-at"), timeout=TIMEOUT * 2)
            waiter.join(TIMEOUT)
            assert waiter.exitcode == 0
        finally:
            waiter.kill()
        gap = float(client.get("test:got-at") or "inf") - free_at
        print(f"\n{data}: the waiter held the lock {gap * 1000:.0f} ms after it was free")
        assert gap < LIVE_BOUND
    finally:
        server.stop()
