"""The SDK drives the client core: futures, outcomes per write, the timer, the backlog
of submissions, closing.  Its E-Cast client here is a stand-in over the storage-core
model (``tests/unit/test_rubberband_client.py`` checks the core's decisions)."""

from __future__ import annotations

import asyncio
import itertools
import time
from types import SimpleNamespace
from typing import Any

import msgpack
import pytest

import ecast
from ecast import Message
from rubberband.client import ClientCore
from rubberband.engine import BadOperation
from rubberband.errors import Indeterminate, Rejected, Unavailable
from rubberband.proto import Describe, Described, H
from rubberband.sdk import RubberbandClient
from storage_adapters.memory import KVOps
from tests.rubberband_model import SUPER, Model


class FakeEcast:
    """E-Cast's client as the SDK uses it, over the model: a safe message goes through
    the order, then its ack (delivered when a live holder took it) and any answers come
    back on later loop turns; unsafe messages reach the holders at once.  Messages
    numbered in ``undelivered`` are acknowledged as delivered nowhere, in ``lost`` never
    acknowledged; answers to those in ``unanswered`` never arrive."""

    name = "client:c"

    def __init__(self, m: Model, ack_timeout: float | None = 30.0, max_queued: int = 10_000):
        self.m = m
        self.ack_timeout = ack_timeout
        self.max_queued = max_queued
        self.endpoint = SimpleNamespace(queued=[])
        self.sent: list[tuple[Any, Any]] = []
        self.undelivered: set[int] = set()
        self.lost: set[int] = set()
        self.unanswered: set[int] = set()
        self.direct_batch_listener: Any = None
        self.ack_listener: Any = None
        self.shed_listener: Any = None
        self.reject_listener: Any = None
        self.detached = False
        self._room = asyncio.Event()
        self._room.set()

    # what the SDK calls
    def submit_batch(self, items: list[tuple[Any, Any]]) -> list[Any]:
        if len(self.endpoint.queued) + len(items) > self.max_queued:
            raise ecast.Backpressure("no room")
        return [self._submit(payload, header) for payload, header in items]

    def submit_unsafe_nowait(self, items: list[tuple[Any, Any]]) -> list[Any]:
        m = self.m
        ids = []
        for payload, header in items:
            mid = (("u", 0, self.name), next(m.seq))
            msg = Message(self.name, mid, header, payload)
            for d in sorted(m.config.destset(msg)):
                m._outputs(d, m.storage[d].deliver_unsafe(msg, m.t, True))
            ids.append(mid)
        self._answers(None)
        return ids

    def _submit(self, payload: Any, header: Any) -> Any:
        n = len(self.sent)
        self.sent.append((payload, header))
        self.endpoint.queued.append(n)
        mid = ("m", n)
        loop = asyncio.get_running_loop()
        if n in self.lost:
            return mid
        dests = self.m.submit(self.name, dict(header), payload)
        self.m.settle()
        self._answers(n)
        ack = SimpleNamespace(id=mid, delivered=bool(dests) and n not in self.undelivered)
        loop.call_soon(self._acked, n, ack)
        return mid

    def _acked(self, n: int, ack: Any) -> None:
        self.endpoint.queued.remove(n)
        self.ack_listener([ack])

    def _answers(self, n: int | None) -> None:
        loop = asyncio.get_running_loop()
        mine = [(src, msg) for src, dst, msg in self.m.to_clients if dst == self.name]
        self.m.to_clients.clear()
        if n is not None and n in self.unanswered:
            return
        # (a peer's answers in a row come in one batch, as a frame carries them)
        for src, run in itertools.groupby(mine, key=lambda pair: pair[0]):
            loop.call_soon(self.direct_batch_listener, src, [msg for _, msg in run])

    def send_direct_nowait(self, dst: str, payload: Any) -> None:
        loop = asyncio.get_running_loop()
        if dst == SUPER and type(payload) is Describe:
            c = self.m.config
            answer = Described(payload.request, c.version, c.keyspace.to_state(), "range")
            loop.call_soon(self.direct_batch_listener, SUPER, [answer])
            return
        self.m._outputs(dst, self.m.storage[dst].on_direct(self.name, payload))
        self._answers(None)

    async def room(self, timeout: float | None = -1.0) -> None:
        while len(self.endpoint.queued) >= self.max_queued:
            await asyncio.sleep(0.01)

    def peers(self) -> list[str]:
        return [SUPER]

    async def detach(self, timeout: float = 10.0) -> None:
        self.detached = True


