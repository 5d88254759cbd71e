"""The scan engine against SQLite: random schemas, rows, predicates and interleaved batches.

Each batch runs on the engine as one ``apply`` (one shared scan) and on an in-memory
SQLite database one statement at a time, in order; every result must agree: rows as
multisets, counts exactly, float aggregates to rounding.  Strict reads see SQLite's state
at their place in the batch, basic reads its state after the batch.  Every batch runs
three times over: with the optimizer's choice of predicate indexes, with every probe
indexed, and with none, so both join paths meet the same inputs.  ``ECAST_LONG=1`` runs
thousands of cases instead of 200.
"""

from __future__ import annotations

import math
import os
import sqlite3
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rubberband.engine import EVERYTHING, BadOperation, Placement
from storage_adapters.scan import ScanEngine, ScanOps
from storage_adapters.scan import plan as plan_module

EXAMPLES = 3000 if os.environ.get("ECAST_LONG") == "1" else 200
OTHER_TYPES = ["int8", "int32", "int64", "float", "bool", "date", "varchar(4)", "char(2)"]
ALPHABET = "abé\U0001f600"
DATES = ["1999-12-31", "2000-01-01", "2000-02-29", "2024-06-15", "1970-01-01"]


def values_of(typ: str) -> st.SearchStrategy[Any]:
    if typ == "int8":
        return st.integers(-128, 127) | st.integers(-3, 3)
    if typ in ("int32", "int64"):
        return st.integers(-5, 5) | st.sampled_from([2**31 - 1, -(2**31), 10**6])
    if typ == "float":
        return st.sampled_from([-1.5, -0.0, 0.0, 0.5, 1.0, 2.0, 1e300, 3.25]) | st.integers(-3, 3)
    if typ == "bool":
        return st.booleans()
    if typ == "date":
        return st.sampled_from(DATES)
    if typ == "char(2)":
        return st.text(ALPHABET, max_size=2)
    return st.text(ALPHABET, max_size=4)


def constants_of(typ: str) -> st.SearchStrategy[Any]:
    base = values_of(typ)
    if typ in ("int8", "int32", "int64"):
        return base | st.sampled_from([2.5, -0.5, 3.0])
    if typ.startswith(("varchar", "char")):
        return base | st.text(ALPHABET, max_size=6)
    return base


@st.composite
def schemas(draw: Any) -> tuple[list[tuple[str, str, bool]], str]:
    key_type = draw(st.sampled_from(["int64", "varchar(3)", "float"]))
    others = draw(st.lists(st.sampled_from(OTHER_TYPES), min_size=1, max_size=4))
    cols = [("k", key_type, False)]
    for i, t in enumerate(others):
        cols.append((f"c{i}", t, draw(st.booleans())))
    return cols, "k"


FLOAT_KEYS = [-1.5, 0.0, 0.5, 1.0, 2.25, 7.0]
STRING_KEYS = ["", "a", "b", "c", "aa", "ab", "ba", "abc", "cab", "ccc"]


def key_universe(typ: str) -> list[Any]:
    if typ == "int64":
        return list(range(-8, 9))
    return FLOAT_KEYS if typ == "float" else STRING_KEYS


def key_values(typ: str) -> st.SearchStrategy[Any]:
    return st.sampled_from(key_universe(typ))


@st.composite
def rows(draw: Any, cols: list[tuple[str, str, bool]], n: int) -> list[dict[str, Any]]:
    out = []
    for _ in range(n):
        row: dict[str, Any] = {"k": draw(key_values(cols[0][1]))}
        for name, typ, nullable in cols[1:]:
            if draw(st.integers(0, 4)) == 0:
                continue  # missing: NULL if nullable, else filled below
            row[name] = None if nullable and draw(st.booleans()) else draw(values_of(typ))
        for name, typ, nullable in cols[1:]:
            if not nullable and row.get(name) is None:
                row[name] = draw(values_of(typ))
        out.append(row)
    return out


@st.composite
def predicates(draw: Any, cols: list[tuple[str, str, bool]]) -> list[list[Any]]:
    preds = []
    for _ in range(draw(st.integers(0, 3))):
        name, typ, _nullable = draw(st.sampled_from(cols))
        ops = ["=", "!=", "<", "<=", ">", ">=", "in", "is null", "is not null"]
        if typ.startswith(("varchar", "char")):
            ops.append("prefix")
        op = draw(st.sampled_from(ops))
        if op in ("is null", "is not null"):
            preds.append([name, op])
        elif op == "in":
            consts = key_values(typ) if name == "k" else constants_of(typ)
            preds.append([name, "in", draw(st.lists(consts, max_size=4))])
        elif op == "prefix":
            preds.append([name, "prefix", draw(st.text(ALPHABET, max_size=2))])
        else:
            consts = key_values(typ) if name == "k" else constants_of(typ)
            preds.append([name, op, draw(consts)])
    return preds


