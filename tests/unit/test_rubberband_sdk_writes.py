"""The SDK's ``write_batch`` against real storage cores (the in-memory model): one
outcome per write, bundles by segment, each key's writes in batch order."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import msgpack
import pytest

from rubberband.client import ClientCore, Indeterminate, Rejected, Unavailable
from rubberband.sdk import RubberbandClient
from storage_adapters.base import BadOperation
from storage_adapters.memory import KVOps
from tests.rubberband_model import Model


class _WriteWire:
    """Stands in for the E-Cast client of ``write_batch``: each message goes through the
    model's order at once; its ack says delivered when it had destinations, unless the
    message is one of ``undelivered``; messages in ``lost`` are never acknowledged, and
    holders' answers in ``unanswered`` never arrive."""

    ack_timeout = 0.3

    def __init__(self, m: Model) -> None:
        self.m = m
        self.inbox: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.sent: list[tuple[Any, Any]] = []
        self.undelivered: set[int] = set()
        self.lost: set[int] = set()
        self.unanswered: set[int] = set()
        self.shed_listener: Any = None

    async def enqueue(self, payload: Any, header: Any, timeout: float | None = -1.0) -> Any:
        n = len(self.sent)
        self.sent.append((payload, header))
        fut = asyncio.get_running_loop().create_future()
        if n in self.lost:
            return fut
        dests = self.m.submit("client:c", dict(header), payload)
        self.m.settle()
        fut.set_result(SimpleNamespace(delivered=bool(dests) and n not in self.undelivered))
        rid = header.get("q")
        if rid is not None and n not in self.unanswered:
            for reply in self.m.replies.pop(rid, ()):
                self.inbox.put_nowait(("storage:0", reply))
        return fut

    async def receive_direct(self) -> tuple[str, Any]:
        return await self.inbox.get()

    async def detach(self) -> None:
        return None


def _grown() -> Model:
    m = Model(f=3).ring_of(5)
    m.write(("put", ((7, "not a list"),)))
    return m


def _run(m: Model, wire: _WriteWire, ops: list[Any], **kw: Any) -> list[Any]:
    async def go() -> list[Any]:
        core = ClientCore(KVOps())
        core.learn(m.config.version, m.config.keyspace.to_state())
        rb = RubberbandClient(wire, core, answer_timeout=0.2)  # type: ignore[arg-type]
        try:
            return await rb.write_batch(ops, **kw)
        finally:
            assert rb._writes == {}  # nothing kept once the batch returned
            await rb.close()

    return asyncio.run(go())


def test_write_batch_bundles_by_segment_and_reports_each_write() -> None:
    m = _grown()
    wire = _WriteWire(m)
    ops: list[Any] = [("put", ((k, f"v{k}"),)) for k in range(0, 500, 3)]
    ops += [("put", ((3, "again"),)), ("append", ((7, "x"),)), ("append", ((8, "y"),))]
    ops += [("delete", (9,)), ("put", ((99, 1), (101, 2)))]
    outcomes = _run(m, wire, ops, bundle=16)
    assert len(outcomes) == len(ops)
    rejected = ops.index(("append", ((7, "x"),)))
    assert isinstance(outcomes[rejected], Rejected) and "append to 7" in str(outcomes[rejected])
    assert all(o is None for i, o in enumerate(outcomes) if i != rejected)
    bundles = [(p, h) for p, h in wire.sent if "n" in h]
    counts = [len(msgpack.unpackb(p)) for p, _ in bundles]
    alone = [p for p, h in wire.sent if "n" not in h]
    assert max(counts) == 16 and sum(counts) + len(alone) == len(ops)
    assert ("append", ((7, "x"),)) in alone and ("put", ((99, 1), (101, 2))) in alone
    assert len(wire.sent) < len(ops) / 4
    for op in ops:  # in batch order; the reference skips the rejected append too
        m.expect(op)
    assert m.reference[3] == "again" and 9 not in m.reference
    assert m.replica_violations() == []


def test_write_batch_reports_undelivered_lost_and_unanswered_messages_alone() -> None:
    m = _grown()
    wire = _WriteWire(m)
    ops: list[Any] = [("put", ((k, k),)) for k in (10, 11, 150, 151, 250)]
    ops += [("append", ((300, 1),)), ("append", ((301, 1),))]
    # Messages in order: the append (alone) closes the bundles before it.
    wire.undelivered.add(0)
    wire.lost.add(1)
    wire.unanswered.add(4)
    outcomes = _run(m, wire, ops, bundle=8)
    sent = [msgpack.unpackb(p) if "n" in h else [p] for p, h in wire.sent]
    assert [len(s) for s in sent] == [2, 2, 1, 1, 1]
    kinds = [type(o).__name__ for o in outcomes]
    assert kinds == [
        "Unavailable", "Unavailable", "TimeoutError", "TimeoutError", "NoneType",
        "NoneType", "Indeterminate",
    ]  # fmt: skip
    assert isinstance(outcomes[0], Unavailable) and isinstance(outcomes[6], Indeterminate)


def test_a_bad_op_raises_before_anything_is_sent() -> None:
    m = _grown()
    wire = _WriteWire(m)
    with pytest.raises(BadOperation):
        _run(m, wire, [("put", ((1, 1),)), ("get", (1,))])
    assert wire.sent == []
    outcomes = _run(m, wire, [("put", ((k, k),)) for k in range(30)], bundle=1)
    assert outcomes == [None] * 30 and len(wire.sent) == 30
    assert all("n" not in h for _, h in wire.sent)


@pytest.mark.exclusive  # a wall-clock bound: a starved process would miss it
def test_a_batch_nobody_acknowledges_times_out_once_not_per_message() -> None:
    m = _grown()
    wire = _WriteWire(m)
    wire.lost.update(range(100))
    ops = [("put", ((k, k),)) for k in range(0, 500, 5)]  # five segments: many messages
    t0 = time.monotonic()
    outcomes = _run(m, wire, ops, bundle=4, timeout=0.3)
    assert len(wire.sent) >= 20
    assert all(isinstance(o, TimeoutError) for o in outcomes)
    assert time.monotonic() - t0 < 1.5  # one timeout for all, not 0.3 s per message


def test_a_client_without_an_ack_timeout_waits_for_every_acknowledgement() -> None:
    # ``ack_timeout=None`` (wait for ever) is the E-Cast client's own setting; the batch's
    # single deadline must not turn it into arithmetic on None.
    m = _grown()
    wire = _WriteWire(m)
    wire.ack_timeout = None  # type: ignore[assignment]
    outcomes = _run(m, wire, [("put", ((k, k),)) for k in range(0, 500, 5)], bundle=4)
    assert outcomes == [None] * 100 and len(wire.sent) >= 20
