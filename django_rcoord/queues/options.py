"""How the worker runs a task: its retries, the waits between them, its time limit."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from django_rcoord.conf import conf
from django_rcoord.validation import is_number


@dataclass(frozen=True)
class RunOptions:
    """A task's run options. None takes the setting's value at run time (so
    ``override_settings`` and a changed ``RCOORD`` apply): ``TASK_TIMEOUT``,
    ``TASK_RETRY_BACKOFF``, ``TASK_RETRY_BACKOFF_MAX``, ``TASK_RETRY_JITTER``.

    ``max_retries`` counts retries after the first attempt. ``timeout`` is in seconds; 0
    means no limit even where ``TASK_TIMEOUT`` sets one. Retry n waits ``retry_backoff *
    2 ** (n - 1)`` seconds, at most ``retry_backoff_max``, shortened by a random share of
    up to ``retry_jitter`` (0 to 1).

    ``rate`` (``"100/m"``: per ``s``, ``m``, ``h`` or ``d``) and ``concurrency`` (runs at
    once) limit the task across every worker; tasks that give the same ``limit_key`` share
    their limits (default: each task its own, by name). ``rate_per_key`` limits the runs of
    each fair key (a task's ``fair_key``) the same way, each key in its own window."""

    max_retries: int = 3
    timeout: float | None = None
    retry_backoff: float | None = None
    retry_backoff_max: float | None = None
    retry_jitter: float | None = None
    rate: str | None = None
    concurrency: int | None = None
    limit_key: str | None = None
    rate_per_key: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.max_retries, int) or isinstance(self.max_retries, bool):
            raise ValueError("max_retries must be an int >= 0")
        if self.max_retries < 0:
            raise ValueError("max_retries must be an int >= 0")
        for name in ("timeout", "retry_backoff", "retry_backoff_max"):
            value = getattr(self, name)
            if value is not None and (not is_number(value) or value < 0):
                raise ValueError(f"{name} must be a number of seconds >= 0, or None")
        jitter = self.retry_jitter
        if jitter is not None and (not is_number(jitter) or not 0 <= jitter <= 1):
            raise ValueError("retry_jitter must be a number from 0 to 1, or None")
        for rate in (self.rate, self.rate_per_key):
            if rate is not None:
                parse_rate(rate)
        concurrency = self.concurrency
        if concurrency is not None and (
            not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1
        ):
            raise ValueError("concurrency must be an int >= 1, or None")
        if self.limit_key is not None and (
            not isinstance(self.limit_key, str) or not self.limit_key
        ):
            raise ValueError("limit_key must be a non-empty str, or None")

    @property
    def time_limit(self) -> float | None:
        """Seconds the task may run, or None for no limit."""
        limit = conf.TASK_TIMEOUT if self.timeout is None else self.timeout
        return float(limit) if limit else None

    def retry_delay_ms(self, earlier: int) -> int:
        """The wait before the next try of a task tried ``earlier`` times before, in ms."""
        backoff = conf.TASK_RETRY_BACKOFF if self.retry_backoff is None else self.retry_backoff
        cap = (
            conf.TASK_RETRY_BACKOFF_MAX
            if self.retry_backoff_max is None
            else self.retry_backoff_max
        )
        jitter = conf.TASK_RETRY_JITTER if self.retry_jitter is None else self.retry_jitter
        delay = min(backoff * 2**earlier, cap)
        if jitter:
            delay *= 1 - random.random() * jitter
        return int(delay * 1000)


_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*)\s*([smhd])\s*$")
_PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_rate(rate: str) -> tuple[int, float]:
    """``"100/m"`` -> (100, 60.0); ``"5/10s"`` -> (5, 10.0). ValueError for anything else."""
    match = _RATE.match(rate) if isinstance(rate, str) else None
    if match is None or int(match[1]) < 1:
        raise ValueError(
            f"rate must look like '100/m' (runs per s, m, h or d; '5/10s' for 5 per 10 s), "
            f"not {rate!r}"
        )
    return int(match[1]), float(int(match[2] or 1) * _PERIODS[match[3]])


#: The options of a task that says nothing: every value from the settings.
DEFAULT_OPTIONS = RunOptions()
