"""A table's rows as columnar blocks of NumPy arrays (dissertation 2.3 segments and chunks).

Crescando stores a segment as chunks of fixed-size slots that may or may not hold a
record.  Here a :class:`Block` holds up to ``capacity`` slots as one NumPy array per
column (values, and a null mask for nullable non-string columns; a string's NULL is code
0), a ``live`` mask of occupied slots, and per-column min/max *summaries* of the numeric
columns that let a scan skip a block a predicate cannot match.  Inserts fill free slots
first ("first fit", 2.4.1), then the last block, then new blocks.

Copy-on-write: a send cursor (:mod:`.migrate`) or a snapshot *pins* a block's current
arrays.  Every mutation goes through :meth:`Block.writable`, which first replaces pinned
arrays by copies, so the cursor keeps the rows of its moment at the cost of at most one
block copy per written block, and never stops a write.

Under hash placement a block also keeps each row's 32-bit placement hash, so that an
operation's ranges (in hash space) are checked with integer comparisons.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from rubberband.engine import Placement
from storage_adapters.scan.dictionary import StringDictionary
from storage_adapters.scan.schema import Column, Schema


class Block:
    """Up to ``capacity`` row slots; rows ``[0, n)`` are in use, ``live`` says which hold one."""

    __slots__ = ("cols", "hash", "live", "maxs", "mins", "n", "n_live", "nulls", "pins")

    def __init__(
        self,
        cols: dict[str, np.ndarray],
        nulls: dict[str, np.ndarray],
        live: np.ndarray,
        n: int,
        hash_: np.ndarray | None,
    ) -> None:
        self.cols = cols
        self.nulls = nulls
        """Null masks of the nullable non-string columns only."""
        self.live = live
        self.n = n
        self.n_live = int(np.count_nonzero(live[:n]))
        self.hash = hash_
        self.mins: dict[str, Any] = {}
        self.maxs: dict[str, Any] = {}
        self.pins = 0
        """Send cursors holding these very arrays."""

    @property
    def capacity(self) -> int:
        return len(self.live)

    def writable(self) -> None:
        """Unshare the arrays before changing them (copy-on-write)."""
        if self.pins:
            self.cols = {k: v.copy() for k, v in self.cols.items()}
            self.nulls = {k: v.copy() for k, v in self.nulls.items()}
            self.live = self.live.copy()
            if self.hash is not None:
                self.hash = self.hash.copy()
            self.pins = 0

    def null_mask(self, name: str, column: Column) -> np.ndarray | None:
        """Which of rows ``[0, n)`` are NULL in ``name`` (None: none can be)."""
        if column.type.is_string:
            return self.cols[name][: self.n] == 0 if column.nullable else None
        m = self.nulls.get(name)
        return None if m is None else m[: self.n]

    def widen(self, name: str, values: np.ndarray) -> None:
        """Grow the column's summary to cover ``values`` (never shrinks: a bound)."""
        if len(values) == 0:
            return
        lo, hi = values.min(), values.max()
        cur = self.mins.get(name)
        if cur is None:
            self.mins[name], self.maxs[name] = lo, hi
        else:
            if lo < cur:
                self.mins[name] = lo
            if hi > self.maxs[name]:
                self.maxs[name] = hi

    def nbytes(self) -> int:
        total = self.live.nbytes + sum(a.nbytes for a in self.cols.values())
        total += sum(a.nbytes for a in self.nulls.values())
        return total + (0 if self.hash is None else self.hash.nbytes)


