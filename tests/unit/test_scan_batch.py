"""Shared-scan equivalence: a batch processed together equals its operations one by one.

Clock Scan activates a whole batch at once (2.4.3); strict reads and writes must still
behave as if each ran alone, in order (2.5), and basic reads as if they ran after the
batch.  The operations come from the SQLite test's generator (random schemas, rows,
predicates, projections and aggregates, under range and hash placement).
"""

from __future__ import annotations

import gc
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rubberband.engine import EVERYTHING, BadOperation, Placement
from storage_adapters.scan import ScanEngine, ScanOps
from tests.garbage import garbage_kept
from tests.unit.test_scan_sqlite import batches, engine_answer


def fresh(cols: list, placement: Placement, block_rows: int) -> ScanEngine:
    e = ScanEngine(placement, block_rows=block_rows)
    spec = [(n, t if nullable else f"{t} not null") for n, t, nullable in cols]
    e.apply([(ScanOps().create_table("t", spec, key="k"), EVERYTHING)])
    return e


def normal(op: dict[str, Any], result: Any) -> Any:
    if isinstance(result, BadOperation):
        return ("rejected", str(result))
    return engine_answer(op, result)


def everything(e: ScanEngine) -> Any:
    (got,) = e.apply([(ScanOps().select("t"), EVERYTHING)])
    return sorted(zip(*got["data"], strict=True), key=repr)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=batches(),
    block_rows=st.sampled_from([16, 32]),
    partitioning=st.sampled_from(["range", "hash"]),
)
def test_a_batch_equals_its_operations_one_at_a_time(
    case: Any, block_rows: int, partitioning: str
) -> None:
    cols, batches_ = case
    placement = Placement(partitioning)  # type: ignore[arg-type]
    together = fresh(cols, placement, block_rows)
    alone = fresh(cols, placement, block_rows)
    for batch in batches_:
        items = [(it["op"], EVERYTHING) for it in batch]
        got = together.apply(items)
        expected: list[Any] = [None] * len(items)
        basic = [i for i, (op, _) in enumerate(items) if op.get("read") == "basic"]
        for i, item in enumerate(items):
            if i not in basic:
                expected[i] = alone.apply([item])[0]
        for i in basic:  # a basic read sees the batch after its writes
            expected[i] = alone.apply([items[i]])[0]
        for i, (op, _) in enumerate(items):
            assert normal(op, got[i]) == normal(op, expected[i]), (i, op, got[i], expected[i])
        assert everything(together) == everything(alone)


def test_strict_reads_between_writes_of_one_batch_see_exactly_the_writes_before_them() -> None:
    ops = ScanOps()
    e = ScanEngine(block_rows=16)
    e.apply([(ops.create_table("t", [("k", "int64"), ("v", "int32")], key="k"), EVERYTHING)])
    batch: list[dict[str, Any]] = []
    for i in range(40):  # a row inserted, counted, updated, counted, deleted, counted
        batch.append(ops.insert("t", [{"k": i, "v": 0}]))
        batch.append(ops.select("t", agg=[("count", "*"), ("sum", "v")]))
        batch.append(ops.update("t", [("k", "=", i)], {"v": i}))
        batch.append(ops.select("t", [("v", ">", 0)], agg=("count", "*")))
        if i % 3 == 0:
            batch.append(ops.delete("t", [("k", "=", i)]))
    got = e.apply([(op, EVERYTHING) for op in batch])
    live: dict[int, int] = {}
    for op, result in zip(batch, got, strict=True):
        kind = op["op"]
        if kind == "insert":
            live[op["rows"][0]["k"]] = 0
        elif kind == "update":
            live[op["where"][0][2]] = op["set"]["v"]
        elif kind == "delete":
            live.pop(op["where"][0][2])
        elif len(op["agg"]) == 2:
            assert result["partials"] == [len(live), sum(live.values())]
        else:
            assert result["partials"] == [sum(1 for v in live.values() if v > 0)]


def test_rejected_operations_leave_no_cyclic_garbage() -> None:
    """A rejection is kept in the batch's results; one that kept the traceback of its
    raise held the frame that held those results, a cycle only the collector frees."""
    ops = ScanOps({"t": "k"})
    e = ScanEngine(Placement(), block_rows=32)
    e.apply([(ops.create_table("t", [("k", "int64"), ("v", "varchar")], key="k"), EVERYTHING)])
    e.apply([(ops.insert("t", [{"k": 1, "v": "a"}]), EVERYTHING)])
    with garbage_kept() as garbage:
        results = e.apply(
            [
                (ops.insert("t", [{"k": 1, "v": "b"}]), EVERYTHING),  # refused while applied
                (("not", "an", "operation"), EVERYTHING),  # refused as it is compiled
                (ops.select("nope"), EVERYTHING),
            ]
        )
        assert all(isinstance(r, BadOperation) for r in results), results
        del results
        assert gc.collect() == 0, Counter(type(o).__name__ for o in garbage).most_common(5)
