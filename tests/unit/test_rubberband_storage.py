"""The storage core: delivery order, partial live migration, failures (4.4.1, 5.4)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ecast import Message
from rubberband.applying import MALFORMED_BUNDLE
from rubberband.client import ClientCore, Rejected
from rubberband.engine import BadOperation, Placement
from rubberband.keys import EVERYTHING, encode_key, intersect, key_range, normalize, point
from rubberband.outputs import Stop
from rubberband.proto import (
    Abort,
    Answer,
    Answers,
    BasicRead,
    Chunk,
    H,
    Pull,
    Refuse,
    Stale,
    Whole,
    write_header,
)
from rubberband.storage import StorageCore, held_part
from rubberband.super import Refused
from storage_adapters.memory import KVOps, MemoryEngine
from tests.rubberband_model import Model


def answers(fx: Any) -> list[Any]:
    """The direct messages a core's effects send, in order."""
    return [d.payload for _, d in fx.send]


def bundles_of(client: ClientCore, gathers: list[Any], limit: int) -> Any:
    return client.bundles(gathers, limit)


def bundle_of(client: ClientCore, reads: list[Any], offset: int | None = None) -> Any:
    return client.bundle(reads, offset)


def grown(n: int, f: int = 3, seed: int = 0, keys: int = 0, partitioning: str = "range") -> Model:
    """A settled model with ``n`` storage processes at ids 0, 100, 200, ... (places:
    hashes under hash partitioning)"""
    m = Model(f=f, seed=seed, partitioning=partitioning)
    for i in range(n):
        m.join_storage(f"storage:{i}")
    for i in range(n):
        m.reconfigure(("expand", f"storage:{i}", i * 100))
        for k in range(keys):
            m.write(("put", ((k * 7 % (100 * n), f"v{k}-{i}"),)))
        m.settle()
    return m


def test_a_version_write_far_behind_its_delivery_is_refused_alike_by_every_replica() -> None:
    """A stale maintainer's versions, delivered more than the window below the
    positions they hold, are refused whole at every replica (nothing of them applied),
    so a row its view dropped cannot come back; recent ones are applied."""
    from unittest.mock import patch

    from rubberband import versions

    m = grown(4)
    with patch.object(versions, "WINDOW", 5):
        for k in range(10):
            m.write(("put", ((k, k),)))
        old, now = ("~view", "v", 1), ("~view", "v", 2)
        stale = ("version", ((old, [m.t - 8, "row"]), (now, [m.t, "row"])), 0)
        mid, dests = m.send(
            "maintainer:c", {H.WRITES: m.ops.part_fun(stale, m.placement).ranges}, stale
        )
        m.settle()
        errors = m.results[mid]
        assert len(errors) == len(dests) == 3
        assert all("more than 5 positions below" in e[3] for e in errors), errors
        low = ("version", ((now, [m.t, "row"]),), 0, m.t - 8)  # its oldest write in flight
        where = {H.WRITES: m.ops.part_fun(low, m.placement).ranges}
        mid, dests = m.send("maintainer:c", where, low)
        m.settle()
        assert len(m.results[mid]) == 3
        fresh = ("version", ((now, [m.t, "row"]),), 0, m.t - 2)
        m.write(fresh, "maintainer:c")
        m.settle()
    held = [dict(c.engine.items()) for c in m.storage.values()]  # type: ignore[attr-defined]
    assert sum(now in h for h in held) == 3 and not any(old in h for h in held)


def test_only_maintainers_write_views_rows_and_a_clients_range_delete_spares_them() -> None:
    """A client's ``version`` or ``reclaim`` is refused alike by every replica, saying
    maintainers write views' rows; a maintainer's is applied.  A client's
    ``delete_range`` over everything deletes the base keys and leaves the rows (the
    views then follow the base); a maintainer's deletes both.  Before, any client could
    write a row's version or delete rows, and readers trusted the view."""
    m = grown(4)
    rows = [("~view", "v", 1), ("~view", "v", 2)]
    for k in range(0, 400, 50):
        m.write(("put", ((k, f"v{k}"),)))
    version = ("version", tuple((r, [m.t, "row"]) for r in rows), 0)
    where = {H.WRITES: m.ops.part_fun(version, m.placement).ranges}
    mid, dests = m.send("client:c", where, version)
    m.settle()
    errors = m.results[mid]
    assert len(errors) == len(dests) == 3, errors
    assert all("only maintainers" in e[3] for e in errors), errors
    assert m.replica_violations() == []  # (the reference takes nothing from a client)
    m.write(("version", tuple((r, [m.t, "row"]) for r in rows), 0), "maintainer:m")
    m.settle()
    reclaim = ("reclaim", tuple(rows), m.t)
    m.write(reclaim, "client:c")  # refused: both rows stay
    m.write(("delete_range", None, None), "client:c")
    # A malformed one (no bounds) under a header naming the whole ring: the engine
    # deletes by the ranges it is given, so it too must spare the rows.
    m.submit("client:c", {H.WRITES: EVERYTHING}, ("delete_range",))
    m.settle()
    assert m.replica_violations() == []
    held = {k for c in m.storage.values() for k, _ in c.engine.items()}  # type: ignore[attr-defined]
    assert held == set(rows), held
    m.write(("delete_range", None, None), "maintainer:m")
    m.settle()
    assert m.replica_violations() == []
    assert not any(c.engine.items() for c in m.storage.values())  # type: ignore[attr-defined]


@pytest.mark.parametrize("partitioning", ["range", "hash"])
def test_only_maintainers_write_views_definitions(partitioning: str) -> None:
    """A client's plain write that names a view's definition (a key ``("~views",
    name)``) is refused whole by every replica it reaches, saying maintainers write
    them, even beside a base key held elsewhere; a client's range delete leaves the
    catalog; a maintainer's writes and deletes are applied.  Before, any client could
    redefine or forget any view, and maintainers kept what it wrote."""
    m = grown(4, partitioning=partitioning)
    defined = ("~views", "v")
    m.write(("put", ((defined, {"name": "v"}),)), "maintainer:m")
    m.settle()
    foreign = ("~views", "w")
    for op in (
        ("put", ((defined, {"name": "v", "kind": "other"}),)),
        ("put", ((5, "base"), (foreign, {"name": "w"}))),  # the base key's segment too
        ("delete", (defined,)),
        ("add", ((foreign, 1),)),
        ("put", ((defined, {"name": "v", "kind": "more"}),), "more"),  # (the engine takes it)
    ):
        where = write_header(m.ops.part_fun(op[:2], m.placement).ranges)  # as a client's
        mid, dests = m.send("client:c", where, op)
        m.settle()
        errors = [e for e in m.results[mid] if e[3]]
        assert dests and len(errors) >= 3, (op, errors)
        assert all("only maintainers" in e[3] for e in errors), errors
    m.write(("put", ((6, "base"),)), "client:c")
    if partitioning == "range":
        m.write(("delete_range", None, None), "client:c")
    m.settle()
    assert m.replica_violations() == []
    held = {k: v for c in m.storage.values() for k, v in c.engine.items()}  # type: ignore[attr-defined]
    assert held.get(defined) == {"name": "v"} and foreign not in held and 5 not in held
    assert (6 in held) == (partitioning == "hash")
    m.write(("delete", (defined,)), "maintainer:m")
    m.settle()
    assert m.replica_violations() == []
    assert not any(defined in dict(c.engine.items()) for c in m.storage.values())  # type: ignore[attr-defined]


