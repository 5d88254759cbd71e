"""The scan engine's row changes (change feeds of tables): every row a write puts or
deletes, with its images after and before, equal to a model that runs the same writes
one by one, in batches of any mix (the hot rows of a Clock Scan cycle)."""

from __future__ import annotations

import operator
import random
from typing import Any

import pytest

from rubberband.engine import EVERYTHING, row_key
from storage_adapters.scan.client import ScanOps
from storage_adapters.scan.engine import ScanEngine

T = ScanOps()
COLUMNS = ("k", "city", "age")
CITIES = ("Bern", "Basel", "Zurich", None)
OPS = {"=": operator.eq, "<": operator.lt, ">": operator.gt}


def _row(rng: random.Random, k: int) -> dict[str, Any]:
    age = rng.choice((None, *range(0, 90, 7)))
    return {"k": k, "city": rng.choice(CITIES), "age": age}


def _where(rng: random.Random) -> list[tuple[str, str, Any]]:
    if rng.random() < 0.5:
        return [("city", "=", rng.choice(CITIES[:3]))]
    return [("age", rng.choice(("<", ">")), rng.randrange(90))]


def _matches(row: dict[str, Any], where: list[tuple[str, str, Any]]) -> bool:
    return all(row[c] is not None and OPS[op](row[c], v) for c, op, v in where)


class Model:
    def __init__(self) -> None:
        self.rows: dict[int, dict[str, Any]] = {}

    def apply(self, kind: str, arg: Any) -> list[Any]:
        out = []
        if kind in ("insert", "upsert"):
            if kind == "insert" and any(r["k"] in self.rows for r in arg):
                return []  # refused whole
            for r in arg:
                full = {c: r.get(c) for c in COLUMNS}
                out.append(
                    (row_key("t", r["k"]), "put", {"row": full, "before": self.rows.get(r["k"])})
                )
                self.rows[r["k"]] = full
        elif kind == "update":
            where, values = arg
            for k, r in sorted(self.rows.items()):
                if _matches(r, where):
                    new = {**r, **values}
                    out.append((row_key("t", k), "put", {"row": new, "before": r}))
                    self.rows[k] = new
        else:
            for k, r in sorted(self.rows.items()):
                if _matches(r, arg):
                    out.append((row_key("t", k), "delete", {"before": r}))
                    del self.rows[k]
        return out


def _op(rng: random.Random, model_keys: list[int]) -> tuple[str, Any, Any]:
    kind = rng.choice(("insert", "upsert", "update", "delete"))
    if kind in ("insert", "upsert"):
        keys = rng.sample(range(60), rng.randrange(1, 4))
        rows = [_row(rng, k) for k in keys]
        return kind, rows, getattr(T, kind)("t", rows)
    if kind == "update":
        values = {"age": rng.randrange(90)} if rng.random() < 0.5 else {"city": rng.choice(CITIES)}
        where = _where(rng)
        return kind, (where, values), T.update("t", where, values)
    where = _where(rng)
    return kind, where, T.delete("t", where)


@pytest.mark.parametrize("seed", range(12))
def test_row_changes_equal_a_model_that_runs_the_writes_one_by_one(seed: int) -> None:
    rng = random.Random(seed)
    engine = ScanEngine(block_rows=16)
    engine.apply(
        [
            (
                T.create_table(
                    "t", [("k", "int64"), ("city", "varchar(8)"), ("age", "int32")], "k"
                ),
                EVERYTHING,
            )
        ]
    )
    model = Model()
    for _ in range(40):
        batch = [_op(rng, list(model.rows)) for _ in range(rng.randrange(1, 6))]
        results, changes = engine.apply_logged([(op, EVERYTHING) for _, _, op in batch])
        for (kind, arg, _), result, changed in zip(batch, results, changes, strict=True):
            want = model.apply(kind, arg)
            got = sorted(changed, key=lambda c: c[0][2])
            assert got == sorted(want, key=lambda c: c[0][2]), (kind, arg, result)
    (everything,) = engine.apply([(T.select("t", columns=list(COLUMNS)), EVERYTHING)])
    assert sorted(ScanOps.rows(everything), key=lambda r: r["k"]) == [
        model.rows[k] for k in sorted(model.rows)
    ]


def test_creating_and_dropping_a_table_change_no_row() -> None:
    engine = ScanEngine()
    ops = [
        T.create_table("u", [("k", "int64"), ("v", "varchar(4)")], "k"),
        T.insert("u", [{"k": 1, "v": "a"}]),
        T.drop_table("u"),
    ]
    _, changes = engine.apply_logged([(op, EVERYTHING) for op in ops])
    assert changes == [
        (),
        ((row_key("u", 1), "put", {"row": {"k": 1, "v": "a"}, "before": None}),),
        (),
    ]


def test_a_row_written_twice_at_one_position_keeps_the_first_before_image() -> None:
    """Two writes of one message are one position: the log keeps the row's last image
    and, as its before image, the row as it was before that position."""
    from rubberband.changelog import ChangeLog

    log = ChangeLog()
    a, b, c = {"k": 1, "v": "a"}, {"k": 1, "v": "b"}, {"k": 1, "v": "c"}
    log.record(
        7,
        0.0,
        [
            (row_key("t", 1), "put", {"row": b, "before": a}),
            (5, "put", "x"),
            (row_key("t", 1), "put", {"row": c, "before": b}),
            (5, "put", "y"),
        ],
    )
    assert log.read(0, EVERYTHING, 10) == [
        [7, [[row_key("t", 1), "put", {"row": c, "before": a}], [5, "put", "y"]]]
    ]
