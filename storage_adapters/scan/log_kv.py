"""``scan-log``: ``scan-memory`` made durable, tables and key-value data on one log.

The key-value data is the log engine's (:mod:`storage_adapters.log`); the tables stay
the scan engine's, in memory, answered by Clock Scan, and are made durable the way
Crescando makes them (dissertation 2.8): their writes are logged *logically*, each
successful table write with its ranges at the position of the delivery that carried
it, a received chunk and a deleted range as they came, and the tables' whole state is
written as a snapshot (the send cursor's chunks, consistent by copy-on-write) beside
each checkpoint of the key-value index, at the same log position.  A restart loads the
newest checkpoint with both and redoes the log after it, table records through the
scan engine's normal execution path.

So one log, one group commit and one ``fdatasync`` per batch hold both stores, the
storage process confirms a batch to E-Cast only once both are on disk, and one
position says up to where the replica holds the total order: a whole-cluster restart
(:mod:`rubberband.restart`) brings tables level as it does key-value data, table writes
coming back through ``tail`` as ``"writes"`` of their message.

What it costs: a table write is logged as the operation, not its rows (an update by
predicate is one record however many rows it changes); a checkpoint writes every
table whole while the batch waits (about 1 s per 100 MB of table data, once per
``checkpoint_mb`` of log).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from rubberband.engine import EVERYTHING, BadOperation, Placement, RangeSet
from storage_adapters.log import CorruptLog, LogEngine
from storage_adapters.scan.engine import ScanEngine
from storage_adapters.scan.memory_kv import TABLES, ScanMemoryEngine, run_on
from storage_adapters.scan.migrate import SendCursor
from storage_adapters.scan.ops import DDL, WRITES

SNAPSHOT_CHUNK = 4 << 20
"""Bytes of table rows per record of a checkpoint's snapshot."""
_LOGGED = (*WRITES, *DDL)


class _Tables:
    """The scan engine's tables as the log engine's
    :class:`~storage_adapters.log.LoggedStore`."""

    def __init__(self, scan: ScanEngine) -> None:
        self.scan = scan

    @property
    def placement(self) -> Placement:
        return self.scan.placement

    @placement.setter
    def placement(self, value: Placement) -> None:
        self.scan.placement = value

    def redo(self, body: Any) -> None:
        kind, payload = body
        if kind == "writes":
            results = self.scan.apply_unlogged([(op, ranges) for op, ranges in payload])
            bad = [r for r in results if isinstance(r, BadOperation)]
            if bad:
                raise CorruptLog(f"a logged table write was refused on redo: {bad[0]}")
        elif kind == "receive":
            self.scan.receive_unlogged(payload)
        elif kind == "delete":
            self.scan.delete_unlogged(payload)
        else:
            raise CorruptLog(f"a table record of unknown kind {kind!r}")

    def snapshot(self) -> Iterator[Any]:
        cursor = SendCursor(self.scan.tables, EVERYTHING)
        try:
            while (chunk := cursor.next_chunk(SNAPSHOT_CHUNK)) is not None:
                yield chunk
        finally:
            cursor.close()

    def restore(self, chunks: Iterable[Any]) -> None:
        self.scan.reset()
        for chunk in chunks:
            self.scan.receive_unlogged(chunk)

    def held(self) -> int:
        return int(self.scan.stats()["items"])


class ScanLogEngine(ScanMemoryEngine):
    """Tables on a :class:`ScanEngine`, key-value data on a :class:`LogEngine`, both
    logged in the log engine's directory ``path``.  Options are the log engine's, and
    the scan engine's ``block_rows``."""

    positions = True
    durable = True

    def __init__(
        self, placement: Placement | None = None, *, block_rows: int | None = None,
        **log_options: Any,
    ) -> None:  # fmt: skip
        self.scan = ScanEngine(None, **({} if block_rows is None else {"block_rows": block_rows}))
        self.data: LogEngine = LogEngine(placement, store=_Tables(self.scan), **log_options)

    @property
    def position(self) -> int:
        return self.data.position

    @property
    def path(self) -> Any:
        return self.data.path

    @property
    def recovered(self) -> dict[str, Any]:
        return self.data.recovered

    @property
    def placement(self) -> Placement:
        return self.data.placement

    @placement.setter
    def placement(self, value: Placement) -> None:
        self.data.placement = value  # the tables' too, refused once data is held

    def apply_basic(self, batch: Sequence[tuple[Any, ...]]) -> list[Any]:
        return super().apply_basic([(op, ranges) for op, ranges, *_ in batch])

    def _apply(self, batch: Sequence[Any], changed: list[tuple[Any, ...]] | None) -> list[Any]:
        results: list[Any] = [None] * len(batch)
        tables = [i for i, (op, *_) in enumerate(batch) if isinstance(op, dict)]
        data = [i for i, (op, *_) in enumerate(batch) if not isinstance(op, dict)]
        with self.data.group():  # one commit (one fdatasync) for both stores
            # The key-value data first: its records take the log's running position, which
            # the tables' records (each with its own) must not have moved past theirs.
            if data:
                run_on(self.data, [batch[i] for i in data], data, changed, results)
            if tables:  # the scan engine takes no positions; the log records them
                ops = [(batch[i][0], batch[i][1]) for i in tables]
                got = run_on(self.scan, ops, tables, changed, results)
                self._log_writes([batch[i] for i in tables], got)
        return results

    def _log_writes(self, items: list[Any], results: list[Any]) -> None:
        """A record per position of the table writes that changed something: redone
        in order on recovery, and a message's writes for a restart's levelling."""
        by_t: dict[int, list[Any]] = {}
        for (op, ranges, *t), res in zip(items, results, strict=True):
            if op.get("op") in _LOGGED and not isinstance(res, BadOperation):
                by_t.setdefault(t[0] if t else -1, []).append([op, ranges])
        for t, writes in by_t.items():
            self.data.log_store(t, ["writes", writes])

    def receive(self, chunk: Any, ranges: RangeSet) -> None:
        super().receive(chunk, ranges)
        if chunk[0] == TABLES:
            self.data.log_store(-1, ["receive", chunk[1]])

    def delete(self, ranges: RangeSet) -> None:
        with self.data.group():
            self.scan.delete(ranges)
            self.data.log_store(-1, ["delete", ranges])
            self.data.delete(ranges)

    def whole(self, t: int, writes: Sequence[tuple[Any, RangeSet]]) -> None:
        self.data.whole(t, writes)

    def tail(self, after: int) -> list[tuple[int, str, Any]]:
        """The log engine's ``tail``, the tables' writes as ``"writes"`` of their
        message (``((op, ranges), ...)``); received chunks and deletes, which no
        message made, left out."""
        out = []
        for t, kind, body in self.data.tail(after):
            if kind != "store":
                out.append((t, kind, body))
            elif body[0] == "writes":
                out.append((t, "writes", tuple((op, ranges) for op, ranges in body[1])))
        return out

    @property
    def epoch(self) -> int:
        return self.data.epoch

    def new_epoch(self, epoch: int | None = None) -> None:
        self.data.new_epoch(epoch)

    def sync(self) -> None:
        self.data.sync()

    def checkpoint(self) -> Any:
        return self.data.checkpoint()

    def close(self, checkpoint: bool = True) -> None:
        self.data.close(checkpoint)
        self.scan.close()