@pytest.mark.parametrize("header_keys", ["both", "base"])
def test_a_write_naming_a_definition_is_decided_alike_alone_and_beside_a_read(
    header_keys: str,
) -> None:
    """Whether a client's write that names a view's definition is refused reads its
    whole message, never the part a replica holds: a storage process holding only the
    base key of ``put((5, v), (("~views", "x"), w))`` refuses it both when the write
    comes alone (the batch's short road) and beside a read (the general one).  Under a
    header that names only the base key (a hostile client's), no replica may write the
    definition, so both roads apply the base key."""
    op = ("put", ((5, "base"), (("~views", "x"), {"name": "x"})))
    ranges = KVOps().part_fun
    where = ranges(op if header_keys == "both" else ("put", ((5, "base"),)), Placement()).ranges
    held = []
    for beside_a_read in (False, True):
        m = Model(f=1).ring_of(2)  # storage:0 holds the integers below 100, alone
        batch = [(op, {H.WRITES: where})]
        if beside_a_read:
            read = ("get", (7,))
            batch.append((read, {H.READS: ranges(read, Placement()).ranges, H.OFFSET: 0}))
        items = []
        for payload, header in batch:
            msg = Message("client:c", (("m", 0, "client:c"), next(m.seq)), header, payload)
            m.config = m.config.apply(msg)  # (nothing of the configuration's)
            m.t += 1
            items.append((m.t, msg))
        core = m.storage["storage:0"]
        m._outputs("storage:0", core.deliver(items))
        held.append(dict(core.engine.items()))  # type: ignore[attr-defined]
    assert held[0] == held[1] == ({} if header_keys == "both" else {5: "base"}), held


def test_storage_names_are_checked() -> None:
    with pytest.raises(ValueError, match="storage:"):
        StorageCore("client:x", MemoryEngine())


def test_writes_land_on_every_holder_and_reads_are_answered_by_a_cover() -> None:
    m = grown(4)
    for k in range(0, 400, 7):
        m.write(("put", ((k, k * 2),)))
    m.write(("append", ((5, "a"), (305, "b"))))
    m.write(("append", ((5, "c"),)))
    assert m.replica_violations() == []
    for offset in range(3):
        mid, dests, ranges = m.read(("scan", 0, 400), offset)
        assert 1 <= len(dests) <= 3
        rows = m.answer(mid, ("scan", 0, 400), ranges)
        assert rows == sorted(m.reference.items())
    mid, _, ranges = m.read(("get", (5, 305, 999)), 1)
    assert m.answer(mid, ("get", (5, 305, 999)), ranges) == {5: ["a", "c"], 305: ["b"]}


def test_a_bad_operation_is_rejected_alike_by_every_replica() -> None:
    m = grown(4)
    m.write(("put", ((7, "not a list"),)))
    mid, dests = m.send(
        "client:c",
        {H.WRITES: m.ops.part_fun(("append", ((7, 1),)), m.placement).ranges},
        ("append", ((7, 1),)),
    )
    errors = [r for r in m.results[mid]]
    assert len(errors) == len(dests) == 3
    assert all("append to 7" in e[3] for e in errors)
    assert m.replica_violations() == []


def test_expand_under_load_moves_data_and_keeps_order() -> None:
    m = grown(4, keys=0)
    for k in range(0, 400, 3):
        m.write(("put", ((k, "base"),)))
    m.join_storage("storage:9")
    m.reconfigure(("expand", "storage:9", 150))
    core = m.storage["storage:9"]
    assert core.receiving  # the transfer has started, nothing arrived yet
    # Writes to the range in flight are held back and applied after the base.
    for k in range(100, 200, 5):
        m.write(("put", ((k, "new"),)))
        m.write(("append", ((k + 1, "late"),)))  # keys 101, 106, ... hold no base
    assert core.queue  # held back behind the base
    mid, _, ranges = m.read(("get", (150, 151)), 0)
    m.settle()
    assert m.answer(mid, ("get", (150, 151)), ranges) == {150: "new", 151: ["late"]}
    assert not core.receiving and not core.queue
    assert m.replica_violations() == []
    assert m.config.pending == {}  # everyone said ready
    assert core.stats.chunks_received > 2  # the copy came in bounded chunks
    for offset in range(3):
        mid, _, ranges = m.read(("scan", 100, 200), offset)
        assert m.answer(mid, ("scan", 100, 200), ranges) == sorted(
            (k, v) for k, v in m.reference.items() if 100 <= k < 200
        )


def test_writes_queued_behind_a_receive_keep_the_queue_cheap_and_in_order() -> None:
    m = grown(5, keys=0)
    for k in range(0, 500):
        m.write(("put", ((k, "base"),)))
    m.reconfigure(("contract", "storage:1"))
    core = m.storage["storage:3"]  # holds [0, 400) now, receiving [0, 100)
    assert core.receiving
    # Many writes inside the range being received: each waits, none adds to the ranges
    # later items are checked against (they overlap the receive anyway).  Before, every
    # one re-sorted a union of all of them: quadratic, and under load the receiver never
    # caught up.
    for i in range(2000):
        m.write(("put", ((i % 50, f"w{i}"),)))
    assert len(core.queue) >= 2000
    assert core._queued_ranges == ()
    # A multi-key write reaching outside the receive is entered, and a later write to
    # its outside key waits behind it (order), though that key is not being received.
    m.write(("put", ((60, "x"), (350, "y"))))
    m.write(("put", ((350, "z"),)))  # applied first, it would be overwritten by "y"
    assert core._queued_ranges != ()
    assert len(core.queue) >= 2002
    m.settle()
    assert not core.queue and not core.receiving
    for offset in range(3):
        mid, _, ranges = m.read(("get", (0, 49, 60, 350)), offset)
        assert m.answer(mid, ("get", (0, 49, 60, 350)), ranges) == {
            0: "w1950",
            49: "w1999",
            60: "x",
            350: "z",
        }
    assert m.replica_violations() == []


def test_contract_replace_and_rebalance_keep_every_replica_right() -> None:
    m = grown(5)
    for k in range(0, 500, 4):
        m.write(("put", ((k, f"v{k}"),)))
    m.join_storage("storage:8")
    for op in (
        ("contract", "storage:2"),
        ("replace", "storage:3", "storage:8"),
        ("rebalance", "storage:4", 450),
    ):
        m.reconfigure(op)
        for k in range(1, 500, 9):
            m.write(("put", ((k, op[0]),)))
        m.settle()
        assert m.replica_violations() == [], op
    assert m.config.pending == {}


def expanding_onto_storage_9() -> tuple[Model, StorageCore, list[str]]:
    """Four holders with data, and ``storage:9`` expanded onto the ring, its copies not
    yet received: the model, the receiver's core and the processes it copies from."""
    m = grown(4)
    for k in range(0, 400, 2):
        m.write(("put", ((k, "x"),)))
    m.join_storage("storage:9")
    m.reconfigure(("expand", "storage:9", 150))
    core = m.storage["storage:9"]
    sources = sorted({rec.src for rec in core.incoming.values()})
    assert sources
    return m, core, sources


def test_a_source_suspected_mid_transfer_leaves_its_receiver_incomplete() -> None:
    m, core, sources = expanding_onto_storage_9()
    for src in sources:
        m.suspect(src)
    m.settle()
    assert core.incomplete and core.broken and not core.incoming
    assert "storage:9" in m.config.incomplete
    assert m.config.pending.get(m.config.version - 0, None) is None or (
        "storage:9" in next(iter(m.config.pending.values())).waiting
    )
    # Reads never go to the incomplete process, writes still do.
    for offset in range(3):
        _, dests, _ = m.read(("get", (160,)), offset)
        assert "storage:9" not in dests
    # A super repairs it: replace it with a fresh standby.
    m.join_storage("storage:10")
    m.reconfigure(("replace", "storage:9", "storage:10"))
    m.settle()
    assert "storage:9" not in m.config.incomplete
    m.dead.add("storage:9")
    assert m.replica_violations() == []


def test_a_source_that_parts_mid_transfer_leaves_its_receiver_incomplete() -> None:
    """A storage process whose engine fails parts from the group instead of falling
    silent: its receivers hear the part as they would its suspicion, so the
    reconfiguration ends (the receiver incomplete, for a super to repair) instead of
    waiting for its chunks for ever."""
    m, core, sources = expanding_onto_storage_9()
    version = m.config.version
    assert "storage:9" in m.config.pending[version].waiting
    for src in sources:
        m.dead.add(src)
        others = set(m.config.storage()) - {src}
        dests = m.submit(src, {"kind": "part"})
        assert others <= dests, (others, dests)  # every storage process hears it
    m.settle()
    assert core.incomplete and core.broken and not core.incoming
    assert "storage:9" in m.config.incomplete
    assert not (
        m.config.pending.get(version, None)
        and m.config.pending[version].waiting - m.config.incomplete
    )


