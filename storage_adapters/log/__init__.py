"""A durable, log-structured key-value engine: the log is the only data repository.

After LogBase (seed 004, chapter 3):

* **The log** (3.2.4): every write is a record appended to segment files on local disk,
  ``[t, PUT, key, value]``, ``[t, DELETE, key]`` or ``[t, DROP, ranges]``, stamped with
  the position ``t`` in the total order of the delivery that made it
  (:mod:`.segments`).  A batch of deliveries is one *group commit*: its records are
  written and, under ``fsync="always"``, ``fdatasync``-ed once before ``apply`` returns;
  under ``fsync="interval"``, at most ``fsync_interval`` seconds after they were
  written (a crash of the machine can lose that window at this replica; a crash of the
  process alone loses nothing, the OS has the bytes).
* **The multiversion index** (3.2.5) in memory: key -> newest version -> log pointer,
  older versions while a send cursor reads them (:mod:`.index`); values are read back
  from the log, checksum checked, through a read buffer of recent ones (3.2.6).
* **Checkpoints** (3.2.8): every ``checkpoint_mb`` of log, and at a clean close, the
  index is written (keys and pointers, no values) with the log position it covers;
  a restart loads the newest intact checkpoint and *redoes* the log after it.  A torn
  last record (a write the crash cut short, never acknowledged) is cut; damage with
  intact records after it, or in an older segment, is acknowledged data lost: the engine
  refuses to open (:class:`CorruptLog`) rather than serve a state no replica had.  A
  damaged checkpoint falls back to the one before it, then to a scan of the whole log.
* **Compaction** (3.2.6): when the log holds more than twice its live bytes, the oldest
  segment's live records are copied to the head, a checkpoint is written, and the
  segment is removed; never while a send cursor is open (:attr:`LogIndex.cut`).
* **Migration** (5.4): a send cursor reads a range as of its opening from the
  multiversion index, without copying it; writes go on beside it.

Every key-value operation is the memory engine's (:class:`MemoryEngine`), unchanged:
only where items live differs.

A second store may share the log (:class:`LoggedStore`: the scan engine's tables,
``scan-log``): its changes are records of their own in the same group commits, its
state is checkpointed beside the index at the same log position, and a restart
restores it from that checkpoint and redoes its records after it (logical logging, as
Crescando's redo log, dissertation 2.8).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from rubberband.engine import Placement, RangeSet
from storage_adapters.log import records
from storage_adapters.log.index import COMMIT, DELETE, DROP, EPOCH, PUT, STORE, WHOLE, LogIndex
from storage_adapters.log.segments import (
    CorruptLog,
    FsyncPolicy,
    Log,
    fsync_dir,
    plausible_record_after,
)
from storage_adapters.memory import OUTSIDE, MemoryEngine

__all__ = ["CorruptLog", "LogEngine", "LoggedStore"]

log = logging.getLogger("rubberband.log_engine")
CKPT = "ckpt-{:08d}.idx"
STORE_CKPT = "ckpt-{:08d}.store"
_TAIL = {PUT: "put", DELETE: "delete", WHOLE: "whole", STORE: "store"}
KEYS_PER_RECORD = 10_000
KEEP_CHECKPOINTS = 2


class LoggedStore(Protocol):
    """A store in memory whose changes the engine logs for it, as records only it reads
    (``[t, STORE, body]``, in the same group commits as the key-value data), and whose
    whole state it checkpoints beside the index, at the same log position.  So one
    ``fdatasync`` per batch covers both, and one position says up to where both hold
    the total order."""

    placement: Placement

    def redo(self, body: Any) -> None:
        """Apply a logged change again (recovery: after the checkpoint, in log order)."""

    def snapshot(self) -> Iterator[Any]:
        """The whole state now, as chunks (each a record of a checkpoint file)."""

    def restore(self, chunks: Iterable[Any]) -> None:
        """Replace the whole state by a snapshot's chunks."""

    def held(self) -> int:
        """Items held (data placed by a partitioning, which may then not change)."""


