"""The SDK's basic reads against real storage cores (the in-memory model), with a
reconfiguration landing between the parts of one read."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import pytest

import ecast
from rubberband.client import ClientCore
from rubberband.sdk import RubberbandClient
from storage_adapters.memory import KVOps
from tests.rubberband_model import Model


def _client(m: Model, wire: Any, answer_timeout: float) -> RubberbandClient:
    """A client over ``wire`` (a stand-in for the E-Cast client) that knows the model's
    keyspace."""
    core = ClientCore(KVOps())
    core.learn(m.config.version, m.config.keyspace.to_state())
    return RubberbandClient(wire, core, answer_timeout=answer_timeout)


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
        if _describe(self.m, self.inbox, target, payload):
            return
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
        return ["super:s"]

    async def detach(self) -> None:
        return None


def _describe(m: Model, inbox: Any, target: str, payload: Any) -> bool:
    """A super's answer to a keyspace question (the client learns the keyspace only from
    a super: a storage process that finds its copy stale only says so)."""
    if target != "super:s":
        return False
    from rubberband.host import CONFIG

    c = m.config
    inbox.put_nowait(("super:s", (CONFIG, payload[1], c.version, c.keyspace.to_state(), "range")))
    return True


def _holder(m: Model, key: int) -> str:
    """A storage process that holds ``key``."""
    place = m.placement.ekey(key)
    ks = m.config.keyspace
    return next(p for _, p in ks.ring() if any(lo <= place < hi for lo, hi in ks.partition(p)))


def test_a_basic_read_across_a_keyspace_change_returns_every_key() -> None:
    """Parts answered under two keyspace versions are not one read: the SDK starts the
    read again under the newer keyspace instead of returning the parts it has (it used
    to return a read missing the keys whose answers had not arrived yet)."""
    m = Model(f=3).ring_of(4)
    keys = [10, 110, 210, 310, 360]
    for k in keys:
        m.write(("put", ((k, f"v{k}"),)))
    m.settle()

    async def go() -> dict[Any, Any]:
        wire = _Wire(m)
        rb = _client(m, wire, 0.3)
        try:
            return dict(await rb.get_many(keys, isolation="basic"))
        finally:
            await rb.close()

    got = asyncio.run(go())
    assert got == {k: f"v{k}" for k in keys}


class _BundleWire:
    """Stands in for the E-Cast client of ``read_batch``: unsafe messages go to the
    model's storage cores at once (unless ``silent``), their answers to the inbox."""

    def __init__(self, m: Model, silent: bool = False, hostile: bool = False) -> None:
        self.m = m
        self.silent = silent
        self.hostile = hostile
        """Before the real answers to a bundle, a malformed one from a storage process."""
        self.inbox: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.sent: list[tuple[Any, Any]] = []
        self.shed_listener: Any = None

    async def submit_unsafe_batch(self, items: list[tuple[Any, Any]]) -> list[Any]:
        from ecast import Message

        mids = []
        for payload, header in items:
            mid = (("u", 0, "client:c"), len(self.sent))
            self.sent.append((payload, header))
            mids.append(mid)
            if self.silent:
                continue
            msg = Message("client:c", mid, header, payload)
            if self.hostile:
                bad = ("resn", header["q"], 1, True, ((0, "not ranges", {}, None),))
                self.inbox.put_nowait(("storage:0", bad))
                # Whole answers with a result too many, or not a tuple of results.
                n = header.get("n", 1)
                self.inbox.put_nowait(("storage:0", ("resw", header["q"], 1, (None,) * (n + 1))))
                self.inbox.put_nowait(("storage:0", ("resw", header["q"], 1, "not results")))
            for d in sorted(self.m.config.destset(msg)):
                for o in self.m.storage[d].deliver_unsafe(msg, self.m.t, True):
                    self.inbox.put_nowait((d, o[2]))
        return mids

    async def receive_direct(self) -> tuple[str, Any]:
        return await self.inbox.get()

    async def detach(self) -> None:
        return None

    def peers(self) -> list[str]:
        return ["super:s"]

    def send_direct_nowait(self, target: str, payload: Any) -> None:
        assert _describe(self.m, self.inbox, target, payload)


