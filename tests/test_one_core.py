"""The lock's and the semaphore's acquire: one core, two faces.

The core is driven here step by step, with no Redis, to show what it decides; then the
sync face and the async face are driven through the same cases on a real Redis, so the
two cannot drift apart unnoticed.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from django_rcoord.connection import get_client
from django_rcoord.keys import KeySpace
from django_rcoord.locks import Lock, acquire_lock, protocol
from django_rcoord.semaphores import Semaphore, acquire_fair_semaphore, release_fair_semaphore
from django_rcoord.steps import Attempt, Leave, Wait


class Clock:
    """A clock the test moves by hand (the core reads time only through it)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- the cores, alone ------------------------------------------------------------
def test_the_lock_core_asks_waits_and_takes_up_a_hand_over() -> None:
    clock = Clock()
    lock = Lock("core-alone", timeout=10, wait=5)
    acquisition = lock._acquisition(None, clock)
    steps = acquisition.steps

    first = steps.send(None)
    assert isinstance(first, Attempt)
    identifier, ttl_ms, block_ms, woken = first.args
    assert (ttl_ms, woken, first.pause) == (10_000, 0, 0.0)
    assert block_ms == protocol.RECHECK * 1000 + 1  # it may block, at most RECHECK
    assert acquisition.in_doubt == identifier  # an attempt in flight may have been granted

    wait = steps.send(-3000)  # refused: the holder has 3 s left
    assert wait == Wait(protocol.RECHECK)
    assert lock.holder_ttl == 3.0
    assert acquisition.in_doubt is None

    confirm = steps.send(b"7:1000:granted-to-me")  # a release handed it over
    # Confirmed as an attempt under the grant, which takes the waiter out of the line.
    assert confirm == Attempt(protocol.confirm_args("granted-to-me", 10_000, identifier))
    assert acquisition.in_doubt == "granted-to-me"

    with pytest.raises(StopIteration) as done:
        steps.send(7)  # confirmed
    hold = done.value.value
    assert (hold.identifier, hold.token) == ("granted-to-me", 7)
    assert lock._holds.current() is hold


def test_the_lock_core_asks_again_after_a_lapsed_grant_and_gives_up_on_time() -> None:
    clock = Clock()
    lock = Lock("core-lapsed", timeout=10, wait=2)
    steps = lock._acquisition(None, clock).steps
    steps.send(None)
    assert isinstance(steps.send(-5000), Wait)
    assert steps.send(b"7:1000:late").args[0] == "late"  # its confirmation
    clock.now += 1.5
    again = steps.send(-5000)  # the grant had lapsed: ask again, as one who was woken
    assert isinstance(again, Attempt)
    assert again.args[3] == 1
    assert again.args[2] == 501  # blocks for what is left of the wait (0.5 s), + 1 ms
    clock.now += 0.5
    with pytest.raises(StopIteration) as done:
        steps.send(-5000)
    assert done.value.value is None  # out of time: not held
    assert lock._holds.current() is None


def test_a_non_fair_lock_core_backs_off_after_losing_the_race() -> None:
    lock = Lock("core-race", fair=False, wait=5)
    steps = lock._acquisition(None, Clock()).steps
    steps.send(None)
    steps.send(-5000)
    woken_attempt = steps.send(b"1")  # a plain wake-up: ask again, at once
    assert woken_attempt.pause == 0.0
    pauses = []
    for _ in range(10):
        steps.send(-5000)  # lost the race to a newcomer again
        pauses.append(steps.send(b"1").pause)  # woken by the next release
    # Each loss doubles the pause before its next try, up to the ceiling: a waiter that
    # keeps losing asks about once per RACE_BACKOFF_MAX, not once per release.
    assert pauses[:6] == [protocol.RACE_BACKOFF_MIN * 2**n for n in range(6)]
    assert pauses[5:] == [protocol.RACE_BACKOFF_MAX] * 5


def test_a_non_fair_lock_core_never_pauses_past_its_wait() -> None:
    clock = Clock()
    lock = Lock("core-race-deadline", fair=False, wait=1)
    steps = lock._acquisition(None, clock).steps
    steps.send(None)
    steps.send(-5000)
    for _ in range(6):
        steps.send(b"1")
        steps.send(-5000)
    clock.now += 1 - 0.004  # 4 ms of the wait left; the pause would be 32 ms
    assert steps.send(b"1").pause == pytest.approx(0.004)


def test_a_fair_lock_core_never_pauses() -> None:
    lock = Lock("core-fair-race", wait=5)
    steps = lock._acquisition(None, Clock()).steps
    steps.send(None)
    steps.send(-5000)
    for _ in range(5):
        assert steps.send(b"1").pause == 0.0  # a plain wake-up of a fair lock: ask at once
        steps.send(-5000)


def test_the_semaphore_core_waits_in_line_and_leaves_it_when_out_of_time() -> None:
    clock = Clock()
    semaphore = Semaphore("core-sem", 2, wait=1)
    steps = semaphore._acquisition("me", 1, clock)
    attempt = steps.send(None)
    assert attempt.args[:2] == ("me", 2)
    assert attempt.args[4] == 1  # it may wait: the script takes a ticket for it
    wait = steps.send([0, 400, 17])  # refused; a lease ends in 0.4 s; ticket 17
    assert wait == Wait(0.4, 17)
    again = steps.send(b"1")
    assert (again.args[6], again.args[7]) == (1, 1)  # woken, and already in line
    clock.now += 1
    assert steps.send([0, -1, 17]) == Leave("me")
    with pytest.raises(StopIteration) as done:
        steps.send(True)
    assert done.value.value is None