@st.composite
def batches(draw: Any) -> tuple[list[tuple[str, str, bool]], list[list[dict[str, Any]]]]:
    cols, _ = draw(schemas())
    ops = ScanOps({"t": "k"})
    out = []
    for _ in range(draw(st.integers(1, 3))):
        batch = []
        for _ in range(draw(st.integers(1, 10))):
            kind = draw(
                st.sampled_from(
                    [
                        "insert",
                        "insert",
                        "upsert",
                        "update",
                        "delete",
                        "select",
                        "select",
                        "select",
                        "agg",
                    ]
                )
            )
            if kind in ("insert", "upsert"):
                op = getattr(ops, kind)("t", draw(rows(cols, draw(st.integers(1, 4)))))
            elif kind == "update":
                name, typ, nullable = draw(st.sampled_from(cols[1:]))
                value = None if nullable and draw(st.booleans()) else draw(values_of(typ))
                op = ops.update("t", draw(predicates(cols)), {name: value})
            elif kind == "delete":
                op = ops.delete("t", draw(predicates(cols)))
            elif kind == "select":
                proj = draw(
                    st.lists(
                        st.sampled_from([c[0] for c in cols]), min_size=1, max_size=3, unique=True
                    )
                )
                isolation = draw(st.sampled_from(["sequential", "sequential", "basic"]))
                op = ops.select("t", draw(predicates(cols)), columns=proj, isolation=isolation)
            else:
                aggs: list[tuple[str, str]] = [("count", "*")]
                for name, typ, _ in draw(st.lists(st.sampled_from(cols), max_size=3)):
                    fns = ["count", "min", "max"]
                    if typ in ("int8", "int32", "int64", "float"):
                        fns += ["sum", "avg"]
                    aggs.append((draw(st.sampled_from(fns)), name))
                op = ops.select("t", draw(predicates(cols)), agg=aggs)
            restrict = None
            if draw(st.integers(0, 3)) == 0:
                a, b = draw(key_values(cols[0][1])), draw(key_values(cols[0][1]))
                if a != b:
                    restrict = (a, b)
            batch.append({"op": op, "restrict": restrict})
        out.append(batch)
    return cols, out


# ---------------------------------------------------------------- SQLite side
SQL_TYPES = {"float": "REAL", "bool": "INTEGER", "date": "TEXT"}


def sql_type(typ: str) -> str:
    if typ.startswith(("int", "bool")):
        return "INTEGER"
    return SQL_TYPES.get(typ, "TEXT")


def sql_where(preds: list[list[Any]], restrict: Any) -> tuple[str, list[Any]]:
    parts, args = [], []
    for p in preds:
        name, op = p[0], p[1]
        if op in ("is null", "is not null"):
            parts.append(f"{name} {op.upper()}")
        elif op == "in":
            if not p[2]:
                parts.append("0")
            else:
                parts.append(f"{name} IN ({', '.join('?' * len(p[2]))})")
                args.extend(p[2])
        elif op == "prefix":
            parts.append(f"substr({name}, 1, ?) = ?")
            args.extend([len(p[2]), p[2]])
        else:
            parts.append(f"{name} {'<>' if op == '!=' else op} ?")
            args.append(p[2])
    if restrict is not None:
        parts.append(f"k IN ({', '.join('?' * len(restrict.keys))})" if restrict.keys else "0")
        args.extend(restrict.keys)
    return (" WHERE " + " AND ".join(parts)) if parts else "", args


class Restriction:
    """An operation's ranges, and the same as a filter on keys (for SQLite)."""

    def __init__(self, lo: Any, hi: Any, placement: Placement, universe: list[Any]):
        self.lo, self.hi = placement.ekey(lo), placement.ekey(hi)
        self.ranges = ((self.lo, self.hi),)
        self.keys = [k for k in universe if self.lo <= placement.ekey(k) < self.hi]

    def holds(self, key: Any) -> bool:
        return key in self.keys


def in_restrict(key: Any, restrict: Restriction | None) -> bool:
    return restrict is None or restrict.holds(key)


