"""Query-data join plans: predicate indexes and the optimizer (dissertation 2.6, 2.7).

Clock Scan answers a batch of operations with one pass over the data by treating the
batch as a relation and *joining* it with the table (2.6.1): the predicates are
indexed, never the data.  A plan splits the batch's probes (reads, or the writes'
predicates) into

* predicate indexes, one per chosen column: the union of the intervals that the probes
  assigned to it ask for on that column (an ``=`` is a one-value interval, an ``in`` list
  many, a range or prefix one).  The column's value line is cut into *segments* at every
  interval end, and each segment lists the probes whose intervals cover it.  Probing a
  block maps each row to its segment in one vectorized step (a dense lookup table for
  integers and dictionary codes, binary search for wide or float domains) and expands
  the rows that land in a non-empty segment into (row, probe) candidate pairs: Index Union
  Join (2.6.2), vectorized over a block instead of a row;
* unindexed probes, evaluated one by one over the block (Block Nested Loops Join, 2.6.2).

Candidates are then checked against the rest of their probe's predicates ("residuals")
in one vectorized pass per column over all pairs: the per-probe bounds sit in arrays
indexed by probe id, the query relation of 2.6.1 stored column-wise.

The optimizer replaces the gain heuristic and fixed threshold of Algorithm 8 (2.7.1)
with measured costs, as Steiner's refinements do (2.7.2): a probe moved from nested
loops into an index on a column saves its predicate evaluations per row and pays per
candidate pair, at its selectivity there as estimated from a row sample (the
"statistics select" of 2.7.1, retaken after a tenth of the table has been written).
Each probe goes to the index that saves it most, so a selective predicate on a rare
column is not lost to a popular but unselective one (the greedy's weakness noted in
2.7.1); an index whose probes together do not repay its own per-row lookup is dropped
and its probes choose again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from storage_adapters.scan.predicates import (
    HASH_COLUMN,
    Constraint,
    Domain,
    Interval,
    evaluate,
)
from storage_adapters.scan.table import Block, Table

INT_MIN = int(np.iinfo(np.int64).min)
INT_MAX = int(np.iinfo(np.int64).max)
SAMPLE_ROWS = 4096
DENSE_SPAN = 1 << 22
"""Integer columns whose values span at most this many get a dense lookup table."""
MAX_SEGMENT_ENTRIES = 1 << 21
"""Cap on an index's (segment, probe) entries: wide overlapping ranges stay unindexed."""

# Costs in nanoseconds per scanned row or per candidate pair, measured with NumPy 2 on
# x86-64 (only their ratios matter): a comparison over a block is SIMD-cheap, a pair is
# a handful of gathers.
COST_SCAN = 0.5  # one unindexed probe over a block: finding its rows, call overhead
COST_ATOM = 0.3  # one comparison and its AND
COST_DENSE_PROBE = 1.2  # an index's lookup-table gather and candidate scan
COST_SEARCH_LEVEL = 5.0  # one level of binary search, for indexes without a lookup table
COST_PAIR = 12.0  # expanding one candidate pair
COST_RESIDUAL = 8.0  # checking one more column of a pair

FORCE: str | None = None
"""Tests set ``"index"`` (index every probe that has an interval) or ``"scan"`` (index
nothing) to drive both join paths over the same inputs; None lets the costs decide."""


def domain_dtype(kind: str) -> np.dtype[Any]:
    return np.dtype(np.float64 if kind == "float" else np.int64)


def domain_of(table: Table, name: str) -> Domain:
    if name == HASH_COLUMN:
        return Domain(None)
    return Domain(table.schema.by_name[name], table.dicts.get(name))


