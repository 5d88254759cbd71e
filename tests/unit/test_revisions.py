"""Revisions (etcd's mod revision): each key's last change, read beside its value at one
position, kept beyond the change log's retention, carried by a copy of its range."""

from __future__ import annotations

from typing import Any

import pytest

from rubberband.changelog import ChangeLog, Revisions, revised_op
from rubberband.errors import BadOperation, Rejected
from rubberband.keys import EVERYTHING, encode_key
from rubberband.proto import H
from storage_adapters.memory import MemoryEngine
from tests.rubberband_client_rig import Rig
from tests.rubberband_model import Model
from tests.unit.test_changes import expand_to_new_holder


def revisions(rig: Rig, keys: list[Any], level: str = "sequential") -> tuple[Any, Any, int]:
    done = rig.until_done(rig.read(Revisions(("get", tuple(keys)), tuple(keys)), level))
    if done.error is not None:
        raise done.error
    values, revised = done.result
    return values, revised, done.position


def written(m: Model, op: Any) -> int:
    """``op`` written; its position."""
    m.write(op)
    return m.t


def test_a_read_names_each_keys_last_change_at_its_own_position() -> None:
    """A key's revision is the position of the write that last changed it, one for
    every key of a multi-key write, as of the read's position: a later write is not
    in it, a deleted key has none, and keys the change log dropped long ago keep theirs."""
    m = Model(f=3).ring_of(4)
    for core in m.storage.values():
        core.changes = ChangeLog(max_changes=2)  # the feed forgets; revisions do not
    rig = Rig(m)
    both = written(m, ("put", ((5, "a"), (350, "b"))))  # two segments, one position
    later = written(m, ("put", ((150, "c"),)))
    gone = written(m, ("put", ((7, "d"),)))
    written(m, ("delete", (7,)))
    again = written(m, ("put", ((5, "e"),)))
    for k in range(20):
        written(m, ("put", ((1000 + k, k),)))  # the change log's window moves on
    m.settle()
    values, revised, at = revisions(rig, [5, 350, 150, 7, 999])
    assert values == {5: "e", 350: "b", 150: "c"}
    assert revised == {5: again, 350: both, 150: later}
    assert gone < at and later < again < at
    written(m, ("put", ((150, "f"),)))
    m.settle()
    _, revised, _ = revisions(rig, [150], "snapshot")
    assert revised[150] > at


def test_every_replica_of_a_segment_keeps_the_same_revisions() -> None:
    m = Model(f=3).ring_of(2)
    for i in range(30):
        m.write(("put", ((i * 13 % 400, i),)))
        if i % 7 == 0:
            m.write(("delete", (i * 5 % 400,)))
    m.settle()
    seen: dict[Any, set[int]] = {}
    for core in m.storage.values():
        for key, t in core.changes.revisions_of(range(400), core.owned):
            seen.setdefault(key, set()).add(t)
    assert seen and all(len(ts) == 1 for ts in seen.values())


def test_revisions_move_with_their_range_to_a_new_holder() -> None:
    """A copy carries the revisions of its keys, also of keys whose changes the
    source's log no longer holds; what the receiver applies after the copy is its own."""
    m = Model(f=1).ring_of(1)
    for core in m.storage.values():
        core.changes = ChangeLog(max_changes=1)
    rig = Rig(m)
    old = written(m, ("put", ((150, "x"), (50, "a"))))
    written(m, ("put", ((160, "y"),)))
    written(m, ("put", ((170, "z"),)))
    m.settle()
    expand_to_new_holder(m, rig)
    new = m.storage["storage:9"].changes.revisions_of([150, 160, 170], EVERYTHING)
    assert dict(new) == {150: old, 160: old + 1, 170: old + 2}
    # The source deleted what it gave away, and its revisions with it.
    assert m.storage["storage:0"].changes.revisions_of([150, 160, 170], EVERYTHING) == []
    assert m.storage["storage:0"].changes.revisions_of([50], EVERYTHING) == [[50, old]]
    after = written(m, ("put", ((170, "w"),)))
    m.settle()
    _, revised, _ = revisions(rig, [150, 50, 170])
    assert revised == {150: old, 50: old, 170: after}


def test_keys_a_dict_confuses_have_revisions_of_their_own() -> None:
    """``True`` and ``1`` are one dict key and two Rubberband keys; ``1`` and ``1.0``
    are one key in both; tuples of them follow their elements."""
    log = ChangeLog()
    log.record(10, 0.0, [(1, "put", "int"), ((1, "x"), "put", "t")])
    log.record(11, 0.0, [(True, "put", "bool"), ((True, "x"), "put", "t")])
    log.record(12, 0.0, [(1.0, "put", "float")])

    def typed(pairs: list[list[Any]]) -> list[Any]:
        return [(repr(k), t) for k, t in pairs]  # repr: True and 1 differ

    got = typed(log.revisions_of([1, True, (1, "x"), (True, "x"), 2], EVERYTHING))
    assert got == [("1", 12), ("True", 11), ("(1, 'x')", 10), ("(True, 'x')", 11)]
    log.record(13, 0.0, [((1, "x"), "delete", None)])
    assert typed(log.revisions_of([(1, "x"), (True, "x")], EVERYTHING)) == [("(True, 'x')", 11)]
    lo, hi = encode_key(False), encode_key(0)  # the bools: below every number
    assert typed(log.revisions_of([1, True], ((lo, hi),))) == [("True", 11)]