def run_sqlite(db: sqlite3.Connection, cols: list, item: dict[str, Any]) -> Any:
    op, restrict = item["op"], item["restrict"]
    kind = op["op"]
    names = [c[0] for c in cols]
    if kind in ("insert", "upsert"):
        rows = [r for r in op["rows"] if in_restrict(r["k"], restrict)]
        values = [[r.get(n) for n in names] for r in rows]
        marks = ", ".join("?" * len(names))
        if kind == "insert":
            db.execute("SAVEPOINT s")
            try:
                db.executemany(f"INSERT INTO t ({', '.join(names)}) VALUES ({marks})", values)
            except sqlite3.IntegrityError:
                db.execute("ROLLBACK TO s")
                db.execute("RELEASE s")
                return "rejected"
            db.execute("RELEASE s")
            return {"inserted": len(values)}
        last = {r["k"]: v for r, v in zip(rows, values, strict=True)}
        existing = sum(
            db.execute("SELECT COUNT(*) FROM t WHERE k = ?", (k,)).fetchone()[0] for k in last
        )
        db.executemany(
            f"INSERT OR REPLACE INTO t ({', '.join(names)}) VALUES ({marks})", list(last.values())
        )
        return {"inserted": len(last) - existing, "updated": existing}
    where, args = sql_where(op.get("where", []), restrict)
    if kind == "update":
        ((name, value),) = op["set"].items()
        cur = db.execute(f"UPDATE t SET {name} = ?{where}", [value, *args])
        return {"updated": cur.rowcount}
    if kind == "delete":
        return {"deleted": db.execute(f"DELETE FROM t{where}", args).rowcount}
    types = {c[0]: c[1] for c in cols}
    if "agg" in op:
        exprs = [f"{fn.upper()}({col})" for fn, col in op["agg"]]
        got = db.execute(f"SELECT {', '.join(exprs)} FROM t{where}", args).fetchone()
        out = []
        for (fn, col), v in zip(op["agg"], got, strict=True):
            if fn in ("min", "max") and v is not None and types.get(col) == "bool":
                v = bool(v)
            if fn in ("sum", "avg", "min", "max") and types.get(col) == "float" and v is not None:
                v = float(v)
            out.append(v)
        return ("agg", out)
    proj = op["columns"]
    got = db.execute(f"SELECT {', '.join(proj)} FROM t{where}", args).fetchall()
    fixed = []
    for row in got:
        fixed.append(
            tuple(
                bool(v)
                if v is not None and types[c] == "bool"
                else float(v)
                if v is not None and types[c] == "float"
                else v
                for c, v in zip(proj, row, strict=True)
            )
        )
    return ("rows", sorted(fixed, key=sort_key))


def sort_key(row: tuple) -> tuple:
    return tuple((v is None, type(v).__name__, v if v is not None else 0) for v in row)


def engine_answer(op: dict[str, Any], result: Any) -> Any:
    if isinstance(result, BadOperation):
        return "rejected"
    if op["op"] != "select":
        return result
    combined = ScanOps.combine(op, [result])
    if "agg" in op:
        return ("agg", combined["values"])
    return ("rows", sorted(zip(*combined["data"], strict=True), key=sort_key))


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            return a is b
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def ranges_of(restrict: Restriction | None) -> Any:
    return EVERYTHING if restrict is None else restrict.ranges


def check(cols: list, batches_: list, block_rows: int, placement: Placement) -> None:
    engine = ScanEngine(placement, block_rows=block_rows)
    universe = key_universe(cols[0][1])
    for batch in batches_:
        for it in batch:
            if it["restrict"] is not None:
                a, b = sorted(it["restrict"], key=placement.ekey)
                it["restrict"] = Restriction(a, b, placement, universe)
    ops = ScanOps()
    create = ops.create_table(
        "t", [(n, t if nl else f"{t} not null") for n, t, nl in cols], key="k"
    )
    assert engine.apply([(create, EVERYTHING)]) == [{"created": True}]
    db = sqlite3.connect(":memory:")
    col_sql = ", ".join(f"{n} {sql_type(t)}{'' if nl else ' NOT NULL'}" for n, t, nl in cols)
    db.execute(f"CREATE TABLE t ({col_sql}, PRIMARY KEY (k))")
    for batch in batches_:
        got = engine.apply([(it["op"], ranges_of(it["restrict"])) for it in batch])
        expected: list[Any] = [None] * len(batch)
        basics = []
        for i, it in enumerate(batch):
            if it["op"].get("read") == "basic":
                basics.append(i)
            else:
                expected[i] = run_sqlite(db, cols, it)
        for i in basics:
            expected[i] = run_sqlite(db, cols, batch[i])
        for i, it in enumerate(batch):
            mine = engine_answer(it["op"], got[i])
            assert same(mine, expected[i]), (i, it, mine, expected[i], got[i])


@pytest.mark.parametrize("force", [None, "index", "scan"])
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=batches(),
    block_rows=st.sampled_from([16, 64]),
    partitioning=st.sampled_from(["range", "hash"]),
)
def test_batches_agree_with_sqlite(
    force: str | None, case: Any, block_rows: int, partitioning: str
) -> None:
    cols, batches_ = case
    plan_module.FORCE = force
    try:
        check(cols, batches_, block_rows, Placement(partitioning))  # type: ignore[arg-type]
    finally:
        plan_module.FORCE = None
