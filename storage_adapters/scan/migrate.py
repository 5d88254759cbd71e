"""Partial live migration: consistent send cursors and the chunks they stream (4.4.1, 5.4).

``open_send(ranges)`` must hand over the rows in ``ranges`` *as of the call* while later
writes go on and never leak in.  Crescando/RB mapped a send to a strict select (5.4);
here a :class:`SendCursor` *pins* every block's arrays at the call (O(blocks), no copy)
and the table copies a pinned block only when it next writes it (copy-on-write, see
:mod:`.table`).  Rows are selected and encoded lazily, chunk by chunk, at the
receiver's pace.  The cursor also keeps each string dictionary's array and length of
the moment: dictionaries only append, so the codes of the pinned rows stay decodable.

A chunk is a plain msgpack-able dict that carries its table's schema and key (a receiver
may not have the table yet), the row count, each column as raw little-endian bytes
(strings as a chunk-local list of distinct strings plus int32 indexes into it), NULL
masks as packed bits, and under hash placement the rows' placement hashes::

    {"v": 1, "table": "t", "schema": [[name, type], ...], "key": "k", "n": 1000,
     "cols": {"price": ["<f8", b"..."], "city": ["str", ["ZRH", ...], b"..."]},
     "nulls": {"price": b"..."}, "hash": b"..." or None}

Every table gets at least one chunk, empty if none of its rows lie in the ranges, so
the receiver learns every schema.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rubberband.engine import RangeSet
from storage_adapters.scan.clock import restriction
from storage_adapters.scan.predicates import (
    Constraint,
    Domain,
    evaluate,
    ranges_constraint,
    typed_range_mask,
)
from storage_adapters.scan.schema import Schema
from storage_adapters.scan.table import Block, Table

CHUNK_VERSION = 1
_OVERHEAD = 256


class _PinnedBlock:
    __slots__ = ("block", "cols", "hash", "live", "n", "nulls", "pinned")

    def __init__(self, block: Block) -> None:
        self.block = block
        self.cols = block.cols
        self.nulls = block.nulls
        self.live = block.live
        self.n = block.n
        self.hash = block.hash
        self.pinned = True
        block.pins += 1

    def release(self) -> None:
        """Unpin, once: a cursor releases a block when it has read it and again with its
        table (or when closed).  Counted twice, a cursor took another's pin away: with
        two sends from one process over one block, a write then changed the arrays the
        other still read, and its copy carried a write made after the copy's position
        (the simulator, seed 43241 with ``--mixed-appends`` on the scan engine and
        60-byte chunks: the receiver applied that write a second time)."""
        if not self.pinned:
            return
        self.pinned = False
        if self.block.cols is self.cols and self.block.pins:
            self.block.pins -= 1


class _PinnedTable:
    __slots__ = ("blocks", "dicts", "hashed", "name", "row_bytes", "schema", "where")

    def __init__(self, table: Table, ranges: RangeSet) -> None:
        self.name = table.name
        self.schema = table.schema
        self.hashed = table.hashed
        self.where = restriction(table, ranges)
        self.blocks = [_PinnedBlock(b) for b in table.blocks if b.n_live]
        self.dicts = {name: (d.values, d.n) for name, d in table.dicts.items()}
        self.row_bytes = _row_bytes(table)

    def rows_of(self, p: _PinnedBlock) -> np.ndarray:
        live = p.live[: p.n]
        if self.where is None:
            return np.flatnonzero(live)
        if not self.where:
            return np.zeros(0, dtype=np.int64)
        if self.hashed:
            assert p.hash is not None
            ivs = ranges_constraint(self.where, Domain(None))
            return np.flatnonzero(live & evaluate(Constraint(intervals=ivs), p.hash[: p.n], None))
        key = self.schema.key_column
        values = p.cols[key.name][: p.n]
        if key.type.is_string:
            strings = self.dicts[key.name][0].take(values)
            strings[values == 0] = ""
            return np.flatnonzero(live & typed_range_mask(self.where, strings))
        ivs = ranges_constraint(self.where, Domain(key))
        return np.flatnonzero(live & evaluate(Constraint(intervals=ivs), values, None))

    def release(self) -> None:
        for p in self.blocks:
            p.release()
        self.blocks = []


def _row_bytes(table: Table) -> int:
    """A row's size in a chunk, estimated from the types and sampled string lengths."""
    total = 8
    for c in table.schema.columns:
        if c.type.is_string:
            d = table.dicts[c.name]
            sample = d.values[1 : min(d.n, 1025)]
            avg = sum(map(len, sample)) / len(sample) if len(sample) else 8
            total += 4 + int(avg) + 2
        else:
            total += c.type.dtype.itemsize
    return total + (8 if table.hashed else 0)


