"""Benchmark: the scan engine against SQLite and DuckDB on a Ticket-like table (2.10).

    python -m storage_adapters.scan.bench --rows 1000000 --json

Each engine holds the same generated rows (:mod:`.ticket`) and serves the same stream of
selects, ``--outstanding`` (1,000) at a time in a closed loop, while updates arrive at 0,
100 and 1,000 per second.  SQLite (in memory) has indexes on the key and the two most
queried attributes (flight number, departure date); DuckDB (in memory) has its primary
key.  All three run in this one process, one after another.

Time is *virtual* and counts only the engines' work: the query generator and the driver
cost nothing.  The scan engine takes every outstanding query and every update that
arrived during its previous cycle as one batch (``apply``), so each query's latency is
one cycle.  SQLite and DuckDB serve one statement at a time; the updates that arrived
since the last query run first, in one transaction (kinder to them than one each).
Their latency in a closed loop with N outstanding is the time between a query's
completion and that of the query N before it, as in steady state; when a run completes
fewer than N queries the measured sequence of service times is repeated to fill the
window.  Throughput is queries per second of engine time.

A handful of queries are answered by all engines on the initial data first and their
answers compared, so the numbers are about the same work.  The generated rows (millions
of Python objects the driver keeps) and each loaded engine are frozen out of the
garbage collector's sight (``gc.freeze``), so no engine pays for walking them.  The last
line of output is one JSON object (``--json``: nothing else goes to stdout).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import gc
import json
import os
import platform
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rubberband.engine import EVERYTHING
from storage_adapters.scan import ScanEngine, ScanOps
from storage_adapters.scan.ticket import (
    COLUMNS,
    DATES,
    KEY,
    SCHEMA,
    TABLE,
    Predicate,
    TicketData,
    Workload,
    generate,
    prefix_upper,
)

Query = tuple[list[Predicate], list[str]]
Update = tuple[str, Any]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- engines
class ScanDriver:
    name = "scan"

    def __init__(self, block_rows: int) -> None:
        self.engine = ScanEngine(block_rows=block_rows)
        self.ops = ScanOps()

    def load(self, data: TicketData) -> None:
        e = self.engine
        e.apply([(self.ops.create_table(TABLE, SCHEMA, KEY), EVERYTHING)])
        names = list(data.columns)
        op = self.ops.insert(TABLE, columns=names, data=[data.columns[c] for c in names])
        (result,) = e.apply([(op, EVERYTHING)])
        assert result == {"inserted": data.n}, result

    def select_op(self, q: Query) -> dict[str, Any]:
        preds, proj = q
        where = [(n, o) if o == "is null" else (n, o, v) for n, o, v in preds]
        return self.ops.select(TABLE, where=where, columns=proj)

    def write_op(self, u: Update) -> dict[str, Any]:
        kind, arg = u
        if kind == "update":
            key, values = arg
            return self.ops.update(TABLE, where={KEY: key}, values=values)
        if kind == "insert":
            return self.ops.insert(TABLE, [arg])
        return self.ops.delete(TABLE, where={KEY: arg})

    def keys_of(self, q: Query) -> list[str]:
        (res,) = self.engine.apply([(self.select_op(q), EVERYTHING)])
        return sorted(res["data"][0])


class SqlDriver:
    """SQLite or DuckDB through their DB-API, one statement at a time."""

    def __init__(self, name: str) -> None:
        self.name = name
        if name == "sqlite":
            self.db: Any = sqlite3.connect(":memory:", isolation_level=None)
        else:
            import duckdb

            self.db = duckdb.connect(":memory:")

    def _type(self, typ: str) -> str:
        base = typ.split()[0]
        if base == "date":
            return "TEXT" if self.name == "sqlite" else "DATE"
        if base == "bool":
            return "INTEGER" if self.name == "sqlite" else "BOOLEAN"
        if base.startswith(("int", "varchar", "char")):
            if base.startswith("int"):
                return "INTEGER"
            return "TEXT" if self.name == "sqlite" else "VARCHAR"
        return "DOUBLE"

    def load(self, data: TicketData) -> None:
        cols = ", ".join(
            f"{n} {self._type(t)}{' PRIMARY KEY NOT NULL' if n == KEY else ''}" for n, t in SCHEMA
        )
        self.db.execute(f"CREATE TABLE {TABLE} ({cols})")
        rows = list(zip(*(data.columns[c] for c in COLUMNS), strict=True))
        if self.name == "sqlite":
            marks = ", ".join("?" * len(COLUMNS))
            self.db.execute("BEGIN")
            self.db.executemany(f"INSERT INTO {TABLE} VALUES ({marks})", rows)
            self.db.execute("COMMIT")
            self.db.execute(f"CREATE INDEX by_product ON {TABLE} (productId)")
            self.db.execute(f"CREATE INDEX by_date_out ON {TABLE} (dateOut)")
            self.db.execute("ANALYZE")
            return
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "tickets.csv"
            with path.open("w", newline="") as f:
                w = csv.writer(f)
                w.writerow(COLUMNS)
                w.writerows(rows)
            types = ", ".join(f"'{n}': '{self._type(t)}'" for n, t in SCHEMA)
            self.db.execute(
                f"INSERT INTO {TABLE} SELECT * FROM read_csv('{path}', header=true, "
                f"columns={{{types}}}, nullstr='')"
            )

    def _param(self, name: str, value: Any) -> Any:
        if self.name == "duckdb" and name in DATES and isinstance(value, str):
            return dt.date.fromisoformat(value)
        return value

    def select_sql(self, q: Query) -> tuple[str, list[Any]]:
        preds, proj = q
        parts, args = [], []
        for name, op, value in preds:
            if op == "is null":
                parts.append(f"{name} IS NULL")
            elif op == "prefix":
                parts.append(f"{name} >= ? AND {name} < ?")
                args.extend([value, prefix_upper(value)])
            else:
                parts.append(f"{name} {op} ?")
                args.append(self._param(name, value))
        sql = f"SELECT {', '.join(proj)} FROM {TABLE} WHERE {' AND '.join(parts)}"
        return sql, args

    def query(self, q: Query) -> list[Any]:
        sql, args = self.select_sql(q)
        return self.db.execute(sql, args).fetchall()  # type: ignore[no-any-return]

    def writes(self, updates: list[Update]) -> None:
        db = self.db
        db.execute("BEGIN")
        for kind, arg in updates:
            if kind == "update":
                key, values = arg
                sets = ", ".join(f"{c} = ?" for c in values)
                db.execute(f"UPDATE {TABLE} SET {sets} WHERE {KEY} = ?", [*values.values(), key])
            elif kind == "insert":
                marks = ", ".join("?" * len(COLUMNS))
                db.execute(
                    f"INSERT INTO {TABLE} VALUES ({marks})",
                    [self._param(c, arg[c]) for c in COLUMNS],
                )
            else:
                db.execute(f"DELETE FROM {TABLE} WHERE {KEY} = ?", [arg])
        db.execute("COMMIT")

    def keys_of(self, q: Query) -> list[str]:
        return sorted(row[0] for row in self.query((q[0], [KEY])))


# ---------------------------------------------------------------- closed loops
def run_scan(
    d: ScanDriver,
    w: Workload,
    outstanding: int,
    rate: float,
    seconds: float,
    rng: np.random.Generator,
) -> dict[str, Any]:
    """Cycles of (every outstanding query + the updates that arrived meanwhile)."""
    t = 0.0
    issued = 0
    latencies: list[float] = []
    cycles = 0
    warm = True
    while warm or t < seconds:
        due = int(rate * t) - issued
        ops = [d.select_op(w.query()) for _ in range(outstanding)]
        writes = [d.write_op(w.update()) for _ in range(max(due, 0))]
        batch = ops + writes
        order = rng.permutation(len(batch))
        items = [(batch[i], EVERYTHING) for i in order.tolist()]
        start = time.perf_counter()
        results = d.engine.apply(items)
        took = time.perf_counter() - start
        bad = [r for r in results if isinstance(r, Exception)]
        assert not bad, bad[:3]
        if warm:  # the first cycle takes statistics and warms caches: not counted
            warm = False
            continue
        t += took
        issued += max(due, 0)
        cycles += 1
        latencies.extend([took] * outstanding)
    return summary(latencies, cycles * outstanding, issued, t, extra={"cycles": cycles})


def run_sql(
    d: SqlDriver, w: Workload, outstanding: int, rate: float, seconds: float
) -> dict[str, Any]:
    """One statement at a time; latency from completion times (see the module doc)."""
    t = 0.0
    issued = 0
    completions: list[float] = []
    d.query(w.query())  # warm-up, not counted
    while t < seconds:
        due = int(rate * t) - issued
        if due > 0:
            writes = [w.update() for _ in range(due)]
            start = time.perf_counter()
            d.writes(writes)
            t += time.perf_counter() - start
            issued += due
        q = w.query()
        start = time.perf_counter()
        d.query(q)
        t += time.perf_counter() - start
        completions.append(t)
    c = np.array(completions)
    m = len(c)
    idx = np.arange(m) - outstanding
    k = np.ceil(np.maximum(-idx, 0) / m).astype(np.int64)
    issue = c[idx + k * m] - k * t
    return summary((c - issue).tolist(), m, issued, t)


def summary(
    latencies: list[float],
    queries: int,
    updates: int,
    t: float,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    lat = np.array(latencies) * 1000
    return {
        "qps": round(queries / t, 2) if t else 0.0,
        "p50_ms": round(float(np.percentile(lat, 50)), 2) if len(lat) else None,
        "p99_ms": round(float(np.percentile(lat, 99)), 2) if len(lat) else None,
        "queries": queries,
        "updates": updates,
        "seconds": round(t, 3),
        **(extra or {}),
    }


# ---------------------------------------------------------------- migration
def measure_migration(d: ScanDriver, w: Workload, updates: int) -> dict[str, Any]:
    """What a consistent send cursor costs (5.4): opening it, draining it, and the writes
    that run while it is open, which copy each block they touch once (copy-on-write);
    beside what copying the rows up front at the call would have cost instead."""
    e = d.engine
    table = e.tables[TABLE]
    plain, beside = [], []
    for _ in range(3):  # alternate, take medians: a single update batch is noisy
        batch = [(d.write_op(w.update()), EVERYTHING) for _ in range(updates)]
        start = time.perf_counter()
        e.apply(batch)
        plain.append(time.perf_counter() - start)
        cursor = e.open_send(EVERYTHING)
        batch = [(d.write_op(w.update()), EVERYTHING) for _ in range(updates)]
        start = time.perf_counter()
        e.apply(batch)
        beside.append(time.perf_counter() - start)
        cursor.close()
    start = time.perf_counter()
    cursor = e.open_send(EVERYTHING)
    opened = time.perf_counter() - start
    start = time.perf_counter()
    for block in table.blocks:  # the worst case: every block written while it is open
        block.writable()
    every_block = time.perf_counter() - start
    cursor.close()
    cursor = e.open_send(EVERYTHING)
    start = time.perf_counter()
    chunks = sent = size = 0
    while (chunk := cursor.next_chunk(1 << 20)) is not None:
        chunks += 1
        sent += chunk["n"]
        size += sum(len(c[-1]) for c in chunk["cols"].values())
    drained = time.perf_counter() - start
    cursor.close()
    start = time.perf_counter()
    copies = [{k: v[: b.n][b.live[: b.n]] for k, v in b.cols.items()} for b in table.blocks]
    upfront = time.perf_counter() - start
    del copies
    return {
        "rows": sent,
        "open_ms": round(opened * 1000, 3),
        "copy_every_block_ms": round(every_block * 1000, 1),
        "copy_up_front_ms": round(upfront * 1000, 1),
        "updates": updates,
        "updates_ms_median": round(float(np.median(plain)) * 1000, 1),
        "updates_ms_median_with_cursor_open": round(float(np.median(beside)) * 1000, 1),
        "drain_s": round(drained, 3),
        "drain_mb_per_s": round(size / drained / 1e6, 1) if drained else None,
        "chunks_of_1mb": chunks,
    }


# ---------------------------------------------------------------- the run
def machine() -> dict[str, Any]:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    out = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "sqlite": sqlite3.sqlite_version,
    }
    try:
        import duckdb

        out["duckdb"] = duckdb.__version__
    except ImportError:
        pass
    return out


def unindexed_fraction(w: Workload, n: int = 2000) -> float:
    """Share of queries SQLite's indexes (key, flight number, departure date) cannot serve."""
    indexed = {KEY, "productId", "dateOut"}
    hits = sum(1 for _ in range(n) if not indexed & {p[0] for p in w.query()[0]})
    return round(hits / n, 3)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m storage_adapters.scan.bench", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--outstanding", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=10.0, help="engine time per cell")
    ap.add_argument("--updates", default="0,100,1000", help="updates per second, a list")
    ap.add_argument("--skew", type=float, default=1.0, help="Zipf s of Algorithm 9")
    ap.add_argument("--predicates", type=float, default=3.0, help="D of Algorithm 9")
    ap.add_argument("--engines", default="scan,sqlite,duckdb")
    ap.add_argument("--block-rows", type=int, default=1 << 16)
    ap.add_argument("--check-queries", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--migration",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure a send cursor on the scan engine's table",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rates = [int(r) for r in args.updates.split(",") if r]
    engines = [e for e in args.engines.split(",") if e]

    start = time.perf_counter()
    data = generate(args.rows, args.seed)
    log(f"generated {args.rows} rows in {time.perf_counter() - start:.1f}s")
    gc.collect()
    gc.freeze()
    probe = Workload(data, args.skew, args.predicates, seed=args.seed + 99)
    checks = [probe.query() for _ in range(args.check_queries)]
    result: dict[str, Any] = {
        "updates_per_s": {str(r): {} for r in rates},
        "rows": args.rows,
        "outstanding": args.outstanding,
        "skew": args.skew,
        "mean_predicates": args.predicates,
        "seconds_per_cell": args.seconds,
        "unindexed_fraction": unindexed_fraction(probe),
        "load_seconds": {},
        "machine": machine(),
    }
    answers: dict[str, list[list[str]]] = {}
    factories: dict[str, Callable[[], Any]] = {
        "scan": lambda: ScanDriver(args.block_rows),
        "sqlite": lambda: SqlDriver("sqlite"),
        "duckdb": lambda: SqlDriver("duckdb"),
    }
    for name in engines:
        driver = factories[name]()
        start = time.perf_counter()
        driver.load(data)
        result["load_seconds"][name] = round(time.perf_counter() - start, 2)
        gc.collect()
        gc.freeze()
        answers[name] = [driver.keys_of(q) for q in checks]
        workload = Workload(data, args.skew, args.predicates, seed=args.seed + 7)
        rng = np.random.default_rng(args.seed + 3)
        for rate in rates:
            if name == "scan":
                cell = run_scan(driver, workload, args.outstanding, rate, args.seconds, rng)
            else:
                cell = run_sql(driver, workload, args.outstanding, rate, args.seconds)
            result["updates_per_s"][str(rate)][name] = cell
            log(f"{name:7s} {rate:5d} updates/s: {cell}")
        if name == "scan" and args.migration:
            result["migration"] = measure_migration(driver, workload, 1000)
            log(f"migration: {result['migration']}")
        del driver
        gc.unfreeze()
        gc.collect()
        gc.freeze()
    first = next(iter(answers.values()), [])
    result["answers_agree"] = all(a == first for a in answers.values())
    result["checked_queries"] = len(checks)
    result["rows_per_checked_query"] = round(sum(map(len, first)) / max(len(first), 1), 1)
    if not args.json:
        for rate, cells in result["updates_per_s"].items():
            for name, cell in cells.items():
                print(
                    f"{rate:>5} updates/s {name:7s} qps {cell['qps']:>10} "
                    f"p50 {cell['p50_ms']:>9} ms p99 {cell['p99_ms']:>9} ms"
                )
    print(json.dumps(result))
    return 0 if result["answers_agree"] else 1


if __name__ == "__main__":
    sys.exit(main())