def _grown() -> Model:
    m = Model(f=3).ring_of(5)
    m.write(("put", ((7, "not a list"),)))
    return m


async def _client(wire: FakeEcast, answer_timeout: float = 30.0) -> RubberbandClient:
    """A client over ``wire``.  Its timeouts (and the fake's ack timeout) are long unless a
    test is about one firing: the unit tests run at the lowest priority beside the
    integration tests in CI, where this process can go without a core for a second, and a
    read once "failed at every replica" there at a 0.2 s default."""
    ack = wire.ack_timeout if wire.ack_timeout is not None else 3600.0
    core = ClientCore(KVOps(), answer_timeout=answer_timeout, write_timeout=ack)
    rb = RubberbandClient(wire, core)  # type: ignore[arg-type]
    await rb.refresh(2.0)
    return rb


def _run(
    m: Model, wire: FakeEcast, ops: list[Any], answer_timeout: float = 30.0, **kw: Any
) -> list[Any]:
    async def go() -> list[Any]:
        rb = await _client(wire, answer_timeout)
        try:
            return await rb.write_batch(ops, **kw)
        finally:
            assert rb.core.writes == {} and rb._done == {}  # nothing kept once returned
            await rb.close()

    return asyncio.run(go())


def test_calls_complete_through_the_core_at_every_isolation_level() -> None:
    m = _grown()

    async def go() -> list[Any]:
        rb = await _client(FakeEcast(m))
        try:
            await rb.put_many({1: "a", 150: "b"})
            await rb.append(2, "x")
            with pytest.raises(Rejected):
                await rb.append(7, "y")
            got = [await rb.get_many([1, 150, 2], isolation=level) for level in
                   ("sequential", "snapshot", "basic")]  # fmt: skip
            got.append(await rb.scan(0, 200, isolation="snapshot"))
            return got
        finally:
            await rb.close()

    *reads, scan = asyncio.run(go())
    assert reads == [{1: "a", 150: "b", 2: ["x"]}] * 3
    assert [k for k, _ in scan] == [1, 2, 7, 150]


def test_write_batch_bundles_by_segment_and_reports_each_write() -> None:
    m = _grown()
    wire = FakeEcast(m)
    ops: list[Any] = [("put", ((k, f"v{k}"),)) for k in range(0, 500, 3)]
    ops += [("put", ((3, "again"),)), ("append", ((7, "x"),)), ("append", ((8, "y"),))]
    ops += [("delete", (9,)), ("put", ((99, 1), (101, 2)))]
    outcomes = _run(m, wire, ops, bundle=16)
    assert len(outcomes) == len(ops)
    rejected = ops.index(("append", ((7, "x"),)))
    assert isinstance(outcomes[rejected], Rejected) and "append to 7" in str(outcomes[rejected])
    assert all(o is None for i, o in enumerate(outcomes) if i != rejected)
    bundles = [(p, h) for p, h in wire.sent if H.COUNT in h]
    counts = [len(msgpack.unpackb(p)) for p, _ in bundles]
    alone = [p for p, h in wire.sent if H.COUNT not in h]
    assert max(counts) == 16 and sum(counts) + len(alone) == len(ops)
    assert ("append", ((7, "x"),)) in alone and ("put", ((99, 1), (101, 2))) in alone
    assert len(wire.sent) < len(ops) / 4
    for op in ops:  # in batch order; the reference skips the rejected append too
        m.expect(op)
    assert m.reference[3] == "again" and 9 not in m.reference
    assert m.replica_violations() == []