def test_a_failing_engine_stops_the_process() -> None:
    class Broken(MemoryEngine):
        def apply(self, batch: Any) -> list[Any]:
            raise OSError("disk on fire")

    core = StorageCore("storage:1", Broken())
    state = {"rubberband": [3, "range", 0, [], [], [], [], [], [], [], []]}
    assert not core.joined(state).deliver
    header = {H.WRITES: (((2, 1), (2, 1, 0)),)}
    msg = Message("client:c", (("c", 0, ""), 1), header, ("put", ((1, 1),)))
    out = core.deliver([(1, msg)]).deliver
    assert out and type(out[-1]) is Stop and "disk on fire" in out[-1].reason
    fx = core.deliver([(2, msg)])
    assert not fx.deliver and not fx.send  # stopped for good


def test_a_joining_process_takes_the_clusters_partitioning() -> None:
    """The engine places keys as the cluster does: under hash partitioning a put lands
    only where the key's hash falls, and a get finds it there."""
    engine = MemoryEngine()
    core = StorageCore("storage:1", engine)
    assert not core.joined({"rubberband": [1, "hash", 0, [], [], [], [], [], [], [], []]}).deliver
    assert engine.placement.partitioning == "hash"
    place = engine.placement.ekey("k")
    mine = ((place, (*place, 0)),)
    elsewhere = (((place[0], place[1] + 1), (place[0], place[1] + 2)),)
    engine.apply([(("put", (("k", 1), ("j", 2))), mine)])
    assert engine.apply([(("get", ("k", "j")), mine)]) == [{"k": 1}]
    assert engine.apply([(("get", ("k",)), elsewhere)]) == [{}]
    bad = StorageCore("storage:2", MemoryEngine())
    out = bad.joined({"rubberband": [1, "sideways", 0, [], [], [], [], [], [], [], []]}).deliver
    assert out and type(out[-1]) is Stop


def test_bad_operation_is_returned_not_raised() -> None:
    e = MemoryEngine()
    res = e.apply([(("explode",), (((-1,), (9,)),))])
    assert isinstance(res[0], BadOperation)


def test_hostile_direct_messages_are_ignored() -> None:
    m = grown(3)
    core = m.storage["storage:0"]
    for payload in (
        None,
        (),
        ("pull",),
        ("pull", "x", 1),
        ("chunk", (1, 2), 0, [], True),
        ("?",),
        5,
        Pull((1, 2), 0),  # a transfer nobody started
        Chunk((1, 2), 0, (), True),
        Abort((9, 9)),
        Refuse((9, 9)),
        BasicRead(1, ("get", (1,)), "not ranges", 0),
    ):
        fx = core.on_direct("storage:1", payload)
        assert not fx.send and not fx.deliver
    assert core.stopped is None


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_random_reconfigurations_under_writes_keep_replicas_equal(data: st.DataObject) -> None:
    seed = data.draw(st.integers(0, 10**6))
    f = data.draw(st.integers(1, 3))
    m = grown(data.draw(st.integers(1, 4)), f=f, seed=seed)
    spare = iter(range(20, 40))
    client = kv_client(m)  # bundles writes with a copy of the keyspace, often stale
    for _ in range(data.draw(st.integers(1, 8))):
        action = data.draw(
            st.sampled_from(["write", "write", "batch", "expand", "contract", "replace", "step"])
        )
        ks = m.config.keyspace
        try:
            if action == "batch":
                if data.draw(st.booleans()):
                    client.learn(m.config.version, ks.to_state())
                keys = data.draw(st.lists(st.integers(0, 600), min_size=1, max_size=30))
                ops = [
                    ("delete", (k,)) if k % 5 == 0 else ("put", ((k, f"{k}@{j}"),))
                    for j, k in enumerate(keys)
                ]
                m.write_batch(ops, client, limit=data.draw(st.integers(1, 8)))
            elif action == "write":
                k = data.draw(st.integers(0, 600))
                if data.draw(st.booleans()):
                    m.write(("append", ((k, data.draw(st.integers(0, 9))),)))
                else:
                    m.write(("put", ((k, k), (k + 1, -k))))
            elif action == "expand":
                name = f"storage:{next(spare)}"
                m.join_storage(name)
                m.reconfigure(("expand", name, data.draw(st.integers(0, 600))))
            elif action == "contract" and len(ks) > f:
                m.reconfigure(("contract", data.draw(st.sampled_from(ks.processes))))
            elif action == "replace" and ks.processes:
                name = f"storage:{next(spare)}"
                m.join_storage(name)
                m.reconfigure(("replace", data.draw(st.sampled_from(ks.processes)), name))
            else:
                for _ in range(data.draw(st.integers(0, 20))):
                    m.step()
        except ValueError:
            pass  # an id that is taken: the super would refuse it
    m.settle()
    assert not m.stopped
    assert m.replica_violations() == []
    assert m.config.pending == {}
    assert m.super.config == m.config
    for offset in range(f):
        mid, dests, ranges = m.read(("scan", None, None), offset)
        m.settle()
        if dests:
            assert m.answer(mid, ("scan", None, None), ranges) == sorted(
                m.reference.items(), key=lambda kv: kv[0]
            )


# ------------------------------------------------------------------ the super's replica
def test_the_super_mirrors_the_routers_config_and_refuses_what_must_not_run() -> None:
    m = grown(3)
    sup = m.super
    assert sup.config == m.config
    with pytest.raises(Refused, match="fewer than the replication factor"):
        sup.plan("contract", "storage:1")
    with pytest.raises(Refused, match="has it joined"):
        sup.plan("expand", "storage:77", 5)
    with pytest.raises(Refused, match="already on the ring"):
        sup.plan("replace", "storage:0", "storage:1")
    with pytest.raises(Refused, match="would pass another"):
        sup.plan("rebalance", "storage:0", 150)
    with pytest.raises(Refused, match="unknown reconfiguration"):
        sup.plan("explode", "storage:0")
    # A plan is stamped with the version it was computed from; one made stale by another
    # reconfiguration is routed nowhere (acknowledged without delivery) and changes nothing.
    m.join_storage("storage:5")
    m.join_storage("storage:6")
    first = sup.plan("expand", "storage:5", 50)
    second = sup.plan("expand", "storage:6", 250)
    assert m.submit("super:s", first.header)
    assert m.submit("super:s", second.header) == frozenset()
    assert "storage:6" in m.config.standby()
    m.reconfigure(("expand", "storage:6", 250))  # planned again from the new version
    m.settle()
    assert sup.config == m.config and m.replica_violations() == []
    # Losing every holder of a range is refused unless forced.
    for p in ("storage:0", "storage:5", "storage:1"):
        m.suspect(p)
    m.join_storage("storage:7")
    with pytest.raises(Refused, match="lost"):
        sup.plan("replace", "storage:0", "storage:7")
    assert sup.plan("replace", "storage:0", "storage:7", force=True).plan.lost
    status = sup.status()
    assert status["version"] == m.config.version and status["standby"] == ["storage:7"]
    assert {r["name"] for r in status["ring"] if r["suspected"]} == {
        "storage:0",
        "storage:1",
        "storage:5",
    }


def test_an_admin_key_named_in_json_places_a_process_among_a_views_rows() -> None:
    """JSON has no tuples: an admin request's array is a tuple key, so a boundary can
    fall among a view's rows (``("~view", name, ...)``, which sort after every integer
    and string key: no other key could split them) and their writes go to both sides'
    holders; a list too deep for a key is refused with the reason."""
    m = grown(3, keys=20)
    m.join_storage("storage:5")
    m.reconfigure(("expand", "storage:5", ["~view", "by_g", ["c", 7]]))
    m.settle()
    ek = encode_key(("~view", "by_g", ("c", 7)))
    assert ek in m.config.keyspace.ids and m.replica_violations() == []
    assert "('~view', 'by_g', ('c', 7))" in [r["id"] for r in m.super.status()["ring"]]
    below, above = (("~view", "by_g", (g, 1)) for g in ("b", "d"))
    for key in (below, above):  # as a maintainer writes a row: a version of it
        m.write(("version", ((key, (1, key[2][0])),), 0), "maintainer:m")
    m.settle()
    assert m.replica_violations() == []
    ks = m.config.keyspace
    holders = [set(ks.holders_of_segment(ks.segment_of(encode_key(k)))) for k in (below, above)]
    assert holders[0] != holders[1], holders  # the view's rows now live apart
    deep: Any = "x"
    for _ in range(12):
        deep = [deep]
    m.join_storage("storage:6")
    with pytest.raises(Refused, match="nest at most"):
        m.super.plan("expand", "storage:6", deep)


