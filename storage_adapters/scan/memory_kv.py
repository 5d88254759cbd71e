"""``scan-memory``: the scan engine's tables and the memory engine's key-value data in one
storage process.

``scan-kv`` puts key-value data into a scan-engine table (integer keys, JSON values), so
that the key-value workloads exercise Clock Scan; it reports no changes, so its data has
no change feed and no views.  This engine is for a cluster that wants both: tables
answered by shared scans (dicts: the scan engine's operations), and key-value data of
any key type on the memory engine (tuples: its operations, with change feeds and the
views' ``version`` operation).  The two stores hold disjoint data (an operation names
one of them by its form), so a batch's operations on one store keep their order and
those on the other commute with them.  Clients use :class:`~.kv.ScanKVOps`.

Both stores report their changes: a change feed over a range tells the writes of
key-value data there and of the tables' rows whose keys lie there (a row by
:func:`rubberband.engine.row_key`, with its images).  With
``durable_dir`` the tables keep the scan engine's redo log; the key-value data is in
memory only, as on the memory engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rubberband.engine import BadOperation, Placement, RangeSet
from storage_adapters.memory import MemoryEngine
from storage_adapters.scan.engine import ScanEngine
from storage_adapters.scan.ops import is_table_or_kv_read

TABLES, DATA = "tables", "data"
"""How a chunk of a copy says which store it is of."""


class _Cursor:
    """A copy of ranges: the tables' chunks, then the key-value data's, each tagged."""

    def __init__(self, parts: list[tuple[str, Any]]) -> None:
        self._parts = parts

    def next_chunk(self, max_bytes: int) -> Any | None:
        while self._parts:
            tag, cursor = self._parts[0]
            chunk = cursor.next_chunk(max_bytes)
            if chunk is not None:
                return [tag, chunk]
            cursor.close()
            self._parts.pop(0)
        return None

    def close(self) -> None:
        for _tag, cursor in self._parts:
            cursor.close()
        self._parts = []


def run_on(
    store: Any, items: list[Any], where: list[int], changed: list[Any] | None, results: list[Any]
) -> list[Any]:
    """``items`` applied by one of the two stores, each result (and what it changed)
    put at its place ``where`` in the whole batch; the results."""
    if changed is None:
        got = store.apply(items)
    else:
        got, logged = store.apply_logged(items)
        for i, c in zip(where, logged, strict=True):
            changed[i] = c
    for i, res in zip(where, got, strict=True):
        results[i] = res
    return list(got)


class ScanMemoryEngine:
    """Tables on a :class:`ScanEngine`, key-value data on a :class:`MemoryEngine`."""

    is_read = staticmethod(is_table_or_kv_read)

    def __init__(self, placement: Placement | None = None, **scan_options: Any) -> None:
        self.scan = ScanEngine(placement, **scan_options)
        self.data = MemoryEngine(self.scan.placement)

    @property
    def placement(self) -> Placement:
        return self.scan.placement

    @placement.setter
    def placement(self, value: Placement) -> None:
        self.scan.placement = self.data.placement = value  # before any data

    def apply(self, batch: Sequence[tuple[Any, RangeSet]]) -> list[Any]:
        return self._apply(batch, None)

    def apply_logged(
        self, batch: Sequence[tuple[Any, RangeSet]]
    ) -> tuple[list[Any], list[tuple[Any, ...]]]:
        """:meth:`apply`, and what each write changed: a key-value write its keys, a
        table write its rows (:meth:`ScanEngine.apply_logged`)."""
        changed: list[tuple[Any, ...]] = [()] * len(batch)
        return self._apply(batch, changed), changed

    def apply_basic(self, batch: Sequence[tuple[Any, RangeSet]]) -> list[Any]:
        """Basic reads of tables outside the delivery order, as the scan engine's."""
        if any(not isinstance(op, dict) for op, _ in batch):
            return [BadOperation("basic reads here are table selects")] * len(batch)
        return self.scan.apply_basic(batch)

    def _apply(
        self, batch: Sequence[tuple[Any, RangeSet]], changed: list[tuple[Any, ...]] | None
    ) -> list[Any]:
        results: list[Any] = [None] * len(batch)
        tables = [i for i, (op, _) in enumerate(batch) if isinstance(op, dict)]
        data = [i for i, (op, _) in enumerate(batch) if not isinstance(op, dict)]
        # The tables' ops first: one Clock Scan cycle for all of them, in their order.
        for store, mine in ((self.scan, tables), (self.data, data)):
            if mine:
                run_on(store, [batch[i] for i in mine], mine, changed, results)
        return results

    def open_send(self, ranges: RangeSet) -> _Cursor:
        return _Cursor([(TABLES, self.scan.open_send(ranges)), (DATA, self.data.open_send(ranges))])

    def receive(self, chunk: Any, ranges: RangeSet) -> None:
        if type(chunk) not in (list, tuple) or len(chunk) != 2 or chunk[0] not in (TABLES, DATA):
            raise BadOperation("a refused chunk: not [tables|data, chunk]")
        (self.scan if chunk[0] == TABLES else self.data).receive(chunk[1], ranges)

    def delete(self, ranges: RangeSet) -> None:
        self.scan.delete(ranges)
        self.data.delete(ranges)

    def stats(self) -> dict[str, int | float]:
        scan, data = self.scan.stats(), self.data.stats()
        return {**scan, **{f"kv_{k}": v for k, v in data.items()},
                "items": scan["items"] + data["items"]}  # fmt: skip

    def close(self) -> None:
        self.scan.close()
        self.data.close()

    def items(self) -> list[tuple[Any, Any]]:
        """The key-value data in placement order: what replicas compare (tables are
        compared by their selects)."""
        return self.data.items()
