"""The SDK client's flow, without daemons: ``room`` at once while the send window has
room and a clear timeout while it stays full; a batch of deliveries queued with one
wake-up, read from the routers paused once the queue is full, and not after the end."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from ecast.core.endpoint import Delivery, EndpointParams, Terminated
from ecast.core.message import Message
from ecast.sdk import Client


class _Runtime:
    def __init__(self) -> None:
        self.paused: list[bool] = []

    def pause_reading(self, paused: bool, peers: Any) -> None:
        self.paused.append(paused)


def _client(queue_size: int = 100) -> Any:
    return Client("client:x", _Runtime(), EndpointParams(), None, queue_size)  # type: ignore[arg-type]


def _delivery(t: int, sender: str = "client:y", header: Any = None) -> Delivery:
    return Delivery(t, Message(sender, (("s", 0, ""), t), header, b""))


async def test_room_now_returns_without_a_task_or_a_timer() -> None:
    c = _client()
    c.endpoint = SimpleNamespace(queued=[])
    loop = asyncio.get_running_loop()
    tasks = len(asyncio.all_tasks())
    timers = len(loop._scheduled)  # type: ignore[attr-defined]
    await c.room(0.0)  # no time to wait, and none needed
    await c.room(None)
    assert len(asyncio.all_tasks()) == tasks
    assert len(loop._scheduled) == timers  # type: ignore[attr-defined]


async def test_a_full_window_times_out_naming_it_and_room_ends_the_wait() -> None:
    c = _client()
    c.endpoint = ep = SimpleNamespace(queued=[1])
    with pytest.raises(TimeoutError, match="no room in the send window"):
        await c.room(0.05)
    waiting = asyncio.ensure_future(c.room(5.0))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    ep.queued = []
    c._space.set()
    await asyncio.wait_for(waiting, 1.0)


async def test_a_batch_of_deliveries_is_queued_in_order_with_one_wakeup() -> None:
    c = _client()
    woken = []
    c._queued = type("E", (), {"set": lambda self: woken.append(1)})()
    batch = [_delivery(t) for t in range(1, 6)]
    join = _delivery(6, "client:z", {"kind": "join"})
    c._on_upcalls(None, [*batch, join])
    assert list(c._queue) == [*batch, join] and c.received == 6
    assert woken == [1]
    assert "client:z" in c._members  # membership still tracked per delivery


async def test_a_full_queue_pauses_the_routers_and_an_ended_one_does_not() -> None:
    c = _client(queue_size=3)
    c._on_upcalls(None, [_delivery(t) for t in range(1, 4)])
    assert c.runtime.paused == [True]
    ended = _client(queue_size=2)
    ended._on_upcalls(None, [_delivery(1), Terminated("closed")])
    assert ended.runtime.paused == []  # the queue's end marker is no delivery to read
    assert list(ended._queue)[-1] is None