def test_answers_are_taken_only_from_holders_a_newer_keyspace_learned_first() -> None:
    """An answer from a process that is no storage process is no answer; one from a
    storage process that the client's keyspace does not name as a holder waits until the
    client has asked a super for the newest keyspace, and counts if that names it."""
    from rubberband.storage import RESULT

    m = Model(f=3).ring_of(4)

    async def go() -> tuple[list[Any], int]:
        wire = _BundleWire(m, silent=True)
        rb = _client(m, wire, 5.0)
        m.join_storage("storage:4")
        m.reconfigure(("expand", "storage:4", 350))  # the client does not know yet
        m.settle()
        got: list[Any] = []
        await rb.read_batch([("get", (360,))], "snapshot", lambda op, g: got.append(g), bundle=1)
        ((_, header),) = wire.sent
        rid = header["q"]
        rb._on_direct("client:x", (RESULT, rid, None, {360: "forged"}, None, 1, True))
        rb._on_direct("storage:4", (RESULT, rid, None, {360: "real"}, None, 1, True))
        assert got == []  # set aside: the client's keyspace names other holders
        for _ in range(100):
            if got:
                break
            await asyncio.sleep(0.01)
        refused = rb.refused_answers
        await rb.close()
        return [rb.core.result(g) for g in got], refused

    got, refused = asyncio.run(go())
    assert got == [{360: "real"}] and refused == 1


def _batch_of_reads(
    silent: bool, shed: bool = False, grouped: bool = False
) -> tuple[dict[int, Any], Any, Any]:
    """200 bundled snapshot reads; what each was told.  ``grouped``: told in groups
    (``read_batch(grouped=True)``), whose sizes go to ``_groups_told``."""
    m = Model(f=3).ring_of(4)
    for k in range(0, 400, 2):
        m.write(("put", ((k, f"v{k}"),)))
    m.settle()
    got: dict[int, Any] = {}
    _groups_told.clear()

    async def go() -> tuple[Any, Any]:
        wire = _BundleWire(m, silent)
        rb = _client(m, wire, 0.3)
        all_done = asyncio.Event()

        def done(op: Any, gather: Any) -> None:
            key = op[1][0]
            assert key not in got, f"read {key} completed twice"
            got[key] = (
                "timeout"
                if gather is None
                else "refused"
                if gather.refused
                else rb.core.result(gather)
            )
            if len(got) == 200:
                all_done.set()

        def done_group(told: list[tuple[Any, Any]]) -> None:
            assert told, "an empty group"
            _groups_told.append(len(told))
            for op, gather in told:
                done(op, gather)

        ops = [("get", (k,)) for k in range(200)]
        if grouped:
            await rb.read_batch(ops, "snapshot", done_group, bundle=16, grouped=True)
        else:
            await rb.read_batch(ops, "snapshot", done, bundle=16)
        if shed:
            rb._on_shed(tuple(rb._unsafe))
        await asyncio.wait_for(all_done.wait(), 2.0)
        try:
            return wire.sent, (dict(rb._bundles), dict(rb._unsafe), dict(rb._reads))
        finally:
            await rb.close()

    sent, left = asyncio.run(go())
    return got, sent, left


_groups_told: list[int] = []


@pytest.mark.parametrize("grouped", [False, True])
def test_read_batch_bundles_reads_and_completes_each_alone(grouped: bool) -> None:
    got, sent, left = _batch_of_reads(silent=False, grouped=grouped)
    assert got == {k: ({k: f"v{k}"} if k % 2 == 0 else {}) for k in range(200)}
    # 200 reads over two segments, 16 to a message (one holder may answer both).
    counts = [len(msgpack.unpackb(p)) for p, _ in sent]
    assert all(h.get("n") == n for (_, h), n in zip(sent, counts, strict=True))
    assert sum(counts) == 200 and max(counts) == 16 and len(sent) <= 14
    assert left == ({}, {}, {})  # nothing kept once every read completed
    if grouped:  # told by answer: never more groups than answers, most of them whole
        assert sum(_groups_told) == 200 and max(_groups_told) == 16
        assert len(_groups_told) <= 3 * len(sent), _groups_told


@pytest.mark.parametrize("grouped", [False, True])
def test_a_shed_bundle_refuses_each_of_its_reads_at_once(grouped: bool) -> None:
    got, sent, left = _batch_of_reads(silent=True, shed=True, grouped=grouped)
    assert got == {k: "refused" for k in range(200)}
    assert left == ({}, {}, {})
    if grouped:  # a bundle's reads in one call
        assert sorted(_groups_told) == sorted(h["n"] for _, h in sent)