# ---------------------------------------------------------------- statistics
class Stats:
    """A uniform sample of each column's values, sorted, refreshed as the table changes."""

    __slots__ = ("at_writes", "n_rows", "samples")

    def __init__(self) -> None:
        self.samples: dict[str, tuple[np.ndarray, float]] = {}
        """Per column: sorted stored values of the sampled non-NULL cells, NULL fraction."""
        self.at_writes = -1
        self.n_rows = 0

    def refresh(self, table: Table) -> None:
        rows = len(table)
        if self.at_writes >= 0 and table.writes - self.at_writes <= max(rows // 10, 1000):
            return
        self.at_writes, self.n_rows = table.writes, rows
        self.samples = {}
        if rows == 0:
            return
        rng = np.random.default_rng(len(table.blocks))
        per_block = []
        for _, block, live in table.live_slots():
            k = max(1, round(SAMPLE_ROWS * len(live) / rows))
            per_block.append((block, rng.choice(live, size=min(k, len(live)), replace=False)))
        names = [c.name for c in table.schema.columns]
        if table.hashed:
            names.append(HASH_COLUMN)
        for name in names:
            values, nulls = [], []
            for block, rows_ in per_block:
                arr = block.hash if name == HASH_COLUMN else block.cols[name]
                assert arr is not None
                values.append(arr[rows_])
                if name in block.nulls:
                    nulls.append(block.nulls[name][rows_])
            v = np.concatenate(values)
            null = np.concatenate(nulls) if nulls else np.zeros(len(v), dtype=bool)
            if name != HASH_COLUMN and table.schema.by_name[name].type.is_string:
                null = null | (v == 0)
            self.samples[name] = (np.sort(v[~null]), float(null.mean()) if len(null) else 0.0)

    def selectivities(
        self, table: Table, name: str, lists: Sequence[Sequence[Interval]]
    ) -> np.ndarray:
        """Estimated fraction of rows whose ``name`` lies in each list of intervals."""
        got = self.samples.get(name)
        if got is None or len(got[0]) == 0:
            return np.full(len(lists), 1.0 / max(self.n_rows, 1))
        values, null_frac = got
        if name != HASH_COLUMN and table.schema.by_name[name].type.is_string:
            values = np.sort(table.dicts[name].ranks()[values])
        big = np.inf if values.dtype.kind == "f" else np.iinfo(np.int64).max
        los, his, owner = [], [], []
        for i, ivs in enumerate(lists):
            for lo, hi in ivs:
                los.append(-big if lo is None else lo)
                his.append(big if hi is None else hi)
                owner.append(i)
        dtype = np.float64 if values.dtype.kind == "f" else np.int64
        a = np.searchsorted(values, np.array(los, dtype=dtype), "left")
        b = np.searchsorted(values, np.array(his, dtype=dtype), "right")
        hits = np.bincount(
            np.array(owner, dtype=np.int64), weights=np.maximum(b - a, 0), minlength=len(lists)
        )
        return (1.0 - null_frac) * (hits + 0.5) / (len(values) + 1)


# ---------------------------------------------------------------- indexes
class IntervalIndex:
    """The intervals that probes ask for on one column, cut into segments (see module)."""

    __slots__ = (
        "column",
        "dense_lo",
        "dropped",
        "edges",
        "kind",
        "lut",
        "nonempty_prefix",
        "seg_len",
        "seg_of",
        "seg_q",
        "seg_start",
    )

    def __init__(self, column: str, kind: str, entries: list[tuple[int, list[Interval]]]):
        """Index ``entries`` (probe id, its intervals); probes whose intervals would cover
        too many segments in all are left out: see :attr:`dropped`."""
        self.column = column
        self.kind = kind
        discrete = kind != "float"
        starts: list[Any] = []
        ends: list[Any] = []
        qids: list[int] = []
        for q, ivs in entries:
            for lo, hi in ivs:
                qids.append(q)
                starts.append(lo)
                if hi is None or (discrete and hi >= INT_MAX):
                    ends.append(None)
                elif discrete:
                    ends.append(hi + 1)
                else:
                    nxt = float(np.nextafter(hi, math.inf))
                    ends.append(None if math.isinf(nxt) else nxt)
        finite = [x for x in starts if x is not None] + [x for x in ends if x is not None]
        dtype = domain_dtype(kind)
        self.edges = np.unique(np.array(finite, dtype=dtype)) if finite else np.zeros(0, dtype)
        n_seg = len(self.edges) + 1
        e = self.edges
        sa = np.zeros(len(starts), dtype=np.int64)
        sb = np.full(len(ends), n_seg, dtype=np.int64)
        given = [i for i, x in enumerate(starts) if x is not None]
        if given:
            sa[given] = np.searchsorted(e, np.array([starts[i] for i in given], dtype), "right")
        given = [i for i, x in enumerate(ends) if x is not None]
        if given:
            sb[given] = np.searchsorted(e, np.array([ends[i] for i in given], dtype), "right")
        cnt = np.maximum(sb - sa, 0)
        q_arr = np.array(qids, dtype=np.int32)
        self.dropped: list[int] = []
        if int(cnt.sum()) > MAX_SEGMENT_ENTRIES:
            per_q = np.bincount(q_arr, weights=cnt)
            order = np.argsort(-per_q[per_q > 0], kind="stable")
            heavy = np.flatnonzero(per_q > 0)[order]
            excess = int(cnt.sum()) - MAX_SEGMENT_ENTRIES
            for q in heavy.tolist():
                if excess <= 0:
                    break
                excess -= int(per_q[q])
                self.dropped.append(q)
            keep = ~np.isin(q_arr, self.dropped)
            sa, cnt, q_arr = sa[keep], cnt[keep], q_arr[keep]
        total = int(cnt.sum())
        offs = np.repeat(np.cumsum(cnt) - cnt, cnt)
        segs = np.repeat(sa, cnt) + (np.arange(total) - offs)
        qs = np.repeat(q_arr, cnt)
        order = np.argsort(segs, kind="stable")
        self.seg_q = qs[order]
        self.seg_len = np.bincount(segs, minlength=n_seg).astype(np.int64)
        self.seg_start = np.cumsum(self.seg_len) - self.seg_len
        self.nonempty_prefix = np.concatenate(([0], np.cumsum(self.seg_len > 0)))
        self.seg_of = np.where(self.seg_len > 0, np.arange(n_seg), -1).astype(np.int32)
        self.lut: np.ndarray | None = None
        self.dense_lo = 0

    def prepare(self, table: Table) -> None:
        """Choose how rows find their segment: through a lookup table when the column's
        values (or its dictionary codes) span a small range, else by binary search."""
        if self.kind == "rank":
            ranks = table.dicts[self.column].ranks()
            by_rank = self._dense(0, max(len(ranks) - 2, 0))
            lut = np.full(len(ranks), -1, dtype=np.int32)
            lut[1:] = by_rank[ranks[1:]]
            self.lut, self.dense_lo = lut, 0
            return
        if self.kind == "int":
            span = table.column_range(self.column)
            if span is not None:
                lo, hi = int(span[0]), int(span[1])
                if hi - lo <= DENSE_SPAN:
                    self.lut, self.dense_lo = self._dense(lo, hi), lo
                    return
        self.lut = None

    def _dense(self, lo: int, hi: int) -> np.ndarray:
        """Segment (or -1) of every value in ``[lo, hi]``."""
        e = self.edges
        inside = e[(e > lo) & (e <= hi)]
        first = int(np.searchsorted(e, lo, "right"))
        cuts = np.concatenate(([0], inside.astype(np.int64) - lo, [hi - lo + 1]))
        return np.repeat(self.seg_of[first : first + len(inside) + 1], np.diff(cuts))

    def segments(self, values: np.ndarray, bounded: bool) -> np.ndarray:
        """Each value's segment, -1 where no probe waits.  ``bounded``: the values are
        known to lie within the table's summaries (true of every block, not of the
        batch's version block), which a dense lookup table covers."""
        if self.lut is not None:
            offsets = values
            if self.dense_lo:
                offsets = np.subtract(values, self.dense_lo, dtype=np.int64)
            segs = np.take(self.lut, offsets, mode="clip")
            if not bounded and self.kind == "int":
                out = (offsets < 0) | (offsets >= len(self.lut))
                if out.any():
                    segs[out] = self.seg_of[np.searchsorted(self.edges, values[out], "right")]
            return segs
        return self.seg_of[np.searchsorted(self.edges, values, "right")]

    def may_match(self, lo: Any, hi: Any) -> bool:
        """Whether a block whose values lie in ``[lo, hi]`` can meet any probe."""
        a = int(np.searchsorted(self.edges, lo, "right"))
        b = int(np.searchsorted(self.edges, hi, "right"))
        return bool(self.nonempty_prefix[b + 1] - self.nonempty_prefix[a] > 0)

    def expand(self, rows: np.ndarray, segs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Candidate (row, probe) pairs of rows that landed in non-empty segments."""
        cnt = self.seg_len[segs]
        total = int(cnt.sum())
        rows_rep = np.repeat(rows, cnt)
        base = np.repeat(self.seg_start[segs] - (np.cumsum(cnt) - cnt), cnt)
        return rows_rep, self.seg_q[base + np.arange(total)]


# ---------------------------------------------------------------- residuals
@dataclass(slots=True)
class Residual:
    """Per-probe bounds of one column, as arrays over probe ids (the query relation)."""

    column: str
    kind: str
    has_iv: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    has_ne: np.ndarray
    ne: np.ndarray
    null_req: np.ndarray
    """0: none; 1: must be NULL; 2: must not be NULL."""
    complex: list[tuple[np.ndarray, Constraint]]
    """Probes whose constraint is not one interval and one ``!=``: (probe mask, constraint)."""

    def check(self, q: np.ndarray, v: np.ndarray, nul: np.ndarray | None) -> np.ndarray:
        req = self.null_req[q]
        if nul is not None:
            ok = np.where(req == 1, nul, np.where(req == 2, ~nul, True))
        else:
            ok = req != 1
        h = self.has_iv[q]
        if h.any():
            ok &= ~h | ((v >= self.lo[q]) & (v <= self.hi[q]))
        h = self.has_ne[q]
        if h.any():
            ok &= ~h | (v != self.ne[q])
        for qmask, con in self.complex:
            sel = qmask[q]
            if sel.any():
                idx = np.flatnonzero(sel)
                ok[idx] &= evaluate(con, v[idx], None if nul is None else nul[idx])
        return ok


def build_residual(
    column: str, kind: str, n_probes: int, items: list[tuple[int, Constraint]]
) -> Residual:
    dtype = domain_dtype(kind)
    lo_fill = -math.inf if kind == "float" else INT_MIN
    hi_fill = math.inf if kind == "float" else INT_MAX
    has_iv = np.zeros(n_probes, dtype=bool)
    lo = np.full(n_probes, lo_fill, dtype=dtype)
    hi = np.full(n_probes, hi_fill, dtype=dtype)
    has_ne = np.zeros(n_probes, dtype=bool)
    ne = np.zeros(n_probes, dtype=dtype)
    null_req = np.zeros(n_probes, dtype=np.int8)
    groups: dict[Any, tuple[np.ndarray, Constraint]] = {}
    for q, con in items:
        simple = (con.intervals is None or len(con.intervals) == 1) and len(con.ne) <= 1
        if not simple:
            key = (tuple(con.intervals or ()), con.intervals is None, tuple(con.ne), con.null)
            if key not in groups:
                groups[key] = (np.zeros(n_probes, dtype=bool), con)
            groups[key][0][q] = True
            continue
        null_req[q] = 1 if con.null == 1 else (2 if con.valued else 0)
        if con.intervals is not None:
            a, b = con.intervals[0]
            has_iv[q] = True
            if a is not None:
                lo[q] = a
            if b is not None:
                hi[q] = b
        if con.ne:
            has_ne[q] = True
            ne[q] = con.ne[0]
    return Residual(column, kind, has_iv, lo, hi, has_ne, ne, null_req, list(groups.values()))


# ---------------------------------------------------------------- plans
Probe = dict[str, Constraint]
"""One probe: a constraint per column it restricts (an empty dict matches every row)."""


@dataclass(slots=True)
class Plan:
    probes: list[Probe]
    indexes: list[IntervalIndex]
    unindexed: list[int]
    residuals: list[Residual]
    """Residual checks for the indexed probes' candidate pairs."""
    kinds: dict[str, str]
    """Domain kind of every column the plan touches."""


def make_plan(table: Table, stats: Stats, probes: list[Probe]) -> Plan:
    """Choose predicate indexes for ``probes`` and the residual checks of their pairs."""
    n = len(probes)
    kinds: dict[str, str] = {}
    for p in probes:
        for name in p:
            if name not in kinds:
                kinds[name] = domain_of(table, name).kind
    columns = list(kinds)
    if FORCE != "index" and n == 1 and _scan_cost(probes[0]) <= COST_DENSE_PROBE:
        # What the optimizer below decides for one cheap probe, without its arrays: an
        # index saves at most the probe's own scan cost per row, less than the cheapest
        # index's lookup, so no index is kept.  A batch of one get or put is the common
        # case on a lightly loaded replica, and the general path costs it tens of µs.
        return Plan(probes, [], [0], [], kinds)
    scan_cost = np.array([_scan_cost(p) for p in probes])
    # gain[q, j]: what probe q saves per row if it leaves nested loops for an index on
    # column j, where its selectivity decides how many candidate pairs it pays for.
    gain = np.full((n, len(columns)), -np.inf)
    for j, name in enumerate(columns):
        qs = [q for q, p in enumerate(probes) if name in p and p[name].intervals]
        if not qs:
            continue
        sel = stats.selectivities(table, name, [probes[q][name].intervals for q in qs])
        residual = np.array([len(probes[q]) - 1 for q in qs])
        gain[qs, j] = scan_cost[qs] - sel * (COST_PAIR + COST_RESIDUAL * residual)
    if FORCE == "index":
        gain = np.where(np.isfinite(gain), gain + 1e9, gain)
    if FORCE == "scan":
        gain[:] = -np.inf
    # Each probe goes to the index that saves it most; an index that does not repay its
    # own per-row lookup is dropped and its probes choose again (see the module).
    open_cols = np.ones(len(columns), dtype=bool)
    while True:
        masked = np.where(open_cols, gain, -np.inf)
        best = masked.argmax(axis=1) if len(columns) else np.zeros(n, dtype=np.int64)
        best_gain = masked[np.arange(n), best] if len(columns) else np.zeros(n)
        assigned = best_gain > 0
        closed_one = False
        for j in np.flatnonzero(open_cols):
            members = assigned & (best == j)
            if not members.any():
                continue
            total = float(best_gain[members].sum())
            if total <= _probe_cost(table, columns[j], kinds, members) and FORCE != "index":
                open_cols[j] = False
                closed_one = True
        if not closed_one:
            break
    chosen = [
        (columns[j], assigned & (best == j))
        for j in np.flatnonzero(open_cols)
        if (assigned & (best == j)).any()
    ]
    indexes: list[IntervalIndex] = []
    access: dict[int, str] = {}
    for name, members in chosen:
        entries = [(int(q), probes[q][name].intervals) for q in np.flatnonzero(members)]
        idx = IntervalIndex(name, kinds[name], entries)  # type: ignore[arg-type]
        idx.prepare(table)
        indexes.append(idx)
        dropped = set(idx.dropped)
        for q, _ in entries:
            if q not in dropped:
                access[q] = name
    unindexed = [q for q in range(n) if q not in access]
    per_column: dict[str, list[tuple[int, Constraint]]] = {}
    for q, name in access.items():
        for col, con in probes[q].items():
            if col != name:
                per_column.setdefault(col, []).append((q, con))
            elif con.ne:
                # The index answers for the intervals only; excluded values still count.
                per_column.setdefault(col, []).append((q, Constraint(ne=list(con.ne))))
    residuals = [build_residual(col, kinds[col], n, items) for col, items in per_column.items()]
    return Plan(probes, indexes, unindexed, residuals, kinds)


def _scan_cost(probe: Probe) -> float:
    """What one unindexed probe costs per row: its call, and one comparison per atom."""
    return COST_SCAN + sum(
        COST_ATOM * max(1, len(c.intervals or ()) + len(c.ne)) for c in probe.values()
    )


def _probe_cost(table: Table, name: str, kinds: dict[str, str], members: np.ndarray) -> float:
    kind = kinds[name]
    if kind == "rank":
        return COST_DENSE_PROBE
    if kind == "int":
        span = table.column_range(name)
        if span is not None and int(span[1]) - int(span[0]) <= DENSE_SPAN:
            return COST_DENSE_PROBE
    edges = 2 * int(members.sum()) + 2
    return COST_DENSE_PROBE + COST_SEARCH_LEVEL * math.log2(edges)


def block_span(block: Block, name: str) -> tuple[Any, Any] | None:
    lo = block.mins.get(name)
    return None if lo is None else (lo, block.maxs[name])
