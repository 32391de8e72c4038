"""``manage.py rcoord_status [--watch [SECONDS]] [--json]``: queues and workers at a glance."""

from __future__ import annotations

import json
import time
from typing import Any

import redis
from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_rcoord.ops.status import overview


class Command(BaseCommand):
    help = (
        "Show every queue (ready, in flight, delayed, dead, cancelled, age of the oldest ready "
        "task, next due time, paused or not), promotion lateness, periodic tasks (last and "
        "next tick, lateness), and the live workers with their tasks."
    )
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--watch",
            nargs="?",
            type=float,
            const=2.0,
            metavar="SECONDS",
            help="Refresh in place every SECONDS (default 2) until Ctrl-C.",
        )
        parser.add_argument("--json", action="store_true", help="Print JSON for scripts.")

    def handle(self, *args: Any, watch: float | None, **options: Any) -> None:
        try:
            while True:
                state = overview()
                if options["json"]:
                    self.stdout.write(json.dumps(state))
                else:
                    if watch:
                        self.stdout.write("\x1b[H\x1b[2J", ending="")
                    self.stdout.write(self.render(state))
                if not watch:
                    return
                time.sleep(watch)
        except KeyboardInterrupt:
            return
        except redis.RedisError as exc:
            raise CommandError(f"Redis is unreachable: {exc}") from exc

    @staticmethod
    def render(state: dict[str, Any]) -> str:
        lines = _queue_lines(state["queues"])
        for group, late in state["promotion_lateness"].items():
            lines.append(
                f"promotion lateness ({group}, last {late['samples']}): "
                f"median {late['median_ms']} ms, max {late['max_ms']} ms"
            )
        if not state["queues"]:
            lines.append("(no queue has had a task yet)")
        if state.get("periodic"):
            lines += ["", *_periodic_lines(state["periodic"])]
        return "\n".join([*lines, "", *_worker_lines(state)])


def _queue_lines(queues: list[dict[str, Any]]) -> list[str]:
    """The table of queues, then the rows of shards of another layout than this process's."""
    lines = [
        (
            f"{'queue':<24} {'ready':>7} {'in flight':>9} {'delayed':>8} {'dead':>6} "
            f"{'cancelled':>9} {'oldest ready':>13} {'next due in':>12}"
        )
    ]
    stray: list[str] = []
    for queue in queues:
        age, due = queue["oldest_ready_age"], queue["next_due_in"]
        shards = queue.get("shards")
        name = f"{queue['name']} ({shards} shards)" if shards else queue["name"]
        if queue.get("paused"):
            name += " (paused)"
        if queue.get("other_layout"):
            stray.append(f"{queue['name']} (a shard of {queue['other_layout']})")
        lines.append(
            f"{name:<24} {queue['ready']:>7} {queue['in_flight']:>9} "
            f"{queue['delayed']:>8} {queue['dead']:>6} {queue['cancelled']:>9} "
            f"{'-' if age is None else f'{age:.1f} s':>13} "
            f"{'-' if due is None else f'{max(due, 0):.1f} s':>12}"
        )
    if stray:
        lines.append(
            "not in this process's QUEUE_SHARDS layout (producers with another layout, "
            "or left from an earlier one; workers serve them until they drain): " + ", ".join(stray)
        )
    return lines


def _periodic_lines(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        (
            f"{'periodic task':<24} {'last tick':<26} {'late':>9} "
            f"{'catch-up':>8} {'p50/p99/max late (of n fires)':>32}  next tick"
        )
    ]
    for row in rows:
        if "error" in row:
            lines.append(f"{row['name']:<24} {row['error']} ({row['task']})")
            continue
        late = row["lateness_ms"]
        samples = row["lateness_samples"]
        recent = (
            f"{row['lateness_p50_ms']}/{row['lateness_p99_ms']}/"
            f"{row['lateness_max_ms']} ms (of {samples})"
            if samples
            else "- (of 0)"
        )
        # A catch-up or skipped tick's delay is no lateness: its kind is shown.
        last = f"{late} ms" if late is not None else row["last_fire"] or "-"
        lines.append(
            f"{row['name']:<24} {row['last_tick'] or '-':<26} {last:>9} "
            f"{row['catch_up_fires']:>8} {recent:>32}  {row['next_tick']}"
        )
    return lines


def _worker_lines(state: dict[str, Any]) -> list[str]:
    by_group = ", ".join(f"{group} {n}" for group, n in sorted(state["worker_counts"].items()))
    lines = [f"workers: {len(state['workers'])} (by group: {by_group})"]
    for group, count in sorted(state["pushed"].items()):
        # Queued, and not on a queue yet: the next take of one of its workers places them.
        lines.append(f"  group {group}: {count} task(s) pushed, to be placed by a worker's take")
    for worker in state["workers"]:
        running = ", ".join(f"{task['task']} {task['id']}" for task in worker["running"])
        done = "" if worker.get("done") is None else f"  {worker['done']} done"
        lines.append(
            f"  {worker['id']}  queues {','.join(worker['queues'])}  "
            f"{'running ' + running if running else 'idle'}{done}  "
            f"heartbeat {worker['last_heartbeat_age']:.0f} s ago"
        )
    return lines