@pytest.mark.parametrize("grouped", [False, True])
def test_reads_of_a_bundle_nobody_answers_time_out_each(grouped: bool) -> None:
    got, sent, left = _batch_of_reads(silent=True, grouped=grouped)
    assert got == {k: "timeout" for k in range(200)}
    assert left == ({}, {}, {})
    if grouped:
        assert sorted(_groups_told) == sorted(h["n"] for _, h in sent)


def test_reads_with_large_operations_go_fewer_to_a_bundle() -> None:
    m = Model(f=3).ring_of(3)
    keys = [f"{i:03}" + "k" * 5000 for i in range(40)]  # one segment, 5 KB each
    for k in keys[::2]:
        m.write(("put", ((k, len(k)),)))
    m.settle()
    got: dict[str, Any] = {}

    async def go() -> list[tuple[Any, Any]]:
        wire = _BundleWire(m)
        rb = _client(m, wire, 0.3)
        finished = asyncio.Event()

        def done(op: Any, gather: Any) -> None:
            got[op[1][0]] = rb.core.result(gather)
            if len(got) == len(keys):
                finished.set()

        sent = await rb.read_batch([("get", (k,)) for k in keys], "snapshot", done)
        await asyncio.wait_for(finished.wait(), 2.0)
        await rb.close()
        assert sent == len(wire.sent)
        return wire.sent

    sent = asyncio.run(go())
    assert got == {k: ({k: len(k)} if i % 2 == 0 else {}) for i, k in enumerate(keys)}
    assert all(len(p) <= 64 * 1024 for p, h in sent if "n" in h)
    # About 15 KB a read (the key in the op and twice in its range): split into
    # bundles of four, not sent one by one.
    assert sum("n" in h for _, h in sent) == len(sent) <= len(keys) // 3


def test_a_malformed_answer_or_a_raising_callback_does_not_stop_the_reader() -> None:
    """One task completes every read: an answer it cannot use (from any storage process)
    and a ``done`` that raises are logged, and every other read still completes."""
    m = Model(f=3).ring_of(3)
    m.write(("put", ((5, "five"),)))
    m.settle()
    got: list[Any] = []

    async def go() -> None:
        wire = _BundleWire(m, hostile=True)
        rb = _client(m, wire, 1.0)
        finished = asyncio.Event()

        def done(op: Any, gather: Any) -> None:
            got.append(rb.core.result(gather) if gather is not None else None)
            if len(got) == 20:
                finished.set()
            if len(got) == 1:
                raise RuntimeError("the caller's own bug")

        await rb.read_batch([("get", (5 + k,)) for k in range(20)], "snapshot", done)
        await asyncio.wait_for(finished.wait(), 2.0)
        await rb.close()

    asyncio.run(go())
    assert len(got) == 20 and None not in got and {5: "five"} in got


def test_a_bundled_read_answered_in_pieces_completes_once_and_whole() -> None:
    """Answers to a bundle's reads come from one responder (whole) or, with a stale
    keyspace, from several (each a piece): a read completes when its pieces cover it, is
    told once however many replicas answer it, and pieces from different frontiers
    refuse it.  The answers here are crafted, so each case is certain to occur."""
    m = Model(f=3).ring_of(4)

    async def go() -> tuple[dict[int, Any], dict[int, int], Any]:
        wire = _BundleWire(m, silent=True)
        rb = _client(m, wire, 5.0)
        got: dict[int, Any] = {}
        told: dict[int, int] = {}
        ops: list[Any] = [("scan", 10, 30), ("get", (12,)), ("get", (14,)), ("scan", 40, 50)]

        def done(op: Any, gather: Any) -> None:
            i = ops.index(op)
            told[i] = told.get(i, 0) + 1
            got[i] = "refused" if gather.refused else rb.core.result(gather)

        await rb.read_batch(ops, "snapshot", done, bundle=8)
        ((payload, header),) = wire.sent
        reads = msgpack.unpackb(payload, use_list=False)
        assert [op[0] for op, _ in reads] == ["scan", "get", "get", "scan"]
        r1, r2 = reads[1][1], reads[2][1]
        k = (2, 20)
        first = ((0, (((2, 10), k),), [(10, "a")], None), (1, r1, {12: "x"}, None))
        src = _holder(m, 10)  # of keys 10 to 50 (segment 0, f = 3)
        rb._on_direct(src, ("resn", header["q"], 7, True, first))
        assert got == {1: {12: "x"}}  # the scan has half of what it reads
        second = (
            (0, ((k, (2, 30)),), [(20, "b")], None),
            (1, r1, {12: "replica"}, None),  # read 1 is complete: not told again
            (2, r2, {}, None),
            (3, (((2, 40), (2, 45)),), [], None),
        )
        rb._on_direct(src, ("resn", header["q"], 7, True, second))
        assert got == {0: [(10, "a"), (20, "b")], 1: {12: "x"}, 2: {}}
        # The rest of read 3 from another frontier: not one consistent cut.
        rb._on_direct(src, ("resn", header["q"], 8, True, ((3, (((2, 45), (2, 50)),), [], None),)))
        left = (dict(rb._bundles), dict(rb._unsafe), dict(rb._reads))
        await rb.close()
        return got, told, left

    got, told, left = asyncio.run(go())
    assert got[3] == "refused"
    assert told == {0: 1, 1: 1, 2: 1, 3: 1}
    assert left == ({}, {}, {})


