"""The scan engine: Crescando's table engine (dissertation chapter 2) behind the protocol of
:mod:`rubberband.engine`.

Every operation is answered by scanning, with no index on the data, so a query costs
about the same whatever its predicate and however many writes run beside it.  A call to
:meth:`ScanEngine.apply` is one Clock Scan cycle (2.4.3): its operations are activated
together and each table is scanned once for the batch's writes and once for its reads
(:mod:`.clock`), with predicate indexes built for the batch (:mod:`.plan`).

Isolation (5.2): Rubberband's *sequential* and *snapshot* reads arrive in delivery
order and are *strict* here (``"read": "strict"``, the default): they see exactly the
writes before them in the batch.  *Basic* reads (``"read": "basic"`` or
:meth:`ScanEngine.apply_basic`) run after the batch's writes and may see writes that
follow them, as basic reads may in Crescando (2.5.3).

Operations and results are described in :mod:`.ops` and :mod:`.results`, migration
chunks in :mod:`.migrate`, the optional redo log and snapshots in :mod:`.durability`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rubberband.engine import BadOperation, Placement, RangeSet, rejection
from storage_adapters.scan import clock
from storage_adapters.scan.durability import Durability
from storage_adapters.scan.migrate import Decoded, SendCursor
from storage_adapters.scan.ops import (
    DDL,
    Compiled,
    CreateTable,
    DropTable,
    Select,
    Write,
    compile_op,
    is_select,
    op_kind,
)
from storage_adapters.scan.plan import Stats, domain_of, make_plan
from storage_adapters.scan.predicates import Constraint, points, ranges_constraint
from storage_adapters.scan.scan import RowMarker, Unit, run
from storage_adapters.scan.schema import Schema
from storage_adapters.scan.table import Table

DEFAULT_BLOCK_ROWS = 1 << 16
MAX_BLOCK_ROWS = 1 << 20
"""Integer sums stay exact per block only up to this many rows (see :mod:`.results`)."""


class ScanEngine:
    """Main-memory tables answered by shared scans; one instance per storage process."""

    is_read = staticmethod(is_select)

    def __init__(
        self,
        placement: Placement | None = None,
        *,
        block_rows: int = DEFAULT_BLOCK_ROWS,
        durable_dir: str | Path | None = None,
        fsync: bool = True,
        snapshot_after_bytes: int = 64 << 20,
    ) -> None:
        """``durable_dir``: keep a redo log and rolling snapshots there and recover from
        them now (off by default; see :mod:`.durability`)."""
        if not 16 <= block_rows <= MAX_BLOCK_ROWS:
            raise ValueError(f"block_rows is between 16 and {MAX_BLOCK_ROWS}")
        self.placement = placement or Placement()
        self.block_rows = block_rows
        self.tables: dict[str, Table] = {}
        self._stats: dict[str, Stats] = {}
        self._counters = {"batches": 0, "ops": 0, "rejected": 0}
        self._cursors = 0
        self._durability: Durability | None = None
        if durable_dir is not None:
            self._durability = Durability(
                Path(durable_dir), fsync=fsync, snapshot_after_bytes=snapshot_after_bytes
            )
            self._durability.recover(self)

    # ---------------------------------------------------------------- the protocol
    def apply(self, batch: Sequence[tuple[Any, RangeSet]]) -> list[Any]:
        """Run ``batch`` as one Clock Scan cycle; a result or a BadOperation per operation."""
        results = self._apply(batch, basic=False)
        if self._durability is not None:
            self._durability.log_batch(batch, results, self)
        return results

    def apply_logged(
        self, batch: Sequence[tuple[Any, RangeSet]]
    ) -> tuple[list[Any], list[tuple[Any, ...]]]:
        """:meth:`apply`, and each operation's row changes (change feeds): every row a
        write put or deleted, named by :func:`rubberband.engine.row_key`, with its
        images after and before.  Creating or dropping a table changes no row."""
        log: dict[int, list[Any]] = {}
        results = self._apply(batch, basic=False, log=log)
        if self._durability is not None:
            self._durability.log_batch(batch, results, self)
        return results, [tuple(log.get(i, ())) for i in range(len(batch))]

    def apply_basic(self, batch: Sequence[tuple[Any, RangeSet]]) -> list[Any]:
        """Basic reads outside the delivery order (5.2): each op must be a select, and runs
        on the current state.  Writes are refused."""
        return self._apply(batch, basic=True)

    def open_send(self, ranges: RangeSet) -> SendCursor:
        cursor = SendCursor(self.tables, ranges)
        self._cursors += 1
        return cursor

    def receive(self, chunk: Any, ranges: RangeSet) -> None:
        try:
            self._receive(chunk, ranges)
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
            raise BadOperation(f"a refused chunk: {e}") from None
        if self._durability is not None:
            self._durability.log_receive(chunk, self)

    def delete(self, ranges: RangeSet) -> None:
        self._delete(ranges)
        if self._durability is not None:
            self._durability.log_delete(ranges, self)

    def stats(self) -> dict[str, int | float]:
        out: dict[str, int | float] = {
            "items": sum(len(t) for t in self.tables.values()),
            "bytes": sum(t.nbytes() for t in self.tables.values()),
            "tables": len(self.tables),
            "blocks": sum(len(t.blocks) for t in self.tables.values()),
            "send_cursors_opened": self._cursors,
            **self._counters,
        }
        if self._durability is not None:
            out["log_lsn"] = self._durability.lsn
            out["recovered_snapshot_lsn"] = self._durability.recovered["snapshot_lsn"]
            out["recovered_records"] = self._durability.recovered["replayed"]
        return out

    def close(self) -> None:
        if self._durability is not None:
            self._durability.close()
            self._durability = None

    # Recovery replays the log through these: the same work, not logged again.
    def apply_unlogged(self, batch: Sequence[tuple[Any, RangeSet]]) -> list[Any]:
        return self._apply(batch, basic=False)

    def receive_unlogged(self, chunk: Any) -> None:
        self._receive(chunk)

    def delete_unlogged(self, ranges: RangeSet) -> None:
        self._delete(ranges)

    def reset(self) -> None:
        """Hold nothing (before a snapshot is restored into it)."""
        self.tables.clear()
        self._stats.clear()

    def checkpoint(self) -> None:
        """Write a full snapshot now and trim the log (durable engines only)."""
        if self._durability is not None:
            self._durability.checkpoint(self)

    # ---------------------------------------------------------------- batches
    def _apply(
        self,
        batch: Sequence[tuple[Any, RangeSet]],
        basic: bool,
        log: dict[int, list[Any]] | None = None,
    ) -> list[Any]:
        self._counters["batches"] += 1
        self._counters["ops"] += len(batch)
        results: list[Any] = [None] * len(batch)
        group: list[tuple[int, Compiled, RangeSet]] = []
        schemas = {name: t.schema for name, t in self.tables.items()}
        for pos, (op, ranges) in enumerate(batch):
            try:
                kind = op_kind(op)
                if basic and kind != "select":
                    raise BadOperation(f"only selects can be basic reads, not {kind}")
                if kind in DDL:
                    self._run(group, results, log)
                    group = []
                    results[pos] = self._ddl(compile_op(op, schemas))
                    schemas = {name: t.schema for name, t in self.tables.items()}
                    continue
                compiled = compile_op(op, schemas)
                if basic:
                    assert isinstance(compiled, Select)
                    compiled.basic = True
                group.append((pos, compiled, ranges))
            except BadOperation as exc:
                results[pos] = rejection(op, exc)
        self._run(group, results, log)
        self._counters["rejected"] += sum(isinstance(r, BadOperation) for r in results)
        return results

    def _run(
        self,
        group: list[tuple[int, Compiled, RangeSet]],
        results: list[Any],
        log: dict[int, list[Any]] | None = None,
    ) -> None:
        by_table: dict[str, list[clock.Item]] = {}
        for pos, op, ranges in group:
            assert isinstance(op, (Select, Write))
            by_table.setdefault(op.table, []).append((pos, op, ranges))
        for name, items in by_table.items():
            table = self.tables[name]
            out = clock.execute(table, self._stats[name], self.placement, items, log)
            for pos, result in out.items():
                results[pos] = result
            if any(isinstance(op, Write) for _, op, _ in items):
                table.settle()

    def _ddl(self, op: Compiled) -> dict[str, bool]:
        if isinstance(op, CreateTable):
            return {"created": self._create(op.table, op.schema)}
        assert isinstance(op, DropTable)
        dropped = self.tables.pop(op.table, None) is not None
        self._stats.pop(op.table, None)
        return {"dropped": dropped}

    def _create(self, name: str, schema: Schema) -> bool:
        existing = self.tables.get(name)
        if existing is not None:
            if existing.schema == schema:
                return False
            raise BadOperation(f"table {name!r} exists with a different schema or key")
        self.tables[name] = Table(name, schema, self.placement, self.block_rows)
        self._stats[name] = Stats()
        return True

    # ---------------------------------------------------------------- migration
    def _receive(self, chunk: Any, ranges: RangeSet | None = None) -> None:
        """Check the whole chunk first (a malformed one, or one with a row outside
        ``ranges``, changes nothing), then create the table if needed and upsert the
        rows.  Replayed from the log, ``ranges`` is None: the chunk was checked then."""
        got = Decoded(chunk)
        table = self.tables.get(got.table)
        if table is not None and table.schema != got.schema:
            raise ValueError(f"a chunk of {got.table!r} has another schema than the table here")
        key = got.schema.key_column
        if key.type.is_string:
            strings, idx = got.strings[key.name]
            keys = [strings[i] for i in idx.tolist()]
        else:
            keys = got.cols[key.name].tolist()
        if len(set(keys)) != len(keys) or any(k is None for k in keys):
            raise ValueError(f"a chunk of {got.table!r} repeats a key or has a NULL key")
        places = None
        if ranges is not None:
            ekey = self.placement.ekey
            places = [ekey(k) for k in keys]
            for k, place in zip(keys, places, strict=True):
                if not any(lo <= place < hi for lo, hi in ranges):
                    raise ValueError(f"a chunk of {got.table!r} holds {k!r:.40}, outside the copy")
        if table is None:
            self._create(got.table, got.schema)
            table = self.tables[got.table]
        if got.n == 0:
            return
        schema = table.schema
        cols: dict[str, np.ndarray] = dict(got.cols)
        for name, (strings, idx) in got.strings.items():
            present = [i for i, s in enumerate(strings) if s is not None]
            codes = np.zeros(len(strings), dtype=np.int32)
            if present:
                codes[present] = table.dicts[name].encode([strings[i] for i in present])
            cols[name] = codes[idx]
        nulls = {
            c.name: got.nulls.get(c.name)
            for c in schema.columns
            if c.nullable and not c.type.is_string
        }
        hashes = None
        if table.hashed:
            if places is not None:  # ours, not the sender's word
                hashes = np.fromiter((p[1] for p in places), np.int64, count=len(keys))
            else:
                hashes = got.hashes
                if hashes is None:
                    hashes = np.fromiter(
                        (self.placement.ekey(k)[1] for k in keys), np.int64, count=len(keys)
                    )
        # A re-sent chunk replaces what an earlier copy left: receiving is an upsert.
        self._drop_keys(table, keys)
        table.append(cols, nulls, hashes)
        table.settle()

    def _drop_keys(self, table: Table, keys: list[Any]) -> None:
        if not table.blocks:
            return
        dom = domain_of(table, table.schema.key)
        pts = [p for p in (dom.point(k) for k in keys) if p is not None]
        if pts:
            self._kill({table.schema.key: Constraint(intervals=points(pts))}, table)

    def _delete(self, ranges: RangeSet) -> None:
        for table in self.tables.values():
            where = clock.restriction(table, ranges)
            if where is None:
                table.blocks = []
                table.writes += 1
                continue
            if not where or not table.blocks:
                continue
            name = clock.placement_column(table)
            ivs = ranges_constraint(where, domain_of(table, name))
            self._kill({name: Constraint(intervals=ivs)}, table)

    def _kill(self, probe: dict[str, Constraint], table: Table) -> None:
        stats = self._stats[table.name]
        stats.refresh(table)
        plan = make_plan(table, stats, [probe])
        units = [Unit(b, i, b.live[: b.n]) for i, b in enumerate(table.blocks) if b.n_live]
        marker = RowMarker()
        run(table, plan, units, marker)
        for i, m in marker.marks.items():
            table.kill(i, np.flatnonzero(m))
        table.drop_empty_blocks()
