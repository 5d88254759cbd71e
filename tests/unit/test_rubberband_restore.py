"""The restart of a whole cluster, sans I/O: the config takes a recorded ring only into
an empty one and only with every holder back; the coordinating super asks for it once
they are; a storage process on the restored ring answers for its ranges from its own
engine and drops what lies outside them."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from ecast import Effects, Message
from rubberband.keys import EVERYTHING, encode_key
from rubberband.outputs import Submit
from rubberband.proto import (
    H,
    LevelApply,
    LevelAsk,
    Levelled,
    LevelTail,
    keyspace_header,
    write_header,
)
from rubberband.restart import LEVEL_AGAIN, Leveller, answer_level, plan
from rubberband.storage import StorageCore
from rubberband.super import RESTORE_AGAIN, SuperCore
from storage_adapters.memory import KVOps, MemoryEngine
from tests.unit.test_rubberband_config import cluster, expand, joined, step

HOLDERS = ("storage:0", "storage:1", "storage:2", "storage:3")


def recorded() -> Any:
    """What a super of a running cluster records (``SuperCore.record``)."""
    s = SuperCore("super:a")
    s.config = cluster(4)
    return s.record()


def test_a_super_records_which_holders_were_still_receiving() -> None:
    s = SuperCore("super:a")
    s.config = cluster(4)
    assert s.record()[4] == ()
    s.config, _ = step(s.config, "storage:9", {"kind": "join"})
    s.config, _ = expand(s.config, "storage:9", 50)  # not ready: its copy never finished
    assert s.record()[2] == s.config.version and "storage:9" in s.record()[4]


def restore_header(record: Any, version: int = 0, instructions: Any = ()) -> Any:
    return keyspace_header(version, ("restore", record[3], record[4]), instructions)


def test_the_config_takes_a_recorded_ring_only_into_an_empty_one_with_its_holders_back() -> None:
    record = recorded()
    fresh = joined("super:a", *HOLDERS)
    c, dests = step(fresh, "super:a", restore_header(record))
    assert c.version == 1 and c.keyspace.ring() == record[3]
    assert not c.pending and set(HOLDERS) <= dests  # every holder mirrors it
    # Ignored (no change): a ring already there, a holder not back, a stale version,
    # instructions, anyone but a super.
    assert step(c, "super:a", restore_header(record, version=1))[0].version == 1
    assert step(c, "super:a", restore_header(record, version=1))[0].keyspace == c.keyspace
    missing = joined("super:a", *HOLDERS[:3])
    assert step(missing, "super:a", restore_header(record))[0].version == 0
    assert step(fresh, "super:a", restore_header(record, version=3))[0].version == 0
    copy = (("copy", "storage:0", "storage:1", ((encode_key(0), encode_key(5)),)),)
    assert step(fresh, "super:a", restore_header(record, instructions=copy))[0].version == 0
    assert step(fresh, "storage:0", restore_header(record))[0].version == 0
    # A holder that was still receiving when the cluster died comes back incomplete:
    # reads avoid it until a super repairs it.
    partial = (*record[:4], ("storage:1",))
    c, _ = step(fresh, "super:a", restore_header(partial))
    assert c.version == 1 and c.incomplete == {"storage:1"}
    # A holder whose disk is gone: restored without it, its name retired (no process
    # under it may join and be trusted with ranges it does not hold).
    lost = keyspace_header(0, ("restore", record[3], (), ("storage:3",)), ())
    c, _ = step(missing, "super:a", lost)
    assert c.version == 1 and "storage:3" in c.excluded() and "storage:3" in c.retired()
    c, _ = step(c, "storage:3", {"kind": "join"})
    assert "storage:3" not in c.storage()
    assert step(fresh, "super:a", lost)[0].version == 0  # said lost, but it is back


def test_the_coordinator_asks_once_every_holder_is_back_and_stops_once_restored() -> None:
    record = recorded()
    core = SuperCore("super:a", restore=record)
    core.config = joined("super:a", *HOLDERS[:3])
    core.position = 1  # its own join, delivered: past the holders' positions (0)
    fx = core.on_tick(0.0)  # who holds which holder's data?
    assert not _submits(fx) and _asks(fx) == [(h, LevelAsk(1, None)) for h in HOLDERS[:3]]
    for h in HOLDERS[:3]:
        assert not _submits(core.on_direct(h, _tail(1, 0, (h,), None), 0.0))
    assert core.restore_waits_for == ["storage:3"]
    assert core.status()["restoring"] == ["storage:3"]
    core.config, _ = step(core.config, "storage:3", {"kind": "join"})
    fx = core.on_tick(1.0)  # every holder is back: a new round brings them level
    for after in (None, 0):  # holders with nothing to level: positions, then tails
        assert not _submits(fx) and _asks(fx) == [(h, LevelAsk(2, after)) for h in HOLDERS]
        stale = core.on_direct(HOLDERS[0], _tail(1, 0, (HOLDERS[0],), after), 1.0)
        assert not stale.send and not _submits(stale)  # the first round's: ignored
        answers = [core.on_direct(h, _tail(2, 0, (h,), after), 1.0) for h in HOLDERS]
        fx = answers[-1]
    asked = [x for x in fx.deliver if type(x) is Submit]
    assert [x.header[H.OP][0] for x in asked] == ["restore"]
    assert not _submits(core.on_tick(1.0 + RESTORE_AGAIN / 2))  # not again at once
    again = [x for x in core.on_tick(1.0 + RESTORE_AGAIN).deliver if type(x) is Submit]
    assert len(again) == 1  # not delivered yet: asked again
    core.config, _ = step(core.config, "super:a", asked[0].header)
    assert not _submits(core.on_tick(1.0 + 2 * RESTORE_AGAIN)) and core.restore is None
    assert core.record()[3] == record[3] and core.status()["restoring"] is None
    other = SuperCore("super:b", restore=record)  # not the coordinator: never asks
    other.config = joined("super:a", "super:b", *HOLDERS)
    assert not _submits(other.on_tick(0.0))


def test_holders_restarted_under_new_names_get_the_ring_of_the_data_they_hold() -> None:
    """The deploys restart every process under a new name (``--unique-name``): each
    storage process says whose data it kept, and the restored ring names it there; a
    fresh process (a spare) claims nothing and gets nothing."""
    record = recorded()
    core = SuperCore("super:a", restore=record)
    new = [f"{h}-b" for h in HOLDERS]
    core.config = joined("super:a", *new, "storage:spare")
    core.position = 8  # its own join, delivered: past the holders' positions (7)
    fx = core.on_tick(0.0)
    assert [dst for dst, _ in _asks(fx)] == sorted([*new, "storage:spare"])
    for h in sorted([*new, "storage:spare"]):
        fx = core.on_direct(h, _tail(1, 7, (h[:-2], h) if h in new else (), None), 0.0)
    assert [dst for dst, _ in _asks(fx)] == new  # the tails of the claimants only
    for h in new:
        fx = core.on_direct(h, _tail(1, 7, (h[:-2], h), 7), 0.0)
    (submit,) = _submits(fx)
    ring = submit.header[H.OP][1]
    assert [p for _, p in ring] == [f"{p}-b" for _, p in record[3]]
    assert [e for e, _ in ring] == [e for e, _ in record[3]]


def _tail(
    round_: int, position: int, holds: tuple[str, ...], after: int | None, records: Any = ()
) -> LevelTail:
    """A holder's whole answer to a round's ask, in one slice, in epoch 0."""
    return LevelTail(round_, 0, position, holds, after, 0, records, True)


def _asks(fx: Effects) -> list[tuple[str, Any]]:
    return sorted((dst, m.payload) for dst, m in fx.send if type(m.payload) is LevelAsk)


def test_a_holder_on_the_restored_ring_keeps_its_ranges_and_drops_the_rest() -> None:
    record = recorded()
    engine = MemoryEngine()
    ops = KVOps()
    put = ("put", tuple((k, f"v{k}") for k in range(0, 400, 10)))
    engine.apply([(put, ops.part_fun(put, engine.placement).ranges)])
    core = StorageCore("storage:1", engine, kept=("storage:1",))
    fresh = joined("super:a", *HOLDERS)
    core.joined({"rubberband": fresh.to_state()})
    assert not core.owned  # standby until the ring comes back
    m = Message("super:a", (("s", 0, ""), 1), restore_header(record), None)
    core.deliver([(5, m)])
    c, _ = step(fresh, "super:a", restore_header(record))
    assert core.owned == c.keyspace.partition("storage:1") and core.version == 1
    kept = {k for k, _ in engine.items()}
    mine = {k for k in range(0, 400, 10) if _inside(core.owned, encode_key(k))}
    assert kept == mine and 0 < len(kept) < 40
    w = ("put", ((15, "new"),))
    header = write_header(ops.part_fun(w, engine.placement).ranges)
    core.deliver([(6, Message("client:c", (("c", 0, ""), 1), header, w))])
    assert dict(engine.items()).get(15) == ("new" if _inside(core.owned, encode_key(15)) else None)


def test_kept_data_is_dropped_unless_the_first_keyspace_change_restores_it() -> None:
    """Data an earlier process left (``--keep-data``) survives only a restore: joined
    into a live cluster, or first handed ranges by anything else (a new cluster placed
    on it), the process starts empty, since a migration would add to what it kept."""
    ops = KVOps()
    put = ("put", tuple((k, "old") for k in range(0, 400, 10)))

    def holder(name: str) -> StorageCore:
        engine = MemoryEngine()
        engine.apply([(put, ops.part_fun(put, engine.placement).ranges)])
        return StorageCore(name, engine, kept=(name,))

    core = holder("storage:9")
    core.joined({"rubberband": cluster(4).to_state()})  # a live cluster: version > 0
    assert core.kept is None and core.engine.items() == []
    core = holder("storage:0")
    fresh = joined("super:a", *HOLDERS)
    core.joined({"rubberband": fresh.to_state()})
    assert core.kept == ("storage:0",) and core.engine.items()  # kept, for now
    m = Message("super:a", (("s", 0, ""), 1), keyspace_header(0, ("expand", "storage:0",
                encode_key(0)), ()), None)  # fmt: skip
    core.deliver([(3, m)])
    assert core.kept is None and core.engine.items() == [] and core.owned


def _submits(fx: Any) -> list[Any]:
    return [x for x in fx.deliver if type(x) is Submit]


def _inside(ranges: Any, ek: Any) -> bool:
    return any(lo <= ek < hi for lo, hi in ranges)


class Divergent:
    """Four holders' logs as a crash left them: each cut its sequence after a different
    message (E-Cast delivers to each in order, gap-free), so a message reached some of
    its destinations or none; the model is every message that reached any."""

    def __init__(self, tmp_path: Any) -> None:
        from rubberband.keys import covers, intersect
        from rubberband.placement import Keyspace
        from storage_adapters.log import LogEngine

        self.ks = ks = Keyspace(3, [(encode_key(i * 100), f"storage:{i}") for i in range(4)])
        self.engines = engines = {n: LogEngine(path=str(tmp_path / n)) for _, n in ks.ring()}
        ops = KVOps()

        def deliver(n: str, op: Any, t: int) -> bool:
            """``op`` at ``t`` delivered to ``n``, as its storage process applies it."""
            full = ops.part_fun(op, engines["storage:0"].placement).ranges
            mine = intersect(full, ks.partition(n))
            if mine:
                if not covers(mine, full):
                    engines[n].whole(t, [(op, full)])
                engines[n].apply([(op, mine, t)])
            return bool(mine)

        self.deliver = deliver

        # Holders: 50 on storage:0-2, 150 and 120 on storage:1-3, 320 and 350 on 0, 1, 3.
        messages = [
            ("put", ((50, "a0"), (250, "b0"), (350, "z"))),
            ("put", ((50, "x"), (150, "y"))),  # reaches storage:0 only: 150 from its whole
            ("put", ((150, "c"),)),  # reaches nobody
            ("delete", (350,)),  # storage:0 only: its key record
            ("put", ((120, "late"), (320, "late"))),  # storage:0 only, which lacks 120
        ]
        cut = {"storage:0": 5, "storage:1": 1, "storage:2": 1, "storage:3": 1}
        reached: set[int] = set()
        for n in engines:
            for t, op in enumerate(messages[: cut[n]], 1):
                if deliver(n, op, t):
                    reached.add(t)
        self.model: dict[int, str] = {}
        for t, op in enumerate(messages, 1):
            if t in reached:
                if op[0] == "put":
                    self.model.update(op[1])
                else:
                    for k in op[1]:
                        self.model.pop(k, None)
        assert reached == {1, 2, 4, 5} and self.model[150] == "y" and self.model[120] == "late"

    def check(self) -> None:
        for n, e in self.engines.items():
            held = {k: v for k, v in self.model.items() if n in self.holders(k)}
            assert dict(e.items()) == held, n

    def holders(self, k: int) -> list[str]:
        return [n for n in self.engines if _inside(self.ks.partition(n), encode_key(k))]

    def close(self) -> None:
        for e in self.engines.values():
            e.close()


def level(engines: dict[str, Any], keyspace: Any) -> dict[str, int]:
    """Bring ``engines`` (all on this machine) level as the coordinating super's rounds
    do, by :func:`rubberband.restart.plan`, then start their new epoch; the items each
    one applied."""
    positions = {name: int(e.position) for name, e in engines.items()}
    low = min(positions.values(), default=0)
    tails = {name: e.tail(low) for name, e in engines.items()}
    placement = next(iter(engines.values())).placement
    applied = {}
    for name, items in plan(positions, tails, keyspace, placement).items():
        if items:
            engines[name].apply(items)
        applied[name] = len(items)
    for e in engines.values():
        e.new_epoch()
    return applied


def test_replicas_are_brought_level_with_every_message_any_of_them_applied(
    tmp_path: Any,
) -> None:
    d = Divergent(tmp_path)
    applied = level(d.engines, d.ks)
    assert sum(applied.values()) > 0
    d.check()
    for e in d.engines.values():
        assert e.position == 0 and e.tail(-1) == []  # a new epoch
    d.close()


def test_a_levelled_replica_applies_a_write_segment_by_segment_as_its_holders_did() -> None:
    """A storage process applies a write that reaches several segments once per
    segment (each part all or nothing by its own segment's data); a replica levelled
    after a crash of the whole cluster gets the message's part for each segment apart,
    so an append with a bad key in one segment is refused there alone, as it was at the
    replicas that delivered it."""
    from rubberband.keys import intersect
    from rubberband.placement import Keyspace

    ks = Keyspace(3, [(encode_key(i * 100), f"storage:{i}") for i in range(4)])
    op = ("append", ((50, "y"), (150, "z")))
    full = KVOps().part_fun(op, MemoryEngine().placement).ranges
    tails = {"storage:0": [(1, "whole", ((op, full),))]}
    (items,) = plan({"storage:2": 0}, tails, ks, MemoryEngine().placement).values()
    segments = ks.segments()
    assert len(items) == 2
    for _, ranges, t in items:
        assert t == 1 and sum(1 for seg in segments if intersect(ranges, seg)) == 1
    engine = MemoryEngine()
    engine.apply([(("put", ((150, "a string"),)), EVERYTHING)])
    results = engine.apply([(o, r) for o, r, _ in items])
    assert dict(engine.items())[50] == ["y"] and dict(engine.items())[150] == "a string"
    assert results[0] is None and "append to 150" in str(results[1])


class _Holder:
    """What :func:`answer_level` needs of a storage core."""

    def __init__(self, engine: Any, name: str) -> None:
        self.engine = engine
        self.kept = (name,)
        self.version = 0
        self.level_next: dict[Any, int] = {}
        self.level_tail: Any = None
        self.sent: list[Any] = []
        self.stopped: str | None = None

    def send(self, dst: str, msg: Any) -> None:
        self.sent.append(msg)

    def stop(self, reason: str) -> None:
        self.stopped = reason


def test_the_coordinator_levels_the_holders_over_messages_and_nothing_twice(
    tmp_path: Any,
) -> None:
    """The same divergent holders levelled by a super's :class:`Leveller` through the
    holders' answers: every slice of what a holder lacks delivered twice, and a first
    round whose answers are lost, then a second one: each message applied once (a
    counter would show a second application), and the epoch starts only at the
    restore."""
    from rubberband.engine import Placement

    d = Divergent(tmp_path)
    # Counters of a message that reached storage:0 only, beyond its ranges (logged
    # whole): the others get the ``add`` itself, which a second time would count twice.
    assert d.deliver("storage:0", ("add", ((60, 1), (160, 1))), 6)
    d.model |= {60: 1, 160: 1}  # type: ignore[dict-item]
    holders = {n: _Holder(e, n) for n, e in d.engines.items()}
    lev = Leveller(list(holders), list(holders), d.ks, Placement("range"))

    def play(fx: Effects, lose: bool = False) -> None:
        queue = [(dst, m.payload) for dst, m in fx.send]
        while queue:
            dst, msg = queue.pop(0)
            h = holders[dst]
            for _ in range(2 if type(msg) is LevelApply else 1):
                answer_level(h, "super:a", msg)
            answers, h.sent = h.sent, []
            if lose and type(msg) is LevelApply:
                continue  # applied, but the Levelled answer is lost
            out = Effects()
            for a in answers:
                if type(a) is LevelTail:
                    lev.on_tail(dst, a, 0.0, out)
                else:
                    lev.on_levelled(dst, a, 0.0)
            queue += [(x, m.payload) for x, m in out.send]

    fx = Effects()
    lev.step(0.0, fx)
    play(fx, lose=True)
    assert not lev.done and lev.round == 1
    fx = Effects()
    lev.step(LEVEL_AGAIN / 2, fx)
    assert not fx.send  # the round is still under way
    lev.step(LEVEL_AGAIN, fx)
    assert lev.round == 2
    play(fx)
    assert lev.done and not any(h.stopped for h in holders.values())
    assert all(n == 0 for n in lev.applied.values())  # the first round applied it all
    d.check()
    assert all(e.position == 6 for e in d.engines.values())  # the epoch is the restore's
    d.close()


def test_a_levelling_slice_never_splits_a_message_and_stays_within_a_frame() -> None:
    from rubberband.restart import SLICE, SLICE_BYTES, _slices

    items = [(("put", ((k, k),)), (), k // 3) for k in range(3 * SLICE + 2)]
    parts = _slices(items, by_message=True)
    assert [x for part in parts for x in part] == items and max(map(len, parts)) <= SLICE + 2
    assert all(a[-1][2] != b[0][2] for a, b in itertools.pairwise(parts))
    big = [(("put", ((k, "x" * 100_000),)), (), k) for k in range(200)]  # 20 MB
    parts = _slices(big, by_message=True)
    assert [x for part in parts for x in part] == big and len(parts) >= 5
    assert all(len(part) * 100_000 <= SLICE_BYTES + 100_000 for part in parts)
    assert _slices([]) == [()]


def test_unreadable_records_stop_a_round_not_the_super(tmp_path: Any) -> None:
    from rubberband.engine import Placement

    d = Divergent(tmp_path)
    lev = Leveller(list(d.engines), list(d.engines), d.ks, Placement("range"))
    fx = Effects()
    lev.step(0.0, fx)
    for n in d.engines:
        lev.on_tail(n, _tail(1, 3, (n,), None), 0.0, fx)
    for n in d.engines:
        lev.on_tail(n, _tail(1, 3, (n,), 3, ((4, "whole", 17),)), 0.0, fx)  # not writes
    assert not lev.done and "unreadable" in (lev.error or "")
    d.close()


def test_only_a_super_levels_a_holder_and_only_before_the_restore(tmp_path: Any) -> None:
    from rubberband.keys import EVERYTHING
    from storage_adapters.log import LogEngine

    core = StorageCore("storage:1-b", LogEngine(path=str(tmp_path)), kept=("storage:1",))
    put = (("put", ((1, "x"),)), EVERYTHING, 5)
    for src in ("client:c", "storage:2"):  # anyone else is ignored
        assert core.on_direct(src, LevelApply(1, 0, 0, (put,), True)).send == []
    assert dict(core.engine.items()) == {}
    fx = core.on_direct("super:a", LevelApply(1, 0, 0, (put, ("junk",)), True))
    assert [m.payload for _, m in fx.send] == [Levelled(1, 5)]
    assert dict(core.engine.items()) == {1: "x"}
    fx = core.on_direct("super:a", LevelAsk(2, 0))
    got = [m.payload for _, m in fx.send]
    assert got == [LevelTail(2, 0, 5, ("storage:1",), 0, 0, ((5, "put", (1, "x")),), True)]
    core.version = 1  # a ring restored: no more levelling
    assert core.on_direct("super:a", LevelAsk(3, None)).send == []
    core.engine.close()


def test_a_restoring_super_refuses_to_reconfigure() -> None:
    """A placement before the restore (a deploy's place job run again) would take the
    ring first and make every holder drop the data it kept: refused."""
    from rubberband.errors import Refused

    core = SuperCore("super:a", restore=recorded())
    core.config = joined("super:a", *HOLDERS)
    with pytest.raises(Refused, match="restoring"):
        core.plan("expand", "storage:0", 0)
    core.restore = None
    assert core.plan("expand", "storage:0", 0)


def test_a_holder_whose_data_never_comes_back_is_restored_as_lost_in_time() -> None:
    """A deploy whose storage:3 volume is gone: its new pod claims nothing.  Within the
    restore's wait the super waits for it; after it, since the others hold a copy of
    every range, it restores without it (lost: excluded, repaired later).  With three
    of the four gone some range has no copy left: it waits on."""
    record = recorded()
    core = SuperCore("super:a", restore=record, restore_wait=60.0)
    core.config = joined("super:a", *HOLDERS[:3], "storage:fresh")
    core.position = 1  # its own join, delivered: past the holders' positions (0)
    claims = {h: (h,) for h in HOLDERS[:3]} | {"storage:fresh": ()}

    def answer(fx: Effects, now: float) -> Effects:
        for dst, m in _asks(fx):
            fx = core.on_direct(dst, _tail(m.round, 0, claims[dst], m.after), now)
        return fx

    fx = answer(core.on_tick(0.0), 0.0)
    assert core.restore_waits_for == ["storage:3"] and not _submits(fx)
    assert not _submits(answer(core.on_tick(30.0), 30.0))
    fx = core.on_tick(61.0)
    for _ in range(3):  # the round without it: positions, tails, then the restore
        fx = answer(fx, 61.0)
    (submit,) = _submits(fx)
    assert submit.header[H.OP][3] == ("storage:3",)  # lost
    core = SuperCore("super:a", restore=record, restore_wait=60.0)  # three disks gone
    core.config = joined("super:a", HOLDERS[0], "storage:fresh")
    core.position = 1  # its own join, delivered: past the holders' positions (0)
    claims = {HOLDERS[0]: (HOLDERS[0],), "storage:fresh": ()}
    answer(core.on_tick(0.0), 0.0)
    fx = answer(core.on_tick(100.0), 100.0)
    assert not _submits(fx) and core.restore_waits_for == list(HOLDERS[1:])


def test_a_holder_that_missed_the_last_restore_starts_its_epoch_and_gets_only_that(
    tmp_path: Any,
) -> None:
    """A power cut while the last restore was being delivered: storage:0 started the new
    epoch and took a write of it (a counter), the others did not start it.  They were
    level at the end of the old epoch (the restore waits for that), so each starts the
    new epoch and gets the new epoch's writes, once; nothing of the old epoch twice."""
    from rubberband.engine import Placement

    d = Divergent(tmp_path)
    first = Leveller(list(d.engines), list(d.engines), d.ks, Placement("range"))
    _level(d, first)  # level at the end of the old epoch, as the restore requires
    d.engines["storage:0"].new_epoch()
    assert d.deliver("storage:0", ("add", ((60, 1), (160, 1))), 1)  # beyond its ranges
    d.model |= {60: 1, 160: 1}  # type: ignore[dict-item]
    lev = Leveller(list(d.engines), list(d.engines), d.ks, Placement("range"), first.round)
    _level(d, lev)
    d.check()
    assert all(e.epoch == 1 for e in d.engines.values())


def _level(d: Divergent, lev: Leveller) -> None:
    holders = {n: _Holder(e, n) for n, e in d.engines.items()}
    fx = Effects()
    lev.step(0.0, fx)
    queue = [(dst, m.payload) for dst, m in fx.send]
    while queue:
        dst, msg = queue.pop(0)
        answer_level(holders[dst], "super:a", msg)
        out = Effects()
        for a in holders[dst].sent:
            if type(a) is LevelTail:
                lev.on_tail(dst, a, 0.0, out)
            else:
                lev.on_levelled(dst, a, 0.0)
        holders[dst].sent = []
        queue += [(x, m.payload) for x, m in out.send]
    assert lev.done


def test_a_holder_takes_levelling_slices_only_in_order(tmp_path: Any) -> None:
    from rubberband.keys import EVERYTHING
    from storage_adapters.log import LogEngine

    core = StorageCore("storage:1", LogEngine(path=str(tmp_path)), kept=("storage:1",))
    put = [(("put", ((k, "x"),)), EVERYTHING, k) for k in (3, 4)]
    core.on_direct("super:a", LevelApply(1, 0, 1, (put[1],), True))  # slice 0 was lost
    assert dict(core.engine.items()) == {}  # not applied: the position would skip 3
    core.on_direct("super:a", LevelApply(2, 0, 0, (put[0],), False))
    fx = core.on_direct("super:a", LevelApply(2, 0, 1, (put[1],), True))
    assert dict(core.engine.items()) == {3: "x", 4: "x"}
    assert [m.payload for _, m in fx.send] == [Levelled(2, 4)]
    core.engine.close()


def test_holders_whose_epochs_cannot_be_told_apart_are_not_levelled(tmp_path: Any) -> None:
    """storage:0 started a new epoch, storage:3 is of an unnumbered one (it joined a
    group later): whose positions are whose cannot be told, so the round stops and says
    why, rather than guess and perhaps apply writes twice."""
    from rubberband.engine import Placement

    d = Divergent(tmp_path)
    d.engines["storage:0"].new_epoch(1)
    d.engines["storage:3"].new_epoch(-1)
    lev = Leveller(list(d.engines), list(d.engines), d.ks, Placement("range"))
    holders = {n: _Holder(e, n) for n, e in d.engines.items()}
    fx = Effects()
    lev.step(0.0, fx)
    for dst, m in fx.send:
        answer_level(holders[dst], "super:a", m.payload)
        for a in holders[dst].sent:
            lev.on_tail(dst, a, 0.0, Effects())
    assert not lev.done and "epochs differ" in (lev.error or "")
    d.close()


class _Positioned(MemoryEngine):
    """A durable engine's part of the restore: the newest position it holds."""

    position = 900
    epochs: list[Any] = []

    def new_epoch(self, epoch: Any) -> None:
        self.epochs.append(epoch)


@pytest.mark.parametrize(("at", "stops"), [(900, True), (901, False)])
def test_a_holder_stops_rather_than_reuse_positions_its_engine_already_holds(
    at: int, stops: bool
) -> None:
    """The new group numbers from its founding router's origin; a restore that comes
    at or below the newest position a holder's engine holds would give two writes one
    position, so the holder stops, naming it, and starts no epoch."""
    engine = _Positioned()
    engine.epochs = []
    core = StorageCore("storage:1", engine, kept=("storage:1",))
    core.joined({"rubberband": joined("super:a", *HOLDERS).to_state()})
    restore = Message("super:a", (("s", 0, ""), 1), restore_header(recorded()), None)
    fx = core.deliver([(at, restore)])
    assert (core.stopped is not None) == stops, core.stopped
    if stops:
        assert "900" in str(core.stopped) and "--origin" in str(core.stopped)
        assert engine.epochs == [] and any("origin" in str(d) for d in fx.deliver)
    else:
        assert len(engine.epochs) == 1 and core.owned


def test_the_coordinator_restores_only_once_its_group_is_past_the_holders_positions() -> None:
    """Holders that hold positions up to 50 and a group at 20 (its routers numbered
    from below them): the ring is not restored, and the super says why; once the
    group's deliveries pass 50, it is, at a position above every one held."""
    core = SuperCore("super:a", restore=recorded())
    core.config = joined("super:a", *HOLDERS)
    core.position = 20
    fx = core.on_tick(0.0)
    for after in (None, 50):  # positions, then tails (nothing after the lowest to level)
        answers = [core.on_direct(h, _tail(1, 50, (h,), after), 0.0) for h in HOLDERS]
        fx = answers[-1]
    assert not _submits(fx)
    error = core.status()["levelling_error"]
    assert "up to 50" in error and "at 20" in error and "--origin" in error
    assert not _submits(core.on_tick(RESTORE_AGAIN))
    assert core.record() is None  # the record of the ring stays the one to restore
    core.position = 51
    assert [x.header[H.OP][0] for x in _submits(core.on_tick(2 * RESTORE_AGAIN))] == ["restore"]