def test_a_batch_that_raises_leaves_nothing_behind_and_tells_no_read() -> None:
    """``read_batch`` raises for the whole batch (an op the wire cannot carry, a
    client with no room or ended): the caller owns every read of it, so none is told
    later (not even as timed out) and nothing of it stays in the client's tables."""
    m = Model(f=3).ring_of(4)

    async def go() -> tuple[list[Any], list[Any]]:
        wire = _BundleWire(m, silent=True)
        rb = _client(m, wire, 0.2)
        told: list[Any] = []
        left: list[Any] = []
        ops = [("get", (k,)) for k in range(0, 400, 5)]
        core = rb.core
        real_packer = core._packer

        class SecondFails:
            """The second bundle's payload cannot be encoded."""

            calls = 0

            def pack(self, obj: Any) -> bytes:
                self.calls += 1
                if self.calls == 2:
                    raise TypeError("cannot encode")
                return real_packer.pack(obj)

        core._packer = SecondFails()  # type: ignore[assignment]
        with pytest.raises(TypeError):
            await rb.read_batch(ops, "snapshot", lambda op, g: told.append(op), bundle=8)
        assert core._packer.calls == 2  # type: ignore[attr-defined]
        left.append((dict(rb._bundles), dict(rb._reads)))
        core._packer = real_packer

        async def refused(items: Any) -> Any:
            raise ecast.ClosedError("the client was closed")

        wire.submit_unsafe_batch = refused  # type: ignore[method-assign]
        with pytest.raises(ecast.ClosedError):
            await rb.read_batch(ops, "snapshot", lambda op, g: told.append(op), bundle=8)
        left.append((dict(rb._bundles), dict(rb._reads), dict(rb._unsafe)))
        await asyncio.sleep(0.4)  # past the answer timeout
        await rb.close()
        return told, left

    told, left = asyncio.run(go())
    assert told == []
    assert left == [({}, {}), ({}, {}, {})]


@pytest.mark.parametrize("grouped", [False, True])
def test_a_bundle_refused_whole_is_told_as_one_group(grouped: bool) -> None:
    """A storage process's refusal of a whole bundle (one ``RESULT`` naming the bundle)
    finishes every read of it: one call for a grouped caller, one per read otherwise."""
    from rubberband.storage import RESULT

    m = Model(f=3).ring_of(4)
    calls: list[list[Any]] = []

    async def go() -> tuple[Any, Any]:
        wire = _BundleWire(m, silent=True)
        rb = _client(m, wire, 5.0)

        def done_one(op: Any, gather: Any) -> None:
            calls.append([(op, gather)])

        ops = [("get", (k,)) for k in range(16)]
        if grouped:
            await rb.read_batch(ops, "snapshot", calls.append, bundle=16, grouped=True)
        else:
            await rb.read_batch(ops, "snapshot", done_one, bundle=16)
        bundles = [h["q"] for _, h in wire.sent if "n" in h]
        for rid in bundles:
            rb._on_direct(_holder(m, 0), (RESULT, rid, None, None, None, 1, False))
        try:
            return bundles, (dict(rb._bundles), dict(rb._unsafe))
        finally:
            await rb.close()

    bundles, left = asyncio.run(go())
    told = [pair for call in calls for pair in call]
    assert bundles and left == ({}, {})
    assert sorted(op[1][0] for op, _ in told) == list(range(16))
    assert len(told) == 16 and all(g is not None and g.refused for _, g in told)
    if grouped:
        assert len(calls) == len(bundles)
    else:
        assert len(calls) == 16