# ------------------------------------------------------------------ the three read levels
def read_all(m: Model, level: str, op: Any) -> Any:
    """One read at ``level`` through the client core, as the SDK does it."""
    client = ClientCore(KVOps())
    client.learn(m.config.version, m.config.keyspace.to_state())
    payload, header, g = client.read_message(op)
    if level == "sequential":
        mid, _ = m.send("client:c", header, payload)
        m.settle()
        for _, covered, result, error in m.results[mid]:
            g.add(covered, result, error, None, True)
    elif level == "snapshot":
        msg = Message("client:c", (("u", 0, "client:c"), next(m.seq)), header, payload)
        for d in sorted(m.config.destset(msg)):
            for a in answers(m.storage[d].deliver_unsafe(msg, m.t, True)):
                g.add(a.covered, a.result, a.error, a.position, a.ok)
    else:
        tried: frozenset[str] = frozenset()
        while not g.complete:
            for target, ranges in client.basic_targets(g, tried).items():
                tried |= {target}
                fx = m.storage[target].on_direct(
                    "client:c", BasicRead(1, op, ranges, client.version)
                )
                for a in answers(fx):
                    if type(a) is Stale:  # ask a super, as the client core does
                        client.learn(m.config.version, m.config.keyspace.to_state())
                    else:
                        g.add(a.covered, a.result, a.error, a.position, a.ok)
    assert g.complete
    return client.result(g)


@pytest.mark.parametrize("level", ["sequential", "snapshot", "basic"])
def test_every_read_level_sees_the_data(level: str) -> None:
    m = grown(5, f=3)
    for k in range(0, 500, 3):
        m.write(("put", ((k, -k),)))
    m.settle()
    want = sorted(m.reference.items())
    assert read_all(m, level, ("scan", None, None)) == want
    assert read_all(m, level, ("get", (3, 6, 7, 450))) == {3: -3, 6: -6, 450: -450}


def test_snapshot_reads_are_refused_where_a_range_is_still_arriving() -> None:
    m = grown(4)
    for k in range(0, 400, 3):
        m.write(("put", ((k, k),)))
    m.join_storage("storage:9")
    m.reconfigure(("expand", "storage:9", 150))
    core = m.storage["storage:9"]
    op = ("get", (153,))
    msg = Message("client:c", (("u", 0, "client:c"), 1), {H.READS: core.receiving, H.OFFSET: 0}, op)
    (out,) = answers(core.deliver_unsafe(msg, m.t, True))
    assert out.ok is False  # refused: the client retries the whole read
    (out,) = answers(core.deliver_unsafe(msg, m.t, False))
    assert out.ok is False  # not accepted by the endpoint either
    m.settle()
    outs = answers(core.deliver_unsafe(msg, m.t, True))
    assert outs and all(out.ok is True for out in outs)
    # One answer per ring segment the read covers: they tile the read's ranges.
    assert normalize(tuple(r for out in outs for r in out.covered)) == msg.header[H.READS]
    merged: dict[int, int] = {}
    for out in outs:
        merged.update(out.result)
    assert merged == {153: 153}


def test_answers_are_cut_at_segments_so_aggregates_are_not_counted_twice() -> None:
    """Each replica answers everything it holds of a read; cut at the ring's segments,
    two replicas' answers for one segment are the same piece, and the client keeps one."""
    m = grown(4)
    m.write(("put", tuple((k, k) for k in range(0, 400, 2))))
    op = ("scan", None, None)
    client = ClientCore(KVOps())
    client.learn(m.config.version, m.config.keyspace.to_state())
    _, header, gather = client.read_message(op)
    for name in sorted(m.storage):
        core = m.storage[name]
        msg = Message("client:c", (("u", 0, "client:c"), 1), header, op)
        for a in answers(core.deliver_unsafe(msg, m.t, True)):
            pieces_before = len(gather.pieces)
            gather.add(a.covered, a.result, a.error, a.position, a.ok)
            # A piece is taken whole or not at all: never in part.
            if len(gather.pieces) > pieces_before:
                assert gather.pieces[-1][0] == a.covered
    assert gather.complete and not gather.refused
    rows = [row for _, piece in gather.pieces for row in piece]
    assert len(rows) == 200 and sorted(rows) == [(k, k) for k in range(0, 400, 2)]


def test_a_basic_read_with_a_stale_version_says_so_and_nothing_more() -> None:
    """A storage process tells a client whose keyspace version is not its own that it is
    stale, and no keyspace: the client learns that from a super only."""
    m = grown(4)
    m.write(("put", ((5, "five"),)))
    client = ClientCore(KVOps())
    client.learn(1, m.config.keyspace.to_state())  # an old version number
    _, _, g = client.read_message(("get", (5,)))
    target = next(iter(client.basic_targets(g)))
    (out,) = answers(
        m.storage[target].on_direct("client:c", BasicRead(7, ("get", (5,)), g.ranges, 1))
    )
    assert out == Stale(7, m.config.version)
    assert read_all(m, "basic", ("get", (5,))) == {5: "five"}


def test_a_rejected_operation_raises_at_the_client() -> None:
    m = grown(3)
    m.write(("put", ((1, "x"),)))
    client = ClientCore(KVOps())
    with pytest.raises(BadOperation):
        client.write_message(("explode",))
    with pytest.raises(BadOperation, match="is a read"):
        client.write_message(("get", (1,)))
    _, _, g = client.read_message(("get", (1,)))
    g.add(g.ranges, None, "append to 1, which holds a str", None, True)
    with pytest.raises(Rejected, match="append to 1"):
        client.result(g)


# ------------------------------------------------------------------ writes sent as reads
WRITES_SENT_AS_READS: list[Any] = [
    ("put", ((5, "x"),)),
    ("append", ((150, 9),)),
    ("delete", (5,)),
    ("delete_range", 0, 300),
    ("version", (((("~view", "v", 1)), (3, "row")),), 0),
    ("explode",),
]


def _stored(m: Model) -> dict[str, list[Any]]:
    return {name: list(core.engine.items()) for name, core in sorted(m.storage.items())}


@pytest.mark.parametrize("level", ["sequential", "bundle", "snapshot", "basic"])
def test_a_write_sent_as_a_read_is_refused_and_changes_no_replica(level: str) -> None:
    """A read reaches one replica of each range (basic and snapshot reads reach it
    outside the order): a write run there changed that replica alone, and its holders
    disagreed for good.  Every road a read takes refuses an operation that is no read
    of the engine, and says so."""
    m = grown(5)
    m.write(("put", ((5, "a"), (150, [1]))))
    m.settle()
    before = _stored(m)
    ranges = m.ops.part_fun(("scan", 0, 300), m.placement).ranges
    for op in WRITES_SENT_AS_READS:
        header: dict[str, Any] = {H.READS: ranges, H.OFFSET: 0, H.REQUEST: "r"}
        payload: Any = op
        if level == "bundle":
            header[H.COUNT] = 2
            payload = msgpack.packb(((("get", (5,)), ranges), (op, ranges)))
        got: list[Any] = []
        if level in ("sequential", "bundle"):
            m.replies.clear()
            m.submit("client:c", header, payload)
            m.settle()
            got = m.replies["r"]
        elif level == "snapshot":
            msg = Message("client:c", (("u", 0, "client:c"), next(m.seq)), header, payload)
            for d in sorted(m.config.destset(msg)):
                got += answers(m.storage[d].deliver_unsafe(msg, m.t, True))
        else:
            for core in m.storage.values():
                got += answers(
                    core.on_direct("client:c", BasicRead(1, op, ranges, m.config.version))
                )
        errors = [a.error for a in got if type(a) is Answer]
        assert errors and all(
            (MALFORMED_BUNDLE if level == "bundle" else "not a read") in e for e in errors
        ), (op, got)
    assert _stored(m) == before


