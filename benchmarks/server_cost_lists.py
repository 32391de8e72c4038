"""The plain lists ``server_cost`` measures beside django-rcoord, each as an enqueue and a
drain of ``count`` messages: what the server spends on them is the floor each phase of a
task is read against.

- **the floor**: ``RPUSH``, then ``LPOP``, pipelined 100 at a time: what a list costs the
  server per message when nothing is paid per request.
- **one RPUSH per round trip**: each ``RPUSH`` its own call, what any enqueue that is one
  call must pay (its drain is not measured: the book's is the same ``LPOP`` by one call).
- **the book's queue** ("Redis in Action" 6.4.1): ``RPUSH`` a JSON message to enqueue,
  ``BLPOP`` to take it, one call each, as its worker runs them.
- **the reliable list** (the pattern of Redis's ``LMOVE`` page): ``LPUSH`` to enqueue,
  ``BLMOVE`` into a processing list to take, ``LREM`` from it once done: three calls.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

FLOOR_BATCH = 100
#: The keys; the reliable list's two share a hash tag (one slot: ``BLMOVE`` on a cluster).
FLOOR, ONE_CALL, BOOK = "cost:floor", "cost:one-call", "cost:book"
RELIABLE, PROCESSING = "cost:{reliable}:queue", "cost:{reliable}:processing"
#: The longest a blocking take waits: the list is full, so it never should.
BLOCK_S = 1

Work = Callable[[], None]


def message(number: int) -> str:
    """A message like the book's e-mail queue's (its ``send_sold_email_via_queue``), each
    one different (the reliable list's ``LREM`` finds a message by its value)."""
    return json.dumps(
        {"id": number, "seller_id": 17, "item_id": "ItemM", "price": 97, "buyer_id": 27}
    )


def patterns(client: Any, count: int) -> dict[str, tuple[Work, Work | None]]:
    """Each pattern's enqueue and drain of ``count`` messages (``None``: not measured)."""
    messages = [message(number) for number in range(count)]
    return {
        "floor": (
            _pipelined(client, count, lambda pipe: pipe.rpush(FLOOR, b"x" * 40)),
            _pipelined(client, count, lambda pipe: pipe.lpop(FLOOR)),
        ),
        "one call": (lambda: _each(count, lambda _: client.rpush(ONE_CALL, b"x" * 40)), None),
        "book": (
            lambda: _each(count, lambda number: client.rpush(BOOK, messages[number])),
            lambda: _each(count, lambda _: _taken(client.blpop([BOOK], BLOCK_S))),
        ),
        "reliable": (
            lambda: _each(count, lambda number: client.lpush(RELIABLE, messages[number])),
            lambda: _each(count, lambda _: _reliable_take(client)),
        ),
    }


def _pipelined(client: Any, count: int, command: Callable[[Any], object]) -> Work:
    def work() -> None:
        for start in range(0, count, FLOOR_BATCH):
            with client.pipeline(transaction=False) as pipe:
                for _ in range(min(FLOOR_BATCH, count - start)):
                    command(pipe)
                pipe.execute()

    return work


def _each(count: int, call: Callable[[int], object]) -> None:
    """``call`` once per message, each its own round trip, back to back."""
    for number in range(count):
        call(number)


def _taken(reply: Any) -> Any:
    if reply is None:
        raise RuntimeError("a full list had nothing to take")
    return reply


def _reliable_take(client: Any) -> None:
    taken = _taken(client.blmove(RELIABLE, PROCESSING, BLOCK_S, "RIGHT", "LEFT"))
    # ... the message is handled here; then acknowledged:
    client.lrem(PROCESSING, 1, taken)
