"""One shared pass over a table's blocks for every probe of a plan (Clock Scan, 2.4.3).

For each block, :func:`run` probes the plan's predicate indexes (candidate pairs, then
their residual checks, all vectorized over the block), then evaluates the unindexed
probes one by one, and hands what matched to a *sink*: the hot-row marker of a batch's
writes, or the reads' result collector.  Blocks whose per-column min/max summaries
exclude a probe, or every probe of an index, are skipped for it.

A scan *unit* is a block plus which of its rows take part (``valid``: live and not
handled elsewhere) and, for the batch's version block, each row's visibility interval
of operation positions (see :mod:`.clock`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from storage_adapters.scan.plan import Plan, block_span
from storage_adapters.scan.predicates import HASH_COLUMN, evaluate
from storage_adapters.scan.table import Block, Table


class Unit:
    """A block as one scan sees it."""

    __slots__ = ("block", "index", "valid", "vend", "vstart")

    def __init__(
        self,
        block: Block,
        index: int,
        valid: np.ndarray,
        vstart: np.ndarray | None = None,
        vend: np.ndarray | None = None,
    ) -> None:
        self.block = block
        self.index = index
        """Position in the table's block list; -1 for the version block."""
        self.valid = valid
        self.vstart = vstart
        self.vend = vend


class Sink(Protocol):
    def pairs(self, unit: Unit, rows: np.ndarray, probes: np.ndarray) -> None: ...

    def rows(self, unit: Unit, probe: int, rows: np.ndarray) -> None: ...


class RowMarker:
    """A sink that only notes which rows of each block any probe matched."""

    def __init__(self) -> None:
        self.marks: dict[int, np.ndarray] = {}

    def _mark(self, unit: Unit, rows: np.ndarray) -> None:
        m = self.marks.get(unit.index)
        if m is None:
            m = self.marks[unit.index] = np.zeros(unit.block.n, dtype=bool)
        m[rows] = True

    def pairs(self, unit: Unit, rows: np.ndarray, probes: np.ndarray) -> None:
        self._mark(unit, rows)

    def rows(self, unit: Unit, probe: int, rows: np.ndarray) -> None:
        self._mark(unit, rows)


class Views:
    """A block's columns in their comparison domain, computed once per block and scan."""

    __slots__ = ("_cache", "block", "ranks", "table")

    def __init__(self, table: Table, block: Block, ranks: dict[str, np.ndarray]) -> None:
        self.table = table
        self.block = block
        self.ranks = ranks
        self._cache: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}

    def full(self, name: str) -> tuple[np.ndarray, np.ndarray | None]:
        got = self._cache.get(name)
        if got is None:
            got = self._compute(name, slice(0, self.block.n))
            self._cache[name] = got
        return got

    def at(self, name: str, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        got = self._cache.get(name)
        if got is not None:
            v, nul = got
            return v[rows], None if nul is None else nul[rows]
        return self._compute(name, rows)

    def _compute(self, name: str, where: Any) -> tuple[np.ndarray, np.ndarray | None]:
        block = self.block
        if name == HASH_COLUMN:
            assert block.hash is not None
            return block.hash[where], None
        col = self.table.schema.by_name[name]
        if col.type.is_string:
            codes = block.cols[name][where]
            nul = (codes == 0) if col.nullable else None
            return self.ranks[name][codes], nul
        nulls = block.nulls.get(name)
        return block.cols[name][where], None if nulls is None else nulls[where]

    def codes(self, name: str) -> np.ndarray:
        return self.block.cols[name][: self.block.n]


def ranks_for(table: Table, plan: Plan) -> dict[str, np.ndarray]:
    """Up-to-date ranks of the string columns a plan compares."""
    return {name: table.dicts[name].ranks() for name, kind in plan.kinds.items() if kind == "rank"}


def run(
    table: Table,
    plan: Plan,
    units: Sequence[Unit],
    sink: Sink,
    positions: np.ndarray | None = None,
) -> None:
    """Scan ``units`` once for all of ``plan``'s probes.  ``positions[q]`` is probe q's
    place in the batch, needed only for units with visibility intervals."""
    ranks = ranks_for(table, plan)
    skips = _skip_bounds(table, plan)
    present = [(res, _present(plan, res.column)) for res in plan.residuals]
    for unit in units:
        block = unit.block
        if block.n == 0:
            continue
        views = Views(table, block, ranks)
        summarized = unit.index >= 0
        pr: list[np.ndarray] = []
        pq: list[np.ndarray] = []
        for idx in plan.indexes:
            if summarized and idx.kind != "rank":
                span = block_span(block, idx.column)
                if span is not None and not idx.may_match(*span):
                    continue
            if idx.kind == "rank":
                values = views.codes(idx.column)
                nul = None
            else:
                values, nul = views.full(idx.column)
            segs = idx.segments(values, bounded=summarized)
            ok = (segs >= 0) & unit.valid
            if nul is not None:
                ok &= ~nul
            rows = np.flatnonzero(ok)
            if len(rows):
                r, q = idx.expand(rows, segs[rows])
                pr.append(r)
                pq.append(q)
        if pr:
            r = np.concatenate(pr) if len(pr) > 1 else pr[0]
            q = np.concatenate(pq) if len(pq) > 1 else pq[0]
            keep = np.ones(len(r), dtype=bool)
            for res, has in present:
                sel = has[q]
                if not sel.any():
                    continue
                idx_ = np.flatnonzero(sel)
                v, nul = views.at(res.column, r[idx_])
                keep[idx_] &= res.check(q[idx_], v, nul)
            if unit.vstart is not None:
                assert positions is not None and unit.vend is not None
                pos = positions[q]
                keep &= (unit.vstart[r] <= pos) & (pos < unit.vend[r])
            if not keep.all():
                r, q = r[keep], q[keep]
            if len(r):
                sink.pairs(unit, r, q)
        for q in plan.unindexed:
            probe = plan.probes[q]
            if summarized and _excluded(block, skips[q]):
                continue
            m = unit.valid
            for name, con in probe.items():
                v, nul = views.full(name)
                m = m & evaluate(con, v, nul)
            if unit.vstart is not None:
                assert positions is not None and unit.vend is not None
                pos = positions[q]
                m = m & (unit.vstart[: block.n] <= pos) & (pos < unit.vend[: block.n])
            rows = np.flatnonzero(m)
            if len(rows):
                sink.rows(unit, q, rows)


def _present(plan: Plan, column: str) -> np.ndarray:
    has = np.zeros(len(plan.probes), dtype=bool)
    for q, p in enumerate(plan.probes):
        if column in p:
            has[q] = True
    return has


def _skip_bounds(table: Table, plan: Plan) -> list[list[tuple[str, Any, Any]]]:
    """Per unindexed probe: (column, lowest, highest) values it can match, for the
    numeric columns whose block summaries can rule it out."""
    out: list[list[tuple[str, Any, Any]]] = [[] for _ in plan.probes]
    for q in plan.unindexed:
        for name, con in plan.probes[q].items():
            if plan.kinds[name] == "rank" or not con.intervals:
                continue
            lo = con.intervals[0][0]
            hi = con.intervals[-1][1]
            if lo is not None or hi is not None:
                out[q].append((name, lo, hi))
    return out


def _excluded(block: Block, bounds: list[tuple[str, Any, Any]]) -> bool:
    for name, lo, hi in bounds:
        bmin = block.mins.get(name)
        if bmin is None:
            continue
        if (hi is not None and bmin > hi) or (lo is not None and block.maxs[name] < lo):
            return True
    return False