def test_a_write_refused_in_one_segment_is_applied_alike_by_every_holder_of_another() -> None:
    """An append to two keys in two segments, one of which holds no list: the holders of
    both segments refused all of it, the holder of only the other segment applied its
    part, and the replicas of that key disagreed from then on.  A write is applied
    segment by segment: the good key's part everywhere, the bad key's nowhere, and the
    client is told of the refusal."""
    m = grown(5)
    m.write(("put", ((5, "a"), (150, [1]))))
    m.settle()
    op = ("append", ((5, "z"), (-1, "y")))
    client = kv_client(m)
    payload, header = client.write_message(op)
    header = {**header, H.REQUEST: "w", H.ANSWER: 1}
    m.submit("client:c", header, payload)
    m.settle()
    holders = {name for name in m.storage if any(
        lo <= encode_key(-1) < hi for lo, hi in m.config.keyspace.partition(name))}  # fmt: skip
    assert len(holders) == 3
    for name in holders:
        assert dict(m.storage[name].engine.items())[-1] == ["y"], name
    assert all(dict(c.engine.items())[5] == "a" for c in m.storage.values() if 5 in
               dict(c.engine.items()))  # fmt: skip
    errors = {a.error for a in m.replies["w"]}
    assert errors == {None, "append to 5, which holds a str"}


def test_an_insert_refused_in_one_segment_leaves_every_holder_of_another_alike() -> None:
    """A table insert of a key that exists is refused whole by the scan engine: across
    two segments, the holders of the existing row's segment refused the new row of the
    other segment too, and its other holders took it.  Per segment, every holder of the
    new row takes it, and the refusal names the existing key."""
    from storage_adapters.scan import ScanOps
    from storage_adapters.scan.memory_kv import ScanMemoryEngine

    m = grown(5)
    for core in m.storage.values():  # empty, and nothing migrates from here on
        core.engine = ScanMemoryEngine(m.placement, block_rows=32)
    ops = ScanOps()

    def send(op: Any, request: str) -> list[Any]:
        header = {**write_header(ops.part_fun(op, m.placement).ranges), H.REQUEST: request,
                  H.ANSWER: 1}  # fmt: skip
        m.submit("client:c", header, op)
        m.settle()
        return [a.error for a in m.replies[request]]

    assert set(
        send(ops.create_table("t", [("k", "int64 not null"), ("v", "int32")], "k"), "c")
    ) == {None}
    assert set(send(ops.insert("t", [{"k": 150, "v": 1}]), "i1")) == {None}
    errors = set(send(ops.insert("t", [{"k": -1, "v": 2}, {"k": 150, "v": 3}]), "i2"))
    assert None in errors and any(e and "150" in e for e in errors), errors
    rows = {}
    for name, core in m.storage.items():
        (got,) = core.engine.apply([(ops.select("t", columns=["k", "v"]), core.owned)])
        assert got["columns"] == ["k", "v"], got
        rows[name] = sorted(zip(*got["data"], strict=True))
    for name, got in rows.items():
        part = m.config.keyspace.partition(name)
        want = [(k, v) for k, v in ((-1, 2), (150, 1)) if any(
            lo <= m.placement.ekey(k) < hi for lo, hi in part)]  # fmt: skip
        assert got == want, (name, got)


# ------------------------------------------------------------------ read bundles
def bundled_reads(
    m: Model, level: str, ops: list[Any], limit: int = 8, kinds: Counter[str] | None = None
) -> list[Any]:
    """Reads sent as the SDK's ``read_batch`` sends them: grouped by segment into bundles
    (a group of one travels alone), answers fanned out to each read's gather; ``kinds``
    counts the answers by their tag."""
    client = ClientCore(KVOps())
    client.learn(m.config.version, m.config.keyspace.to_state())
    reads = [client.read_message(op) for op in ops]
    gathers = [g for _, _, g in reads]
    groups, offset = bundles_of(client, gathers, limit)
    assert sorted(i for g in groups for i in g) == list(range(len(ops)))
    for group in groups:
        if len(group) == 1:
            payload, header = reads[group[0]][0], reads[group[0]][1]
        else:
            payload, header = bundle_of(client, [(ops[i], gathers[i]) for i in group], offset)
        header[H.REQUEST] = rid = ("b", tuple(group))
        if level == "sequential":
            m.send("client:c", header, payload)
            m.settle()
            replies = m.replies[rid]
        else:
            msg = Message("client:c", (("u", 0, "client:c"), next(m.seq)), header, payload)
            replies = [
                a
                for d in sorted(m.config.destset(msg))
                for a in answers(m.storage[d].deliver_unsafe(msg, m.t, True))
            ]
        assert replies, f"no answer to {rid}"
        for reply in replies:
            if kinds is not None:
                kinds[type(reply).__name__] += 1
            if type(reply) is Whole:  # every read of the bundle whole: the results alone
                assert len(reply.results) == len(group) > 1
                for i, result in enumerate(reply.results):
                    gathers[group[i]].add(None, result, None, reply.position, True)
                continue
            if type(reply) is Answer:  # a read alone, or a whole bundle refused
                for i in group:
                    a = reply
                    gathers[i].add(a.covered, a.result, a.error, a.position, a.ok)
                continue
            assert type(reply) is Answers and len(group) > 1
            for i, covered, result, error in reply.rows:
                gathers[group[i]].add(covered, result, error, reply.position, reply.ok)
    assert all(g.complete and not g.refused for g in gathers)
    return [client.result(g) for g in gathers]


@pytest.mark.parametrize("level", ["sequential", "snapshot"])
def test_a_read_bundle_answers_each_of_its_reads_alone(level: str) -> None:
    """Reads of one segment share a message and a responder's one answer, and each still
    gets exactly its own keys: present, missing, or spread over a segment boundary."""
    m = grown(5, f=3)
    for k in range(0, 500, 3):
        m.write(("put", ((k, -k),)))
    m.settle()
    ops: list[Any] = [("get", (k,)) for k in range(0, 500, 7)]
    ops += [("get", (99, 100, 102)), ("scan", 90, 130), ("get", (1,))]
    client = ClientCore(KVOps())
    client.learn(m.config.version, m.config.keyspace.to_state())
    groups, _ = bundles_of(client, [client.read_message(op)[2] for op in ops], 8)
    assert max(len(g) for g in groups) == 8  # the limit holds, and is reached
    assert len(groups) < len(ops) / 3
    kinds: Counter[str] = Counter()
    got = bundled_reads(m, level, ops, kinds=kinds)
    # Bundles whose every read one responder answers whole take the short form; those
    # with a read across a segment boundary are answered read by read.
    assert kinds["Whole"] > 0 and kinds["Answers"] > 0, kinds
    for op, answer in zip(ops, got, strict=True):
        if op[0] == "get":
            assert answer == {k: -k for k in op[1] if k % 3 == 0}, op
        else:
            assert answer == [(k, -k) for k in range(90, 130) if k % 3 == 0]


def test_a_bundle_reaches_one_responder_and_every_holder_takes_turns() -> None:
    """Reads grouped by the holder the routers' cover picks at the bundle's offset: the
    cover of each bundle is one process, even for reads on both sides of the ring's
    wrap, and as the offset turns from batch to batch every process answers some."""
    m = grown(7, f=3)
    client = ClientCore(KVOps())
    assert bundles_of(client, [], 8) == ([], 0)
    _, _, lone = client.read_message(("get", (5,)))
    assert bundles_of(client, [lone, lone], 8)[0] == [[0], [1]]  # no keyspace known yet
    client.learn(m.config.version, m.config.keyspace.to_state())
    keys = [5, 99, 100, 150, 250, 310, 399, 450, 590, 601, 650, 699, -3, 10**9]
    responders: set[str] = set()
    for _ in range(6):
        gathers = [client.read_message(("get", (k,)))[2] for k in keys]
        gathers.append(client.read_message(("get", (8, 309)))[2])  # two ranges: alone
        groups, offset = bundles_of(client, gathers, 8)
        assert [len(keys)] in groups and sorted(i for g in groups for i in g) == list(
            range(len(gathers))
        )
        assert len(groups) <= 4  # 7 segments, 3 holders each
        for group in groups:
            if len(group) == 1:
                continue
            payload, header = bundle_of(
                client, [(("get", (keys[i],)), gathers[i]) for i in group], offset
            )
            cover = m.config.destset(Message("client:c", 1, header, payload))
            assert len(cover) == 1, (group, header[H.READS], cover)
            responders |= cover
    assert responders == set(m.storage)
    assert bundles_of(client, gathers, 1)[0] == [[i] for i in range(len(gathers))]