# -- both faces, the same cases ----------------------------------------------------
class SyncFace:
    """Runs the sync methods, all on one thread of their own (a lock's holder is its thread)."""

    def __init__(self) -> None:
        self.thread = ThreadPoolExecutor(1)

    async def __call__(self, thing: Any, method: str, *args: Any) -> Any:
        call = functools.partial(getattr(thing, method), *args)
        return await asyncio.get_running_loop().run_in_executor(self.thread, call)

    async def hold(self, lock: Lock, wait: float) -> tuple[bool, int | None, bool]:
        """Acquire, read the token, ask whether it is owned, release: as one holder."""

        def hold() -> tuple[bool, int | None, bool]:
            if not lock.acquire(wait):
                return False, lock.token, False
            token, owned = lock.token, lock.owned()
            lock.release()
            return True, token, owned

        return await asyncio.get_running_loop().run_in_executor(self.thread, hold)


class AsyncFace:
    """Runs the async twins (``a`` + the method's name) in the caller's task."""

    async def __call__(self, thing: Any, method: str, *args: Any) -> Any:
        return await getattr(thing, "a" + method)(*args)

    async def hold(self, lock: Lock, wait: float) -> tuple[bool, int | None, bool]:
        if not await lock.aacquire(wait):
            return False, lock.token, False
        token, owned = lock.token, await lock.aowned()
        await lock.arelease()
        return True, token, owned


Face = SyncFace | AsyncFace


@pytest.fixture(params=["sync", "async"])
def face(request: pytest.FixtureRequest) -> Iterator[Face]:
    if request.param == "async":
        yield AsyncFace()
        return
    sync = SyncFace()
    yield sync
    sync.thread.shutdown()


async def until(condition: Callable[[], bool]) -> None:
    """Wait for what the server shows (generous: a busy machine is slow, not wrong)."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the server never showed it")


def lock_waiting(name: str) -> bool:
    return bool(get_client().exists(KeySpace("lock", name).key("waiting")))


def semaphore_waiters(name: str) -> int:
    return int(get_client().zcard(KeySpace("semaphore", name).key("waiters")))


async def test_a_free_lock_is_granted_with_a_growing_fencing_token(face: Face) -> None:
    lock = Lock("faces-free", timeout=10)
    acquired, first, owned = await face.hold(lock, 0)
    assert acquired
    assert owned
    assert first is not None
    acquired, second, owned = await face.hold(lock, 0)
    assert acquired
    assert owned
    assert second is not None
    assert second > first  # fencing tokens only grow
    assert lock.token is None  # the holds were the face's, and are released


async def test_a_held_lock_is_refused_with_the_holders_ttl(face: Face) -> None:
    holder = acquire_lock("faces-held", lock_timeout=30)
    assert holder is not None
    lock = Lock("faces-held")
    assert not await face(lock, "acquire", 0)
    assert lock.holder_ttl is not None
    assert 0 < lock.holder_ttl <= 30
    assert not lock_waiting("faces-held")  # a caller that will not wait raises no flag


@pytest.mark.parametrize("fair", [True, False])
async def test_a_waiter_gets_the_lock_its_holder_releases(face: Face, fair: bool) -> None:
    owner = Lock("faces-wait", timeout=30, fair=fair)
    assert owner.acquire()  # the test's own task holds it
    lock = Lock("faces-wait", fair=fair)
    waiter = asyncio.ensure_future(face.hold(lock, 30))
    await until(lambda: lock_waiting("faces-wait"))
    owner_token = owner.token
    assert owner_token is not None
    owner.release()
    # Handed over (fair) or taken once woken (not fair): a later token, and owned.
    acquired, token, owned = await waiter
    assert acquired
    assert owned
    assert token is not None
    assert token > owner_token


async def test_a_waiter_out_of_time_holds_nothing(face: Face) -> None:
    holder = acquire_lock("faces-late", lock_timeout=30)
    assert holder is not None
    lock = Lock("faces-late")
    assert await face.hold(lock, 0.2) == (False, None, False)
    assert get_client().get(KeySpace("lock", "faces-late").key("owner")).decode() == holder


async def test_a_free_permit_is_granted_and_counted(face: Face) -> None:
    semaphore = Semaphore("faces-permit", 2)
    first = await face(semaphore, "acquire")
    second = await face(semaphore, "acquire")
    assert first
    assert second
    assert first != second
    assert await face(semaphore, "holders") == 2
    assert await face(semaphore, "acquire", 0) is None
    assert await face(semaphore, "release", first)
    assert not await face(semaphore, "release", first)  # not held twice
    assert await face(semaphore, "holders") == 1


async def test_a_permit_waiter_is_served_on_release_and_out_of_time_leaves_the_line(
    face: Face,
) -> None:
    held = acquire_fair_semaphore("faces-line", 1, timeout=30)
    assert held is not None
    semaphore = Semaphore("faces-line", 1, timeout=30)
    waiter = asyncio.ensure_future(face(semaphore, "acquire", 30))
    await until(lambda: semaphore_waiters("faces-line") == 1)
    assert release_fair_semaphore("faces-line", held)
    permit = await waiter
    assert permit is not None
    assert semaphore_waiters("faces-line") == 0  # served: out of the line

    assert await face(semaphore, "acquire", 0.2) is None
    assert semaphore_waiters("faces-line") == 0  # gave up: out of the line too
    assert await face(semaphore, "release", permit)
