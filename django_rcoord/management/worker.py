"""The task worker command: ``manage.py run_email_worker`` (the sold-item e-mails first, where
it began) and ``manage.py rcoord_worker``, the same command under a general name."""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_rcoord.connection.errors import REDIS_ERRORS
from django_rcoord.exceptions import RcoordError, RedisUnavailable, WorkerGaveUp
from django_rcoord.management.base import (
    add_protocol_arguments,
    announce_protocols,
    configure_logging,
    stop_on_signals,
)
from django_rcoord.queues.shards import per_shard
from django_rcoord.queues.worker import Worker
from django_rcoord.queues.worker.budget import BurstQuorum, TaskBudget
from django_rcoord.queues.worker.layouts import LayoutLoops
from django_rcoord.queues.worker.loop import ISOLATIONS
from django_rcoord.queues.worker.watch import default_queues, waiting_elsewhere

logger = logging.getLogger("django_rcoord.queues.worker")

#: How long a --burst run waits out a failing loop (Redis unusable, or any other error)
#: before it fails (seconds).
BURST_MAX_OUTAGE = 60.0


class WorkerCommand(BaseCommand):
    help = (
        "Run tasks from the given queues, highest priority first (default: RCOORD['EMAIL_QUEUES'] "
        "and every queue a registered task or the Tasks framework backend uses, one worker "
        "per queue group). SIGTERM or Ctrl-C finishes the running task and exits; a second "
        "one exits at once (the task's lease brings it back)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add_protocol_arguments(parser)
        parser.add_argument("--queues", nargs="+", help="Queues to watch, highest priority first.")
        parser.add_argument(
            "--burst",
            action="store_true",
            help="Exit when the queues are empty: when no loop of the process (one per shard) "
            "has work.",
        )
        parser.add_argument(
            "--max-tasks",
            type=int,
            help="Exit after this many tasks, run by the whole process (all its loops).",
        )
        parser.add_argument(
            "--concurrency",
            type=int,
            default=1,
            help="Tasks run at once, each in its own thread (default 1; per queue group).",
        )
        parser.add_argument("--lease", type=float, help="Seconds (default RCOORD['TASK_LEASE']).")
        parser.add_argument(
            "--isolation",
            choices=ISOLATIONS,
            default="inline",
            help="Where tasks run: in the worker's process (inline, the default), or in a "
            "child process per worker thread that is killed at a task's time limit and "
            "started again (process).",
        )
        parser.add_argument(
            "--max-outage",
            type=float,
            help="Fail (exit 1) when the loop keeps failing this many seconds: Redis "
            "unusable, or any other error (default: "
            f"{BURST_MAX_OUTAGE:g} with --burst; without it, retry for ever).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        concurrency = options["concurrency"]
        if concurrency < 1:
            raise CommandError("--concurrency must be at least 1")
        if options["max_tasks"] is not None and options["max_tasks"] < 1:
            raise CommandError("--max-tasks must be at least 1")
        max_outage = _max_outage(options["max_outage"], burst=options["burst"])
        configure_logging(options["verbosity"])
        announce_protocols(upgrade=options["upgrade_protocols"])
        named = [options["queues"]] if options["queues"] else default_queues()
        # A group with shards is served by a loop per shard, each waiting on its own; the
        # groups beside the layout (the group's own keys, other layouts' shards) by one
        # loop each, as named, kept in step with the registry while the process runs.
        own = [(shard, concurrency) for queues in named for shard in per_shard(queues)]
        process = _Process(options, max_outage)
        layouts = LayoutLoops(named, process.start)
        beside = _beside(layouts)
        process.plan(sum(count for _, count in own) + len(beside))
        workers = [process.make(queues, False) for queues, count in own for _ in range(count)]
        watched = [name for queues, _ in own for name in queues]
        watched += [name for queues in beside.values() for name in queues]
        self._report_unwatched(watched)
        with stop_on_signals(process.stop):
            layouts.refresh(beside)  # their loops start now, each with a stop of its own
            process.serve(workers, layouts, discover=not options["burst"])
        if process.failed:
            raise CommandError(str(process.failed[0]))
        if options["burst"]:
            self._report_unwatched(watched)

    @staticmethod
    def _report_unwatched(watched: list[str]) -> None:
        """Say, once, which queues hold tasks that this command's workers do not watch."""
        try:
            waiting = waiting_elsewhere(watched)
        except REDIS_ERRORS:
            return  # the workers report an unusable Redis
        if waiting:
            logger.warning(
                "tasks are waiting in queues these workers do not watch: %s (add them with "
                "--queues, or run a worker for them)",
                ", ".join(f"{name} ({count})" for name, count in sorted(waiting.items())),
            )


class _Process:
    """The loops of one worker process: their shared stop, task budget (--max-tasks) and
    burst quorum, the threads they run in, and the errors that ended them."""

    def __init__(self, options: dict[str, Any], max_outage: float | None) -> None:
        self.options = options
        self.max_outage = max_outage
        self.stop = threading.Event()
        # --max-tasks and --burst are the process's: every loop draws on one budget (spent,
        # it sets ``stop`` for them all), and a burst ends when no loop has work.
        self.budget = TaskBudget(options["max_tasks"], stop=self.stop)
        self.quorum: BurstQuorum | None = None
        self.failed: list[RcoordError] = []
        self.threads: list[threading.Thread] = []

    def plan(self, loops: int) -> None:
        """``loops`` loops start with the process (a burst ends when none has work)."""
        if self.options["burst"]:
            self.quorum = BurstQuorum(loops)

    def make(
        self, queues: list[str], as_named: bool, stop: threading.Event | None = None
    ) -> Worker:
        try:
            return Worker(
                queues,
                lease=self.options["lease"],
                burst=self.quorum or False,
                max_tasks=self.budget,
                stop_event=stop or self.stop,
                max_outage=self.max_outage,
                isolation=self.options["isolation"],
                as_named=as_named,
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc

    def start(self, queues: list[str], stop: threading.Event) -> Worker:
        """A loop for ``queues`` (as named), stopped by ``stop``, started in a thread."""
        worker = self.make(queues, True, stop)
        thread = threading.Thread(target=self.run, args=(worker,), name=f"worker-{queues[0]}")
        self.threads.append(thread)
        thread.start()
        return worker

    def run(self, worker: Worker) -> None:
        try:
            worker.run()
        except (RedisUnavailable, WorkerGaveUp) as exc:  # its max_outage ran out
            self.failed.append(exc)
            self.stop.set()

    def serve(self, workers: list[Worker], layouts: LayoutLoops, *, discover: bool) -> None:
        """Run ``workers`` (one in this thread, for its time limits' signals; more in a
        thread each) until they end, the loops of ``layouts`` beside them, kept in step
        with the registry when ``discover``; then stop everything and wait for it."""
        watcher = threading.Thread(
            target=layouts.watch,
            args=(self.stop,),
            kwargs={"refresh": discover},
            name="rcoord-layouts",
        )
        watcher.start()
        try:
            if len(workers) == 1:
                self.run(workers[0])
            else:
                own = [
                    threading.Thread(target=self.run, args=(worker,), name=f"worker-{i}")
                    for i, worker in enumerate(workers)
                ]
                for thread in own:
                    thread.start()
                while any(thread.is_alive() for thread in own):
                    for thread in own:
                        thread.join(0.2)
        finally:
            self.stop.set()
            watcher.join()
            for thread in self.threads:
                thread.join()


def _max_outage(given: float | None, *, burst: bool) -> float | None:
    """``--max-outage``, by default ``BURST_MAX_OUTAGE`` for a burst run (None: none)."""
    if given is None and burst:
        return BURST_MAX_OUTAGE
    if given is not None and given <= 0:
        raise CommandError("--max-outage must be a positive number of seconds")
    return given


def _beside(layouts: LayoutLoops) -> dict[str, list[str]]:
    """The groups beside the process's layout, by name, with their queues (see
    ``LayoutLoops.wanted``); none when Redis cannot say now (the loops report it)."""
    try:
        return layouts.wanted()
    except REDIS_ERRORS:
        return {}