@pytest.mark.exclusive  # the lost and unanswered time out; a starved process times out all
def test_write_batch_reports_undelivered_lost_and_unanswered_messages_alone() -> None:
    m = _grown()
    wire = FakeEcast(m, ack_timeout=0.3)
    ops: list[Any] = [("put", ((k, k),)) for k in (10, 11, 150, 151, 250)]
    ops += [("append", ((300, 1),)), ("append", ((301, 1),))]
    # Messages in order: the append (alone) closes the bundles before it.
    wire.undelivered.add(0)
    wire.lost.add(1)
    wire.unanswered.add(4)
    outcomes = _run(m, wire, ops, answer_timeout=0.2, bundle=8)
    sent = [msgpack.unpackb(p) if H.COUNT in h else [p] for p, h in wire.sent]
    assert [len(s) for s in sent] == [2, 2, 1, 1, 1]
    kinds = [type(o).__name__ for o in outcomes]
    assert kinds == [
        "Unavailable", "Unavailable", "Indeterminate", "Indeterminate", "NoneType",
        "NoneType", "Indeterminate",
    ]  # fmt: skip
    assert isinstance(outcomes[0], Unavailable) and isinstance(outcomes[6], TimeoutError)
    assert "not stable" in str(outcomes[2]) and "no holder answered" in str(outcomes[6])


def test_a_bad_op_raises_before_anything_is_sent() -> None:
    m = _grown()
    wire = FakeEcast(m)
    with pytest.raises(BadOperation):
        _run(m, wire, [("put", ((1, 1),)), ("get", (1,))])
    assert wire.sent == []
    outcomes = _run(m, wire, [("put", ((k, k),)) for k in range(30)], bundle=1)
    assert outcomes == [None] * 30 and len(wire.sent) == 30
    assert all(H.COUNT not in h for _, h in wire.sent)


@pytest.mark.exclusive  # a wall-clock bound: a starved process would miss it
def test_a_batch_nobody_acknowledges_times_out_once_not_per_message() -> None:
    m = _grown()
    wire = FakeEcast(m, ack_timeout=0.3)
    wire.lost.update(range(100))
    ops = [("put", ((k, k),)) for k in range(0, 500, 5)]  # five segments: many messages
    t0 = time.monotonic()
    outcomes = _run(m, wire, ops, bundle=4, timeout=0.3)
    assert len(wire.sent) >= 20
    assert all(isinstance(o, Indeterminate) for o in outcomes)
    assert time.monotonic() - t0 < 1.5  # one timeout for all, not 0.3 s per message


def test_a_client_without_an_ack_timeout_waits_for_every_acknowledgement() -> None:
    # ``ack_timeout=None`` (wait for ever) is the E-Cast client's own setting; the batch's
    # single deadline must not turn it into arithmetic on None.
    m = _grown()
    wire = FakeEcast(m, ack_timeout=None)
    outcomes = _run(m, wire, [("put", ((k, k),)) for k in range(0, 500, 5)], bundle=4)
    assert outcomes == [None] * 100 and len(wire.sent) >= 20


def test_submissions_beyond_e_casts_queue_wait_in_order_and_all_complete() -> None:
    m = _grown()
    wire = FakeEcast(m, max_queued=3)
    ops = [("put", ((k, k),)) for k in range(0, 500, 5)]
    outcomes = _run(m, wire, ops, bundle=1)
    assert outcomes == [None] * 100
    assert [p for p, _ in wire.sent] == ops  # in the batch's order


def test_close_fails_what_still_waits_and_detaches() -> None:
    m = _grown()
    wire = FakeEcast(m)
    wire.lost.update(range(10))

    async def go() -> BaseException:
        rb = await _client(wire)
        pending = asyncio.ensure_future(rb.put(1, "x"))
        await asyncio.sleep(0.05)
        await rb.close()
        try:
            await pending
        except BaseException as e:
            return e
        raise AssertionError("the write completed")

    assert isinstance(asyncio.run(go()), ecast.ClosedError) and wire.detached
