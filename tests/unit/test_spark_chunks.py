"""The Spark writer's messages are a function of its input prefix alone.

A retried task resubmits in the same E-Cast session from sequence number 1, and the
routers keep the first copy of each number: exactly once holds only if an attempt's
messages are byte-identical to the earlier attempt's for every number both used, and an
attempt whose input ended early (PySpark ends a failed upstream's iterator normally)
sent a prefix of the full attempt's messages."""

from __future__ import annotations

import itertools

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rubberband.engine import MAX_EKEY as MAX
from rubberband.engine import MIN_EKEY as MIN
from rubberband.engine import Placement
from rubberband.keys import stable_hash32
from rubberband.proto import written
from rubberband.spark.chunks import BadRows, Chunker, Target, remainder_messages
from storage_adapters.memory import KVOps
from storage_adapters.scan.client import ScanOps

TABLE = Target(key="id", operation="upsert", table="t")
KV = Target(key="k", operation="append", value="v")


def rows(n: int, seed: int = 0) -> dict[str, list[object]]:
    ids = [(i * 7919 + seed) % 100_003 for i in range(n)]
    return {"id": ids, "name": [f"n{i}" for i in ids], "amount": [i * 0.5 for i in ids]}


def attempt(target: Target, placement: Placement, data: dict, splits: list[int], **kw):
    """Feed ``data`` cut into Arrow-like batches at ``splits``; the numbered messages
    as packed bytes, and the remainder."""
    c = Chunker(target, placement, **kw)
    out = []
    bounds = [0, *sorted(set(splits)), len(next(iter(data.values())))]
    for lo, hi in itertools.pairwise(bounds):
        if hi > lo:
            out.extend(c.feed({k: v[lo:hi] for k, v in data.items()}))
    packed = [msgpack.packb((n, h, p), use_bin_type=True) for n, (p, h) in enumerate(out, 1)]
    return packed, c.remainder()


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 3000),
    splits_a=st.lists(st.integers(0, 3000), max_size=8),
    splits_b=st.lists(st.integers(0, 3000), max_size=8),
    cut=st.integers(0, 3000),
    rpm=st.sampled_from([1, 7, 100, 512]),
    buckets=st.sampled_from([1, 3, 8]),
    partitioning=st.sampled_from(["range", "hash"]),
)
def test_attempts_agree_and_a_cut_input_sends_a_prefix(
    n, splits_a, splits_b, cut, rpm, buckets, partitioning
) -> None:
    placement = Placement(partitioning)
    data = rows(n)
    kw = {"rows_per_message": rpm, "buckets": buckets}
    first, rest_a = attempt(TABLE, placement, data, [s for s in splits_a if s < n], **kw)
    second, rest_b = attempt(TABLE, placement, data, [s for s in splits_b if s < n], **kw)
    assert first == second  # batch boundaries (Arrow's) change nothing
    assert rest_a == rest_b
    cut = min(cut, n)
    short, _ = attempt(TABLE, placement, {k: v[:cut] for k, v in data.items()}, [], **kw)
    assert first[: len(short)] == short


def test_every_row_is_sent_once_by_the_tasks_or_the_driver() -> None:
    placement = Placement("hash")
    data = rows(5000, seed=3)
    parts = []
    sent: list[int] = []
    for p in range(3):
        c = Chunker(TABLE, placement, rows_per_message=128, buckets=8)
        part = {k: v[p::3] for k, v in data.items()}
        for payload, header in c.feed(part):
            sent.extend(payload["data"][payload["columns"].index("id")])
            assert TABLE_OPS.part_fun(payload, placement).ranges  # a valid operation
            ((lo, hi),) = written(header)
            for place in (placement.ekey(k) for k in payload["data"][0]):
                assert lo <= place < hi  # the header covers every row it carries
        parts.append((c.columns, c.remainder()))
    driver = remainder_messages(TABLE, placement, 128, parts)
    again = remainder_messages(TABLE, placement, 128, parts)
    assert driver == again
    for payload, _ in driver:
        sent.extend(payload["data"][0])
    assert sorted(sent) == sorted(data["id"])


TABLE_OPS = ScanOps({"t": "id"})


def test_hash_buckets_keep_a_message_on_one_arc() -> None:
    placement = Placement("hash")
    c = Chunker(KV, placement, rows_per_message=50, buckets=8)
    msgs = c.feed({"k": list(range(4000)), "v": list(range(4000))})
    assert msgs
    for (kind, pairs), header in msgs:
        assert kind == "append"
        arcs = {stable_hash32(k) * 8 >> 32 for k, _ in pairs}
        assert len(arcs) == 1
        ((lo, hi),) = written(header)
        assert hi[1] - lo[1] < 2**32 // 8
        assert KVOps().part_fun((kind, pairs), placement).ranges


