"""What reads return: projected rows, column-wise, and combinable aggregate partials.

A select returns ``{"columns": [names], "data": [[values of column 1], ...]}``: one list
per column rather than one dict per row, because building a dict per row costs more
than the scan that found it, and msgpack then carries each name once.  ``ScanOps.rows``
turns it into dicts for people.  NULL is ``None``; dates are ISO strings.

An aggregating select returns ``{"columns": ["count(*)", ...], "partials": [...]}``,
one *partial* per aggregate that a client combines across storage processes
(:meth:`ScanOps.combine`): ``count`` an int; ``sum``, ``min``, ``max`` a value or None
when no row counted; ``avg`` a ``[sum, count]`` pair.  Integer sums are exact (summed as
two 32-bit halves, each exact in a float64 per block); one that leaves the 64-bit range
msgpack carries is returned as a float.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from storage_adapters.scan.ops import Select
from storage_adapters.scan.scan import Unit
from storage_adapters.scan.schema import Column, day_to_iso, decode_dates
from storage_adapters.scan.table import Table

_INT64 = (-(2**63), 2**63 - 1)


def decode_column(table: Table, col: Column, values: np.ndarray) -> np.ndarray:
    """Stored values (codes, days, 0/1) of one column as an array whose ``tolist()`` gives
    plain Python values.  Arrays, not lists: NumPy arrays are invisible to the garbage
    collector, which would otherwise walk a batch's whole result at every collection."""
    kind = col.type.kind
    if kind == "str":
        return table.dicts[col.name].values.take(values)  # type: ignore[no-any-return]
    if kind == "date":
        return decode_dates(values)
    if kind == "bool":
        return values.astype(bool)
    return values


def stored_nulls(block: Any, col: Column, rows: np.ndarray) -> np.ndarray | None:
    if col.type.is_string:
        return None  # code 0 decodes to None by itself
    mask = block.nulls.get(col.name)
    return None if mask is None else mask[rows]


