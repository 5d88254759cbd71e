"""Clock Scan over one batch of a table's operations (dissertation 2.4.3, 2.5, 2.6.2).

All operations of a batch are activated together.  Writes and *strict* reads must take
effect exactly as if run one after another in batch order; *basic* reads see the batch's
final state (Clock Scan runs its update-data join before its query-data join, so a basic
read sharing a cycle with later writes sees them, 2.5.3).

Index Union Update Join (2.6.2) keeps that order per row with timestamps; here the same
insight is applied a batch at a time, vectorized:

1. **Hot rows.**  A row no write's predicate matches in the batch's *initial* state is
   never changed by the batch: the first write to change it would have to match it while
   it still held its initial values.  One shared scan with the writes as probes (an
   update-data join, including each insert's and upsert's keys) finds the *hot* rows,
   normally a handful: updates and deletes are selective in practice (2.6.2).
2. **Writes in order.**  The writes run one after another on the hot rows only, gathered
   into small arrays.  Every change closes the row's current *version* at the write's
   position and opens the next one, so each version knows the batch positions
   ``[start, end)`` at which it is the row's state.  An insert whose key exists, or
   repeats within it, is refused whole before it changes anything.
3. **Reads.**  One shared scan with all reads as probes (the query-data join) covers the
   cold rows, unchanged through the batch, and a *version block* of the hot rows'
   versions, where a pair counts only if the read's position lies in the version's
   interval (basic reads sit past the last write).
4. **Write-back.**  The hot rows' final state goes back into the blocks; new rows fill
   free slots.

This equals executing the batch's operations one by one, which the tests check against
that and against SQLite; its cost is one scan for the writes' predicates and one for the
reads, plus work proportional to the hot rows, whatever the mix of the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rubberband.engine import ROWS, BadOperation, Placement, RangeSet, rejection
from storage_adapters.scan.ops import Rows, Select, Write
from storage_adapters.scan.plan import Probe, Stats, domain_of, make_plan
from storage_adapters.scan.predicates import (
    HASH_COLUMN,
    Atom,
    Constraint,
    Domain,
    TypedRange,
    evaluate,
    points,
    ranges_constraint,
    string_atom_mask,
    typed_range_mask,
    typed_ranges,
)
from storage_adapters.scan.results import ReadSink, decode_column
from storage_adapters.scan.scan import RowMarker, Unit, run
from storage_adapters.scan.table import Block, Table

LAST = 1 << 62
"""Version end of a row still alive after the batch."""
BASIC = LAST - 1
"""The position of a basic read: after every write of the batch."""

Restriction = list[TypedRange] | None
"""An operation's ranges as key (or hash) intervals; None: everything."""

Item = tuple[int, Select | Write, RangeSet]


def restriction(table: Table, ranges: RangeSet) -> Restriction:
    if table.hashed:
        return typed_ranges(ranges, 2)
    return typed_ranges(ranges, 3 if table.schema.key_column.type.is_string else 2)


def placement_column(table: Table) -> str:
    return HASH_COLUMN if table.hashed else table.schema.key


def probe_of(table: Table, atoms: Sequence[Atom], where: Restriction) -> Probe | None:
    """The constraints of a conjunction and a restriction; None if nothing can match."""
    by_col: dict[str, list[Atom]] = {}
    for a in atoms:
        by_col.setdefault(a.column, []).append(a)
    probe: Probe = {}
    for name, col_atoms in by_col.items():
        con = domain_of(table, name).fold(col_atoms)
        if con.empty:
            return None
        probe[name] = _tidy(con)
    if where is not None:
        name = placement_column(table)
        ivs = ranges_constraint(where, domain_of(table, name))
        con = probe.get(name) or Constraint()
        con.add_intervals(ivs)
        if con.empty:
            return None
        probe[name] = _tidy(con)
    return probe


def _tidy(con: Constraint) -> Constraint:
    if con.intervals == [(None, None)]:
        con.intervals = None
        if con.null == 0:
            con.null = 2
    return con


