"""The log repository (seed 004, 3.2.4): append-only segment files in one directory.

Records are appended to the newest segment through a buffer that one :meth:`Log.commit`
writes out and syncs: a *group commit*, one ``fdatasync`` per batch of deliveries, never
one per write.  A segment closes at ``segment_bytes`` and the next opens; old segments
are read (``pread``) and compacted away, never written again.  A record is addressed by
``(segment, offset, size)``: the pointer the multiversion index keeps (3.2.5).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Literal

from storage_adapters.log.records import HEADER, MAX_RECORD, Damaged, packer, unpack

Ptr = tuple[int, int, int]
"""``(segment number, offset, size)`` of a record."""
FsyncPolicy = Literal["always", "interval"]
NAME = "log-{:08d}.seg"


def segment_number(path: Path) -> int:
    return int(path.name[4:12])


def fsync_dir(path: Path) -> None:
    """Make a file's creation, rename or removal in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CorruptLog(OSError):
    """Acknowledged data on disk is damaged: this replica must be rebuilt from others
    (an ``OSError``: the disk failed this replica, as an I/O error would)."""


class Log:
    def __init__(self, path: Path, segment_bytes: int, fsync: FsyncPolicy, interval: float) -> None:
        if fsync not in ("always", "interval"):
            raise ValueError(f"fsync is 'always' or 'interval', not {fsync!r}")
        self.path = path
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self.interval = interval
        self._fds: dict[int, int] = {}
        self._buf = bytearray()
        self._pack = packer()
        self.active = 0
        self._written = 0  # bytes of the active segment handed to the OS
        self._synced_at = 0.0
        self.commit_mark: bytes | None = None
        """A record appended at the end of every commit that appended anything: a batch
        is in the log whole or not at all (recovery drops what follows the last mark)."""
        self.syncs = 0
        self.appended = 0
        """Bytes appended since the engine opened (what checkpoints are paced by)."""

    # ---------------------------------------------------------------- files
    def segments(self) -> list[int]:
        return sorted(segment_number(p) for p in self.path.glob("log-*.seg"))

    def file(self, n: int) -> Path:
        return self.path / NAME.format(n)

    def _fd(self, n: int) -> int:
        fd = self._fds.get(n)
        if fd is None:
            flags = os.O_RDWR | os.O_CREAT if n == self.active else os.O_RDONLY
            fd = self._fds[n] = os.open(self.file(n), flags, 0o600)
        return fd

    def open_active(self, n: int) -> None:
        """Append from now on to segment ``n`` (created if missing), at its end."""
        self.active = n
        fd = self._fds.pop(n, None)
        if fd is not None:
            os.close(fd)
        created = not self.file(n).exists()
        self._written = os.fstat(self._fd(n)).st_size
        if created:
            fsync_dir(self.path)

    def size(self, n: int) -> int:
        if n == self.active:
            return self._written + len(self._buf)
        return os.fstat(self._fd(n)).st_size

    # ---------------------------------------------------------------- writing
    def append(self, body: Any) -> Ptr:
        rec = self._pack(body)
        if len(rec) > MAX_RECORD:
            raise ValueError(f"a record of {len(rec):,} bytes")
        if self._written + len(self._buf) >= self.segment_bytes:
            self.rotate()
        off = self._written + len(self._buf)
        self._buf += rec
        self.appended += len(rec)
        return (self.active, off, len(rec))

    def abandon(self) -> None:
        """Drop what was appended and not yet handed to the OS (a failed batch; what
        was handed over has no commit mark after it, so a reopen cuts it)."""
        self._buf.clear()

    def flush(self) -> None:
        """Hand the buffer to the OS (no sync): readers can ``pread`` it."""
        if not self._buf:
            return
        fd = self._fd(self.active)
        view = memoryview(self._buf)
        done = 0
        while done < len(view):
            done += os.pwrite(fd, view[done:], self._written + done)
        self._written += done
        view.release()
        self._buf.clear()

    def commit(self, force: bool = False, mark: bool = True) -> None:
        """The group commit: everything appended is on disk when this returns (under
        ``always``), or within ``interval`` seconds of its append (under ``interval``);
        ``mark``: and ends a batch (a rotation in the middle of one does not)."""
        had = bool(self._buf)
        if had and mark and self.commit_mark is not None:
            self._buf += self.commit_mark
        self.flush()
        if not had and not force:
            return
        now = time.monotonic()
        if force or self.fsync == "always" or now - self._synced_at >= self.interval:
            os.fdatasync(self._fd(self.active))
            self._synced_at = now
            self.syncs += 1

    def rotate(self) -> None:
        """Close the active segment (synced) and open the next."""
        self.commit(force=True, mark=False)
        old = self.active
        os.close(self._fds.pop(old))
        self.open_active(old + 1)

    # ---------------------------------------------------------------- reading
    def read(self, ptr: Ptr) -> Any:
        """The body of the record at ``ptr``; :class:`CorruptLog` if it is damaged (a
        value read back wrong is never returned)."""
        n, off, size = ptr
        if n == self.active and off + size > self._written:
            self.flush()
        try:
            data = os.pread(self._fd(n), size, off)
        except FileNotFoundError:
            raise CorruptLog(f"segment {self.file(n).name} is missing") from None
        try:
            return unpack(data)
        except Damaged as e:
            raise CorruptLog(f"{self.file(n)} at offset {off}: {e}") from None

    def read_all(self, n: int) -> bytes:
        self.flush()
        with self.file(n).open("rb") as f:
            return f.read()

    def truncate(self, n: int, size: int) -> None:
        os.truncate(self.file(n), size)
        if n == self.active:
            self._written = size

    def remove(self, n: int) -> None:
        fd = self._fds.pop(n, None)
        if fd is not None:
            os.close(fd)
        self.file(n).unlink()

    def close(self) -> None:
        if self._fds:
            self.commit(force=True)
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def plausible_record_after(data: bytes, start: int, limit: int = 8 << 20) -> int | None:
    """The offset of the first intact record at or after ``start``, searching at most
    ``limit`` bytes (None: none there).  Tells a torn tail (nothing intact after the
    damage: a write the crash cut short, never acknowledged) from damage in the middle
    (intact records after it: acknowledged data lost)."""
    end = min(len(data), start + limit)
    for pos in range(start, end - HEADER.size + 1):
        length, _ = HEADER.unpack_from(data, pos)
        if pos + HEADER.size + length > len(data) or length == 0:
            continue
        try:
            unpack(memoryview(data)[pos : pos + HEADER.size + length])
        except Exception:
            continue
        return pos
    return None
