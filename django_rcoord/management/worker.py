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
from django_rcoord.queues.records import known_groups
from django_rcoord.queues.shards import earlier_layouts, per_shard
from django_rcoord.queues.worker import Worker
from django_rcoord.queues.worker.budget import BurstQuorum, TaskBudget
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
        # groups of its earlier layouts (resharding) by one loop each, as named.
        loops = [(shard, concurrency, False) for queues in named for shard in per_shard(queues)]
        loops += [(queues, 1, True) for queues in _earlier_layouts(named)]
        stop = threading.Event()
        workers = _workers(loops, options, stop, max_outage)
        watched = [name for queues, _, _ in loops for name in queues]
        self._report_unwatched(watched)
        failed: list[RcoordError] = []

        def run(worker: Worker) -> None:
            try:
                worker.run()
            except (RedisUnavailable, WorkerGaveUp) as exc:  # its max_outage ran out
                failed.append(exc)
                stop.set()

        with stop_on_signals(stop):
            if len(workers) == 1:
                run(workers[0])
            else:
                threads = [
                    threading.Thread(target=run, args=(worker,), name=f"worker-{i}")
                    for i, worker in enumerate(workers)
                ]
                for thread in threads:
                    thread.start()
                while any(thread.is_alive() for thread in threads):
                    for thread in threads:
                        thread.join(0.2)
        if failed:
            raise CommandError(str(failed[0]))
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


def _workers(
    loops: list[tuple[list[str], int, bool]],
    options: dict[str, Any],
    stop: threading.Event,
    max_outage: float | None,
) -> list[Worker]:
    """A ``Worker`` for each of ``loops`` (queues, how many, as_named). --max-tasks and
    --burst are the process's: every loop draws on one budget (spent, it sets ``stop`` for
    them all), and a burst ends when no loop has work."""
    budget = TaskBudget(options["max_tasks"], stop=stop)
    quorum = BurstQuorum(sum(count for _, count, _ in loops)) if options["burst"] else None
    try:
        return [
            Worker(
                queues,
                lease=options["lease"],
                burst=quorum or False,
                max_tasks=budget,
                stop_event=stop,
                max_outage=max_outage,
                isolation=options["isolation"],
                as_named=as_named,
            )
            for queues, count, as_named in loops
            for _ in range(count)
        ]
    except ValueError as exc:
        raise CommandError(str(exc)) from exc


def _max_outage(given: float | None, *, burst: bool) -> float | None:
    """``--max-outage``, by default ``BURST_MAX_OUTAGE`` for a burst run (None: none)."""
    if given is None and burst:
        return BURST_MAX_OUTAGE
    if given is not None and given <= 0:
        raise CommandError("--max-outage must be a positive number of seconds")
    return given


def _earlier_layouts(named: list[list[str]]) -> list[list[str]]:
    """The queues of the groups left from earlier shard layouts of the groups of ``named``
    (see ``earlier_layouts``): found in the registry, none when Redis cannot say now."""
    try:
        known = known_groups()
    except REDIS_ERRORS:
        return []  # the workers report an unusable Redis
    return [queues for names in named for queues in earlier_layouts(names, known)]