def test_update_sends_one_operation_per_assignment() -> None:
    t = Target(key="id", operation="update", table="t")
    c = Chunker(t, Placement("range"), rows_per_message=6, buckets=1)
    msgs = c.feed({"id": [1, 2, 3, 4, 5, 6], "state": ["a", "b", "a", "a", "b", "c"]})
    assert [(m["set"], m["where"][0][2]) for m, _ in msgs] == [
        ({"state": "a"}, [1, 3, 4]),
        ({"state": "b"}, [2, 5]),
        ({"state": "c"}, [6]),
    ]


def test_bad_rows_are_refused_with_the_reason() -> None:
    with pytest.raises(BadRows, match=r"no (key )?column"):
        Chunker(TABLE, Placement()).feed({"name": ["x"]})
    with pytest.raises(BadRows, match="null"):
        Chunker(TABLE, Placement()).feed({"id": [1, None]})
    with pytest.raises(BadRows, match="operation"):
        Target(key="id", operation="merge")  # type: ignore[arg-type]
    with pytest.raises(BadRows, match="append"):
        Target(key="id", operation="append", table="t")
    with pytest.raises(BadRows, match="rows_per_message"):
        Chunker(TABLE, Placement(), rows_per_message=0)


def _apply(engine, messages, placement):  # type: ignore[no-untyped-def]
    """Apply messages as a replica holding their ranges would (the header's ranges)."""
    results = engine.apply([(p, written(h)) for p, h in messages])
    for r in results:
        assert not isinstance(r, Exception), r
    return results


@pytest.mark.parametrize("partitioning", ["range", "hash"])
def test_every_operation_does_what_it_says_on_the_engines(partitioning: str) -> None:
    from storage_adapters.memory import MemoryEngine
    from storage_adapters.scan.engine import ScanEngine

    placement = Placement(partitioning)
    scan = ScanEngine(placement)
    ops = ScanOps()
    schema = [("id", "int64"), ("state", "varchar(8)"), ("day", "date")]
    scan.apply([(ops.create_table("t", schema, "id"), ((MIN, MAX),))])
    rows = {"id": list(range(100)), "state": ["new"] * 100, "day": ["2026-11-27"] * 100}

    def run(operation: str, data: dict, rpm: int = 16) -> None:
        c = Chunker(Target(key="id", operation=operation, table="t"), placement, rpm, 4)
        msgs = c.feed(data)
        msgs += remainder_messages(c.target, placement, rpm, [(c.columns, c.remainder())])
        _apply(scan, msgs, placement)

    def table() -> dict:
        op = ops.select("t")
        op["key"] = "id"
        (res,) = scan.apply([(op, ((MIN, MAX),))])
        return {r["id"]: (r["state"], r["day"]) for r in ScanOps.rows(res)}

    run("insert", rows)
    assert table() == {i: ("new", "2026-11-27") for i in range(100)}
    run("update", {"id": [3, 4, 5], "state": ["paid", "paid", "void"]})
    run("upsert", {"id": [7, 100], "state": ["again", "more"], "day": ["2026-01-01"] * 2})
    run("delete", {"id": [0, 1, 2]})
    got = table()
    assert set(got) == set(range(3, 101))
    assert got[3] == got[4] == ("paid", "2026-11-27") and got[5][0] == "void"
    assert got[7] == ("again", "2026-01-01") and got[100] == ("more", "2026-01-01")

    kv = MemoryEngine(placement)
    for operation, data in [
        ("upsert", {"k": ["a", "b"], "v": [1, 2]}),
        ("append", {"k": ["l", "l", "m"], "v": [1, 2, 3]}),
        ("delete", {"k": ["b"]}),
    ]:
        c = Chunker(Target(key="k", operation=operation, value="v"), placement, 2, 4)
        msgs = c.feed({k: v for k, v in data.items() if operation != "delete" or k == "k"})
        msgs += remainder_messages(c.target, placement, 2, [(c.columns, c.remainder())])
        _apply(kv, msgs, placement)
    (found,) = kv.apply([(("scan", None, None), ((MIN, MAX),))])
    assert dict(found) == {"a": 1, "l": [1, 2], "m": [3]}
