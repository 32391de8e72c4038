"""The process's one renewer: jobs on one thread, or on the event loop that asked."""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from collections.abc import Callable

import pytest

from django_rcoord.renewal import akeep_alive, keep_alive, schedule
from tests.procs import wait_until


def renewer_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "rcoord-renewer"]


def test_many_leases_share_one_thread_and_each_is_renewed_on_time() -> None:
    calls: dict[int, list[float]] = {n: [] for n in range(50)}

    def renew_for(index: int) -> Callable[[], bool]:
        def renew() -> bool:
            calls[index].append(time.monotonic())
            return True

        return renew

    renewals = [keep_alive(0.05, renew_for(n), f"job {n}") for n in range(50)]
    try:
        wait_until(lambda: all(len(times) >= 3 for times in calls.values()), timeout=5)
        assert len(renewer_threads()) == 1
        gaps = [b - a for times in calls.values() for a, b in itertools.pairwise(times)]
        assert min(gaps) >= 0.045  # never before it is due
    finally:
        for renewal in renewals:
            renewal.cancel()


def test_a_job_that_returns_false_is_done_and_one_that_raises_is_tried_again() -> None:
    done_calls: list[int] = []
    failing_calls: list[int] = []

    def lost() -> bool:
        done_calls.append(1)
        return False

    def failing() -> bool:
        failing_calls.append(1)
        raise RuntimeError("a Redis hiccup")

    keep_alive(0.02, lost, "lost lease")
    renewal = keep_alive(0.02, failing, "failing lease")
    try:
        wait_until(lambda: len(failing_calls) >= 3, timeout=5)
        assert done_calls == [1]
    finally:
        renewal.cancel()


class _PastException(BaseException):
    """What a job might raise past ``Exception`` (SystemExit, a stray KeyboardInterrupt)."""


def test_a_job_that_raises_past_exception_is_stopped_and_every_other_goes_on() -> None:
    """Before, it ended the process's renewal thread: every lock and permit of the process
    stopped renewing, and cancel() of the job hung."""
    raised: list[int] = []
    renewed: list[int] = []

    def fatal() -> bool:
        raised.append(1)
        raise _PastException

    def healthy() -> bool:
        renewed.append(1)
        return True

    broken = keep_alive(0.02, fatal, "a job raising past Exception")
    other = keep_alive(0.02, healthy, "a healthy lease")
    try:
        wait_until(lambda: raised == [1] and len(renewed) >= 5, timeout=10)
        broken.cancel()  # returns: no run is left in flight
        count = len(renewed)
        wait_until(lambda: len(renewed) >= count + 3, timeout=10)  # still renewed
        assert raised == [1]  # stopped, not tried again
    finally:
        other.cancel()


def test_an_async_job_that_raises_past_exception_is_stopped_and_the_loop_goes_on() -> None:
    async def main() -> None:
        raised: list[int] = []
        renewed: list[int] = []

        async def fatal() -> bool:
            raised.append(1)
            raise SystemExit(3)  # in a task, asyncio lets it end the loop

        five = asyncio.Event()

        async def healthy() -> bool:
            renewed.append(1)
            if len(renewed) >= 5:
                five.set()
            return True

        broken = akeep_alive(0.02, fatal, "a job raising past Exception")
        other = akeep_alive(0.02, healthy, "a healthy lease")
        await asyncio.wait_for(five.wait(), 10)
        assert raised == [1]
        broken.cancel()
        other.cancel()

    asyncio.run(main())


def test_cancel_waits_for_a_run_in_flight_and_nothing_runs_after() -> None:
    started, ran_after_cancel = threading.Event(), []
    cancelled = threading.Event()
    runs = {"begun": 0, "ended": 0}

    def slow() -> bool:
        runs["begun"] += 1
        started.set()
        time.sleep(0.2)
        if cancelled.is_set():
            ran_after_cancel.append(1)
        runs["ended"] += 1
        return True

    renewal = keep_alive(0.01, slow, "slow lease")
    assert started.wait(5)
    renewal.cancel()
    assert runs["begun"] == runs["ended"] >= 1  # it waited for the run in flight to end
    cancelled.set()
    time.sleep(0.1)
    assert ran_after_cancel == []


def test_wake_runs_a_job_sooner_even_while_it_runs() -> None:
    runs: list[float] = []
    in_run = threading.Event()

    def job() -> float:
        runs.append(time.monotonic())
        in_run.set()
        time.sleep(0.05)
        return 60.0  # next due in a minute unless woken

    renewal = schedule(job, 0, "worker keeper", retry=1.0)
    try:
        assert in_run.wait(5)
        renewal.wake(time.monotonic())  # while it runs: it runs again right after
        wait_until(lambda: len(runs) >= 2, timeout=30)  # unwoken: a minute
        renewal.wake(time.monotonic() + 0.05)  # between runs
        wait_until(lambda: len(runs) >= 3, timeout=30)
    finally:
        renewal.cancel()


def test_hundreds_of_async_leases_are_renewed_on_the_loop_without_a_thread() -> None:
    async def main() -> None:
        counts = [0] * 300
        all_thrice = asyncio.Event()

        def renew_for(index: int):
            async def renew() -> bool:
                counts[index] += 1
                if min(counts) >= 3:
                    all_thrice.set()
                return True

            return renew

        threads_before = threading.active_count()
        renewals = [akeep_alive(0.02, renew_for(n), f"async lease {n}") for n in range(300)]
        await asyncio.wait_for(all_thrice.wait(), 5)
        assert threading.active_count() == threads_before
        for renewal in renewals:
            renewal.cancel()
        settled = list(counts)
        await asyncio.sleep(0.1)
        assert counts == settled  # nothing runs once cancelled

    asyncio.run(main())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_does_not_renew_its_parents_leases() -> None:
    parent_calls: list[int] = []

    def renew() -> bool:
        parent_calls.append(os.getpid())
        return True

    renewal = keep_alive(0.02, renew, "parent lease")
    try:
        wait_until(lambda: parent_calls, timeout=5)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: the parent's job must not run here
            try:
                time.sleep(0.2)
                own = [call for call in parent_calls if call == os.getpid()]
                os.write(write, b"clean" if not own else b"renewed")
            finally:
                os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
        assert os.read(read, 16) == b"clean"
        os.close(read)
    finally:
        renewal.cancel()