class SendCursor:
    """A consistent copy of some ranges of every table, drained in chunks."""

    def __init__(self, tables: Mapping[str, Table], ranges: RangeSet) -> None:
        self._tables = [_PinnedTable(t, ranges) for t in tables.values()]
        self._t = 0
        self._b = 0
        self._offset = 0
        self._rows: np.ndarray | None = None
        self._sent_any = False

    def next_chunk(self, max_bytes: int) -> dict[str, Any] | None:
        """The next chunk of about ``max_bytes`` at most (at least one row), None at the end."""
        while self._t < len(self._tables):
            pt = self._tables[self._t]
            budget = max(1, (max_bytes - _OVERHEAD) // pt.row_bytes)
            parts: list[tuple[_PinnedBlock, np.ndarray]] = []
            taken = 0
            while self._b < len(pt.blocks) and taken < budget:
                p = pt.blocks[self._b]
                if self._rows is None:
                    self._rows, self._offset = pt.rows_of(p), 0
                rows = self._rows[self._offset : self._offset + budget - taken]
                if len(rows):
                    parts.append((p, rows))
                    taken += len(rows)
                self._offset += len(rows)
                if self._offset >= len(self._rows):
                    self._b += 1
                    self._rows = None
                    p.release()
            if taken or not self._sent_any:
                self._sent_any = True
                return _encode(pt, parts)
            pt.release()
            self._t += 1
            self._b = 0
            self._sent_any = False
        return None

    def close(self) -> None:
        for pt in self._tables:
            pt.release()
        self._tables = []


def _encode(pt: _PinnedTable, parts: list[tuple[_PinnedBlock, np.ndarray]]) -> dict[str, Any]:
    n = sum(len(r) for _, r in parts)
    cols: dict[str, Any] = {}
    nulls: dict[str, bytes] = {}
    for c in pt.schema.columns:
        name = c.name
        values = (
            np.concatenate([p.cols[name][r] for p, r in parts])
            if parts
            else np.zeros(0, dtype=c.type.dtype)
        )
        if c.type.is_string:
            uniq, local = np.unique(values, return_inverse=True)
            strings = pt.dicts[name][0].take(uniq).tolist()
            cols[name] = ["str", strings, local.astype("<i4").tobytes()]
        else:
            little = values.dtype.newbyteorder("<")
            cols[name] = [little.str, values.astype(little).tobytes()]
            if c.nullable and parts:
                mask = np.concatenate([p.nulls[name][r] for p, r in parts])
                if mask.any():
                    nulls[name] = np.packbits(mask).tobytes()
    hashes = None
    if pt.hashed and parts:
        hashes = (
            np.concatenate([p.hash[r] for p, r in parts if p.hash is not None])
            .astype("<i8")
            .tobytes()
        )
    return {
        "v": CHUNK_VERSION,
        "table": pt.name,
        "schema": pt.schema.spec(),
        "key": pt.schema.key,
        "n": n,
        "cols": cols,
        "nulls": nulls,
        "hash": hashes,
    }


class Decoded:
    """A received chunk as storage arrays (string columns still as Python strings)."""

    __slots__ = ("cols", "hashes", "n", "nulls", "schema", "strings", "table")

    def __init__(self, chunk: Any) -> None:
        if not isinstance(chunk, Mapping) or chunk.get("v") != CHUNK_VERSION:
            raise ValueError("not a scan-engine chunk of a version this engine reads")
        self.table = chunk["table"]
        self.schema = Schema.parse(chunk["schema"], chunk["key"])
        n = chunk["n"]
        if type(n) is not int or n < 0:
            raise ValueError(f"bad row count {n!r:.40} in a chunk")
        self.n = n
        self.cols: dict[str, np.ndarray] = {}
        self.strings: dict[str, tuple[list[Any], np.ndarray]] = {}
        self.nulls: dict[str, np.ndarray | None] = {}
        raw_nulls = chunk.get("nulls") or {}
        for c in self.schema.columns:
            item = chunk["cols"][c.name]
            if c.type.is_string:
                _, strings, local = item
                idx = np.frombuffer(local, dtype="<i4").astype(np.int64)
                if len(idx) != n or (n and (idx.min() < 0 or idx.max() >= len(strings))):
                    raise ValueError(f"column {c.name!r} of a chunk is malformed")
                self.strings[c.name] = (list(strings), idx)
                continue
            dtype = np.dtype(item[0])
            arr = np.frombuffer(item[1], dtype=dtype)
            if len(arr) != n or dtype.kind != c.type.dtype.kind:
                raise ValueError(f"column {c.name!r} of a chunk is malformed")
            self.cols[c.name] = arr.astype(c.type.dtype)
            packed = raw_nulls.get(c.name)
            if packed is not None:
                self.nulls[c.name] = np.unpackbits(
                    np.frombuffer(packed, dtype=np.uint8), count=n
                ).astype(bool)
        raw_hash = chunk.get("hash")
        self.hashes = None if raw_hash is None else np.frombuffer(raw_hash, "<i8").astype(np.int64)
        if self.hashes is not None and len(self.hashes) != n:
            raise ValueError("the hashes of a chunk are malformed")