def test_revisions_are_read_at_a_position_from_processes_that_keep_them() -> None:
    m = Model(f=1).ring_of(1)
    rig = Rig(m)
    with pytest.raises(BadOperation, match="sequential or snapshot"):
        revisions(rig, [1], "basic")
    with pytest.raises(BadOperation, match="does not cover"):
        rig.read(Revisions(("get", (1,)), (1, 2)), "sequential")

    class Plain(MemoryEngine):
        apply_logged = None  # type: ignore[assignment]

    for core in m.storage.values():
        core.engine.__class__ = Plain
        core._logged = False
    with pytest.raises(Rejected, match="keeps no change log"):
        revisions(rig, [1])


@pytest.mark.parametrize(
    "payload",
    [None, ("get", (1,)), (("get", (1,)), [1]), (("get", (1,)), ({"a": 1},)), (("get",), (1,))],
)
def test_a_malformed_revisions_read_is_answered_with_an_error_and_stops_nothing(
    payload: Any,
) -> None:
    m = Model(f=1).ring_of(1)
    m.write(("put", ((1, "a"),)))
    point = ((encode_key(1), (*encode_key(1), 0)),)
    m.send("client:c", {H.READS: point, H.OFFSET: 0, H.REVISIONS: True}, payload)
    m.settle()
    assert not m.stopped
    answers = [msg for _src, client, msg in m.to_clients if client == "client:c"]
    assert answers and answers[-1].error is not None
    assert m.storage["storage:0"].engine.items() == [(1, "a")]


def test_a_write_that_claims_to_be_a_revisions_read_is_just_a_write() -> None:
    m = Model(f=1).ring_of(1)
    op = ("append", ((1, "a"),))
    m.submit("client:c", {H.WRITES: m.ops.part_fun(op, m.placement).ranges, H.ANSWER: True,
                          H.REVISIONS: True}, op)  # fmt: skip
    m.settle()
    assert not m.stopped
    assert m.storage["storage:0"].engine.items() == [(1, ["a"])]


def test_a_revisions_payload_is_an_op_and_keys() -> None:
    assert revised_op((("get", (1,)), (1,)), True) == ("get", (1,))
    assert "no change log" in revised_op((("get", (1,)), (1,)), False)
    for bad in (None, (1, 2, 3), (("get", (1,)), [1]), (("get", (1,)), ({},))):
        assert type(revised_op(bad, True)) is str


def test_a_revisions_read_answers_as_of_its_position_in_a_batch_with_later_writes() -> None:
    """A read and the writes after it delivered in one engine batch: the read's value
    and revisions are both as of its own position, not the batch's end."""
    from ecast import Message

    m = Model(f=1).ring_of(1)
    first = written(m, ("put", ((1, "a"), (2, "b"))))
    core = m.storage["storage:0"]
    point = ((encode_key(1), (*encode_key(1), 0)),)
    read = Message("client:c", (("m", 0, "client:c"), 901), {H.READS: point, H.OFFSET: 0,
                   H.REVISIONS: True, H.REQUEST: 77}, (("get", (1,)), (1,)))  # fmt: skip
    w1 = Message("client:c", (("m", 0, "client:c"), 902), {H.WRITES: point}, ("put", ((1, "c"),)))
    w2 = Message("client:c", (("m", 0, "client:c"), 903), {H.WRITES: point}, ("delete", (1,)))
    w0 = Message("client:c", (("m", 0, "client:c"), 900), {H.WRITES: point}, ("put", ((1, "z"),)))
    t = m.t
    fx = core.deliver([(t + 1, w0), (t + 2, read), (t + 3, w1), (t + 4, w2)])
    m._outputs("storage:0", fx)
    answers = [msg for _s, c, msg in m.to_clients if getattr(msg, "request", None) == 77]
    assert answers and answers[-1].result == [{1: "z"}, [[1, t + 1]]]
    assert first < t + 1


def test_keys_a_dict_confuses_changed_at_one_position_are_two_changes() -> None:
    log = ChangeLog()
    log.record(10, 0.0, [((1, "x"), "put", "a"), ((True, "x"), "put", "b"), (1, "put", "c"),
                         (True, "put", "d"), (1.0, "put", "e")])  # fmt: skip
    (entry,) = log.read(0, EVERYTHING, 11)
    assert sorted(repr(c) for c in entry[1]) == sorted(
        repr(c) for c in [[(1, "x"), "put", "a"], [(True, "x"), "put", "b"],
                          [1.0, "put", "e"], [True, "put", "d"]]
    )  # fmt: skip
    got = [(repr(k), t) for k, t in log.revisions_of([(1, "x"), (True, "x")], EVERYTHING)]
    assert got == [("(1, 'x')", 10), ("(True, 'x')", 10)]


def test_key_value_data_may_not_take_a_table_rows_change_key() -> None:
    """``("~rows", table, key)`` names a row's change: refused as a key-value key by the
    client and by every engine alike, and never stops a replica."""
    m = Model(f=1).ring_of(1)
    rig = Rig(m)
    with pytest.raises(BadOperation, match="reserved"):
        rig.read(("get", (("~rows", "t", 1),)), "sequential")
    key = ("~rows", "t", 1)
    point = ((encode_key(key), (*encode_key(key), 0)),)
    m.submit("client:c", {H.WRITES: point, H.ANSWER: True},
             ("put", ((key, "a"), (key, "b"))))  # fmt: skip
    m.settle()
    assert not m.stopped and m.storage["storage:0"].engine.items() == []
