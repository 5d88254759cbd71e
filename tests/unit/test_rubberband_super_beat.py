"""A super's failure detector does not blame others for its own stall."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

from rubberband.host import PING, PONG, SuperHost
from rubberband.super import SuperCore


class _Peers:
    """Every storage process answers a ping at once (the next loop turn)."""

    def __init__(self) -> None:
        self.host: SuperHost | None = None
        self.suspected: list[str] = []

    def send_direct_nowait(self, p: str, payload: Any) -> None:
        if payload[0] == PING and self.host is not None:
            asyncio.get_running_loop().call_soon(self.host._direct, p, (PONG, payload[1]))

    async def suspect(self, who: list[str], timeout: Any = None) -> None:
        self.suspected += who


def _host(peers: _Peers) -> SuperHost:
    core = SuperCore("super:s1")
    core.config = SimpleNamespace(  # type: ignore[assignment]
        storage=lambda: frozenset({"storage:1", "storage:2"}),
        supers=lambda: frozenset({"super:s1"}),
    )
    host = SuperHost(peers, core, heartbeat=0.05, suspect_after=0.3)  # type: ignore[arg-type]
    peers.host = host
    host.joined.set()
    return host


def test_a_super_that_stalled_votes_against_nobody() -> None:
    async def go() -> _Peers:
        peers = _Peers()
        host = _host(peers)
        beat = asyncio.ensure_future(host._beat())
        await asyncio.sleep(0.2)
        time.sleep(1.0)  # the super's own loop stalls, everyone else answers on time
        await asyncio.sleep(0.3)
        host.stopped = "done"
        await beat
        return peers

    peers = asyncio.run(go())
    assert peers.suspected == []


def test_a_silent_storage_process_is_still_voted_against() -> None:
    async def go() -> tuple[_Peers, SuperHost]:
        peers = _Peers()
        host = _host(peers)
        orig = peers.send_direct_nowait

        def mute(p: str, payload: Any) -> None:
            if p != "storage:2":  # storage:2 never answers
                orig(p, payload)

        peers.send_direct_nowait = mute  # type: ignore[method-assign]
        beat = asyncio.ensure_future(host._beat())
        await asyncio.sleep(0.8)
        host.stopped = "done"
        await beat
        await asyncio.sleep(0)
        return peers, host

    _peers, host = asyncio.run(go())
    assert host.voted == {"storage:2"}