def test_a_batch_of_reads_travels_as_its_groups_would_one_by_one() -> None:
    """``reads`` (the SDK's one pass over a batch) sends what ``bundles`` and ``bundle``
    would: the same groups, the same payloads and headers, a group of one alone with its
    own header, and a bundle over ``max_bytes`` in halves, each with its own hulls."""
    m = grown(7, f=3)
    client = ClientCore(KVOps())
    client.learn(m.config.version, m.config.keyspace.to_state())
    keys = [5, 99, 100, 150, 250, 310, 399, 450, 590, 601, 650, 699, -3, 10**9, 7, 11]
    ops: list[Any] = [("get", (k,)) for k in keys] + [("get", (8, 309))]
    gathers = [client.gather(op) for op in ops]
    offset = client._offset
    groups, _ = bundles_of(client, gathers, 4)
    client._offset = offset  # the same offsets again, for the batch form
    messages = client.read_messages(ops, gathers, 4, 1 << 20)
    assert [list(idx) for idx, _, _ in messages] == groups
    client._offset = offset + 1
    for (_, payload, header), group in zip(messages, groups, strict=True):
        if len(group) == 1:
            assert payload == ops[group[0]] and header == client.header(gathers[group[0]])
            continue
        assert (payload, header) == bundle_of(
            client, [(ops[i], gathers[i]) for i in group], offset + 1
        )
        assert len(m.config.destset(Message("client:c", 1, header, payload))) == 1
    # A limit of 1, or no keyspace: every read alone.
    assert [idx for idx, _, _ in client.read_messages(ops, gathers, 1, 1 << 20)] == [
        (i,) for i in range(len(ops))
    ]
    # Too large: halves, each its own message with the hulls of its own reads.
    big = client.read_messages(ops, gathers, 16, 120)
    assert sorted(i for idx, _, _ in big for i in idx) == list(range(len(ops)))
    for idx, payload, header in big:
        assert len(idx) == 1 or len(payload) <= 120
        if len(idx) > 1:
            assert (
                header[H.READS]
                == bundle_of(client, [(ops[i], gathers[i]) for i in idx], 1)[1][H.READS]
            )


def test_a_malformed_or_refused_bundle_is_one_answer_for_all_its_reads() -> None:
    m = grown(4)
    m.write(("put", ((5, "five"),)))
    client = ClientCore(KVOps())
    client.learn(m.config.version, m.config.keyspace.to_state())
    g5, g6 = client.read_message(("get", (5,)))[2], client.read_message(("get", (6,)))[2]
    payload, header = bundle_of(client, [(("get", (5,)), g5), (("get", (6,)), g6)], 1)
    header[H.REQUEST] = "b1"
    core = m.storage[sorted(m.config.destset(Message("client:c", 1, header, payload)))[0]]
    msg = Message("client:c", (("u", 0, "client:c"), 1), header, payload)
    (out,) = answers(core.deliver_unsafe(msg, m.t, False))  # not accepted: refused whole
    assert type(out) is Answer and out.request == "b1" and out.ok is False
    (out,) = answers(core.deliver_unsafe(msg, m.t, True))
    # Both reads answered whole and without error: their results alone, in read order.
    assert out == Whole("b1", m.t, ({5: "five"}, {}))
    subs = msgpack.unpackb(payload, use_list=False)
    assert len(subs) == 2 and msg.header[H.READS] == ((subs[0][1][0][0], subs[1][1][0][1]),)
    for bad in (
        msgpack.packb(subs[:1]),  # fewer reads than the count
        msgpack.packb(((("get", (5,)), "not ranges"), subs[1])),
        msgpack.packb(((("get", (5,)), ((5, 7),)), subs[1])),  # ints are not keys
        msgpack.packb((("get", (5,)), subs[1])),  # not an (op, ranges) pair
        subs,  # not bytes
        b"\xc1",  # not msgpack
        b"\x91" * 100_000,  # nested deeper than any decoder's stack
    ):
        for out in [
            *answers(core.deliver_unsafe(msg._replace(payload=bad), m.t, True)),
            *answers(core.deliver([(m.t + 1, msg._replace(payload=bad))])),
        ]:
            assert type(out) is Answer and out.request == "b1"
            assert "bundle" in (out.error or "")
    assert core.stopped is None


@pytest.mark.parametrize("level", ["sequential", "snapshot"])
def test_a_bundle_with_a_rejected_read_is_answered_read_by_read(level: str) -> None:
    """An engine that rejects one read of a bundle: that read gets its error, the others
    their results, in the answer with a row per read (the short form of a bundle
    answered whole has no room for an error)."""
    m = grown(4)
    m.write(("put", ((5, "five"), (6, "six"))))
    for core in m.storage.values():
        apply = core.engine.apply

        def rejecting(batch: Any, apply: Any = apply) -> list[Any]:
            results = apply(batch)
            return [
                BadOperation("not 6 today") if op == ("get", (6,)) else res
                for (op, _), res in zip(batch, results, strict=True)
            ]

        core.engine.apply = rejecting  # type: ignore[method-assign]
    client = ClientCore(KVOps())
    client.learn(m.config.version, m.config.keyspace.to_state())
    ops: list[Any] = [("get", (5,)), ("get", (6,)), ("get", (7,))]
    gathers = [client.read_message(op)[2] for op in ops]
    payload, header = bundle_of(client, list(zip(ops, gathers, strict=True)), 1)
    header[H.REQUEST] = "b1"
    if level == "sequential":
        m.send("client:c", header, payload)
        m.settle()
        replies = m.replies["b1"]
    else:
        msg = Message("client:c", (("u", 0, "client:c"), 1), header, payload)
        replies = [
            a
            for d in sorted(m.config.destset(msg))
            for a in answers(m.storage[d].deliver_unsafe(msg, m.t, True))
        ]
    assert replies and all(type(r) is Answers for r in replies), replies
    for r in replies:
        assert sorted(row[0] for row in r.rows) == [0, 1, 2]
        for i, covered, result, error in r.rows:
            gathers[i].add(covered, result, error, r.position, r.ok)
    assert client.result(gathers[0]) == {5: "five"} and client.result(gathers[2]) == {}
    with pytest.raises(Rejected, match="not 6 today"):
        client.result(gathers[1])


# ------------------------------------------------------------------ write bundles
def kv_client(m: Model) -> ClientCore:
    client = ClientCore(KVOps())
    client.learn(m.config.version, m.config.keyspace.to_state())
    return client


def test_a_write_bundle_reaches_one_segments_holders_and_keeps_each_keys_order() -> None:
    """Writes of one segment share a message to its holders; writes to one key keep
    their batch order (replicas agree with the reference, which takes the batch in
    order); appends (answered) and writes across segments travel alone, behind the
    bundles begun before them."""
    m = grown(5, f=3)
    client = kv_client(m)
    ops: list[Any] = []
    for j in range(120):
        k = (j * 37) % 500
        ops.append(("put", ((k, f"a{j}"),)))
        if j % 10 == 0:
            ops.append(("put", ((k, f"b{j}"),)))  # the same key again: must win
        if j % 17 == 0:
            ops.append(("delete", (k,)))
    ops += [("append", ((7, "x"),)), ("put", ((7, "after the append"),))]
    ops += [("put", ((98, 1), (101, 2))), ("delete_range", 150, 260), ("put", ((151, "late"),))]
    sent = m.write_batch(ops, client, limit=8)
    m.settle()
    assert sorted(i for indices, _ in sent for i in indices) == list(range(len(ops)))
    assert max(len(indices) for indices, _ in sent) == 8
    assert len(sent) < len(ops) / 3
    for indices, dests in sent:
        if len(indices) > 1:  # one segment: its three holders
            assert len(dests) == 3 and all(ops[i][0] in ("put", "delete") for i in indices)
    order = [i for indices, _ in sent for i in indices]
    for lone in (len(ops) - 5, len(ops) - 3, len(ops) - 2):  # barriers: all before first
        assert set(order[: order.index(lone)]) == set(range(lone))
    assert m.reference[151] == "late" and 200 not in m.reference
    assert m.replica_violations() == []
    assert not m.stopped
    assert client.writes_of(ops[:5], 1, 1 << 16) == [
        ((i,), op, write_header(m.ops.part_fun(op, m.placement).ranges))
        for i, op in enumerate(ops[:5])
    ]


