"""Redis Cluster: keys of different names spread over the primaries, while every
key of one primitive (lock, semaphore, guild, queue group) shares one hash slot.

Runs in both CI steps: on the suite's cluster with ``RCOORD_TEST_CLUSTER=1``,
otherwise on a 3-master cluster this module starts.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

import pytest
from redis.cluster import RedisCluster

from django_rcoord.autocomplete import autocomplete_on_prefix, join_guild
from django_rcoord.connection import get_client
from django_rcoord.embedded import EmbeddedCluster
from django_rcoord.keys import decode_name
from django_rcoord.locks import Lock
from django_rcoord.queues import execute_later, queue_stats
from django_rcoord.queues.keys import DEFAULT_GROUP, QueueKeys
from django_rcoord.queues.records import known_groups
from django_rcoord.semaphores import Semaphore
from tests import cluster

NAMES = [f"n{index}" for index in range(24)]


@pytest.fixture(scope="module")
def cluster_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    if cluster.ENABLED:
        yield get_client()
        return
    server = EmbeddedCluster(tmp_path_factory.mktemp("cluster")).start()
    client = server.client()
    try:
        yield client
    finally:
        client.close()
        server.stop()


@pytest.fixture
def cc(cluster_client: RedisCluster) -> RedisCluster:
    cluster_client.flushall()
    return cluster_client


def keys_by_primary(client: RedisCluster) -> dict[str, list[bytes]]:
    """Every key, listed on the primary that holds it."""
    return {
        node.name: list(client.get_redis_connection(node).scan_iter(count=1000))
        for node in client.get_primaries()
    }


def test_primitives_spread_over_the_primaries_each_in_one_slot(cc: RedisCluster) -> None:
    held = []
    for name in NAMES:
        join_guild(f"guild-{name}", "Ada", client=cc)
        lock = Lock(f"lock-{name}", client=cc)
        assert lock.acquire()
        held.append(lock)
        assert Semaphore(f"sem-{name}", 2, client=cc).acquire() is not None
        execute_later(f"group-{name}/mail", "tests.tasks.record", ["x"], client=cc)
        execute_later(f"group-{name}/mail", "tests.tasks.record", ["y"], delay=60, client=cc)

    # kind -> primitive name -> the slots and primaries its keys are on
    slots: dict[str, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
    primaries: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    key_count: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for primary, keys in keys_by_primary(cc).items():
        for key in keys:
            prefix, kind, tagged, _part = key.decode().split(":", 3)
            assert prefix == "rcoord"
            assert tagged.startswith("{")
            assert tagged.endswith("}")
            name = decode_name(tagged[1:-1])
            slots[kind][name].add(cc.keyslot(key))
            primaries[kind][name].add(primary)
            key_count[kind][name] += 1

    # The registry of queue groups pollers read is one instance, in one slot.
    registry = slots.pop("queues")
    assert list(registry) == ["registry"]
    assert len(registry["registry"]) == 1
    assert set(slots) == {"guild", "lock", "semaphore", "queue"}
    for kind, by_name in slots.items():
        assert len(by_name) == len(NAMES), kind
        for name, name_slots in by_name.items():
            assert len(name_slots) == 1, (kind, name, name_slots)  # one slot per primitive
        spread = set().union(*primaries[kind].values())
        assert len(spread) > 1, (kind, spread)  # different names, different primaries
    # The multi-key primitives really have several keys in that one slot...
    assert min(key_count["lock"].values()) >= 2
    assert min(key_count["queue"].values()) >= 4
    # ...and so do the keys their scripts may write later (waiters, signals, dead letters).
    semaphore, lock = Semaphore("sem-n0", 2, client=cc), held[0]
    declared = {
        # Every key an instance's scripts may touch (its KEY_PARTS, built once per name).
        "semaphore": [key.decode() for key in semaphore._keys],
        "lock": [key.decode() for key in lock._keys],
        "queue": [
            value
            for value in vars(QueueKeys.of("group-n0/mail")).values()
            if isinstance(value, str) and value.startswith("rcoord:")
        ],
    }
    for kind, names in declared.items():
        assert len(names) >= 3, kind
        assert len({cc.keyslot(key) for key in names}) == 1, (kind, names)

    # And they work there: reads, queue inspection across every primary.
    assert autocomplete_on_prefix("guild-n3", "a", client=cc) == ["Ada"]
    assert queue_stats("group-n5/mail", client=cc)["ready"] == 1
    assert queue_stats("group-n5/mail", client=cc)["delayed"] == 1
    assert set(known_groups(client=cc)) == {DEFAULT_GROUP} | {f"group-{name}" for name in NAMES}
    for lock in held:
        lock.release()


def test_a_lock_on_the_cluster_excludes_and_hands_over(cc: RedisCluster) -> None:
    first = Lock("shared", timeout=5, client=cc)
    second = Lock("shared", timeout=5, client=cc)
    assert first.acquire(wait=0)
    first_token = first.token
    assert first_token is not None
    assert not second.acquire(wait=0)
    first.release()
    assert second.acquire(wait=1)
    assert second.token == first_token + 1
    second.release()
