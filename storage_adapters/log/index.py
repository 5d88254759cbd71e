"""The in-memory multiversion index over the log (seed 004, 3.2.5).

Each live key maps to its newest version: ``[key, lsn, segment, offset, size]``, where
``lsn`` numbers this engine's writes in log order.  Values stay in the log and are read
back by pointer (``pread``, checksum checked), through a small read buffer of recent
values (3.2.6's read buffer).  A delete removes the key from the index and appends a
tombstone, so that redo from a checkpoint removes it again (3.2.6, *Delete*).

Older versions are kept only while a send cursor may still ask for them: a cursor is
opened at an LSN and reads, for each key, the version that was newest at that LSN.
Every superseded version that some open cursor can see moves to ``old``; when the
last cursor that could see it closes, it is dropped.  So the oldest LSN any cursor
holds is the explicit point compaction may not cut behind (:attr:`LogIndex.cut`).

The index quacks like the ordered map :class:`~storage_adapters.memory.MemoryEngine`
keeps its items in (``get``, ``[]``, assignment, ``pop``, ``irange``...): the engine
reuses every key-value operation of the memory engine unchanged, and only where items
live differs.
"""

from __future__ import annotations

import bisect
import heapq
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from sortedcontainers import SortedDict

from storage_adapters.leafmap import LeafMap
from storage_adapters.log.segments import Log, Ptr

PUT, DELETE, DROP, WHOLE, EPOCH, COMMIT, STORE = 0, 1, 2, 3, 4, 5, 6
"""Record kinds: ``[t, PUT, key, value]``, ``[t, DELETE, key]``, ``[t, DROP, ranges]``
(flat placement ranges, every key in them removed), ``[t, WHOLE, ((op, ranges), ...)]``
(every write of a message that reaches beyond this replica's ranges: what a restart
brings the other replicas level with), ``[-1, EPOCH, n]`` (positions start again: a
new E-Cast group after a restart of the whole cluster) and ``[-1, COMMIT]`` (the end of
a group commit: records after the last one are a batch the crash cut, dropped whole)
and ``[t, STORE, body]`` (a change of a store logged beside the key-value data, whose
``body`` only that store reads: :class:`storage_adapters.log.LoggedStore`)."""
CACHE_ITEMS = 50_000
"""Values the read buffer holds (least recently used out)."""


