"""Optional local durability: a logical redo log and rolling snapshots (dissertation 2.8).

For a single-node deployment (under Rubberband, replication is the durability, 2.8.4).
Crescando logs the write *operations*, not their effects (logical logging), and keeps a
rolling, fuzzy checkpoint of individually consistent segment snapshots taken by
"snapshot selects" that never block the scan.  Here:

* **Log.**  Every call that changes state is appended to the current log file before
  its results are returned: a batch's successful writes (with their ranges; a rejected
  operation changed nothing and replays to the same rejection anyway), a received chunk,
  a ranges delete.  A record is ``[length][crc32][msgpack [lsn, kind, payload]]``; with
  ``fsync`` (the default) the file is synced before the call returns.
* **Rolling snapshots.**  Once ``snapshot_after_bytes`` of log have accumulated, a
  snapshot opens: a send cursor over everything (:mod:`.migrate`), which is consistent
  as of its log sequence number (LSN) by copy-on-write, and is written out one chunk
  (``step_bytes``) per later call, so it never stalls the writes it runs beside.  The
  log rotates when a snapshot opens; when the snapshot is complete and synced, it is
  renamed into place and the older snapshot and log files are deleted.
* **Recovery.**  Load the newest complete snapshot (its chunks are ``receive``d), then
  replay every log record with a higher LSN, in order, through the normal execution
  path; a torn or corrupt tail record ends the replay (it was never acknowledged).

Where Crescando's checkpoint is fuzzy across segments and each segment's replay starts
at its own timestamp, a copy-on-write cursor makes the whole snapshot consistent at one
LSN, so recovery replays one suffix of the log.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rubberband.engine import EVERYTHING, BadOperation
from storage_adapters.log.records import pack as _pack
from storage_adapters.log.records import scan
from storage_adapters.scan.migrate import SendCursor
from storage_adapters.scan.ops import DDL, WRITES

if TYPE_CHECKING:
    from storage_adapters.scan.engine import ScanEngine

_LOG = "log-{:020d}.redo"
_SNAP = "snap-{:020d}.snap"


class _Snapshot:
    """A snapshot being written: its LSN, cursor, temporary file and chunk count."""

    __slots__ = ("chunks", "cursor", "file", "lsn", "tmp")

    def __init__(self, lsn: int, cursor: SendCursor, tmp: Path) -> None:
        self.lsn = lsn
        self.cursor = cursor
        self.tmp = tmp
        self.file = tmp.open("wb")
        self.chunks = 0


def _records(path: Path) -> tuple[list[Any], int]:
    """The intact records of a file and the offset where they end."""
    found, end = scan(path.read_bytes())
    return [r.body for r in found], end


class Durability:
    """The log and snapshots of one engine in one directory."""

    def __init__(
        self,
        path: Path,
        *,
        fsync: bool = True,
        snapshot_after_bytes: int = 64 << 20,
        step_bytes: int = 1 << 20,
    ) -> None:
        self.path = path
        self.fsync = fsync
        self.snapshot_after_bytes = snapshot_after_bytes
        self.step_bytes = step_bytes
        path.mkdir(parents=True, exist_ok=True)
        self.lsn = 0
        self._log: Any = None
        self._log_bytes = 0
        self._snap: _Snapshot | None = None
        self.recovered = {"snapshot_lsn": 0, "replayed": 0}

    # ---------------------------------------------------------------- recovery
    def recover(self, engine: ScanEngine) -> None:
        """Rebuild ``engine`` (empty) from the directory, then open a fresh log file."""
        for tmp in self.path.glob("*.tmp"):
            tmp.unlink()
        base = 0
        for snap in sorted(self.path.glob("snap-*.snap"), reverse=True):
            records, _ = _records(snap)
            if not records or records[-1] != ("end", len(records) - 1):
                continue  # incomplete: an older one may do
            for chunk in records[:-1]:
                engine.receive_unlogged(chunk)
            base = int(snap.name[5:25])
            break
        self.lsn = base
        replayed = 0
        for log in sorted(self.path.glob("log-*.redo")):
            records, end = _records(log)
            for lsn, kind, payload in records:
                if lsn <= base:
                    continue
                if lsn != self.lsn + 1:
                    raise ValueError(f"log {log.name} skips from LSN {self.lsn} to {lsn}")
                self._replay(engine, kind, payload)
                self.lsn = lsn
                replayed += 1
            if end < log.stat().st_size:
                os.truncate(log, end)  # a torn tail: never acknowledged, never appended to
                break
        self.recovered = {"snapshot_lsn": base, "replayed": replayed}
        self._rotate()

    def _replay(self, engine: ScanEngine, kind: str, payload: Any) -> None:
        if kind == "batch":
            results = engine.apply_unlogged(payload)
            bad = [r for r in results if isinstance(r, BadOperation)]
            if bad:
                raise ValueError(f"a logged write was rejected on replay: {bad[0]}")
        elif kind == "receive":
            engine.receive_unlogged(payload)
        elif kind == "delete":
            engine.delete_unlogged(payload)
        else:
            raise ValueError(f"unknown log record kind {kind!r}")

    # ---------------------------------------------------------------- logging
    def log_batch(self, batch: Any, results: list[Any], engine: ScanEngine) -> None:
        writes = [
            [op, ranges]
            for (op, ranges), result in zip(batch, results, strict=True)
            if not isinstance(result, BadOperation)
            and isinstance(op, dict)
            and op.get("op") in (*WRITES, *DDL)
        ]
        if writes:
            self._append("batch", writes)
        self._step(engine)

    def log_receive(self, chunk: Any, engine: ScanEngine) -> None:
        self._append("receive", chunk)
        self._step(engine)

    def log_delete(self, ranges: Any, engine: ScanEngine) -> None:
        self._append("delete", ranges)
        self._step(engine)

    def _append(self, kind: str, payload: Any) -> None:
        record = _pack([self.lsn + 1, kind, payload])
        self._log.write(record)
        self._log.flush()
        if self.fsync:
            os.fsync(self._log.fileno())
        self.lsn += 1
        self._log_bytes += len(record)

    def _rotate(self) -> None:
        if self._log is not None:
            self._log.close()
        self._log = (self.path / _LOG.format(self.lsn + 1)).open("ab")
        self._log_bytes = 0

    # ---------------------------------------------------------------- snapshots
    def _step(self, engine: ScanEngine) -> None:
        """Advance the rolling snapshot by one chunk; open one when the log has grown."""
        if self._snap is None:
            if self._log_bytes >= self.snapshot_after_bytes:
                self._open_snapshot(engine)
            return
        self._write_chunk()

    def _open_snapshot(self, engine: ScanEngine) -> None:
        tmp = self.path / (_SNAP.format(self.lsn) + ".tmp")
        self._snap = _Snapshot(self.lsn, SendCursor(engine.tables, EVERYTHING), tmp)
        self._rotate()  # records after the snapshot's LSN go to a fresh file

    def _write_chunk(self) -> bool:
        """Write one chunk of the open snapshot; finish it at the end.  True when done."""
        snap = self._snap
        assert snap is not None
        chunk = snap.cursor.next_chunk(self.step_bytes)
        if chunk is not None:
            snap.file.write(_pack(chunk))
            snap.chunks += 1
            return False
        snap.file.write(_pack(["end", snap.chunks]))
        snap.file.flush()
        os.fsync(snap.file.fileno())
        snap.file.close()
        snap.cursor.close()
        final = self.path / _SNAP.format(snap.lsn)
        snap.tmp.rename(final)
        self._snap = None
        for old in self.path.glob("snap-*.snap"):
            if old != final:
                old.unlink()
        logs = sorted(self.path.glob("log-*.redo"))
        for log in logs[:-1]:  # every file but the current one ends at or before the LSN
            if int(log.name[4:24]) <= snap.lsn:
                log.unlink()
        return True

    def checkpoint(self, engine: ScanEngine) -> None:
        """Finish the open snapshot, or take a whole one now."""
        if self._snap is None:
            self._open_snapshot(engine)
        while not self._write_chunk():
            pass

    def close(self) -> None:
        if self._snap is not None:
            self._snap.cursor.close()
            self._snap.file.close()
            self._snap.tmp.unlink()
            self._snap = None
        if self._log is not None:
            self._log.close()
            self._log = None