class LogEngine(MemoryEngine):
    """Key-value data in a log on disk, indexed in memory.  ``path`` None: a private
    directory removed at close (tests)."""

    positions = True
    """Give ``apply`` each operation's position: ``(op, ranges, t)`` items."""
    durable = True
    """A batch is written (and, under ``fsync="always"``, synced) when ``apply``
    returns: the storage process confirms deliveries to E-Cast only then."""

    def __init__(
        self,
        placement: Placement | None = None,
        *,
        path: str | None = None,
        fsync: FsyncPolicy = "always",
        fsync_interval: float = 0.05,
        segment_mb: float = 64,
        checkpoint_mb: float = 256,
        store: LoggedStore | None = None,
    ) -> None:
        self._own = path is None
        self._store = store
        self.path = Path(tempfile.mkdtemp(prefix="rb-log-")) if path is None else Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock = os.open(self.path / "LOCK", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock)
            raise RuntimeError(f"{self.path} is in use by another process") from None
        try:
            self._open(placement, fsync, fsync_interval, segment_mb, checkpoint_mb)
        except BaseException:
            with contextlib.suppress(Exception):
                self._log.close()
            os.close(self._lock)  # a refused or damaged directory stays as it was
            self._lock = -1
            raise

    def _open(
        self, placement: Placement | None, fsync: FsyncPolicy, fsync_interval: float,
        segment_mb: float, checkpoint_mb: float,
    ) -> None:  # fmt: skip
        if fsync_interval <= 0 or segment_mb <= 0 or checkpoint_mb <= 0:
            raise ValueError("fsync_interval, segment_mb and checkpoint_mb are positive")
        self._log = Log(self.path, int(segment_mb * (1 << 20)), fsync, fsync_interval)
        self._log.commit_mark = records.pack((-1, COMMIT))
        self._checkpoint_bytes = int(checkpoint_mb * (1 << 20))
        self._meta = self.path / "engine.json"
        stored = json.loads(self._meta.read_text()) if self._meta.exists() else {}
        self._placement = Placement(stored.get("partitioning", "range"))
        self._ordered = self._placement.ordered
        if self._store is not None:  # before its redo: a row's place depends on it
            self._store.placement = self._placement
        self._data: Any = LogIndex(self._log, self._slot)
        self.counts = {"writes": 0, "reads": 0, "rejected": 0}
        self.figures = {"checkpoints": 0, "compactions": 0, "cut_bytes": 0}
        self._holding = False
        self._broken = False
        self._compacted_at = -1
        self._checkpointed_at = 0  # the log's appended bytes at the last checkpoint
        self.recovered: dict[str, Any] = {}
        self._recover()
        if placement is not None:
            self.placement = placement

    @property
    def placement(self) -> Placement:
        return self._placement

    @placement.setter
    def placement(self, placement: Placement) -> None:
        """Set by a storage process joining a cluster, before data; data already held
        was placed by its partitioning, so another is refused."""
        if placement != getattr(self, "_placement", None):
            if getattr(self, "_data", None) is not None and self._held():
                raise ValueError(
                    f"{self.path} holds data placed by {self._placement.partitioning} "
                    f"partitioning, not {placement.partitioning}"
                )
            self._placement = placement
            self._ordered = placement.ordered
            if self._store is not None:
                self._store.placement = placement
        if hasattr(self, "_meta"):
            self._write_meta()

    def _held(self) -> int:
        return len(self._data) + (self._store.held() if self._store is not None else 0)

    def _write_meta(self) -> None:
        tmp = self._meta.with_suffix(".tmp")
        tmp.write_text(json.dumps({"partitioning": self._placement.partitioning}))
        os.replace(tmp, self._meta)

    @property
    def position(self) -> int:
        """The position of the newest write this engine holds (0: none)."""
        return int(self._data.t)

    # ---------------------------------------------------------------- the protocol
    def apply(self, batch: Sequence[Any]) -> list[Any]:
        with self.group():
            index = self._data
            out = []
            for item in batch:
                if len(item) == 3 and item[2] > index.t:
                    index.t = item[2]
                out.append(self._one(item[0], item[1]))
            return out

    def apply_logged(self, batch: Sequence[Any]) -> tuple[list[Any], list[Any]]:
        with self.group():  # one group commit for the batch, not one per operation
            return super().apply_logged(batch)

    def _put_store(self) -> Any:
        """The memory engine's written-out put, into the log: the general road cost a
        put two group contexts, a lookup by name and four calls before its record."""
        if not self._fast_puts(LogEngine, LogIndex):
            return None
        index = self._data

        def store(slot: Any, one: Any) -> tuple[Any, ...]:
            if len(one) == 3 and one[2] > index.t:  # as apply: the record's position
                index.t = one[2]
            if slot is OUTSIDE:
                return ()
            key, value = one[0][1][0]
            index[slot] = (key, value)
            return ((key, "put", value),)

        return store

    @contextlib.contextmanager
    def group(self) -> Iterator[None]:
        """One group commit for everything written inside (nested: the outermost).  A
        failure inside commits nothing: the batch is not in the log, and this engine
        writes no more (its storage process stops; a restart cuts what was written)."""
        outer, self._holding = self._holding, True
        try:
            yield
        except BaseException:
            self._holding = outer
            self._broken = True
            self._log.abandon()
            raise
        self._holding = outer
        if not outer:
            self._commit()

    def log_store(self, t: int, body: Any) -> None:
        """Log a change of the :class:`LoggedStore` made at position ``t`` (committed
        with the group it is written in, or at once outside one)."""
        index = self._data
        if t > index.t:
            index.t = t
        self._log.append((t, STORE, body))
        if not self._holding:
            self._commit()

    def whole(self, t: int, writes: Sequence[tuple[Any, RangeSet]]) -> None:
        """Every write ``(op, ranges)`` of the message at ``t``, which reaches beyond
        this replica's ranges: logged (with the batch's commit), so that a restart after
        a crash can bring the replicas that missed the message level with it."""
        if t >= 0:
            self._log.append((t, WHOLE, [list(w) for w in writes]))

    def tail(self, after: int) -> list[tuple[int, str, Any]]:
        """``(t, kind, body)`` of every record of the current epoch at a position after
        ``after``, in log order: ``"put"`` ``(key, value)``, ``"delete"`` ``key`` and
        ``"whole"`` ``((op, ranges), ...)`` (what :func:`rubberband.restart.plan`
        reads), and ``"store"`` the :class:`LoggedStore`'s bodies.  Reads the whole
        log, checksums and all: :class:`CorruptLog` on damage anywhere, even behind the
        checkpoint a restart opened from."""
        self._log.commit(force=True)
        out: list[tuple[int, str, Any]] = []
        for n in self._log.segments():
            data = self._log.read_all(n)
            end = 0
            for rec in records.iter_records(data):
                t, kind = rec.body[0], rec.body[1]
                if kind == EPOCH:
                    out = []
                elif t > after and kind in _TAIL:
                    out.append((t, _TAIL[kind], rec.body[2:4] if kind == PUT else rec.body[2]))
                end = rec.offset + rec.size
            if end < len(data):  # every record is read: damage anywhere is found here
                raise CorruptLog(f"{self._log.file(n)}: damaged record at offset {end}")
        return out

    @property
    def epoch(self) -> int:
        """The epoch of the positions: the cluster's restore that started their group
        (-1: a group this engine joined later, whose number it was not told)."""
        return int(self._data.epoch)

    def new_epoch(self, epoch: int | None = None) -> None:
        """Positions start again from here (a new E-Cast group), in ``epoch`` (None: the
        next one): synced at once."""
        index = self._data
        index.t = 0
        index.epoch = index.epoch + 1 if epoch is None else epoch
        self._log.append((-1, EPOCH, index.epoch))
        self._log.commit(force=True)

    def sync(self) -> None:
        """Everything written so far on disk, whatever the fsync policy."""
        self._log.commit(force=True)

    def _delete_range(self, op: Any, ranges: RangeSet) -> None:
        live = self._data.live
        for lo, hi in ranges:
            for slot in list(live.irange(lo, hi, inclusive=(True, False))):
                key = self._data.pop(slot)[0]
                if self._changes is not None:
                    self._changes.append((key, "delete", None))

    def open_send(self, ranges: RangeSet) -> _Cursor:  # type: ignore[override]
        return _Cursor(self, self._flat(ranges))

    def receive(self, chunk: Any, ranges: RangeSet) -> None:
        index = self._data
        t, index.t = index.t, -1  # a copy is no message's write: out of every tail
        try:
            with self.group():
                super().receive(chunk, ranges)
        finally:
            index.t = t

    def delete(self, ranges: RangeSet) -> None:
        self._data.drop(self._flat(ranges))
        if not self._holding:
            self._commit()

    def stats(self) -> dict[str, int | float]:
        index = self._data
        segments = self._log.segments()
        return {
            "items": len(index),
            "bytes": sum(self._log.size(n) for n in segments),
            "live_bytes": sum(index.live_bytes.values()),
            "segments": len(segments),
            "syncs": self._log.syncs,
            "position": index.t,
            **self.figures,
            **self.counts,
        }

    def close(self, checkpoint: bool = True) -> None:
        """Commit, and (``checkpoint``) write a checkpoint so the next open reads no log."""
        if self._lock < 0:
            return
        try:
            if not self._own and not self._broken:  # a failed batch stays uncommitted
                self._log.commit(force=True)
                if checkpoint:
                    self.checkpoint()
        finally:
            self._log.close()
            self._data.clear()
            os.close(self._lock)
            self._lock = -1
            if self._own:
                shutil.rmtree(self.path, ignore_errors=True)

    # ---------------------------------------------------------------- commit
    def _commit(self) -> None:
        self._log.commit()
        if self._log.appended - self._checkpointed_at >= self._checkpoint_bytes:
            self.checkpoint()
        if self._log.active != self._compacted_at:  # garbage piles up as segments fill
            self._maybe_compact()

    def checkpoint(self) -> Path:
        """Write the index with the log position it covers (synced, renamed into
        place), the :class:`LoggedStore`'s state first beside it; keep the newest
        :data:`KEEP_CHECKPOINTS`.  The store's snapshot is written whole, here: a
        batch waits for it (seconds for a million rows, once per ``checkpoint_mb``)."""
        log_ = self._log
        log_.commit(force=True)
        index = self._data
        olds = sorted(self.path.glob("ckpt-*.idx"))
        n = int(olds[-1].name[5:13]) + 1 if olds else 1
        final = self.path / CKPT.format(n)
        entries = [(e[0], e[2], e[3], e[4]) for e in index.live.ordered_values()]
        head = {"segment": log_.active, "offset": log_.size(log_.active), "t": index.t,
                "epoch": index.epoch, "items": len(entries)}  # fmt: skip
        if self._store is not None:
            _write_file(self.path / STORE_CKPT.format(n), _store_records(self._store.snapshot()))
        _write_file(final, _checkpoint_records(head, entries))
        for old in olds[: max(0, len(olds) + 1 - KEEP_CHECKPOINTS)]:
            old.unlink()
            old.with_suffix(".store").unlink(missing_ok=True)
        self._checkpointed_at = log_.appended
        self.figures["checkpoints"] += 1
        return final

    def _maybe_compact(self) -> None:
        """Copy the oldest segment's live records to the head and remove it, when the
        log holds more than twice its live bytes (one segment per commit at most, so a
        batch never waits for more than one)."""
        index, log_ = self._data, self._log
        if index.cut is not None:
            return  # a send cursor may read any version: nothing is cut behind it
        self._compacted_at = log_.active  # looked at for this segment
        segments = log_.segments()
        if len(segments) < 2:
            return
        total = sum(log_.size(n) for n in segments)
        live = sum(index.live_bytes.values())
        if total > 2 * live + log_.segment_bytes:
            self.compact(segments[0])
            self._compacted_at = -1  # look again at the next commit

    def compact(self, n: int) -> None:
        """Move segment ``n``'s live records to the head, checkpoint, remove ``n``.
        Only the oldest segment may go: its tombstones hide nothing older."""
        index, log_ = self._data, self._log
        if n == log_.active or n != log_.segments()[0] or index.cut is not None:
            raise ValueError(f"segment {n} cannot be compacted now")
        moved = [e for e in index.live.values() if e[2] == n]
        for e in moved:
            value = index.value(e[2:])
            ptr = log_.append((-1, PUT, e[0], value))  # moved, not written: in no tail
            index.live_bytes[n] -= e[4]
            e[2:] = ptr
            index.live_bytes[ptr[0]] = index.live_bytes.get(ptr[0], 0) + ptr[2]
        self.checkpoint()  # before the segment goes: recovery must not need it
        cut = log_.size(n)
        log_.remove(n)
        fsync_dir(self.path)
        index.live_bytes.pop(n, None)
        self.figures["compactions"] += 1
        self.figures["cut_bytes"] += cut

    # ---------------------------------------------------------------- recovery
    def _recover(self) -> None:
        started = time.monotonic()
        for tmp in self.path.glob("*.tmp"):
            tmp.unlink()
        segments = self._log.segments()
        start = (segments[0], 0) if segments else (1, 0)
        used = None
        for ckpt in sorted(self.path.glob("ckpt-*.idx"), reverse=True):
            got = self._load_checkpoint(ckpt, set(segments))
            if got is not None:
                start, used = got, ckpt.name
                break
            log.warning("event=checkpoint_unusable file=%s", ckpt.name)
        if used is None and self._store is not None:
            if segments and segments[0] != 1:
                raise CorruptLog(
                    f"{self.path}: no usable checkpoint, and the log before segment "
                    f"{segments[0]} was compacted: the store kept beside the key-value "
                    "data cannot be rebuilt (rebuild this replica from the others)"
                )
            self._store.restore(())  # an unusable checkpoint may have half-loaded it
        redone, cut = self._redo(segments, start)
        self._log.open_active(segments[-1] if segments else 1)
        self.recovered = {
            "checkpoint": used, "redone": redone, "cut_bytes": cut, "items": len(self._data),
            "position": self._data.t, "seconds": round(time.monotonic() - started, 3),
        }  # fmt: skip
        if segments:
            log.info("event=log_recovered %s", " ".join(f"{k}={v}" for k, v in
                                                        self.recovered.items()))  # fmt: skip

    def _load_checkpoint(self, path: Path, segments: set[int]) -> tuple[int, int] | None:
        recs = _read_file(path)
        if recs is None or recs[0].body[0] != "head":
            return None
        head = recs[0].body[1]
        if recs[-1].body != ("end", head["items"]) or head["segment"] not in segments:
            return None
        if self._store is not None:
            chunks = _read_file(path.with_suffix(".store"))
            if chunks is None or chunks[-1].body != ("end", len(chunks) - 1):
                return None
            self._store.restore(rec.body[1] for rec in chunks[:-1])
        index = self._data
        index.clear()
        index.live_bytes.clear()
        for rec in recs[1:-1]:
            for key, seg, off, size in rec.body[1]:
                if seg not in segments:
                    index.clear()
                    return None
                index.lsn += 1
                index.live[self._slot(key)] = [key, index.lsn, seg, off, size]
                index.live_bytes[seg] = index.live_bytes.get(seg, 0) + size
        index.t, index.epoch = head["t"], head.get("epoch", 0)
        return head["segment"], head["offset"]

    def _redo(self, segments: list[int], start: tuple[int, int]) -> tuple[int, int]:
        """Apply the log after ``start`` to the index, a batch at a time (up to each
        commit mark); cut what follows the last mark (a batch the crash cut, torn or
        not: never acknowledged).  Returns the records redone and the bytes cut."""
        redone = 0
        pending: list[tuple[int, records.Record]] = []
        committed = start  # (segment, offset) just after the last commit mark
        for n in [s for s in segments if s >= start[0]]:
            data = self._log.file(n).read_bytes()
            pos = start[1] if n == start[0] else 0
            for rec in records.iter_records(data, pos):
                if rec.body[1] == COMMIT:
                    for m, r in pending:
                        self._redo_one(m, r)
                    redone += len(pending)
                    pending = []
                    committed = (n, rec.offset + rec.size)
                else:
                    pending.append((n, rec))
                pos = rec.offset + rec.size
            if pos < len(data) and (
                n != segments[-1] or plausible_record_after(data, pos + 1) is not None
            ):
                raise CorruptLog(
                    f"{self._log.file(n)}: damaged record at offset {pos} with intact "
                    "data after it (acknowledged writes are lost here: rebuild this replica "
                    "from the others)"
                )
        return redone, self._cut_after(segments, committed)

    def _cut_after(self, segments: list[int], committed: tuple[int, int]) -> int:
        cut = 0
        for n in [s for s in segments if s >= committed[0]]:
            size = self._log.file(n).stat().st_size
            if n == committed[0] and size > committed[1]:
                self._log.truncate(n, committed[1])
                cut += size - committed[1]
            elif n > committed[0]:
                self._log.file(n).unlink()
                cut += size
        if cut:
            log.warning("event=uncommitted_tail_cut segment=%s offset=%s bytes=%s",
                        committed[0], committed[1], cut)  # fmt: skip
        return cut

    def _redo_one(self, n: int, rec: records.Record) -> None:
        """One committed record into the index, as its write put it there (no cursor is
        open while recovering, so no older version is kept)."""
        index = self._data
        t, kind = rec.body[0], rec.body[1]
        index.t = 0 if kind == EPOCH else max(index.t, t)
        if kind == EPOCH:
            index.epoch = rec.body[2]
        index.lsn += 1
        if kind == PUT:
            key = rec.body[2]
            index.supersede(self._slot(key), [key, index.lsn, n, rec.offset, rec.size])
        elif kind == DELETE:
            index.supersede(self._slot(rec.body[2]), None)
        elif kind == DROP:
            index.forget([(tuple(lo), tuple(hi)) for lo, hi in rec.body[2]])
        elif kind == STORE:
            if self._store is None:
                raise CorruptLog(f"{self._log.file(n)}: a store's record, and no store here")
            self._store.redo(rec.body[2])