class Table:
    """The blocks, dictionaries and summaries of one table."""

    __slots__ = ("block_rows", "blocks", "dicts", "name", "placement", "schema", "writes")

    def __init__(self, name: str, schema: Schema, placement: Placement, block_rows: int) -> None:
        self.name = name
        self.schema = schema
        self.placement = placement
        self.block_rows = block_rows
        self.blocks: list[Block] = []
        self.dicts: dict[str, StringDictionary] = {
            c.name: StringDictionary() for c in schema.columns if c.type.is_string
        }
        self.writes = 0
        """Rows written since creation (drives statistics refresh)."""

    @property
    def hashed(self) -> bool:
        return not self.placement.ordered

    def __len__(self) -> int:
        return sum(b.n_live for b in self.blocks)

    def nbytes(self) -> int:
        return sum(b.nbytes() for b in self.blocks) + sum(d.nbytes() for d in self.dicts.values())

    def column_range(self, name: str) -> tuple[Any, Any] | None:
        """Bounds of a numeric column's live values over all blocks (None: no rows)."""
        lo = hi = None
        for b in self.blocks:
            if b.n_live == 0 or name not in b.mins:
                continue
            if lo is None or b.mins[name] < lo:
                lo = b.mins[name]
            if hi is None or b.maxs[name] > hi:
                hi = b.maxs[name]
        return None if lo is None else (lo, hi)

    def live_slots(self) -> Iterator[tuple[int, Block, np.ndarray]]:
        for i, b in enumerate(self.blocks):
            if b.n_live:
                yield i, b, np.flatnonzero(b.live[: b.n])

    # ---------------------------------------------------------------- changes
    def _new_block(self) -> Block:
        cap = self.block_rows
        cols = {c.name: np.zeros(cap, dtype=c.type.dtype) for c in self.schema.columns}
        nulls = {
            c.name: np.zeros(cap, dtype=bool)
            for c in self.schema.columns
            if c.nullable and not c.type.is_string
        }
        hash_ = np.zeros(cap, dtype=np.int64) if self.hashed else None
        block = Block(cols, nulls, np.zeros(cap, dtype=bool), 0, hash_)
        self.blocks.append(block)
        return block

    def append(
        self,
        cols: dict[str, np.ndarray],
        nulls: dict[str, np.ndarray | None],
        hashes: np.ndarray | None,
    ) -> None:
        """Add rows given column-wise in storage form (string columns as codes)."""
        total = len(next(iter(cols.values())))
        if total == 0:
            return
        self.writes += total
        done = 0
        # First fit: free slots of existing blocks, then the tail, then new blocks.
        for block in self.blocks:
            if done == total:
                return
            free = block.n - block.n_live
            if free <= 0:
                continue
            slots = np.flatnonzero(~block.live[: block.n])[: total - done]
            self._put(block, slots, cols, nulls, hashes, done)
            done += len(slots)
        while done < total:
            block = self.blocks[-1] if self.blocks else None
            if block is None or block.n == block.capacity:
                block = self._new_block()
            take = min(block.capacity - block.n, total - done)
            slots = np.arange(block.n, block.n + take)
            self._put(block, slots, cols, nulls, hashes, done)
            done += take

    def _put(
        self,
        block: Block,
        slots: np.ndarray,
        cols: dict[str, np.ndarray],
        nulls: dict[str, np.ndarray | None],
        hashes: np.ndarray | None,
        start: int,
    ) -> None:
        block.writable()
        k = len(slots)
        src = slice(start, start + k)
        for c in self.schema.columns:
            name = c.name
            values = cols[name][src]
            block.cols[name][slots] = values
            mask = nulls.get(name)
            mask_part = None if mask is None else mask[src]
            if name in block.nulls:
                block.nulls[name][slots] = False if mask_part is None else mask_part
            if not c.type.is_string:
                block.widen(name, values if mask_part is None else values[~mask_part])
        if block.hash is not None:
            assert hashes is not None
            block.hash[slots] = hashes[src]
            block.widen("\0hash", hashes[src])
        block.live[slots] = True
        block.n = max(block.n, int(slots[-1]) + 1)
        block.n_live += k

    def scatter(
        self,
        block_index: int,
        rows: np.ndarray,
        cols: dict[str, np.ndarray],
        nulls: dict[str, np.ndarray | None],
    ) -> None:
        """Overwrite rows of one block (an update's final values)."""
        block = self.blocks[block_index]
        block.writable()
        self.writes += len(rows)
        for c in self.schema.columns:
            name = c.name
            values = cols[name]
            block.cols[name][rows] = values
            mask = nulls.get(name)
            if name in block.nulls:
                block.nulls[name][rows] = False if mask is None else mask
            if not c.type.is_string:
                block.widen(name, values if mask is None else values[~mask])

    def kill(self, block_index: int, rows: np.ndarray) -> None:
        """Free the slots ``rows`` of one block (deleted rows)."""
        if len(rows) == 0:
            return
        block = self.blocks[block_index]
        block.writable()
        block.live[rows] = False
        block.n_live -= len(rows)
        self.writes += len(rows)

    def drop_empty_blocks(self) -> None:
        """Forget blocks with no rows left (a pinned one stays with its cursor)."""
        if any(b.n_live == 0 for b in self.blocks):
            self.blocks = [b for b in self.blocks if b.n_live]

    # ---------------------------------------------------------------- upkeep
    def settle(self) -> None:
        """Upkeep after a batch of writes: compact and rank the string dictionaries."""
        self.compact_dictionaries()
        for d in self.dicts.values():
            d.settle()

    def compact_dictionaries(self) -> None:
        """Drop strings no row uses any more, when they outnumber the rows (updates that
        write fresh strings would otherwise grow a dictionary without bound)."""
        rows = len(self)
        for name, d in list(self.dicts.items()):
            if len(d) <= 2 * rows + 4096:
                continue
            used_mask = np.zeros(len(d), dtype=bool)
            for _, block, live in self.live_slots():
                used_mask[block.cols[name][live]] = True
            used_mask[0] = False
            fresh, mapping = d.remapped(np.flatnonzero(used_mask))
            for block in self.blocks:
                # Replace the array (never rewrite it in place: cursors may hold it).
                block.cols = dict(block.cols)
                block.cols[name] = mapping[block.cols[name]]
            self.dicts[name] = fresh
