"""The key-value operations on the scan engine run a whole batch in few Clock Scan
cycles (puts merged, appends and adds read once per run); the answer and the data must
be those of running the operations one after another.  The references are the same
engine and the in-memory key-value engine, each given one operation at a time with the
same ranges (a replica's share: an operation's ranges cut by what the replica holds,
which may differ from one operation to the next while writes wait behind a migration).
Operations a client would refuse (``part_fun`` raises) reach only the scan engines: the
batch must treat them as one at a time does."""

from __future__ import annotations

from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from rubberband.engine import BadOperation, Placement, RangeSet, intersect
from storage_adapters.memory import KVOps, MemoryEngine
from storage_adapters.scan.kv import ScanKVEngine
from tests.unit.test_engine_conformance import key_range

KEYS = st.integers(0, 7)
OPS = KVOps()
VALUES = st.one_of(st.integers(-3, 3), st.text("ab", max_size=2), st.lists(st.integers(0, 2)))
OP = st.one_of(
    st.tuples(st.just("put"), st.lists(st.tuples(KEYS, VALUES), min_size=1, max_size=3)),
    st.tuples(st.just("append"), st.lists(st.tuples(KEYS, st.integers(0, 9)), min_size=1,
                                          max_size=3)),
    st.tuples(st.just("add"), st.lists(st.tuples(KEYS, st.integers(-2, 2)), min_size=1,
                                       max_size=3)),
    st.tuples(st.just("delete"), st.lists(KEYS, min_size=1, max_size=2)),
    st.tuples(st.just("get"), st.lists(KEYS, min_size=1, max_size=3)),
    st.tuples(st.just("scan"), st.one_of(st.none(), KEYS), st.one_of(st.none(), KEYS)),
    st.tuples(st.just("delete_range"), KEYS, KEYS),
    st.just(("put", ((1,),))),
    st.just(("explode", 1)),
)  # fmt: skip
HELD = st.one_of(st.none(), st.tuples(KEYS, KEYS).map(sorted))
"""What the replica holds when an operation is delivered: everything, or [lo, hi)."""


def _ranges(op: Any, held: Any) -> tuple[RangeSet, bool]:
    """The ranges a replica applies ``op`` with, and whether a client would send it."""
    try:
        ranges, valid = OPS.part_fun(op, Placement()).ranges, True
    except BadOperation:
        ranges, valid = key_range(0, 8), False
    return (ranges if held is None else intersect(ranges, key_range(*held))), valid


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, BadOperation) or isinstance(b, BadOperation):
        return isinstance(a, BadOperation) and isinstance(b, BadOperation)
    return bool(a == b)


@settings(max_examples=300, deadline=None)
# An add writes key 0 where the replica holds it; the append after it is delivered where
# the replica holds nothing of it, so it must neither read nor be refused by that value.
@example([(("add", [(0, 0)]), None), (("append", [(0, 0)]), [0, 0])], [])
@given(st.lists(st.tuples(OP, HELD), max_size=25), st.lists(st.tuples(KEYS, VALUES)))
def test_one_batch_equals_one_operation_after_another(
    batch: list[tuple[Any, Any]], initial: list[tuple[int, Any]]
) -> None:
    scan, one, memory = ScanKVEngine(block_rows=16), ScanKVEngine(block_rows=16), MemoryEngine()
    try:
        seed = ("put", tuple(initial))
        for e in (scan, one, memory):
            e.apply([(seed, _ranges(seed, None)[0])])
        items = [(op, *_ranges(op, held)) for op, held in batch]
        got = scan.apply([(op, ranges) for op, ranges, _ in items])
        assert len(got) == len(items)
        for (op, ranges, valid), g in zip(items, got, strict=True):
            (w,) = one.apply([(op, ranges)])
            assert _same(g, w), (op, g, w)
            if valid:
                (w,) = memory.apply([(op, ranges)])
                assert _same(g, w), (op, g, w)
        assert scan.items() == one.items() == memory.items()
    finally:
        for e in (scan, one, memory):
            e.close()
