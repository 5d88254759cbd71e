"""The keyspace: which storage process holds which keys (dissertation 4.2.2, 4.3, 4.4.1).

Storage processes sit on a ring ordered by their *ids* (encoded keys, see
:mod:`rubberband.keys`).  With ring positions ``0..n-1`` and replication factor ``f``
(*successor replication*, 4.2.2):

* the *primary segment* of position ``i`` is ``[id(i), id(i+1))``; the last one wraps
  through ``MAX``/``MIN``, so it is ``[id(n-1), MAX) | [MIN, id(0))``;
* the *partition* of position ``i`` is ``[id(i-f+1), id(i+1))`` (wrapping): its own primary
  segment and those of its ``f-1`` predecessors, so segment ``s`` is held by positions
  ``s, s+1, ..., s+f-1``: its *replication group*.  With ``n <= f`` every process holds
  everything, with ``n == 0`` nothing is held.

A :class:`Keyspace` is an immutable value: the transformations of the four keyspace
messages (4.4.1: ``expand``, ``contract``, ``replace``, ``rebalance``) return new ones and
refuse impossible requests with :class:`BadReconfiguration` before building anything.

Routing (Algorithm 12's ``destset``) runs once per message on every router, so it never
walks the ring: a :class:`Routing` holds per-segment tables built once for one keyspace
and one set of excluded (suspected, parted) and avoided (busy) processes; a point write is
one bisect and one tuple index.  A router keeps its ``Routing`` until the keyspace or
those sets change; :meth:`Keyspace.routing` caches a few.

Reads are ROWA reads (4.2.2): one holder per primary segment.  The holder is picked by
the read's *replica offset* (4.3), aligned across segments so that a range read is
answered by whole partitions: for segment ``s`` the holder at ring position
``q = s + ((offset - s) mod f)`` is taken, the one with ``q == offset (mod f)``.  A point
read therefore goes to each of its ``f`` holders for ``f`` consecutive offsets, and a read
of the whole keyspace is answered by about ``n/f`` processes (5.3), not by ``n``.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from typing import Any

from rubberband.keys import (
    EVERYTHING,
    MAX_EKEY,
    MIN_EKEY,
    NOTHING,
    EKey,
    RangeSet,
    decode_key,
    describe,
    is_ekey,
    normalize,
)

NO_PROCESSES: frozenset[str] = frozenset()
_VIEW_CACHE_SIZE = 16


class BadKeyspace(ValueError):
    """A keyspace that cannot exist (duplicate ids or names, a bad id, a malformed state)."""


class BadReconfiguration(BadKeyspace):
    """A keyspace transformation that is impossible on this keyspace; nothing was changed."""


class Unavailable(LookupError):
    """Part of a read has no holder left once excluded processes are skipped.

    ``uncovered`` is that part; ``partial`` the cover of the rest, for a caller that wants
    to say exactly what it could not read.
    """

    def __init__(self, uncovered: RangeSet, partial: dict[str, RangeSet]) -> None:
        super().__init__(f"no unexcluded holder for {describe(uncovered)}")
        self.uncovered = uncovered
        self.partial = partial


class Keyspace:
    """Replication factor ``f`` and the ring of active storage processes, ordered by id."""

    __slots__ = (
        "_hash",
        "_partitions",
        "_position",
        "_segments",
        "_views",
        "f",
        "ids",
        "processes",
    )

    def __init__(self, f: int, ring: Iterable[tuple[EKey, str]] = ()) -> None:
        if type(f) is not int or f < 1:
            raise BadKeyspace(f"the replication factor must be an integer >= 1, got {f!r}")
        pairs = list(ring)
        for entry in pairs:
            if type(entry) is not tuple or len(entry) != 2:
                raise BadKeyspace(f"a ring entry is an (id, name) pair, got {entry!r:.60}")
            ekey, name = entry
            if not is_ekey(ekey) or ekey == MAX_EKEY:
                raise BadKeyspace(f"process id {ekey!r:.60} is not an encoded key below MAX")
            if type(name) is not str or not name:
                raise BadKeyspace(f"process name {name!r:.60} is not a non-empty string")
        pairs.sort()
        ids = tuple(e for e, _ in pairs)
        names = tuple(p for _, p in pairs)
        if len(set(ids)) != len(ids):
            raise BadKeyspace("two processes share an id")
        if len(set(names)) != len(names):
            raise BadKeyspace("a process appears twice on the ring")
        self.f = f
        self.ids: tuple[EKey, ...] = ids
        """Ascending; ``ids[i]`` is the id of ``processes[i]``."""
        self.processes: tuple[str, ...] = names
        """Ring order (ascending id)."""
        self._position = {p: i for i, p in enumerate(names)}
        self._segments = tuple(self._segment(i) for i in range(len(ids)))
        self._partitions = {p: self._partition(i) for i, p in enumerate(names)}
        self._hash = hash((f, ids, names))
        self._views: dict[tuple[frozenset[str], frozenset[str]], Routing] = {}

    # ------------------------------------------------------------------ reading
    def __len__(self) -> int:
        return len(self.processes)

    def __contains__(self, process: object) -> bool:
        return process in self._position

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Keyspace):
            return NotImplemented
        return self.f == other.f and self.ids == other.ids and self.processes == other.processes

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        ring = ", ".join(f"{p}@{decode_key(e)!r}" for e, p in self.ring())
        return f"Keyspace(f={self.f}, [{ring}])"

    def ring(self) -> tuple[tuple[EKey, str], ...]:
        return tuple(zip(self.ids, self.processes, strict=True))

    @property
    def group_size(self) -> int:
        """How many processes hold each key: ``min(f, n)``."""
        return min(self.f, len(self.ids))

    @property
    def underreplicated(self) -> bool:
        """Fewer than ``f`` processes: keys have fewer than ``f`` replicas."""
        return len(self.ids) < self.f

    def position(self, process: str) -> int:
        try:
            return self._position[process]
        except KeyError:
            raise BadReconfiguration(f"{process!r} is not on the ring") from None

    def id_of(self, process: str) -> EKey:
        return self.ids[self.position(process)]

    def partition(self, process: str) -> RangeSet:
        """The keys ``process`` holds; nothing for a process that is not on the ring
        (standby, contracted, replaced): such a process holds no data."""
        return self._partitions.get(process, NOTHING)

    def segments(self) -> tuple[RangeSet, ...]:
        """Primary segments by ring position; they tile the keyspace exactly once."""
        return self._segments

    def holders_of_segment(self, i: int) -> tuple[str, ...]:
        """The replication group of segment ``i``: positions ``i, i+1, ...`` (``min(f, n)``
        of them), primary first.  Read rotation and the optimizer's groups use this order."""
        n = len(self.processes)
        if not 0 <= i < n:
            raise IndexError(f"segment {i} of a ring of {n}")
        return tuple(self.processes[(i + t) % n] for t in range(min(self.f, n)))

    def segment_of(self, ekey: EKey) -> int:
        """The ring position whose primary segment holds ``ekey`` (a non-empty ring)."""
        if not self.ids:
            raise LookupError("an empty keyspace has no segments")
        return (bisect_right(self.ids, ekey) - 1) % len(self.ids)

    # ------------------------------------------------------------------ routing
    def routing(
        self, exclude: frozenset[str] = NO_PROCESSES, avoid: frozenset[str] = NO_PROCESSES
    ) -> Routing:
        """The routing tables for this keyspace with ``exclude`` never chosen and ``avoid``
        chosen for reads only where no other holder is left.  Cached: the same sets give
        the same object."""
        key = (exclude, avoid)
        view = self._views.get(key)
        if view is None:
            if len(self._views) >= _VIEW_CACHE_SIZE:
                self._views.clear()
            view = self._views[key] = Routing(self, exclude, avoid)
        return view

    def write_set(self, ranges: RangeSet, exclude: frozenset[str] = NO_PROCESSES) -> frozenset[str]:
        return self.routing(exclude).write_set(ranges)

    def read_cover(
        self,
        ranges: RangeSet,
        offset: int,
        avoid: frozenset[str] = NO_PROCESSES,
        exclude: frozenset[str] = NO_PROCESSES,
    ) -> dict[str, RangeSet]:
        return self.routing(exclude, avoid).read_cover(ranges, offset)

    def overlapping(self, ranges: RangeSet) -> frozenset[str]:
        """Every process whose partition overlaps ``ranges`` (suspected ones included)."""
        return self.routing().write_set(ranges)

    # ------------------------------------------------------------------ transformations
    def expand(self, ekey: EKey, process: str) -> Keyspace:
        """A standby ``process`` becomes active at id ``ekey``."""
        if process in self._position:
            raise BadReconfiguration(f"{process!r} is already on the ring")
        self._check_free(ekey)
        return Keyspace(self.f, (*self.ring(), (ekey, process)))

    def contract(self, *processes: str) -> Keyspace:
        """``processes`` leave the ring, together: a range of one goes to its next
        successor that stays.  Always allowed by the algebra; a super should refuse
        when :meth:`would_underreplicate` (the last copies could be lost)."""
        gone = {self.position(p) for p in processes}
        return Keyspace(self.f, [r for i, r in enumerate(self.ring()) if i not in gone])

    def would_underreplicate(self, process: str) -> bool:
        """Whether contracting ``process`` leaves fewer than ``f`` processes."""
        self.position(process)
        return len(self.ids) - 1 < self.f

    def replace(self, old: str, new: str) -> Keyspace:
        """The standby ``new`` takes ``old``'s id; ``old`` leaves the ring."""
        i = self.position(old)
        if new in self._position:
            raise BadReconfiguration(f"{new!r} is already on the ring")
        ring = list(self.ring())
        ring[i] = (self.ids[i], new)
        return Keyspace(self.f, ring)

    def rebalance(self, process: str, ekey: EKey) -> Keyspace:
        """``process`` moves to id ``ekey`` without changing the cyclic ring order (4.4.1).

        Only the cyclic order decides who succeeds whom, so moving the first process past
        the last one (across ``MAX``/``MIN``) is allowed; passing any other process is not.
        """
        i = self.position(process)
        if ekey == self.ids[i]:
            return self
        self._check_free(ekey)
        ring = list(self.ring())
        ring[i] = (ekey, process)
        moved = Keyspace(self.f, ring)
        if not _same_cycle(self.processes, moved.processes):
            raise BadReconfiguration(
                f"moving {process!r} to {decode_key(ekey)!r} would pass another "
                "process; rebalance keeps the ring order (contract and expand instead)"
            )
        return moved

    def _check_free(self, ekey: EKey) -> None:
        if not is_ekey(ekey) or ekey == MAX_EKEY:
            raise BadReconfiguration(f"process id {ekey!r:.60} is not an encoded key below MAX")
        i = bisect_left(self.ids, ekey)
        if i < len(self.ids) and self.ids[i] == ekey:
            raise BadReconfiguration(
                f"id {decode_key(ekey)!r:.60} is taken by {self.processes[i]!r}: a new or "
                "moved process needs an id no process has"
            )

    # ------------------------------------------------------------------ state
    def to_state(self) -> tuple[Any, ...]:
        """``(f, ((id, name), ...))``: msgpack-able; ids stay tuples with ``use_list=False``."""
        return (self.f, self.ring())

    @classmethod
    def from_state(cls, state: Any) -> Keyspace:
        if not isinstance(state, tuple | list) or len(state) != 2:
            raise BadKeyspace("a keyspace state is (f, ring)")
        f, ring = state
        if not isinstance(ring, tuple | list) or not all(
            isinstance(entry, tuple | list) and len(entry) == 2 for entry in ring
        ):
            raise BadKeyspace("a keyspace ring is a sequence of (id, name) pairs")
        return cls(f, ((e, p) for e, p in ring))

    def describe(self) -> list[str]:
        """One line per process, for people: position, name, id bound, partition."""
        return [
            f"{i:>3} {p} id={decode_key(e)!r} holds {describe(self._partitions[p])}"
            for i, (e, p) in enumerate(self.ring())
        ]

    # ------------------------------------------------------------------ construction
    def _segment(self, i: int) -> RangeSet:
        ids = self.ids
        if i < len(ids) - 1:
            return ((ids[i], ids[i + 1]),)
        return normalize(((MIN_EKEY, ids[0]), (ids[i], MAX_EKEY)))

    def _partition(self, i: int) -> RangeSet:
        ids, n, f = self.ids, len(self.ids), self.f
        if n <= f:
            return EVERYTHING
        lo, hi = i - f + 1, i + 1
        if lo >= 0 and hi < n:
            return ((ids[lo], ids[hi]),)
        return normalize(((MIN_EKEY, ids[hi % n]), (ids[lo % n], MAX_EKEY)))