class LogIndex:
    def __init__(self, log: Log, slot_of: Any) -> None:
        self.log = log
        self.slot_of = slot_of
        self.live = LeafMap()
        self.old: SortedDict = SortedDict()
        """slot -> [(from lsn, until lsn, key, ptr | None), ...]: versions open cursors see."""
        self.cursors: dict[int, int] = {}
        """id -> the LSN an open cursor reads at."""
        self.lsn = 0
        self.t = 0
        """The position in the total order of the write being applied (records carry it)."""
        self.epoch = 0
        """The epoch of the positions (a new one at each restart of the whole cluster)."""
        self.live_bytes: dict[int, int] = {}
        """segment -> bytes of its records the index points at (what compaction keeps)."""
        self._cache: OrderedDict[tuple[int, int], Any] = OrderedDict()

    # ---------------------------------------------------------------- the map's face
    def __len__(self) -> int:
        return len(self.live)

    def __contains__(self, slot: Any) -> bool:
        return slot in self.live

    def get(self, slot: Any, default: Any = None) -> Any:
        e = self.live.get(slot)
        if e is None:
            return default
        return (e[0], self.value(e[2:]))

    def __getitem__(self, slot: Any) -> Any:
        e = self.live[slot]
        return (e[0], self.value(e[2:]))

    def __setitem__(self, slot: Any, item: tuple[Any, Any]) -> None:
        key, value = item
        ptr = self.log.append((self.t, PUT, key, value))
        self._cache_put(ptr, value)
        self.lsn += 1
        self.supersede(slot, [key, self.lsn, *ptr])

    def update(self, items: dict[Any, tuple[Any, Any]]) -> None:
        for slot, item in items.items():
            self[slot] = item

    def pop(self, slot: Any, default: Any = None) -> Any:
        e = self.live.get(slot)
        if e is None:
            return default
        self.log.append((self.t, DELETE, e[0]))
        self.lsn += 1
        self.supersede(slot, None)
        return e

    def __delitem__(self, slot: Any) -> None:
        if self.pop(slot) is None:
            raise KeyError(slot)

    def irange(self, lo: Any, hi: Any, inclusive: tuple[bool, bool] = (True, False)) -> Any:
        return self.live.irange(lo, hi, inclusive=inclusive)

    def ordered_values(self) -> list[tuple[Any, Any]]:
        return [(e[0], self.value(e[2:])) for e in self.live.ordered_values()]

    def clear(self) -> None:
        self.live.clear()
        self.old.clear()
        self._cache.clear()

    # ---------------------------------------------------------------- versions
    def drop(self, ranges: Any) -> int:
        """Remove every key in ``ranges`` (flat) with one record; how many were there."""
        self.log.append((self.t, DROP, [list(r) for r in ranges]))
        self.lsn += 1
        return self.forget(ranges)

    def forget(self, ranges: Any) -> int:
        """Every key in ``ranges`` (flat) absent from now on (no record: a drop's, or
        its redo); how many were there."""
        gone = [s for lo, hi in ranges for s in self.live.irange(lo, hi, inclusive=(True, False))]
        for slot in gone:
            self.supersede(slot, None)
        return len(gone)

    def supersede(self, slot: Any, entry: list[Any] | None) -> None:
        """``slot``'s newest version becomes ``entry`` (None: absent); the version it
        replaces is kept while a cursor may read it."""
        prev = self.live.get(slot)
        if entry is None:
            if prev is not None:
                del self.live[slot]
        else:
            if prev is not None:  # a key already there: its place in the order stands
                dict.__setitem__(self.live, slot, entry)
            else:
                self.live.add_new(slot, entry)
            self.live_bytes[entry[2]] = self.live_bytes.get(entry[2], 0) + entry[4]
        if prev is not None:
            self.live_bytes[prev[2]] -= prev[4]
            if self.cursors and max(self.cursors.values()) >= prev[1]:
                self.old.setdefault(slot, []).append((prev[1], self.lsn, prev[0], tuple(prev[2:])))

    def at(self, slot: Any, lsn: int) -> tuple[Any, Ptr] | None:
        """``(key, ptr)`` of the version of ``slot`` that was newest at ``lsn``."""
        e = self.live.get(slot)
        if e is not None and e[1] <= lsn:
            return e[0], tuple(e[2:])  # type: ignore[return-value]
        for since, until, key, ptr in self.old.get(slot, ()):
            if since <= lsn < until:
                return key, ptr
        return None

    @property
    def cut(self) -> int | None:
        """The oldest LSN an open cursor reads at (None: none open): versions newer than
        it stay readable, and no segment holding one may be compacted away."""
        return min(self.cursors.values()) if self.cursors else None

    def open(self, token: int) -> int:
        self.cursors[token] = self.lsn
        return self.lsn

    def close(self, token: int) -> None:
        if self.cursors.pop(token, None) is None:
            return
        if not self.cursors:
            self.old.clear()
            return
        seen = sorted(self.cursors.values())
        for slot in list(self.old):
            keep = [v for v in self.old[slot] if _seen(seen, v[0], v[1])]
            if keep:
                self.old[slot] = keep
            else:
                del self.old[slot]

    def slots_from(self, lo: Any, hi: Any, after: Any) -> Iterator[Any]:
        """Every slot in ``[lo, hi)`` past ``after`` (None: from ``lo``), live or old, in
        order, once."""
        if after is None:
            a = self.live.irange(lo, hi, inclusive=(True, False))
            b = self.old.irange(lo, hi, inclusive=(True, False))
        else:
            a = self.live.irange(after, hi, inclusive=(False, False))
            b = self.old.irange(after, hi, inclusive=(False, False))
        last = None
        for slot in heapq.merge(a, b):
            if slot != last:
                yield slot
                last = slot

    # ---------------------------------------------------------------- values
    def value(self, ptr: Any) -> Any:
        n, off = ptr[0], ptr[1]
        got = self._cache.get((n, off), _MISSING)
        if got is not _MISSING:
            self._cache.move_to_end((n, off))
            return got
        body = self.log.read((n, off, ptr[2]))
        self._cache_put((n, off, ptr[2]), body[3])
        return body[3]

    def _cache_put(self, ptr: Ptr, value: Any) -> None:
        cache = self._cache
        cache[(ptr[0], ptr[1])] = value
        if len(cache) > CACHE_ITEMS:
            cache.popitem(last=False)


_MISSING = object()


def _seen(cursors: list[int], since: int, until: int) -> bool:
    """Whether a cursor at some LSN in ``cursors`` (sorted) sees a version that held from
    ``since`` to ``until``."""
    i = bisect.bisect_left(cursors, since)
    return i < len(cursors) and cursors[i] < until
