"""ScanOps: building operations, routing them (part_fun, 5.3) and combining results."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rubberband.engine import (
    EVERYTHING,
    MAX_EKEY,
    MIN_EKEY,
    NOTHING,
    BadOperation,
    Operations,
    Placement,
    after,
    encode_key,
    normalize,
)
from storage_adapters.scan import ScanEngine, ScanOps

RANGE, HASH = Placement("range"), Placement("hash")


def point(k: Any, placement: Placement = RANGE) -> tuple:
    e = placement.ekey(k)
    return (e, after(e))


def ops() -> ScanOps:
    o = ScanOps()
    o.create_table("t", [("k", "int64"), ("s", "varchar")], key="k")
    return o


def test_it_is_an_operations_implementation() -> None:
    o: Operations = ops()
    assert o.part_fun(ScanOps().drop_table("t"), RANGE).ranges == EVERYTHING


def test_ddl_writes_everything_and_rows_write_their_keys() -> None:
    o = ops()
    assert o.part_fun(o.create_table("u", [("a", "int")], key="a"), HASH).kind == "write"
    ins = o.insert("t", [{"k": 3}, {"k": 1}, {"k": 3}])
    assert o.part_fun(ins, RANGE).ranges == normalize([point(1), point(3)])
    assert o.part_fun(ins, HASH).ranges == normalize([point(1, HASH), point(3, HASH)])
    cols = o.upsert("t", columns=["s", "k"], data=[["a", "b"], [7, 8]])
    assert o.part_fun(cols, RANGE) == o.part_fun(o.upsert("t", [{"k": 7}, {"k": 8}]), RANGE)
    with pytest.raises(BadOperation, match="needs its key"):
        o.part_fun(o.insert("t", [{"s": "x"}]), RANGE)
    with pytest.raises(BadOperation, match="needs the table's key"):
        ScanOps().part_fun(ScanOps().insert("t", [{"k": 1}]), RANGE)
    with pytest.raises(BadOperation, match="cannot be a key"):
        o.part_fun(o.insert("t", [{"k": float("nan")}]), RANGE)


@pytest.mark.parametrize(
    "where, ranges",
    [
        ([("k", "=", 5)], (point(5),)),
        ([("k", "in", [9, 5, 9])], normalize([point(5), point(9)])),
        ([("k", ">=", 5), ("k", "<", 10)], ((encode_key(5), encode_key(10)),)),
        ([("k", ">", 5), ("k", "<=", 10)], ((after(encode_key(5)), after(encode_key(10))),)),
        ([("k", "<", 3)], ((MIN_EKEY, encode_key(3)),)),
        ([("k", ">", 3), ("s", "=", "x")], ((after(encode_key(3)), MAX_EKEY),)),
        ([("k", "=", 5), ("k", "=", 6)], NOTHING),
        ([("k", "in", [1, 5]), ("k", ">", 2)], (point(5),)),
        ([("k", "is null")], NOTHING),
        ([("k", "!=", 5)], EVERYTHING),
        ([("s", "=", "x")], EVERYTHING),
        ([], EVERYTHING),
    ],
)
def test_range_placement_routes_by_the_key_predicates(where: Any, ranges: Any) -> None:
    o = ops()
    for op in (o.select("t", where), o.update("t", where, {"s": "y"}), o.delete("t", where)):
        part = o.part_fun(op, RANGE)
        assert part.ranges == ranges
        assert part.kind == ("read" if op["op"] == "select" else "write")


def test_a_prefix_on_a_string_key_is_a_range_of_strings() -> None:
    o = ScanOps({"u": "name"})
    got = o.part_fun(o.select("u", [("name", "prefix", "ab")]), RANGE).ranges
    assert got == ((encode_key("ab"), encode_key("ac")),)
    got = o.part_fun(o.select("u", [("name", "prefix", "")]), RANGE).ranges
    assert got == ((encode_key(""), encode_key(b"")),)  # every string, nothing else


def test_hash_placement_routes_only_equalities() -> None:
    o = ops()
    assert o.part_fun(o.select("t", [("k", "=", 5)]), HASH).ranges == (point(5, HASH),)
    both = o.part_fun(o.delete("t", [("k", "in", [5, 6]), ("k", "=", 6)]), HASH).ranges
    assert both == (point(6, HASH),)
    assert o.part_fun(o.select("t", [("k", "<", 5)]), HASH).ranges == EVERYTHING
    assert o.part_fun(o.select("t", [("k", "prefix", "a")]), HASH).ranges == EVERYTHING


@st.composite
def key_predicates(draw: Any, string: bool) -> list[tuple[str, str, Any]]:
    values = st.text("abc", max_size=3) if string else st.integers(-20, 20)
    preds: list[tuple[str, str, Any]] = []
    for _ in range(draw(st.integers(0, 3))):
        op = draw(
            st.sampled_from(
                ["=", "<", "<=", ">", ">=", "in", "!="] + (["prefix"] if string else [])
            )
        )
        value = draw(st.lists(values, max_size=3)) if op == "in" else draw(values)
        preds.append(("k", op, value))
    return preds


@settings(max_examples=150, deadline=None)
@given(data=st.data(), string=st.booleans(), partitioning=st.sampled_from(["range", "hash"]))
def test_routing_never_loses_a_row(data: Any, string: bool, partitioning: str) -> None:
    """Whatever the key predicates, the ranges part_fun names hold every row they select."""
    placement = Placement(partitioning)  # type: ignore[arg-type]
    o = ScanOps()
    e = ScanEngine(placement, block_rows=16)
    key_type = "varchar" if string else "int64"
    e.apply([(o.create_table("t", [("k", key_type), ("v", "int8")], key="k"), EVERYTHING)])
    values = st.text("abc", max_size=3) if string else st.integers(-20, 20)
    keys = data.draw(st.lists(values, max_size=30, unique=True))
    e.apply([(o.insert("t", [{"k": k, "v": 0} for k in keys]), EVERYTHING)])
    where = data.draw(key_predicates(string))
    select = o.select("t", where, columns=["k"])
    part = o.part_fun(select, placement)
    (everywhere,) = e.apply([(select, EVERYTHING)])
    (routed,) = e.apply([(select, part.ranges)])
    assert sorted(routed["data"][0]) == sorted(everywhere["data"][0])
    update = o.update("t", where, {"v": 1})
    (changed,) = e.apply([(update, o.part_fun(update, placement).ranges)])
    assert changed == {"updated": len(everywhere["data"][0])}


def test_builders_make_plain_values_and_map_isolation_levels() -> None:
    o = ops()
    op = o.select("t", {"k": 1}, columns=["s"], agg=None, isolation="snapshot")
    assert op == {
        "op": "select",
        "table": "t",
        "where": [["k", "=", 1]],
        "columns": ["s"],
        "key": "k",
    }
    assert o.select("t", isolation="basic")["read"] == "basic"
    with pytest.raises(BadOperation, match="isolation"):
        o.select("t", isolation="dirty")
    day = o.update("t", [("d", ">", dt.date(2024, 1, 2))], {"d": dt.date(2024, 5, 6)})
    assert day["where"] == [["d", ">", "2024-01-02"]] and day["set"] == {"d": "2024-05-06"}
    assert o.select("t", agg=("count", "*"))["agg"] == [["count", "*"]]
    assert o.select("t", agg=[("min", "k"), ("max", "k")])["agg"] == [["min", "k"], ["max", "k"]]


def test_combine_merges_partial_answers_and_raises_rejections() -> None:
    o = ops()
    sel = o.select("t", columns=["k", "s"])
    a = {"columns": ["k", "s"], "data": [[1], ["x"]]}
    b = {"columns": ["k", "s"], "data": [[2, 3], ["y", None]]}
    merged = ScanOps.combine(sel, [a, b])
    assert ScanOps.rows(merged) == [{"k": 1, "s": "x"}, {"k": 2, "s": "y"}, {"k": 3, "s": None}]
    assert ScanOps.combine(o.delete("t"), [{"deleted": 2}, {"deleted": 3}]) == {"deleted": 5}
    assert ScanOps.combine(
        o.upsert("t", [{"k": 1}]), [{"inserted": 1, "updated": 0}, {"inserted": 0, "updated": 2}]
    ) == {"inserted": 1, "updated": 2}
    with pytest.raises(BadOperation, match="nope"):
        ScanOps.combine(sel, [a, BadOperation("nope")])


def test_operations_and_results_survive_msgpack_both_ways() -> None:
    import msgpack

    o = ops()
    e = ScanEngine()
    batch = [
        o.create_table("u", [("k", "int64"), ("d", "date"), ("s", "varchar")], key="k"),
        o.insert("u", [{"k": 1, "d": dt.date(2024, 2, 3), "s": "x"}, {"k": 2}]),
        o.upsert("u", columns=["k", "s"], data=[[2], ["y"]]),
        o.update("u", [("k", "in", [1, 2])], {"d": dt.date(2024, 2, 4)}),
        o.select("u", [("s", "prefix", "")], columns=["k", "d"]),
        o.select("u", agg=[("count", "*"), ("max", "d")], isolation="basic"),
    ]
    wire = [msgpack.unpackb(msgpack.packb(op), use_list=False) for op in batch]
    got = e.apply([(op, EVERYTHING) for op in wire])
    assert got[:4] == [
        {"created": True},
        {"inserted": 2},
        {"inserted": 0, "updated": 1},
        {"updated": 2},
    ]
    assert sorted(zip(*got[4]["data"], strict=True)) == [(1, "2024-02-04"), (2, "2024-02-04")]
    assert got[5]["partials"] == [2, "2024-02-04"]
    assert msgpack.unpackb(msgpack.packb(got)) == got