def execute(
    table: Table,
    stats: Stats,
    placement: Placement,
    items: Sequence[Item],
    log: dict[int, list[Any]] | None = None,
) -> dict[int, Any]:
    """Run one table's share of a batch; results by batch position.  With ``log``, each
    write's row changes go into it by batch position (:meth:`HotState.images`)."""
    reads = [(pos, op, rs) for pos, op, rs in items if isinstance(op, Select)]
    writes = [(pos, op, rs) for pos, op, rs in items if isinstance(op, Write)]
    results: dict[int, Any] = {}
    hot: HotState | None = None
    if writes:
        stats.refresh(table)
        hot = _find_hot(table, stats, writes, track_versions=bool(reads))
        hot.log = log
        for pos, op, rs in writes:
            try:
                results[pos] = hot.apply(pos, op, restriction(table, rs), placement)
            except BadOperation as exc:
                results[pos] = rejection(op, exc)
    if reads:
        results.update(_read(table, stats, reads, hot))
    if hot is not None:
        hot.write_back()
    return results


def _find_hot(table: Table, stats: Stats, writes: list[Item], track_versions: bool) -> HotState:
    probes: list[Probe] = []
    for _, op, rs in writes:
        assert isinstance(op, Write)
        where = restriction(table, rs)
        if op.rows is not None:
            key = table.schema.key
            dom = domain_of(table, key)
            pts = [p for p in (dom.point(k) for k in op.rows.keys) if p is not None]
            if pts:
                probes.append({key: Constraint(intervals=points(pts))})
            continue
        probe = probe_of(table, op.atoms, where)
        if probe is not None:
            probes.append(probe)
    hot_rows: dict[int, np.ndarray] = {}
    if probes and table.blocks:
        plan = make_plan(table, stats, probes)
        units = [Unit(b, i, b.live[: b.n]) for i, b in enumerate(table.blocks) if b.n_live]
        marker = RowMarker()
        run(table, plan, units, marker)
        hot_rows = {i: np.flatnonzero(m) for i, m in marker.marks.items() if m.any()}
    return HotState(table, hot_rows, track_versions)


def _read(table: Table, stats: Stats, reads: list[Item], hot: HotState | None) -> dict[int, Any]:
    stats.refresh(table)
    ops: list[Select] = []
    probes: list[Probe] = []
    positions: list[int] = []
    empty: list[int] = []
    for pos, op, rs in reads:
        assert isinstance(op, Select)
        probe = probe_of(table, op.atoms, restriction(table, rs))
        if probe is None:
            empty.append(len(ops))
            probe = {}
        ops.append(op)
        probes.append(probe)
        positions.append(BASIC if op.basic else pos)
    sink = ReadSink(table, ops)
    nothing = set(empty)
    live_probes = [q for q in range(len(ops)) if q not in nothing]
    if live_probes:
        plan = make_plan(table, stats, [probes[q] for q in live_probes])
        # Probe ids in the plan are positions in ``live_probes``; the sink speaks in read
        # ids, so translate on the way in.
        relay = _Relay(sink, np.array(live_probes, dtype=np.int32))
        units = []
        for i, b in enumerate(table.blocks):
            if not b.n_live:
                continue
            valid = b.live[: b.n]
            if hot is not None and i in hot.by_block:
                valid = valid.copy()
                valid[hot.by_block[i]] = False
            units.append(Unit(b, i, valid))
        if hot is not None and len(hot):
            units.append(hot.version_unit())
        pos_arr = np.array([positions[q] for q in live_probes], dtype=np.int64)
        run(table, plan, units, relay, pos_arr)
    out = sink.results()
    return {pos: out[i] for i, (pos, _, _) in enumerate(reads)}


def _hash_in_ranges(where: list[TypedRange], hashes: np.ndarray) -> np.ndarray:
    ivs = ranges_constraint(where, Domain(None))
    return evaluate(Constraint(intervals=ivs), hashes, None)


class _Relay:
    def __init__(self, sink: ReadSink, ids: np.ndarray) -> None:
        self.sink = sink
        self.ids = ids

    def pairs(self, unit: Unit, rows: np.ndarray, probes: np.ndarray) -> None:
        self.sink.pairs(unit, rows, self.ids[probes])

    def rows(self, unit: Unit, probe: int, rows: np.ndarray) -> None:
        self.sink.rows(unit, int(self.ids[probe]), rows)