def test_large_write_bundles_split_in_order_and_a_stale_keyspace_still_lands() -> None:
    m = grown(4, f=2)
    client = kv_client(m)
    ops = [("put", ((k % 7, "v" * 300 + str(k)),)) for k in range(40)]  # one segment
    sent = m.write_batch(ops, client, limit=32, max_bytes=2000)
    assert all(len(indices) <= 6 for indices, _ in sent)
    assert [i for indices, _ in sent for i in indices] == list(range(40))
    # The ring changes under the client: its bundles are cut at the old ids, so each
    # reaches whoever holds its range now, and each holder applies what it holds.
    m.join_storage("storage:9")
    m.reconfigure(("expand", "storage:9", 150))
    m.settle()
    ops = [("put", ((k, -k),)) for k in range(0, 400, 3)]
    m.write_batch(ops, client, limit=16)
    m.settle()
    assert m.replica_violations() == []


def test_a_malformed_write_bundle_is_applied_nowhere_and_lies_change_nothing() -> None:
    m = grown(4)
    client = kv_client(m)
    m.write(("put", ((5, "five"), (6, "six"))))
    ((_, payload, header),) = client.writes_of(
        [("put", ((5, 50),)), ("put", ((6, 60),))], 8, 1 << 16
    )
    subs = msgpack.unpackb(payload, use_list=False)
    header[H.REQUEST] = "wb"
    for bad in (
        msgpack.packb(subs[:1]),  # fewer writes than the count
        msgpack.packb((subs[0], (("put", ((6, 60),)), "not ranges"))),
        msgpack.packb((subs[0], (("put", ((6, 60),)), ((5, 7),)))),  # ints are not keys
        msgpack.packb((subs[0], ("put", ((6, 60),)))),  # not an (op, ranges) pair
        # an extension value: stored, it would go out in answers as a typed message
        msgpack.packb((subs[0], (("put", ((6, msgpack.ExtType(64, b"\x90")),)), subs[1][1]))),
        subs,  # not bytes
        b"\xc1",  # not msgpack
        b"\x91" * 100_000,  # nested deeper than any decoder's stack
    ):
        m.replies.clear()
        dests = m.submit("client:c", header, bad)
        assert len(dests) == 3 and len(m.replies["wb"]) == 3
        assert all(type(r) is Answer and "bundle" in r.error for r in m.replies["wb"])
    assert m.replica_violations() == []  # nothing of any of them applied
    # A write whose ranges leave out its key changes that key on no replica.
    lie = msgpack.packb(((("put", ((5, "lie"),)), subs[1][1]), subs[1]))
    m.submit("client:c", header, lie)
    m.reference[6] = 60
    assert m.replica_violations() == []
    # An engine's rejection is answered, write by write; the others are applied.
    rejected = msgpack.packb(((("append", ((5, "x"),)), subs[0][1]), subs[1]))
    m.replies.clear()
    m.submit("client:c", header, rejected)
    assert all(type(r) is Answers and [a[0] for a in r.rows] == [0] for r in m.replies["wb"])
    assert len(m.replies["wb"]) == 3 and "append to 5" in m.replies["wb"][0].rows[0][3]
    assert m.replica_violations() == []
    assert not m.stopped


def test_a_write_of_many_keys_travels_packed_and_lands_as_its_operation() -> None:
    """A write of more than ``EXACT_RANGES`` keys travels as its operation's bytes,
    which the routers pass on whole; every holder applies it as the operation itself,
    alone or in a batch.  A few keys travel as the operation.  Bytes that are no
    operation (or hold an extension value) are refused at every replica, as any
    payload that is no operation; the flag on a payload that is not bytes is that
    payload, as if sent unpacked."""
    from rubberband.messages import EXACT_RANGES

    m = grown(4)
    client = kv_client(m)
    many = ("put", tuple((k, f"m{k}") for k in range(0, 400, 7)))  # every segment
    payload, header = client.write_message(many)
    assert header[H.PACKED] == 1 and type(payload) is bytes
    assert msgpack.unpackb(payload, use_list=False) == many
    assert client.writes_of([many, ("put", ((3, 3),))], 8, 1 << 16)[0][1:] == (payload, header)
    dests = m.submit("client:c", header, payload)
    m.expect(many)
    m.settle()
    assert len(dests) == 4 and m.replica_violations() == []
    few = ("put", tuple((k, -k) for k in range(EXACT_RANGES)))
    assert client.write_message(few) == (few, write_header(m.ops.part_fun(few, m.placement).ranges))
    wide = ("put", tuple((k, 1 << 70) for k in range(EXACT_RANGES + 1)))  # no msgpack int
    assert client.write_message(wide)[0] == wide  # (E-Cast's encoder says why)
    unpacked = ("put", tuple((k, f"u{k}") for k in range(0, 400, 7)))  # the same keys
    m.submit("client:c", header, unpacked)
    m.expect(unpacked)
    m.settle()
    assert m.replica_violations() == []
    header = {**header, H.REQUEST: "pk"}
    ext = msgpack.packb(("put", tuple((k, msgpack.ExtType(64, b"\x90")) for k in range(0, 400, 7))))
    # no msgpack, cut short, nested too deep, an extension value (stored, it would go
    # out in answers and feed pages as if it were one of E-Cast's typed messages)
    for bad in (b"\xc1", b"\x93\x01", b"\x91" * 100_000, ext):
        m.replies.clear()
        dests = m.submit("client:c", header, bad)
        # refused by each holder for each of the three segments it holds: a write is
        # applied, or refused, segment by segment
        assert len(dests) == 4 and len(m.replies["pk"]) == 4 * 3
        assert all(type(r) is Answer and "not a key-value operation" in r.error
                   for r in m.replies["pk"])  # fmt: skip
    m.settle()
    assert m.replica_violations() == []  # nothing of any of them applied
    assert not m.stopped


def test_an_answer_for_part_of_a_bundled_read_names_the_part() -> None:
    """A responder answers what it holds of each read: all of it (``covered`` None) or
    the part it holds, named, so the client gathers the rest elsewhere."""
    m = grown(4)
    client = ClientCore(KVOps())
    client.learn(m.config.version, m.config.keyspace.to_state())
    ops: list[Any] = [("get", (5,)), ("scan", 50, 450)]  # the scan spans all 4 segments
    gathers = [client.read_message(op)[2] for op in ops]
    payload, header = bundle_of(client, list(zip(ops, gathers, strict=True)), 1)
    header[H.REQUEST] = "b2"
    msg = Message("client:c", (("u", 0, "client:c"), 1), header, payload)
    name = sorted(m.config.destset(msg))[0]
    (out,) = answers(m.storage[name].deliver_unsafe(msg, m.t, True))
    covered = {i: c for i, c, _, _ in out.rows}
    assert covered[0] is None
    parts = [c for i, c, _, _ in out.rows if i == 1]
    assert parts and all(c is not None and c != gathers[1].ranges for c in parts)


@pytest.mark.parametrize("tamper", ["outside", "malformed"])
def test_a_chunk_outside_the_copy_or_malformed_is_refused_and_nothing_wedges(
    tamper: str,
) -> None:
    """Probe: a compromised or buggy source added keys outside the receiver's range and
    they were stored; a malformed chunk stopped the receiver and left the
    reconfiguration pending for good."""
    m = grown(4, keys=0)
    for k in range(0, 400, 3):
        m.write(("put", ((k, "base"),)))
    m.join_storage("storage:9")
    m.reconfigure(("expand", "storage:9", 150))
    core = m.storage["storage:9"]
    (_tid, rec), *_ = core.incoming.items()
    outside = next(
        k for k in range(400) if not any(lo <= m.placement.ekey(k) < hi for lo, hi in rec.ranges)
    )
    while not any(type(p) is Chunk for p in m.links[(rec.src, "storage:9")]):
        assert m.step()
    link = m.links[(rec.src, "storage:9")]
    i = next(i for i, p in enumerate(link) if type(p) is Chunk)
    chunk = link[i]
    if tamper == "outside":
        evil = (((0, 0), (outside, "evil")),)  # the sender's slot is not believed either
        link[i] = Chunk(chunk.transfer, chunk.chunk, tuple(chunk.data) + evil, chunk.last)
    else:
        link[i] = Chunk(chunk.transfer, chunk.chunk, ((1, 2, 3),), chunk.last)
    m.settle()
    assert "storage:9" not in m.stopped
    assert core.stats.chunks_refused == 1
    assert ("outside" if tamper == "outside" else "malformed") in (
        core.migration.last_refusal or ""
    )
    assert outside not in dict(core.engine.items())
    assert not m.storage[rec.src].outgoing  # the source was told to stop
    # Incomplete, as when a source fails mid-transfer: the reconfiguration waits only for
    # the repair a super makes (here by hand), which copies from another replica.
    assert core.incomplete and "storage:9" in m.config.incomplete
    assert {p for pend in m.config.pending.values() for p in pend.waiting} == {"storage:9"}
    m.join_storage("storage:10")
    m.reconfigure(("replace", "storage:9", "storage:10"))
    m.settle()
    assert m.config.pending == {} and m.replica_violations() == []


