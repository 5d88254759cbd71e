"""The scan engine's data model: types, predicates, NULLs, writes and their rejections."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rubberband.engine import EVERYTHING, BadOperation, Engine, Placement
from storage_adapters.scan import ScanEngine, ScanOps

OPS = ScanOps()
SCHEMA = [
    ("id", "int64"),
    ("name", "varchar(8)"),
    ("code", "char(2) not null"),
    ("price", "float"),
    ("day", "date"),
    ("ok", "bool"),
    ("small", "int8"),
]


def engine(rows: list[dict[str, Any]] | None = None, **kw: Any) -> ScanEngine:
    e = ScanEngine(block_rows=kw.pop("block_rows", 16), **kw)
    run(e, OPS.create_table("t", SCHEMA, key="id"))
    if rows:
        assert run(e, OPS.insert("t", rows)) == {"inserted": len(rows)}
    return e


def run(e: ScanEngine, *ops: dict[str, Any]) -> Any:
    results = e.apply([(op, EVERYTHING) for op in ops])
    return results[0] if len(ops) == 1 else results


def ids(e: ScanEngine, where: Any) -> list[int]:
    result = run(e, OPS.select("t", where, columns=["id"]))
    assert not isinstance(result, Exception), result
    return sorted(result["data"][0])


ROWS = [
    {
        "id": 1,
        "name": "Amy",
        "code": "A1",
        "price": 10.5,
        "day": "2024-01-31",
        "ok": True,
        "small": -3,
    },
    {
        "id": 2,
        "name": "Bob",
        "code": "B2",
        "price": None,
        "day": "2023-12-01",
        "ok": False,
        "small": 7,
    },
    {"id": 3, "name": None, "code": "C3", "price": 300.0, "day": None, "ok": None, "small": None},
    {
        "id": 4,
        "name": "Albert",
        "code": "A1",
        "price": -0.0,
        "day": "2024-02-29",
        "ok": True,
        "small": 127,
    },
]


def test_it_implements_the_engine_protocol() -> None:
    assert isinstance(ScanEngine(), Engine)


def test_rows_come_back_typed_with_nulls_and_iso_dates() -> None:
    e = engine(ROWS)
    got = run(e, OPS.select("t", [("id", "<=", 3)]))
    assert got["columns"] == [c for c, _ in SCHEMA]
    rows = sorted(ScanOps.rows(got), key=lambda r: r["id"])
    assert rows == [{k: r.get(k) for k, _ in SCHEMA} for r in ROWS[:3]]
    assert type(rows[0]["ok"]) is bool and type(rows[0]["small"]) is int
    assert type(rows[0]["price"]) is float and rows[0]["day"] == "2024-01-31"
    # A date object in an operation means the same as its ISO string.
    assert ids(e, [("day", "=", dt.date(2024, 1, 31))]) == [1]


@pytest.mark.parametrize(
    "where, expected",
    [
        ([("name", "=", "Bob")], [2]),
        ([("name", "!=", "Bob")], [1, 4]),  # NULL is neither equal nor unequal
        ([("name", "<", "B")], [1, 4]),
        ([("name", "<=", "Bob")], [1, 2, 4]),
        ([("name", ">", "Amy")], [2]),
        ([("name", ">=", "Albert")], [1, 2, 4]),
        ([("name", "prefix", "A")], [1, 4]),
        ([("name", "prefix", "Al")], [4]),
        ([("name", "prefix", "")], [1, 2, 4]),
        ([("name", "in", ["Bob", "Zed", "Amy"])], [1, 2]),
        ([("name", "in", [])], []),
        ([("name", "is null")], [3]),
        ([("name", "is not null")], [1, 2, 4]),
        ([("price", "<", 0.0)], []),  # -0.0 is not below 0.0
        ([("price", "=", 0)], [4]),
        ([("price", ">", 10.5)], [3]),
        ([("price", ">=", 10.5), ("price", "<=", 10.5)], [1]),
        ([("price", "<", float("inf"))], [1, 3, 4]),
        ([("price", ">", float("inf"))], []),
        ([("small", ">", 2.5)], [2, 4]),  # an integer column against a fraction
        ([("small", "=", 7.0)], [2]),
        ([("small", "=", 7.5)], []),
        ([("small", "<", 1000)], [1, 2, 4]),  # beyond int8: still a comparison
        ([("small", "!=", 1000)], [1, 2, 4]),
        ([("day", "<", "2024-01-01")], [2]),
        ([("day", ">=", "2024-02-01")], [4]),
        ([("ok", "=", True)], [1, 4]),
        ([("ok", "!=", True)], [2]),
        ([("ok", "is null")], [3]),
        ([("code", "=", "A1"), ("name", "prefix", "Al")], [4]),
        ([("id", "=", 1), ("id", "=", 2)], []),
        ([("id", ">", 1), ("id", "<", 4), ("id", "!=", 2)], [3]),
        ([("name", "is null"), ("name", "=", "Amy")], []),
        ([], [1, 2, 3, 4]),
        ({"code": "A1"}, [1, 4]),
    ],
)
def test_predicates_follow_sql_three_valued_logic(where: Any, expected: list[int]) -> None:
    assert ids(engine(ROWS), where) == expected


def test_aggregates_are_partials_that_ignore_nulls() -> None:
    e = engine(ROWS)
    op = OPS.select(
        "t",
        agg=[
            ("count", "*"),
            ("count", "price"),
            ("sum", "price"),
            ("avg", "small"),
            ("min", "name"),
            ("max", "name"),
            ("min", "day"),
            ("max", "ok"),
            ("sum", "id"),
        ],
    )
    got = run(e, op)
    assert got["columns"] == [
        "count(*)",
        "count(price)",
        "sum(price)",
        "avg(small)",
        "min(name)",
        "max(name)",
        "min(day)",
        "max(ok)",
        "sum(id)",
    ]
    assert got["partials"] == [4, 3, 310.5, [131, 3], "Albert", "Bob", "2023-12-01", True, 10]
    final = ScanOps.combine(op, [got, got])
    assert final["values"] == [8, 6, 621.0, 131 / 3, "Albert", "Bob", "2023-12-01", True, 20]
    empty = run(
        e,
        OPS.select(
            "t",
            [("id", ">", 99)],
            agg=[("count", "*"), ("sum", "price"), ("avg", "price"), ("min", "name")],
        ),
    )
    assert empty["partials"] == [0, None, [None, 0], None]
    assert ScanOps.combine(op, [])["values"][0] == 0


def test_integer_sums_are_exact_beyond_float_precision() -> None:
    e = ScanEngine(block_rows=16)
    run(e, OPS.create_table("n", [("k", "int64"), ("v", "int64")], key="k"))
    big = 2**62 + 1
    run(e, OPS.insert("n", [{"k": i, "v": big if i % 2 else -big + 3} for i in range(40)]))
    (got,) = run(e, OPS.select("n", agg=[("sum", "v")]))["partials"]
    assert got == 20 * big + 20 * (-big + 3)
    run(e, OPS.insert("n", [{"k": 100 + i, "v": 2**63 - 1} for i in range(4)]))
    (over,) = run(e, OPS.select("n", [("k", ">=", 100)], agg=[("sum", "v")]))["partials"]
    assert over == float(4 * (2**63 - 1))  # beyond what msgpack carries: a float


def test_insert_refuses_existing_and_repeated_keys_whole_and_upsert_replaces() -> None:
    e = engine(ROWS)
    dup = run(e, OPS.insert("t", [{"id": 9, "code": "Z9"}, {"id": 2, "code": "Z9"}]))
    assert isinstance(dup, BadOperation) and "key 2 exists" in str(dup)
    twice = run(e, OPS.insert("t", [{"id": 9, "code": "Z9"}, {"id": 9, "code": "Z8"}]))
    assert isinstance(twice, BadOperation) and "twice" in str(twice)
    assert ids(e, [("id", "=", 9)]) == []  # nothing of either insert stayed
    up = run(
        e,
        OPS.upsert(
            "t", [{"id": 2, "code": "Q1"}, {"id": 9, "code": "Z9"}, {"id": 9, "code": "Z7"}]
        ),
    )
    assert up == {"inserted": 1, "updated": 1}
    rows = ScanOps.rows(
        run(e, OPS.select("t", [("id", "in", [2, 9])], columns=["id", "name", "code"]))
    )
    assert sorted(rows, key=lambda r: r["id"]) == [
        {"id": 2, "name": None, "code": "Q1"},  # replaced whole: left-out columns are NULL
        {"id": 9, "name": None, "code": "Z7"},  # the last row of a key wins
    ]


def test_update_and_delete_report_counts_and_see_earlier_writes_of_the_batch() -> None:
    e = engine(ROWS)
    got = run(
        e,
        OPS.update("t", [("code", "=", "A1")], {"price": 1.0, "name": "X"}),
        OPS.update("t", [("name", "=", "X"), ("price", "=", 1.0)], {"small": None}),
        OPS.delete("t", [("small", "is null")]),
        OPS.select("t", columns=["id", "name"]),
        OPS.delete("t", [("id", "=", 42)]),
    )
    assert got[:3] == [{"updated": 2}, {"updated": 2}, {"deleted": 3}]
    assert got[3] == {"columns": ["id", "name"], "data": [[2], ["Bob"]]}
    assert got[4] == {"deleted": 0}


@pytest.mark.parametrize(
    "op, message",
    [
        ({"op": "select", "table": "nope"}, "unknown table 'nope'"),
        ({"op": "frobnicate", "table": "t"}, "unknown operation"),
        ("select", "an operation is a dict"),
        ({"op": "select", "table": "t", "columns": ["id", "zz"]}, "unknown column 'zz'"),
        ({"op": "select", "table": "t", "where": [["zz", "=", 1]]}, "unknown column 'zz'"),
        ({"op": "select", "table": "t", "where": [["id", "~", 1]]}, "unknown predicate operator"),
        ({"op": "select", "table": "t", "where": [["id", "=", None]]}, "use 'is null'"),
        ({"op": "select", "table": "t", "where": [["id", "=", "x"]]}, "not a value of it"),
        ({"op": "select", "table": "t", "where": [["id", "prefix", "x"]]}, "applies to strings"),
        ({"op": "select", "table": "t", "where": [["price", "=", float("nan")]]}, "NaN"),
        ({"op": "select", "table": "t", "where": [["day", "=", "31.01.2024"]]}, "YYYY-MM-DD"),
        ({"op": "select", "table": "t", "agg": [["sum", "name"]]}, "sum needs a number"),
        ({"op": "select", "table": "t", "agg": [["median", "id"]]}, "unknown aggregate"),
        ({"op": "select", "table": "t", "agg": [["avg", "*"]]}, "only count(*)"),
        ({"op": "select", "table": "t", "agg": [["count", "*"]], "columns": ["id"]}, "not both"),
        ({"op": "select", "table": "t", "read": "dirty"}, "read is 'strict' or 'basic'"),
        ({"op": "select", "table": "t", "key": "name"}, "has key 'id'"),
        ({"op": "select", "table": "t", "limit": 3}, "unknown field"),
        ({"op": "update", "table": "t", "set": {"id": 5}}, "cannot be updated"),
        ({"op": "update", "table": "t", "set": {"code": None}}, "NOT NULL"),
        ({"op": "update", "table": "t", "set": {"small": 128}}, "out of range"),
        ({"op": "update", "table": "t", "set": {"name": "much too long"}}, "longer than 8"),
        ({"op": "update", "table": "t", "set": {"ok": 1}}, "1 is not a value of it"),
        ({"op": "update", "table": "t", "set": {}}, "non-empty"),
        ({"op": "insert", "table": "t", "rows": [{"id": 5}]}, "'code' is NOT NULL"),
        ({"op": "insert", "table": "t", "rows": [{"code": "x"}]}, "needs its key"),
        (
            {"op": "insert", "table": "t", "rows": [{"id": 5, "code": "x", "zz": 1}]},
            "unknown column",
        ),
        ({"op": "insert", "table": "t", "rows": [{"id": True, "code": "x"}]}, "not an integer"),
        (
            {"op": "insert", "table": "t", "rows": [{"id": 5, "code": "x", "price": "1"}]},
            "not a number",
        ),
        (
            {"op": "insert", "table": "t", "rows": [{"id": 5, "code": "\ud800"}]},
            "not valid Unicode",
        ),
        (
            {"op": "insert", "table": "t", "columns": ["id", "code"], "data": [[1, 2], ["a"]]},
            "one value per row",
        ),
        (
            {"op": "create_table", "table": "u", "schema": [["a", "int"]], "key": "b"},
            "not a column",
        ),
        (
            {"op": "create_table", "table": "u", "schema": [["a", "date"]], "key": "a"},
            "must be an integer, float or string",
        ),
        (
            {
                "op": "create_table",
                "table": "u",
                "schema": [["a", "int"], ["a", "int"]],
                "key": "a",
            },
            "twice",
        ),
        (
            {"op": "create_table", "table": "u", "schema": [["a", "decimal"]], "key": "a"},
            "unknown column type",
        ),
        (
            {"op": "create_table", "table": "t", "schema": [["id", "int64"]], "key": "id"},
            "different schema",
        ),
    ],
)
def test_invalid_operations_are_rejected_with_a_clear_message(op: Any, message: str) -> None:
    e = engine(ROWS)
    before = run(e, OPS.select("t"))
    first = run(e, op, OPS.select("t", agg=("count", "*")))[0]
    again = run(e, op, OPS.select("t", agg=("count", "*")))[0]
    assert isinstance(first, BadOperation), first
    assert message in str(first), str(first)
    assert str(again) == str(first)  # deterministic: every replica rejects alike
    assert run(e, OPS.select("t")) == before  # and nothing changed


def test_a_rejected_operation_leaves_the_rest_of_its_batch_alone() -> None:
    e = engine(ROWS)
    got = run(
        e,
        OPS.update("t", [("id", "=", 1)], {"name": "One"}),
        OPS.update("t", [("id", "=", 2)], {"name": "far too long a name"}),
        OPS.insert("t", [{"id": 5, "code": "E5"}, {"id": 1, "code": "E1"}]),
        OPS.select("t", [("id", "in", [1, 2, 5])], columns=["id", "name"]),
    )
    assert got[0] == {"updated": 1}
    assert isinstance(got[1], BadOperation) and isinstance(got[2], BadOperation)
    assert sorted(zip(*got[3]["data"], strict=True)) == [(1, "One"), (2, "Bob")]


def test_create_table_is_idempotent_for_an_identical_schema_and_drop_forgets() -> None:
    e = engine(ROWS)
    assert run(e, OPS.create_table("t", SCHEMA, key="id")) == {"created": False}
    assert ids(e, []) == [1, 2, 3, 4]
    assert run(e, OPS.drop_table("t")) == {"dropped": True}
    assert run(e, OPS.drop_table("t")) == {"dropped": False}
    assert isinstance(run(e, OPS.select("t")), BadOperation)


def test_strings_keep_every_code_point_and_order_like_python() -> None:
    e = ScanEngine(block_rows=16)
    run(e, OPS.create_table("s", [("k", "varchar"), ("v", "int32")], key="k"))
    words = ["", "a", "a\x00", "a\x00b", "ab", "é", "z", "\U0001f600", "\uffff", "A"]
    run(e, OPS.insert("s", [{"k": w, "v": i} for i, w in enumerate(words)]))
    got = run(e, OPS.select("s", columns=["k"]))["data"][0]
    assert sorted(got) == sorted(words)
    for probe in [*words, "a\x00a", "b", "\U0001f601"]:
        below = run(e, OPS.select("s", [("k", "<", probe)], columns=["k"]))["data"][0]
        assert sorted(below) == sorted(w for w in words if w < probe), probe
        pre = run(e, OPS.select("s", [("k", "prefix", probe)], columns=["k"]))["data"][0]
        assert sorted(pre) == sorted(w for w in words if w.startswith(probe)), probe
    (lo, hi) = run(e, OPS.select("s", agg=[("min", "k"), ("max", "k")]))["partials"]
    assert (lo, hi) == (min(words), max(words))


def test_basic_reads_see_the_batch_after_its_writes_and_strict_reads_in_order() -> None:
    e = engine(ROWS)
    strict = OPS.select("t", [("id", "=", 1)], columns=["name"])
    basic = OPS.select("t", [("id", "=", 1)], columns=["name"], isolation="basic")
    got = run(e, strict, basic, OPS.update("t", [("id", "=", 1)], {"name": "Later"}))
    assert got[0]["data"] == [["Amy"]]
    assert got[1]["data"] == [["Later"]]  # a basic read shares the cycle after its writes
    (alone,) = e.apply_basic([(strict, EVERYTHING)])
    assert alone["data"] == [["Later"]]
    (refused,) = e.apply_basic([(OPS.delete("t"), EVERYTHING)])
    assert isinstance(refused, BadOperation)


def test_operations_touch_only_their_ranges() -> None:
    e = engine(ROWS)
    from rubberband.engine import encode_key

    mid = ((encode_key(2), encode_key(4)),)  # ids 2 and 3
    got = e.apply(
        [
            (OPS.select("t", columns=["id"]), mid),
            (OPS.update("t", values={"small": 0}), mid),
            (OPS.insert("t", [{"id": 1.5, "code": "no"}, {"id": 2.5, "code": "ok"}]), mid),
            (OPS.select("t", [("small", "=", 0)], columns=["id"]), EVERYTHING),
            (OPS.delete("t"), ()),
        ]
    )
    assert sorted(got[0]["data"][0]) == [2, 3]
    assert got[1] == {"updated": 2}
    assert isinstance(got[2], BadOperation)  # 1.5 is not an int64 (checked first, whole)
    assert sorted(got[3]["data"][0]) == [2, 3]
    assert got[4] == {"deleted": 0}
    got = e.apply(
        [
            (
                OPS.insert("t", [{"id": 0, "code": "no"}, {"id": 2, "code": "ok"}]),
                ((encode_key(1), encode_key(2)),),
            )
        ]
    )
    assert got == [{"inserted": 0}]  # the row of key 0 belongs elsewhere; 2 is outside too


def test_failures_that_are_not_the_operations_fault_propagate(monkeypatch: Any) -> None:
    e = engine(ROWS)
    from storage_adapters.scan import clock

    def broken(*args: Any) -> Any:
        raise MemoryError("out of memory")

    monkeypatch.setattr(clock, "_read", broken)
    with pytest.raises(MemoryError):
        e.apply([(OPS.select("t"), EVERYTHING)])


def test_hash_placement_restricts_by_the_hash_of_the_key() -> None:
    e = engine(ROWS, placement=Placement("hash"))
    hashes = {i: Placement("hash").ekey(i) for i in range(1, 5)}
    lo, hi = sorted(hashes.values())[1], sorted(hashes.values())[3]
    inside = sorted(i for i, h in hashes.items() if lo <= h < hi)
    (got,) = e.apply([(OPS.select("t", columns=["id"]), ((lo, hi),))])
    assert sorted(got["data"][0]) == inside
    assert len(inside) == 2


def test_stats_report_items_and_bytes() -> None:
    e = engine(ROWS)
    s = e.stats()
    assert s["items"] == 4 and s["bytes"] > 0 and s["tables"] == 1
    run(e, OPS.delete("t", [("id", "<", 3)]))
    assert e.stats()["items"] == 2


TEXT = st.text(
    st.one_of(st.sampled_from("ab\x00é"), st.characters(exclude_categories=("Cs",))),
    max_size=5,
)


@settings(max_examples=80, deadline=None)
@given(
    words=st.lists(TEXT, min_size=1, max_size=20, unique=True), probes=st.lists(TEXT, max_size=5)
)
def test_string_comparisons_agree_with_python_on_any_text(
    words: list[str], probes: list[str]
) -> None:
    e = ScanEngine(block_rows=16)
    run(e, OPS.create_table("s", [("k", "varchar"), ("v", "int8")], key="k"))
    half = len(words) // 2  # two batches: ranks are merged incrementally the second time
    run(e, OPS.insert("s", [{"k": w} for w in words[:half]]))
    run(e, OPS.insert("s", [{"k": w} for w in words[half:]]))
    for probe in [*probes, *words[:3], *(w[:1] for w in words[:3])]:
        for op, test in (
            ("<", str.__lt__),
            ("<=", str.__le__),
            (">", str.__gt__),
            (">=", str.__ge__),
            ("=", str.__eq__),
            ("!=", str.__ne__),
            ("prefix", str.startswith),
        ):
            expected = sorted(w for w in words if test(w, probe))
            got = run(e, OPS.select("s", [("k", op, probe)], columns=["k"]))["data"][0]
            assert sorted(got) == expected, (op, probe)
            # Writes test their rows by value (the hot rows of a batch), not by rank.
            changed = run(e, OPS.update("s", [("k", op, probe)], {"v": 1}))
            assert changed == {"updated": len(expected)}, (op, probe)
        inside = [probe, *words[:2]]
        got = run(e, OPS.update("s", [("k", "in", inside)], {"v": 2}))
        assert got == {"updated": len(set(inside) & set(words))}