def _checkpoint_records(head: dict[str, Any], entries: list[Any]) -> Iterator[Any]:
    yield ["head", head]
    for i in range(0, len(entries), KEYS_PER_RECORD):
        yield ["keys", entries[i : i + KEYS_PER_RECORD]]
    yield ["end", len(entries)]


def _store_records(chunks: Iterable[Any]) -> Iterator[Any]:
    n = 0
    for chunk in chunks:
        yield ["chunk", chunk]
        n += 1
    yield ["end", n]


def _write_file(final: Path, bodies: Iterable[Any]) -> None:
    """A record per body, written to a temporary file, synced, renamed into place."""
    tmp = final.with_suffix(final.suffix + ".tmp")
    with tmp.open("wb") as f:
        for body in bodies:
            f.write(records.pack(body))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    fsync_dir(final.parent)


def _read_file(path: Path) -> list[records.Record] | None:
    """The records of a file :func:`_write_file` wrote, if it is there whole (every
    byte a record, the last an ``end``); None if missing, damaged or cut short."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    recs, end = records.scan(data)
    if end != len(data) or not recs or recs[-1].body[0] != "end":
        return None
    return recs


class _Cursor:
    """A range as of the cursor's opening, read from the multiversion index chunk by
    chunk while writes go on (no copy: the versions it needs are kept until it closes)."""

    def __init__(self, engine: LogEngine, ranges: RangeSet) -> None:
        self._engine = engine
        self._index: LogIndex | None = engine._data
        self._ranges = list(ranges)
        self._lsn = engine._data.open(id(self))
        self._after: Any = None

    def next_chunk(self, max_bytes: int) -> Any | None:
        index = self._index
        if index is None:
            return None
        out: list[Any] = []
        size = 0
        while self._ranges and (not out or size < max_bytes):
            lo, hi = self._ranges[0]
            for slot in index.slots_from(lo, hi, self._after):
                self._after = slot
                got = index.at(slot, self._lsn)
                if got is not None:
                    key, ptr = got
                    out.append((slot, (key, index.value(ptr))))
                    size += 64 + ptr[2]
                    if size >= max_bytes:
                        break
            else:
                self._ranges.pop(0)
                self._after = None
        if not out:
            self.close()
            return None
        return out

    def close(self) -> None:
        if self._index is not None:
            self._index.close(id(self))
            self._index = None
