"""``Client.room``: at once while the send window has room, a clear timeout while it
stays full."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from ecast.core.endpoint import EndpointParams
from ecast.sdk import Client


def _client() -> Any:
    return Client("client:x", None, EndpointParams(), None, 100)  # type: ignore[arg-type]


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
