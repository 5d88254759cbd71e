"""``scan-memory``: tables on the scan engine and key-value data on the memory engine in
one storage process; one batch of both keeps each store's order, only the key-value
writes report changes, and a copy moves both stores (the conformance suite runs each
store's operations as it runs the other engines')."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from rubberband.engine import EVERYTHING, BadOperation, Placement
from rubberband.keys import encode_key
from storage_adapters.scan.client import ScanOps
from storage_adapters.scan.memory_kv import ScanMemoryEngine

T = ScanOps({"t": "k"})


def engine(placement: Placement | None = None) -> ScanMemoryEngine:
    e = ScanMemoryEngine(placement, block_rows=32)
    create = T.create_table("t", [("k", "int64"), ("v", "varchar")], key="k")
    assert e.apply([(create, EVERYTHING)]) == [{"created": True}]
    return e


def rows(result: Any) -> list[tuple[Any, ...]]:
    return sorted(zip(*result["data"], strict=True))


def test_one_batch_of_tables_and_key_value_data_keeps_each_stores_order() -> None:
    e = engine()
    batch: list[tuple[Any, Any]] = [
        (T.upsert("t", [{"k": 1, "v": "a"}]), EVERYTHING),
        (("put", ((("acct", 1), {"b": 5}), ("x", 1))), EVERYTHING),
        (T.select("t", columns=["k", "v"]), EVERYTHING),
        (("append", (("x", 2),)), EVERYTHING),  # x holds an int: refused, nothing written
        (T.upsert("t", [{"k": 1, "v": "b"}, {"k": 2, "v": "c"}]), EVERYTHING),
        (("get", (("acct", 1), "x")), EVERYTHING),
        (("delete", ("x", "never")), EVERYTHING),
        (T.select("t", columns=["k", "v"]), EVERYTHING),
    ]
    results, changes = e.apply_logged(batch)
    assert rows(results[2]) == [(1, "a")]
    assert isinstance(results[3], BadOperation) and "holds a int" in str(results[3])
    assert results[5] == {("acct", 1): {"b": 5}, "x": 1}
    assert rows(results[7]) == [(1, "b"), (2, "c")]
    a, b, c = ({"k": 1, "v": "a"}, {"k": 1, "v": "b"}, {"k": 2, "v": "c"})
    assert changes == [
        ((("~rows", "t", 1), "put", {"row": a, "before": None}),),  # a row, apart from 1
        ((("acct", 1), "put", {"b": 5}), ("x", "put", 1)),
        (),
        (),
        (
            (("~rows", "t", 1), "put", {"row": b, "before": a}),
            (("~rows", "t", 2), "put", {"row": c, "before": None}),
        ),
        (),
        (("x", "delete", None),),  # "never" held nothing: no change
        (),
    ]
    assert e.items() == [(("acct", 1), {"b": 5})]
    assert e.stats()["items"] == 3  # two rows and one key


@pytest.mark.parametrize("partitioning", ["range", "hash"])
def test_a_copy_moves_both_stores_and_a_malformed_chunk_is_refused(partitioning: str) -> None:
    placement = Placement(partitioning)  # type: ignore[arg-type]
    src, dst = engine(placement), engine(placement)
    src.apply([
        (T.upsert("t", [{"k": k, "v": str(k)} for k in range(300)]), EVERYTHING),
        (("put", tuple((k, [k]) for k in range(300))), EVERYTHING),  # the same keys
    ])  # fmt: skip
    half = ((encode_key(0), encode_key(150)),) if partitioning == "range" else (
        (placement.ekey(0), (2, 2**31)),)  # fmt: skip
    cursor = src.open_send(half)
    tags = []
    while (chunk := cursor.next_chunk(300)) is not None:
        tags.append(chunk[0])
        dst.receive(msgpack.unpackb(msgpack.packb(chunk), raw=False), half)
    cursor.close()
    assert tags[0] == "tables" and tags[-1] == "data" and len(tags) > 2
    moved = rows(dst.apply([(T.select("t", columns=["k", "v"]), EVERYTHING)])[0])
    want = rows(src.apply([(T.select("t", columns=["k", "v"]), half)])[0])
    assert moved == want and 0 < len(moved) < 300
    assert dst.items() == [kv for kv in src.items() if any(
        lo <= placement.ekey(kv[0]) < hi for lo, hi in half)]  # fmt: skip
    src.delete(half)
    assert len(src.items()) + len(dst.items()) == 300
    for bad in (None, ["rows", []], ["data"], "data"):
        with pytest.raises(BadOperation, match="chunk"):
            dst.receive(bad, half)


def test_basic_reads_are_table_selects() -> None:
    e = engine()
    e.apply([(T.upsert("t", [{"k": 1, "v": "a"}]), EVERYTHING)])
    (got,) = e.apply_basic([(T.select("t", columns=["k"]), EVERYTHING)])
    assert got["data"] == [[1]]
    (refused,) = e.apply_basic([(("get", ("x",)), EVERYTHING)])
    assert isinstance(refused, BadOperation)