class ReadSink:
    """Collects what a scan matched for a batch's reads, and builds their results."""

    def __init__(self, table: Table, reads: list[Select]):
        self.table = table
        self.reads = reads
        n = len(reads)
        self.n = n
        self.is_agg = np.array([r.aggs is not None for r in reads], dtype=bool)
        self.pieces: list[tuple[Unit, np.ndarray, np.ndarray]] = []
        specs = {spec for r in reads if r.aggs for spec in r.aggs}
        self.agg_columns = sorted({c for _, c in specs if c is not None})
        self.want_sum = {c for fn, c in specs if fn in ("sum", "avg")}
        self.want_min = {c for fn, c in specs if fn == "min"}
        self.want_max = {c for fn, c in specs if fn == "max"}
        self.count_star = np.zeros(n, dtype=np.int64)
        self.count = {c: np.zeros(n, dtype=np.int64) for c in self.agg_columns}
        self.fsum = {c: np.zeros(n) for c in self.want_sum}
        self.isum: dict[str, list[int]] = {c: [0] * n for c in self.want_sum}
        self.mins: dict[str, np.ndarray] = {}
        self.maxs: dict[str, np.ndarray] = {}
        for c in self.want_min | self.want_max:
            kind = table.schema.by_name[c].type.kind
            fdt = np.float64 if kind == "float" else np.int64
            hi = np.inf if kind == "float" else np.iinfo(np.int64).max
            if c in self.want_min:
                self.mins[c] = np.full(n, hi, dtype=fdt)
            if c in self.want_max:
                self.maxs[c] = np.full(n, -hi, dtype=fdt)
        # String MIN/MAX compare ranks (string order), decoded when the results are built.
        self.ranks = {
            c: table.dicts[c].ranks()
            for c in self.want_min | self.want_max
            if table.schema.by_name[c].type.is_string
        }

    # ---------------------------------------------------------------- sink protocol
    def pairs(self, unit: Unit, rows: np.ndarray, probes: np.ndarray) -> None:
        agg = self.is_agg[probes]
        if agg.any():
            self._aggregate(unit, rows[agg], probes[agg])
            if not agg.all():
                self.pieces.append((unit, rows[~agg], probes[~agg]))
        else:
            self.pieces.append((unit, rows, probes))

    def rows(self, unit: Unit, probe: int, rows: np.ndarray) -> None:
        qs = np.full(len(rows), probe, dtype=np.int32)
        if self.is_agg[probe]:
            self._aggregate(unit, rows, qs)
        else:
            self.pieces.append((unit, rows, qs))

    def _aggregate(self, unit: Unit, rows: np.ndarray, qs: np.ndarray) -> None:
        n = self.n
        self.count_star += np.bincount(qs, minlength=n)
        block = unit.block
        schema = self.table.schema
        for c in self.agg_columns:
            col = schema.by_name[c]
            v = block.cols[c][rows]
            if col.type.is_string:
                ok = v != 0
            else:
                mask = block.nulls.get(c)
                ok = None if mask is None else ~mask[rows]
            q = qs if ok is None else qs[ok]
            if ok is not None:
                v = v[ok]
            self.count[c] += np.bincount(q, minlength=n)
            if len(q) == 0:
                continue
            if c in self.want_sum:
                if col.type.kind == "float":
                    self.fsum[c] += np.bincount(q, weights=v, minlength=n)
                else:
                    w = v.astype(np.int64)
                    lo = np.bincount(q, weights=w & 0xFFFFFFFF, minlength=n)
                    hi = np.bincount(q, weights=w >> 32, minlength=n)
                    acc = self.isum[c]
                    for i in np.flatnonzero((lo != 0) | (hi != 0)).tolist():
                        acc[i] += (int(hi[i]) << 32) + int(lo[i])
            if c in self.mins or c in self.maxs:
                if col.type.is_string:
                    v = self.ranks[c][v]
                if c in self.mins:
                    np.minimum.at(self.mins[c], q, v)
                if c in self.maxs:
                    np.maximum.at(self.maxs[c], q, v)

    # ---------------------------------------------------------------- results
    def results(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{} for _ in range(self.n)]
        for q, read in enumerate(self.reads):
            if read.aggs is not None:
                out[q] = self._partials(q, read)
        self._rows_into(out)
        return out

    def _partials(self, q: int, read: Select) -> dict[str, Any]:
        names, partials = [], []
        assert read.aggs is not None
        for fn, c in read.aggs:
            names.append(f"{fn}({'*' if c is None else c})")
            if c is None:
                partials.append(int(self.count_star[q]))
                continue
            count = int(self.count[c][q])
            col = self.table.schema.by_name[c]
            if fn == "count":
                partials.append(count)
            elif fn in ("sum", "avg"):
                total: Any = None
                if count:
                    total = float(self.fsum[c][q]) if col.type.kind == "float" else self.isum[c][q]
                    if type(total) is int and not _INT64[0] <= total <= _INT64[1]:
                        total = float(total)
                partials.append(total if fn == "sum" else [total, count])
            else:
                arr = self.mins[c] if fn == "min" else self.maxs[c]
                partials.append(self._value(col, arr[q]) if count else None)
        return {"columns": names, "partials": partials}

    def _value(self, col: Column, v: Any) -> Any:
        kind = col.type.kind
        if kind == "str":
            return str(self.table.dicts[col.name].sorted_strings()[int(v)])
        if kind == "date":
            return day_to_iso(int(v))
        if kind == "bool":
            return bool(v)
        if kind == "float":
            return float(v)
        return int(v)

    def _rows_into(self, out: list[dict[str, Any]]) -> None:
        """Gather and decode every projected column once for all selects together."""
        selects = [q for q in range(self.n) if not self.is_agg[q]]
        if not selects:
            return
        index_of: dict[int, int] = {}
        units: list[Unit] = []
        unit_of, rows_of, qs_of = [], [], []
        for unit, rows, qs in self.pieces:
            i = index_of.get(id(unit))
            if i is None:
                i = index_of[id(unit)] = len(units)
                units.append(unit)
            unit_of.append(np.full(len(rows), i, dtype=np.int32))
            rows_of.append(rows)
            qs_of.append(qs)
        if self.pieces:
            which = np.concatenate(unit_of)
            rows = np.concatenate(rows_of)
            qs = np.concatenate(qs_of)
            order = np.argsort(qs, kind="stable")  # by query, each in scan order
            which, rows, qs = which[order], rows[order], qs[order]
        else:
            which = rows = qs = np.zeros(0, dtype=np.int64)
        counts = np.bincount(qs, minlength=self.n)
        starts = np.cumsum(counts) - counts
        by_unit = []
        for i, unit in enumerate(units):
            sel = np.flatnonzero(which == i)
            by_unit.append((unit, sel, rows[sel]))
        wanted = {c for q in selects for c in self.reads[q].columns}
        decoded: dict[str, np.ndarray] = {}
        for col in self.table.schema.columns:
            if col.name in wanted:
                decoded[col.name] = self._column(col, by_unit, len(rows))
        for q in selects:
            a, b = int(starts[q]), int(starts[q] + counts[q])
            proj = self.reads[q].columns
            out[q] = {"columns": list(proj), "data": [decoded[c][a:b].tolist() for c in proj]}

    def _column(self, col: Column, by_unit: list[Any], total: int) -> np.ndarray:
        """One column of every matched row, in the sorted order, as plain values."""
        name = col.name
        dtype = self.table.schema.by_name[name].type.dtype
        values = np.zeros(total, dtype=dtype)
        nulls = None
        for unit, sel, rows in by_unit:
            values[sel] = unit.block.cols[name][rows]
            mask = stored_nulls(unit.block, col, rows)
            if mask is not None and mask.any():
                if nulls is None:
                    nulls = np.zeros(total, dtype=bool)
                nulls[sel] = mask
        decoded = decode_column(self.table, col, values)
        if nulls is None:
            return decoded
        decoded = decoded.astype(object)
        decoded[nulls] = None
        return decoded