class Routing:
    """One keyspace's routing tables with excluded and avoided processes folded in.

    The keyspace is cut at its ids into *pieces* ``0..n``: piece ``k`` is
    ``[ids[k-1], ids[k])`` with ``MIN`` and ``MAX`` at the ends, so pieces ``0`` and ``n``
    are the two halves of the wrapping segment ``n-1``; piece ``k`` belongs to segment
    ``(k-1) mod n``.  ``bisect_right(ids, key)`` is the piece of ``key``.  Every table is
    indexed by piece, so routing does no modular arithmetic and no set arithmetic.
    """

    __slots__ = ("_everyone", "_ids", "_m", "_picks", "_uppers", "_wsets", "avoid", "exclude")

    def __init__(self, keyspace: Keyspace, exclude: frozenset[str], avoid: frozenset[str]) -> None:
        self.exclude = exclude
        self.avoid = avoid
        ids, n = keyspace.ids, len(keyspace.ids)
        self._ids = ids
        self._uppers: tuple[EKey, ...] = (*ids, MAX_EKEY)
        self._everyone = frozenset(keyspace.processes) - exclude
        if n == 0:
            self._m = 1
            self._wsets: tuple[frozenset[str], ...] = (NO_PROCESSES,)
            self._picks: tuple[tuple[str | None, ...], ...] = ((None,),)
            return
        m = keyspace.group_size
        groups = [keyspace.holders_of_segment(s) for s in range(n)]
        piece_segment = [(k - 1) % n for k in range(n + 1)]
        by_segment = [frozenset(g) - exclude for g in groups]
        self._wsets = tuple(by_segment[s] for s in piece_segment)
        self._m = m
        picks = []
        for r in range(m):
            chosen = [_pick(groups[s], (r - s) % m, exclude, avoid) for s in range(n)]
            picks.append(tuple(chosen[s] for s in piece_segment))
        self._picks = tuple(picks)

    def key_set(self, ekey: EKey) -> frozenset[str]:
        """:meth:`write_set` of the one key ``ekey`` (a write that names its key alone,
        most writes): the piece that holds it, by one bisection.  Exact because every
        id is an encoded key, and an encoded key above ``ekey`` is at or above
        ``after(ekey)``."""
        return self._wsets[bisect_right(self._ids, ekey)]

    def write_set(self, ranges: RangeSet) -> frozenset[str]:
        """Every unexcluded process whose partition overlaps ``ranges`` (ROWA writes)."""
        ids = self._ids
        if len(ranges) == 1:
            lo, hi = ranges[0]
            k = bisect_right(ids, lo)
            if hi <= self._uppers[k]:
                return self._wsets[k]
        wsets = self._wsets
        n = len(ids)
        out: set[str] = set()
        for lo, hi in ranges:
            k0 = bisect_right(ids, lo)
            k1 = bisect_left(ids, hi)
            if k1 - k0 >= n - 1:  # n consecutive pieces touch every segment
                return self._everyone
            for k in range(k0, k1 + 1):
                out |= wsets[k]
        return frozenset(out)

    def read_cover(self, ranges: RangeSet, offset: int) -> dict[str, RangeSet]:
        """One holder per primary segment that ``ranges`` touches, mapped to what it must
        answer (``ranges`` cut at segment bounds, adjacent parts merged).

        Deterministic in (keyspace, exclusions, ``ranges``, ``offset``).  Raises
        :class:`Unavailable` when some part has only excluded holders.
        """
        ids, uppers = self._ids, self._uppers
        picks = self._picks[offset % self._m]
        out: dict[str, list[tuple[EKey, EKey]]] = {}
        missing: list[tuple[EKey, EKey]] | None = None
        for lo, hi in ranges:
            k = bisect_right(ids, lo)
            last = bisect_left(ids, hi)
            a = lo
            while True:
                b = uppers[k] if k < last else hi
                p = picks[k]
                if p is None:
                    if missing is None:
                        missing = []
                    missing.append((a, b))
                else:
                    got = out.get(p)
                    if got is None:
                        out[p] = [(a, b)]
                    elif got[-1][1] == a:
                        got[-1] = (got[-1][0], b)
                    else:
                        got.append((a, b))
                if k >= last:
                    break
                a = b
                k += 1
        cover = {p: tuple(rs) for p, rs in out.items()}
        if missing is not None:
            raise Unavailable(normalize(missing), cover)
        return cover


def _pick(
    group: tuple[str, ...], start: int, exclude: frozenset[str], avoid: frozenset[str]
) -> str | None:
    """The read holder of one segment: ``group`` rotated to ``start``, the first holder
    that is neither excluded nor avoided, else the first that is not excluded."""
    m = len(group)
    fallback = None
    for t in range(m):
        p = group[(start + t) % m]
        if p in exclude:
            continue
        if p not in avoid:
            return p
        if fallback is None:
            fallback = p
    return fallback


def _same_cycle(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Whether ``b`` is a rotation of ``a`` (the same successor of every process)."""
    if len(a) != len(b):
        return False
    if not a:
        return True
    i = b.index(a[0])
    return b[i:] + b[:i] == a