def test_pulls_before_the_keyspace_message_are_kept_only_from_storage_and_bounded() -> None:
    """Probe: 5,000 junk pulls from a client filled the early-pull table (4,096, never
    expired); a legitimate early pull was dropped and the version stayed pending."""
    m = grown(3)
    core = m.storage["storage:0"]
    now = core.delivered
    for i in range(5000):
        core.on_direct("client:mallory", Pull((now + 1 + i, 0), 0))
    assert core.early_pulls == {}
    for i in range(200):
        core.on_direct("storage:1", Pull((now + 1 + i, 0), 0))  # a storage process: bounded
        core.on_direct("storage:1", Pull((now - i, 0), 0))  # delivered, no copy: junk
    assert len(core.early_pulls) == 64
    core.on_direct("storage:2", Pull((now + 5, 1), 0))  # a real one still finds room
    assert core.early_pulls[(now + 5, 1)] == ("storage:2", 0)
    m.write(("put", ((1, "x"),)))  # positions go by: what they passed goes
    assert all(tid[0] > core.delivered for tid in core.early_pulls)


_bound_ints = st.integers(min_value=0, max_value=12)
_owned_sets = st.lists(st.tuples(_bound_ints, _bound_ints), max_size=5).map(
    lambda pairs: normalize(((2, a), (2, b)) for a, b in pairs if a < b)
)
_one_range = st.one_of(
    _bound_ints.map(lambda k: ((2, k), (2, k, 0))),  # a key, as most deliveries name
    st.tuples(_bound_ints, _bound_ints)
    .filter(lambda p: p[0] < p[1])
    .map(lambda p: ((2, p[0]), (2, p[1]))),
)


@given(_owned_sets, _one_range, st.sampled_from(["reads", "writes", "header"]))
@settings(max_examples=400)
def test_the_part_of_one_range_a_process_holds_is_what_intersect_says(
    owned: Any, rng: Any, how: str
) -> None:
    """A delivery of one range finds what this process holds of it by one bisection of
    the owned ranges' bounds, taken again whenever they change: equal to the general
    intersection, whole ranges held, straddled, and missed alike, whether the range is
    read, written, or written as the client's header names it (a key alone)."""
    core = StorageCore("storage:1", MemoryEngine())
    header = {
        "reads": {H.READS: (rng,), H.OFFSET: 0},
        "writes": {H.WRITES: (rng,)},
        "header": write_header((rng,)),
    }[how]
    core.owned = normalize((*owned, rng))
    assert held_part(core, header) == (rng,)
    core.owned = owned  # then less: what it held is no longer all its own
    assert held_part(core, header) == intersect((rng,), owned)


@given(
    st.lists(_owned_sets, min_size=1, max_size=3),
    st.lists(st.lists(_one_range, max_size=12), min_size=1, max_size=3),
)
@settings(max_examples=300)
def test_each_write_of_a_batch_is_applied_on_the_part_its_process_holds(
    owneds: list[Any], batches: list[list[Any]]
) -> None:
    """A batch of deliveries finds what its process holds of each write as
    :func:`held_part` does (a header naming one key alone takes a written-out road),
    with the owned ranges as they are at each batch: each write reaches the engine on
    the part of it the process holds, empty if none."""
    from storage_adapters.null import NullEngine

    class Recording(NullEngine):
        def apply(self, batch: Any) -> list[Any]:
            seen.extend(batch)
            return super().apply(batch)

    seen: list[Any] = []
    core = StorageCore("storage:1", Recording())
    core.joined({"rubberband": [3, "range", 0, [], [], [], [], [], [], [], []]})
    t = 0
    for owned, ranges in zip(owneds, batches, strict=False):
        core.owned = owned  # a new object each batch, as a keyspace message makes
        seen.clear()
        items, want = [], []
        for rng in ranges:
            t += 1
            header = write_header((rng,))
            op = ("write", (rng,), b"")
            items.append((t, Message("client:c", (("c", 0, ""), t), header, op)))
            want.append((op, intersect((rng,), owned)))  # (held_part's, tested above)
        core.deliver(items)
        assert seen == want


def test_writes_after_a_keyspace_message_in_the_same_batch_see_what_it_gave() -> None:
    """A keyspace message in the middle of a batch changes what the process holds for
    the writes after it in that batch, not only from the next batch on: gained, and
    then lost again to a process placed below it (one replica)."""
    from rubberband.proto import keyspace_header
    from storage_adapters.null import NullEngine

    class Recording(NullEngine):
        def apply(self, batch: Any) -> list[Any]:
            seen.extend(ranges for _, ranges in batch)
            return super().apply(batch)

    seen: list[Any] = []
    core = StorageCore("storage:1", Recording())
    core.joined({"rubberband": [1, "range", 0, [], [], [], [], [], [], [], []]})
    assert core.owned == ()

    def write(t: int, k: int) -> tuple[int, Message]:
        return (t, Message("client:c", (("c", 0, ""), t), write_header((point(k),)), ("x",)))

    def expand(t: int, who: str, at: int) -> tuple[int, Message]:
        h = keyspace_header(t, ("expand", who, encode_key(at)), ())
        return (t, Message("super:s", (("s", 0, ""), t), h, None))

    core.deliver([write(1, 30), expand(2, "storage:1", 50), write(3, 30)])
    core.deliver([write(4, 30), expand(5, "storage:2", 10), write(6, 30), write(7, 7)])
    assert core.stopped is None
    # 30: not held, then held, then no longer (storage:2 holds from 10 to 50); 7 held
    assert seen == [(), (point(30),), (point(30),), (), (point(7),)]


def test_a_write_of_one_key_is_held_as_its_range_and_a_malformed_key_is_not_applied() -> None:
    """A write of one key names it alone (``H.KEY``): each holder takes it as the range
    of that key; a key that is none (the routers refuse it too) is passed over, and
    the process goes on."""
    engine = MemoryEngine()
    core = StorageCore("storage:1", engine)
    core.joined({"rubberband": [3, "range", 0, [], [], [], [], [], [], [], []]})
    core.owned = normalize(((encode_key(0), encode_key(100)),))
    assert write_header((point(7),)) == {H.KEY: encode_key(7)}
    assert write_header((key_range(7, 9),)) == {H.WRITES: (key_range(7, 9),)}
    assert held_part(core, {H.KEY: encode_key(7)}) == (point(7),)
    assert held_part(core, {H.KEY: encode_key(700)}) == ()  # not ours
    bad_keys = (5, [2, 7], (2, 2**64), (2, float("nan")), (2, True), (2,), ((2, 7),))
    for t, key in enumerate(bad_keys, 1):
        assert held_part(core, {H.KEY: key}) is None
        msg = Message("client:c", (("c", 0, ""), t), {H.KEY: key}, ("put", ((7, "bad"),)))
        fx = core.deliver([(t, msg)])
        assert not fx.deliver and core.stopped is None
    good = Message("client:c", (("c", 0, ""), 99), write_header((point(7),)), ("put", ((7, "ok"),)))
    core.deliver([(len(bad_keys) + 1, good)])
    assert engine.apply([(("get", (7,)), (point(7),))]) == [{7: "ok"}]