# ---------------------------------------------------------------- hot rows
class HotState:
    """The hot rows of a batch, gathered into small arrays, and their versions.

    Arrays grow by doubling (``n`` rows in use), so a batch of many inserts costs linear
    time.  Writes find their rows through the key when they name it (``key = c`` or
    ``key in [...]``, the common case) and compare strings by dictionary code for ``=``,
    ``!=`` and ``in``, so thousands of writes by key cost about as much as their count."""

    def __init__(self, table: Table, by_block: dict[int, np.ndarray], track_versions: bool):
        self.table = table
        self.by_block = by_block
        self.track = track_versions
        schema = table.schema
        blocks = sorted(by_block)
        parts = [(table.blocks[i], by_block[i]) for i in blocks]
        self.cols: dict[str, np.ndarray] = {}
        self.nulls: dict[str, np.ndarray] = {}
        for c in schema.columns:
            arrays = [b.cols[c.name][r] for b, r in parts]
            self.cols[c.name] = (
                np.concatenate(arrays) if arrays else np.zeros(0, dtype=c.type.dtype)
            )
            if c.nullable and not c.type.is_string:
                masks = [b.nulls[c.name][r] for b, r in parts]
                self.nulls[c.name] = np.concatenate(masks) if masks else np.zeros(0, bool)
        self.hash: np.ndarray | None = None
        if table.hashed:
            hashes = [b.hash[r] for b, r in parts if b.hash is not None]
            self.hash = np.concatenate(hashes) if hashes else np.zeros(0, np.int64)
        n = sum(len(r) for _, r in parts)
        self.n = n
        self.origin_block = np.repeat(
            np.array(blocks, dtype=np.int64), [len(by_block[i]) for i in blocks]
        ).astype(np.int64)
        self.origin_row = (
            np.concatenate([by_block[i] for i in blocks]).astype(np.int64)
            if blocks
            else np.zeros(0, np.int64)
        )
        self.alive = np.ones(n, dtype=bool)
        self.dirty = np.zeros(n, dtype=bool)
        self.start = np.full(n, -1, dtype=np.int64)
        self.versions: list[
            tuple[
                np.ndarray,
                np.ndarray,
                dict[str, np.ndarray],
                dict[str, np.ndarray],
                np.ndarray | None,
            ]
        ] = []
        self.keys: dict[Any, int] = dict(zip(self._key_values(slice(0, n)), range(n), strict=True))
        """Hot row of each alive key."""
        self.log: dict[int, list[Any]] | None = None
        """Set, it takes each write's row changes by batch position (change feeds)."""

    def __len__(self) -> int:
        return self.n

    def _key_values(self, where: Any) -> list[Any]:
        key = self.table.schema.key_column
        values = self.cols[key.name][where]
        if key.type.is_string:
            return self.table.dicts[key.name].decode(values)
        return values.tolist()  # type: ignore[no-any-return]

    def _grow(self, extra: int) -> None:
        need = self.n + extra
        if need <= len(self.alive):
            return
        cap = max(need, 2 * len(self.alive), 64)

        def grown(a: np.ndarray, fill: Any) -> np.ndarray:
            out = np.full(cap, fill, dtype=a.dtype)
            out[: self.n] = a[: self.n]
            return out

        self.cols = {k: grown(v, 0) for k, v in self.cols.items()}
        self.nulls = {k: grown(v, False) for k, v in self.nulls.items()}
        if self.hash is not None:
            self.hash = grown(self.hash, 0)
        self.alive = grown(self.alive, False)
        self.dirty = grown(self.dirty, False)
        self.start = grown(self.start, -1)
        self.origin_block = grown(self.origin_block, -1)
        self.origin_row = grown(self.origin_row, -1)

    # ---------------------------------------------------------------- value mode
    def match(self, atoms: Sequence[Atom], where: Restriction) -> np.ndarray:
        """Alive hot rows that satisfy ``atoms`` and lie in ``where``."""
        rows = self._by_key(atoms)
        if rows is None:
            rows = np.flatnonzero(self.alive[: self.n])
        if not len(rows):
            return rows
        m = np.ones(len(rows), dtype=bool)
        by_col: dict[str, list[Atom]] = {}
        for a in atoms:
            by_col.setdefault(a.column, []).append(a)
        schema = self.table.schema
        for name, col_atoms in by_col.items():
            col = schema.by_name[name]
            if col.type.is_string:
                codes = self.cols[name][rows]
                nul = codes == 0
                for a in col_atoms:
                    m &= self._string_mask(name, a, codes, nul)
            else:
                con = Domain(col).fold(col_atoms)
                nulls = self.nulls.get(name)
                m &= evaluate(con, self.cols[name][rows], None if nulls is None else nulls[rows])
        if where is not None:
            m &= self._in_ranges(where, rows)
        return rows[m]

    def _by_key(self, atoms: Sequence[Atom]) -> np.ndarray | None:
        """The alive rows an equality or ``in`` on the key allows, None without one."""
        key = self.table.schema.key
        found: set[int] | None = None
        for a in atoms:
            if a.column != key or a.op not in ("=", "in"):
                continue
            values = (a.value,) if a.op == "=" else a.value
            hits = {self.keys[v] for v in values if v in self.keys}
            found = hits if found is None else found & hits
        return None if found is None else np.array(sorted(found), dtype=np.int64)

    def _string_mask(self, name: str, a: Atom, codes: np.ndarray, nul: np.ndarray) -> np.ndarray:
        d = self.table.dicts[name]
        if a.op == "=":
            code = d.code(a.value)
            return codes == code if code else np.zeros(len(codes), dtype=bool)
        if a.op == "!=":
            code = d.code(a.value)
            return (codes != code) & ~nul if code else ~nul
        if a.op == "in":
            wanted = [c for c in (d.code(v) for v in a.value) if c]
            return np.isin(codes, wanted)
        strings = d.values.take(codes)
        strings[nul] = ""
        return string_atom_mask(a, strings, nul)

    def _in_ranges(self, where: list[TypedRange], rows: np.ndarray) -> np.ndarray:
        table = self.table
        if table.hashed:
            assert self.hash is not None
            return _hash_in_ranges(where, self.hash[rows])
        key = table.schema.key_column
        values = self.cols[key.name][rows]
        if key.type.is_string:
            return typed_range_mask(where, table.dicts[key.name].values.take(values))
        ivs = ranges_constraint(where, Domain(key))
        return evaluate(Constraint(intervals=ivs), values, None)

    def _new_rows_in_ranges(
        self, where: list[TypedRange], rows: Rows, hashes: np.ndarray | None
    ) -> np.ndarray:
        table = self.table
        if table.hashed:
            assert hashes is not None
            return _hash_in_ranges(where, hashes)
        key = table.schema.key_column
        values = rows.values[key.name]
        if key.type.is_string:
            return typed_range_mask(where, np.array(values, dtype=object))
        ivs = ranges_constraint(where, Domain(key))
        return evaluate(Constraint(intervals=ivs), values, None)

    # ---------------------------------------------------------------- writes
    def apply(self, pos: int, op: Write, where: Restriction, placement: Placement) -> Any:
        if op.kind == "update":
            rows = self.match(op.atoms, where)
            if len(rows):
                before = self.images(rows) if self.log is not None else None
                self._close(rows, pos)
                self._assign(rows, op.assignments)
                self.start[rows] = pos
                if before is not None:
                    self._logged(pos, rows, before, "put")
            return {"updated": len(rows)}
        if op.kind == "delete":
            rows = self.match(op.atoms, where)
            if len(rows):
                if self.log is not None:
                    self._logged(pos, rows, self.images(rows), "delete")
                self._close(rows, pos)
                self.alive[rows] = False
                self.dirty[rows] = True
                for k in self._key_values(rows):
                    self.keys.pop(k, None)
            return {"deleted": len(rows)}
        assert op.rows is not None
        return self._put(pos, op.rows, where, placement, op.kind == "upsert")

    def images(self, rows: np.ndarray) -> list[dict[str, Any]]:
        """The hot rows' values as plain Python (a NULL as None), a dict each."""
        table, nulls = self.table, self.nulls
        names, columns = [], []
        for col in table.schema.columns:
            values = decode_column(table, col, self.cols[col.name][rows]).tolist()
            if col.name in nulls:
                masked = nulls[col.name][rows].tolist()
                values = [None if null else v for v, null in zip(values, masked, strict=True)]
            names.append(col.name)
            columns.append(values)
        return [dict(zip(names, row, strict=True)) for row in zip(*columns, strict=True)]

    def _logged(self, pos: int, rows: np.ndarray, before: list[Any] | None, kind: str) -> None:
        """Log a write's changes to ``rows``: after (a put) and before images."""
        assert self.log is not None
        name = self.table.name
        keys = self._key_values(rows)
        olds = before if before is not None else [None] * len(keys)
        if kind == "delete":
            pairs = zip(keys, olds, strict=True)
            out = [((ROWS, name, k), "delete", {"before": b}) for k, b in pairs]
        else:  # row_key's form, built inline: a bulk insert logs thousands at once
            after = self.images(rows)
            out = [((ROWS, name, k), "put", {"row": a, "before": b})
                   for k, a, b in zip(keys, after, olds, strict=True)]  # fmt: skip
        self.log.setdefault(pos, []).extend(out)

    def _close(self, rows: np.ndarray, pos: int) -> None:
        """End the current version of ``rows`` at ``pos``."""
        if not self.track:
            return
        cols = {k: v[rows] for k, v in self.cols.items()}
        nulls = {k: v[rows] for k, v in self.nulls.items()}
        hashes = None if self.hash is None else self.hash[rows]
        self.versions.append(
            (self.start[rows], np.full(len(rows), pos, dtype=np.int64), cols, nulls, hashes)
        )

    def _assign(self, rows: np.ndarray, assignments: dict[str, Any]) -> None:
        schema = self.table.schema
        for name, value in assignments.items():
            col = schema.by_name[name]
            if col.type.is_string:
                code = 0 if value is None else int(self.table.dicts[name].encode([value])[0])
                self.cols[name][rows] = code
                continue
            if value is None:
                self.nulls[name][rows] = True
                continue
            stored = int(value) if col.type.kind == "bool" else value
            self.cols[name][rows] = stored
            if name in self.nulls:
                self.nulls[name][rows] = False
        self.dirty[rows] = True

    def _put(
        self, pos: int, rows: Rows, where: Restriction, placement: Placement, upsert: bool
    ) -> dict[str, int]:
        table = self.table
        schema = table.schema
        hashes = None
        if table.hashed:
            hashes = np.fromiter(
                (placement.ekey(k)[1] for k in rows.keys), dtype=np.int64, count=rows.n
            )
        sel = np.arange(rows.n)
        if where is not None:
            sel = np.flatnonzero(self._new_rows_in_ranges(where, rows, hashes))
        keys = [rows.keys[i] for i in sel.tolist()] if len(sel) < rows.n else rows.keys
        if upsert:
            last = {k: i for i, k in zip(sel.tolist(), keys, strict=True)}
            sel = np.array(sorted(last.values()), dtype=np.int64)
            keys = [rows.keys[i] for i in sel.tolist()]
        else:
            if len(set(keys)) < len(keys):
                seen: set[Any] = set()
                dup = next(k for k in keys if k in seen or seen.add(k))  # type: ignore[func-returns-value]
                raise BadOperation(f"key {dup!r:.60} appears twice in the insert")
            for k in keys:
                if k in self.keys:
                    raise BadOperation(f"key {k!r:.60} exists (upsert replaces rows)")
        existing = np.array([self.keys.get(k, -1) for k in keys], dtype=np.int64)
        old = existing >= 0
        # Encode the rows as stored: strings to codes, NULLs to masks.
        cols: dict[str, np.ndarray] = {}
        nulls: dict[str, np.ndarray] = {}
        for c in schema.columns:
            name = c.name
            raw = rows.values[name]
            mask = rows.nulls[name]
            if c.type.is_string:
                strings = raw if len(sel) == rows.n else [raw[i] for i in sel.tolist()]
                codes = table.dicts[name].encode(strings)
                if mask is not None:
                    codes[mask[sel]] = 0
                cols[name] = codes
            else:
                cols[name] = raw[sel]
                if name in self.nulls:
                    nulls[name] = mask[sel] if mask is not None else np.zeros(len(sel), dtype=bool)
        new_hash = None if hashes is None else hashes[sel]
        updated = 0
        if old.any():
            targets = existing[old]
            before = self.images(targets) if self.log is not None else None
            self._close(targets, pos)
            for name, arr in cols.items():
                self.cols[name][targets] = arr[old]
            for name, arr in nulls.items():
                self.nulls[name][targets] = arr[old]
            self.dirty[targets] = True
            self.start[targets] = pos
            updated = int(old.sum())
            if before is not None:
                self._logged(pos, targets, before, "put")
        fresh = ~old
        count = int(fresh.sum())
        if count:
            base = self.n
            self._grow(count)
            span = slice(base, base + count)
            for name in self.cols:
                self.cols[name][span] = cols[name][fresh]
            for name in self.nulls:
                self.nulls[name][span] = nulls[name][fresh]
            if self.hash is not None:
                assert new_hash is not None
                self.hash[span] = new_hash[fresh]
            self.alive[span] = True
            self.dirty[span] = True
            self.start[span] = pos
            self.origin_block[span] = -1
            self.origin_row[span] = -1
            self.n = base + count
            fresh_keys = [k for k, f in zip(keys, fresh.tolist(), strict=True) if f]
            self.keys.update(zip(fresh_keys, range(base, base + count), strict=True))
            if self.log is not None:
                self._logged(pos, np.arange(base, base + count), None, "put")
        if upsert:
            return {"inserted": count, "updated": updated}
        return {"inserted": count}

    # ---------------------------------------------------------------- reads and the end
    def version_unit(self) -> Unit:
        """The versions of the hot rows as one block, with their visibility intervals."""
        alive = np.flatnonzero(self.alive[: self.n])
        parts = [*self.versions]
        parts.append(
            (
                self.start[alive],
                np.full(len(alive), LAST, dtype=np.int64),
                {k: v[alive] for k, v in self.cols.items()},
                {k: v[alive] for k, v in self.nulls.items()},
                None if self.hash is None else self.hash[alive],
            )
        )
        vstart = np.concatenate([p[0] for p in parts])
        vend = np.concatenate([p[1] for p in parts])
        cols = {k: np.concatenate([p[2][k] for p in parts]) for k in self.cols}
        nulls = {k: np.concatenate([p[3][k] for p in parts]) for k in self.nulls}
        hashes = None
        if self.hash is not None:
            hashes = np.concatenate([p[4] for p in parts if p[4] is not None])
        n = len(vstart)
        block = Block(cols, nulls, np.ones(n, dtype=bool), n, hashes)
        return Unit(block, -1, np.ones(n, dtype=bool), vstart, vend)

    def write_back(self) -> None:
        table = self.table
        n = self.n
        have_origin = self.origin_block[:n] >= 0
        alive = self.alive[:n]
        gone = np.flatnonzero(have_origin & ~alive)
        changed = np.flatnonzero(have_origin & alive & self.dirty[:n])
        for idx, action in ((gone, "kill"), (changed, "scatter")):
            if not len(idx):
                continue
            blocks = self.origin_block[idx]
            for b in np.unique(blocks).tolist():
                sel = idx[blocks == b]
                rows = self.origin_row[sel]
                if action == "kill":
                    table.kill(b, rows)
                else:
                    table.scatter(
                        b,
                        rows,
                        {k: v[sel] for k, v in self.cols.items()},
                        {k: v[sel] for k, v in self.nulls.items()},
                    )
        new = np.flatnonzero(~have_origin & alive)
        if len(new):
            table.append(
                {k: v[new] for k, v in self.cols.items()},
                {k: v[new] for k, v in self.nulls.items()},
                None if self.hash is None else self.hash[new],
            )
        table.drop_empty_blocks()
