"""The query-data join planner: which predicates it indexes, and what the scan skips."""

from __future__ import annotations

from typing import Any

import numpy as np

from rubberband.engine import EVERYTHING
from storage_adapters.scan import ScanEngine, ScanOps
from storage_adapters.scan import scan as scan_module
from storage_adapters.scan.clock import probe_of
from storage_adapters.scan.plan import Stats, make_plan
from storage_adapters.scan.predicates import parse_where

OPS = ScanOps()


def table_of(rows: int = 20000, block_rows: int = 2048) -> tuple[ScanEngine, Any]:
    e = ScanEngine(block_rows=block_rows)
    e.apply(
        [
            (
                OPS.create_table(
                    "t",
                    [
                        ("k", "int64"),
                        ("cabin", "char(1)"),
                        ("city", "varchar"),
                        ("price", "float"),
                        ("day", "date"),
                    ],
                    key="k",
                ),
                EVERYTHING,
            )
        ]
    )
    rng = np.random.default_rng(5)
    e.apply(
        [
            (
                OPS.insert(
                    "t",
                    columns=["k", "cabin", "city", "price", "day"],
                    data=[
                        list(range(rows)),
                        rng.choice(["Y", "C", "F"], size=rows, p=[0.8, 0.15, 0.05]).tolist(),
                        [f"C{i}" for i in rng.integers(0, 2000, size=rows).tolist()],
                        rng.random(rows).tolist(),
                        [f"2024-{1 + i // 2000 % 12:02d}-{1 + i % 28:02d}" for i in range(rows)],
                    ],
                ),
                EVERYTHING,
            )
        ]
    )
    return e, e.tables["t"]


def plan_for(table: Any, wheres: list[list[Any]]) -> Any:
    stats = Stats()
    stats.refresh(table)
    probes = [probe_of(table, parse_where(w, table.schema.by_name), None) for w in wheres]
    return make_plan(table, stats, probes)


def test_hundreds_of_equalities_on_one_column_become_one_index() -> None:
    _, table = table_of()
    plan = plan_for(table, [[("city", "=", f"C{i}")] for i in range(300)])
    assert [idx.column for idx in plan.indexes] == ["city"] and plan.unindexed == []
    keys = plan_for(table, [[("k", "in", [i, i + 7])] for i in range(300)])
    assert [idx.column for idx in keys.indexes] == ["k"]
    assert keys.indexes[0].lut is not None  # a dense lookup table over the key's span


def test_unselective_predicates_stay_in_nested_loops_and_selective_ones_win() -> None:
    _, table = table_of()
    wheres = [[("cabin", "=", "Y")]] + [[("cabin", "=", "Y"), ("k", "=", i)] for i in range(9)]
    plan = plan_for(table, wheres)
    assert plan.unindexed == [0]
    assert [(idx.column, sorted(idx.seg_q.tolist())) for idx in plan.indexes] == [
        ("k", list(range(1, 10)))
    ]
    (residual,) = plan.residuals
    assert residual.column == "cabin" and residual.has_iv.tolist() == [False] + [True] * 9
    # One probe alone does not repay an index: scanning costs it about as much.
    alone = plan_for(table, [[("k", "=", 5)]])
    assert alone.indexes == [] and alone.unindexed == [0]


def test_range_predicates_share_an_index_of_segments() -> None:
    _, table = table_of()
    wheres = [[("price", ">=", i / 1024), ("price", "<", (i + 1) / 1024)] for i in range(200)]
    plan = plan_for(table, wheres)
    (idx,) = plan.indexes
    assert idx.column == "price" and idx.lut is None  # floats: binary search
    assert int(idx.seg_len.sum()) == 200  # abutting ranges: one segment each


def test_blocks_whose_summaries_exclude_a_probe_are_not_scanned(monkeypatch: Any) -> None:
    e, table = table_of()
    scanned: list[int] = []
    real = scan_module.evaluate

    def counting(con: Any, v: np.ndarray, nul: Any) -> np.ndarray:
        scanned.append(len(v))
        return real(con, v, nul)

    monkeypatch.setattr(scan_module, "evaluate", counting)
    (got,) = e.apply(
        [
            (
                OPS.select(
                    "t",
                    [("k", ">=", 4100), ("k", "<", 4200), ("cabin", "!=", "X")],
                    agg=("count", "*"),
                ),
                EVERYTHING,
            )
        ]
    )
    assert got["partials"] == [100]
    assert len(table.blocks) == 10 and sum(scanned) <= 2 * 2 * 2048  # 1 block, 2 columns
