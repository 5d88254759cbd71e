"""The SDK's basic reads against real storage cores (the in-memory model), with a
reconfiguration landing between the parts of one read."""

from __future__ import annotations

import asyncio
from typing import Any

from rubberband.client import ClientCore
from rubberband.sdk import RubberbandClient
from storage_adapters.memory import KVOps
from tests.rubberband_model import Model


class _Wire:
    """Stands in for the E-Cast client: basic reads go straight to the model's storage
    cores; the first target asked in each round answers at once, the others 20 ms later.
    After the very first answer the keyspace changes (an expand), so the rest of the
    first round finds the client's keyspace stale."""

    def __init__(self, m: Model) -> None:
        self.m = m
        self.inbox: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.rounds: list[list[str]] = []
        self._last_rid: Any = None

    def send_direct_nowait(self, target: str, payload: Any) -> None:
        rid = payload[1]
        if rid != self._last_rid:
            self.rounds.append([])
            self._last_rid = rid
        first = not self.rounds[-1]
        self.rounds[-1].append(target)
        outs = self.m.storage[target].direct("client:c", payload)
        loop = asyncio.get_running_loop()
        for o in outs:
            if first:
                self.inbox.put_nowait((target, o[2]))
            else:
                loop.call_later(0.02, self.inbox.put_nowait, (target, o[2]))
        if len(self.rounds) == 1 and first:
            self.m.join_storage("storage:4")
            self.m.reconfigure(("expand", "storage:4", 350))
            self.m.settle()

    async def receive_direct(self) -> tuple[str, Any]:
        return await self.inbox.get()

    def peers(self) -> list[str]:
        return []

    async def detach(self) -> None:
        return None


def test_a_basic_read_across_a_keyspace_change_returns_every_key() -> None:
    """Parts answered under two keyspace versions are not one read: the SDK starts the
    read again under the newer keyspace instead of returning the parts it has (it used
    to return a read missing the keys whose answers had not arrived yet)."""
    m = Model(f=3)
    for i in range(4):
        m.join_storage(f"storage:{i}")
        m.reconfigure(("expand", f"storage:{i}", i * 100))
        m.settle()
    keys = [10, 110, 210, 310, 360]
    for k in keys:
        m.write(("put", ((k, f"v{k}"),)))
    m.settle()

    async def go() -> dict[Any, Any]:
        core = ClientCore(KVOps())
        core.learn(m.config.version, m.config.keyspace.to_state())
        wire = _Wire(m)
        rb = RubberbandClient(wire, core, answer_timeout=0.3)  # type: ignore[arg-type]
        try:
            return dict(await rb.get_many(keys, isolation="basic"))
        finally:
            await rb.close()

    got = asyncio.run(go())
    assert got == {k: f"v{k}" for k in keys}
