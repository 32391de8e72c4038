"""What every benchmark shares: one real Redis on loopback, Django configured, timing."""

from __future__ import annotations

import argparse
import datetime
import platform
import socket
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import django
import redis
from django.conf import settings

from django_rcoord.embedded import EmbeddedRedis


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_redis() -> EmbeddedRedis:
    """A fresh embedded redis-server on a loopback TCP port (stop it when done)."""
    server = EmbeddedRedis(tempfile.mkdtemp(prefix="rcoord-bench-"), port=free_port())
    return server.start()


def configure_django(url: str) -> None:
    if not settings.configured:
        settings.configure(
            INSTALLED_APPS=["django_rcoord"],
            CACHES={"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": url}},
            RCOORD={"CONNECTION": "default"},
        )
        django.setup()


@dataclass
class Measurement:
    name: str
    round_trips: str
    rates: list[float]  # operations per second, one per repeat

    @property
    def median(self) -> float:
        return statistics.median(self.rates)

    @property
    def spread(self) -> float:
        """(max - min) / median, as a fraction."""
        return (max(self.rates) - min(self.rates)) / self.median if self.median else 0.0


def measure(
    name: str, round_trips: str, operation: Callable[[], object], *, count: int, repeats: int
) -> Measurement:
    """Run ``operation`` ``count`` times per repeat; record operations per second."""
    for _ in range(min(count, 200)):  # warm up connections and script caches
        operation()
    rates = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(count):
            operation()
        rates.append(count / (time.perf_counter() - started))
    return Measurement(name, round_trips, rates)


def describe_machine(client: redis.Redis) -> str:
    info = client.info("server")
    return (
        f"Redis {info['redis_version']} on loopback TCP, Python {platform.python_version()}, "
        f"{platform.machine()}, {platform.system()}"
    )


def print_table(title: str, rows: list[Measurement], baseline: Measurement) -> None:
    print(f"\n{title}")
    header = f"{'':<34} {'round trips':>12} {'ops/s (median)':>15} {'spread':>8} {'vs floor':>9}"
    print(header)
    print("-" * len(header))
    for row in rows:
        print(
            f"{row.name:<34} {row.round_trips:>12} {row.median:>15,.0f} "
            f"{row.spread:>7.0%} {row.median / baseline.median:>8.2f}x"
        )


def two_pings(client: redis.Redis, *, count: int, repeats: int) -> Measurement:
    """The floor for a two-round-trip operation, measured beside it."""

    def ping_twice() -> None:
        client.ping()
        client.ping()

    return measure("2 x PING (the floor)", "2", ping_twice, count=count, repeats=repeats)


def run_benchmark(description: str, scenario: Callable[[Any, int, int], None]) -> None:
    """Parse --count/--repeats, start Redis, configure Django, run ``scenario(client, count,
    repeats)``, stop Redis."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--count", type=int, default=3000, help="operations per repeat")
    parser.add_argument("--repeats", type=int, default=5)
    options = parser.parse_args()
    server = start_redis()
    try:
        configure_django(server.url)
        from django_rcoord.connection import get_client

        client = get_client()
        print(f"{datetime.date.today()}: {describe_machine(client)}")
        scenario(client, options.count, options.repeats)
    finally:
        server.stop()
