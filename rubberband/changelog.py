"""Change feeds: every write's changes at its position in the total order.

Every replica of a segment applies the same writes at the same positions (4.4), so
every replica can keep the same record of what changed, and a reader can continue at
any of them.  A storage process keeps a :class:`ChangeLog` of the changes its engine
reports (an engine that reports changes implements ``apply_logged``, see
:mod:`rubberband.engine`): for each position that changed something it holds, the keys
and their new values (``put``) or their removal (``delete``).

A feed is read with a *changes read*: a sequential read (its header names the ranges
and ``since``) that each holder answers, at the read's own position ``t``, with every
change it holds in those ranges at positions in ``(since, t)``.  Every write before ``t``
was delivered to the holder before the read (E-Cast delivers in order), so an answer
has no gap, and the client's next read continues from ``t``: a feed is a chain of reads,
each exact, and a read's failover (another replica, another router) is a feed's
failover.  Parts of one multi-key write held by several segments carry the write's one
position, and the client merges them into one event (:func:`merge`).

A holder answers only for what it holds in full since ``since``: a range it gained at
position ``K`` (a copy into it, or its first placement) has no changes before ``K``
here, and entries dropped by retention (a count and an age) are gone.  For a read from
before either it answers that the feed was compacted, naming the oldest position it can
still continue from, as etcd answers a watch from a compacted revision.

Beside the changes, a log keeps each key's *revision*, the position of its last change
(etcd's mod revision), for as long as the key stands: retention drops changes, not
revisions.  A read wrapped in :class:`Revisions` is answered with the revisions of the
keys it names, at the read's own position; a copy of a range carries its revisions
with its history.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Iterable, Sequence
from operator import itemgetter
from typing import Any, NamedTuple

import msgpack

from ecast.core import mutations
from rubberband.engine import ROWS, Event, changed_key
from rubberband.errors import BadKey, BadOperation, Compacted, Rejected
from rubberband.keys import (
    EVERYTHING,
    MAX_EKEY,
    MIN_EKEY,
    NOTHING,
    EKey,
    RangeSet,
    contains,
    difference,
    encode_key,
    overlaps,
    sort_key,
)
from rubberband.proto import Answer, H, Peek

COMPACTED = "compacted: continue from position "
"""How a holder's answer says a feed was compacted (the position follows)."""
NO_LOG = (
    "this storage process keeps no change log (its engine reports no changes, or it runs "
    "with --change-log 0)"
)
OUT_OF_ORDER = mutations.declare(
    "changes_out_of_order", "storage",
    "a write held back behind a copy is logged after later positions, not in order",
)  # fmt: skip
HISTORY_TWICE = mutations.declare(
    "history_twice", "storage",
    "a copy's history is merged with what the receiver logged of the same ranges",
)  # fmt: skip
FROM_NOW = -1
"""``since`` of a feed's first read when it starts at the read itself."""
MAX_CHANGES = 500_000
"""Changes a storage process keeps by default (each key changed counts one): about 40 s
of a holder's changes at the views benchmark's peak.  At 100,000 (about 9 s there) a
view's maintainer that fell behind the peak had its feed compacted under it, and each
start over from a snapshot (about 10 s) ended behind the log again, for as long as the
load lasted.  The price is memory: about 250 MB more a storage process there, a log
entry holding the value a write replaced (docs/decisions.md)."""
MAX_AGE = 600.0
"""Seconds a storage process keeps a change by default."""
TRIM_SLACK = 5
"""A log past a bound by ``bound >> TRIM_SLACK`` (a 32nd) is trimmed back to it."""
MAX_BYTES = 256 * 1024 * 1024
"""About how many bytes of changes a storage process keeps by default (estimated,
:func:`_size`): a table row's change holds its images, and 100,000 of a 22-column row
held 400 MB."""
_PLAIN = (int, str)
"""Row keys whose row change key is its own revisions' dict key (no bool among them)."""
REVISIONS_PART = 10_000
"""Revisions one part of a copy's history carries (a key and a position each)."""
PEEK_CHANGES = 256
"""Changes a peek (:class:`Changed`) tests at most before it answers True: a peek
costs what a few hundred tests cost even when other tables' writes fill the log (the
follower then reads in order, which moves its ``since`` on)."""
PAGE_CHANGES = 20_000
"""Key changes a holder puts in one answer at most: a feed read after a long pause (or a
Spark micro-batch over a backlog) is answered in pages, each well under the 16 MiB frame
limit for values of a few hundred bytes, never in one answer the connection refuses."""


class Changes(NamedTuple):
    """A changes read's operation (what travels as its payload): changes after position
    ``since`` (None: none, only the read's position) of the keys in ``[lo, hi)`` (None:
    unbounded)."""

    since: int | None
    lo: Any = None
    hi: Any = None


class Changed(NamedTuple):
    """A basic read's operation: has any key in ``[lo, hi)`` changed after position
    ``since``, as far as the replicas asked know?  A hint, not a page: the answer is
    True also where a replica cannot tell cheaply (its log starts after ``since``, or
    :data:`PEEK_CHANGES` others' changes lie after it).  An idle follower of a feed asks
    this of one replica a segment, straight, instead of putting a read in the total
    order every few milliseconds (each such read woke every router and holder), and
    reads the feed in order when the answer is True."""

    since: int
    lo: Any = None
    hi: Any = None


class Revisions(NamedTuple):
    """A read (sequential or snapshot) answered with the revisions of ``keys`` beside
    its result: ``(result, {key: position of its last change})``, a key that stands
    and has a known revision in the second (absent: no such key, or one written before
    any holder kept revisions of it)."""

    op: Any
    keys: tuple[Any, ...]


class Page(NamedTuple):
    """One changes read's answer: the events after its ``since``, and the position the
    next read continues after: the read's own position, or an earlier one where a
    holder's answer was cut (:data:`PAGE_CHANGES`), every event up to it included."""

    position: int
    events: list[Event]


def changes_ranges(op: Changes, ordered: bool) -> RangeSet:
    """The ranges (placement space) a changes read covers: the key range itself under
    range partitioning, everything under hash partitioning (the holders filter keys)."""
    if op.since is not None and (type(op.since) is not int or op.since < 0):
        raise BadOperation(f"since is a position (an int, 0 or more) or None, not {op.since!r}")
    lo = MIN_EKEY if op.lo is None else encode_key(op.lo)
    hi = MAX_EKEY if op.hi is None else encode_key(op.hi)
    if not lo < hi:
        raise BadOperation(f"a change feed of [{op.lo!r}, {op.hi!r}) follows no key")
    return ((lo, hi),) if ordered else EVERYTHING


def merge(pieces: Iterable[tuple[RangeSet, Any]], position: int, ekey: Any) -> Page:
    """The answers of a changes read's holders, one event per position: a write's
    changes in several segments come from several holders, each with its part.  Each
    answer counts only for the ranges it was taken for (``ekey`` places a key): two
    holders of one range both answer for it, and its changes are taken once.  A holder
    that cut its answer ends it with ``[t, None]``: it holds nothing more up to ``t``
    than it gave, and may hold more after, so the page ends at the earliest cut."""
    # (A maintainer merges pages of thousands of one-change events: each change's place
    # is found once, against one range without a bisection where the answer is for one,
    # and a lone change is not sorted.)
    by_t: dict[int, list[Any]] = {}
    for ranges, piece in pieces:
        lo, hi = ranges[0] if len(ranges) == 1 else (None, None)
        for t, changes in piece or ():
            if changes is None:
                position = min(position, int(t))
                continue
            if lo is not None:
                mine = [c for c in changes if lo <= ekey(c[0]) < hi]
            else:
                mine = [c for c in changes if contains(ranges, ekey(c[0]))]
            if mine:
                got = by_t.get(int(t))
                if got is None:
                    by_t[int(t)] = mine
                else:
                    got.extend(mine)
    events = []
    for t in sorted(by_t):
        if t > position:
            break
        cs = by_t[t]
        if len(cs) == 1:
            c = cs[0]
            events.append(Event(t, ((c[0], c[1], c[2]),)))
        else:
            ordered = sorted(((c[0], c[1], c[2]) for c in cs), key=lambda c: encode_key(c[0]))
            events.append(Event(t, tuple(ordered)))
    return Page(position, events)


def page(
    pieces: Iterable[tuple[RangeSet, Any]], position: Any, error: str | None, ekey: Any
) -> Page:
    """A changes read's result, or the error its answers carried (a compacted feed
    raises :class:`Compacted` naming where it can continue)."""
    if error is not None:
        if error.startswith(COMPACTED) and error[len(COMPACTED) :].isdigit():
            raise Compacted(int(error[len(COMPACTED) :]))
        raise Rejected(error)
    return merge(pieces, position, ekey)


class ChangeLog:
    """A storage process's changes, by position, within a retention window.

    Positions in a list (searched by bisection: a feed's page starts at its ``since``,
    not at the oldest change kept), the changes beside them; dropped entries are cut
    from the front in bulk.  A change is stored as the engine reported it, ``(key,
    kind, value)``: its place on the ring (``place``) is computed when a page or a copy
    asks, not on every write."""

    def __init__(
        self,
        max_changes: int = MAX_CHANGES,
        max_age: float = MAX_AGE,
        page: int = PAGE_CHANGES,
        max_bytes: int = MAX_BYTES,
    ) -> None:
        self.max_changes = max_changes
        self.max_age = max_age
        self.max_bytes = max_bytes
        self.page = page
        self.place: Callable[[Any], EKey] = encode_key
        """A key's place on the ring (the storage core sets its engine's placement)."""
        self._t: list[int] = []
        self._at: list[float] = []
        self._changes: list[tuple[tuple[Any, str, Any], ...]] = []
        self._sizes: list[int] = []
        """Each entry's estimated bytes (:func:`_size`)."""
        self._head = 0
        """Entries before this index are dropped (cut from the lists now and then)."""
        self._count = 0
        self._bytes = 0
        self.floor = -1
        """Changes at positions up to this one may be gone (retention)."""
        self._starts: list[tuple[RangeSet, int]] = []
        """Ranges this process holds changes of only after a position (gained there)."""
        self.recorded = 0
        self.revisions: dict[Any, Any] = {}
        """Each standing key's last change: a scalar key maps to its position, any other
        key's sort form to ``(key, position)`` (a bool and an int, ``True`` and ``1``,
        are one dict key but two Rubberband keys).  About 50 bytes a key of ints or
        strings: the key and the position are the objects the engine and the log hold."""

    @property
    def enabled(self) -> bool:
        return self.max_changes > 0

    def gained(self, ranges: RangeSet, t: int) -> None:
        """``ranges`` are ours from position ``t`` on: their earlier changes are not."""
        if ranges:
            self._starts = [*self._others(ranges), (ranges, t)]

    def _others(self, ranges: RangeSet) -> list[tuple[RangeSet, int]]:
        kept = []
        for held, start in self._starts:
            rest = difference(held, ranges)
            if rest:
                kept.append((rest, start))
        return kept

    def record(self, t: int, now: float, changes: Sequence[tuple[Any, str, Any]]) -> None:
        """The changes of the write at position ``t``: ``(key, kind, value)`` each, a
        key's last change at ``t`` only.  Usually after every position recorded; a write
        held back while its range was received runs after later writes to other ranges,
        and takes its place in position order (a read bisects by position)."""
        self._record_many([(t, changes)], now)

    def _record_many(self, entries: Sequence[tuple[int, Any]], now: float) -> None:
        """Entries ``(t, changes)`` each as :meth:`record` takes one, in their order.

        One older than the newest held (a write held back while its range was
        received, drained after later writes) waits outside the lists, and all of
        them are merged in at once: inserted one by one, each moved every newer
        entry, and a drain of thousands took seconds.  What they hold is what they
        would hold inserted one by one: each entry is counted as it comes, and the
        oldest entries dropped as then, a waiting one among them (a write held back
        for longer than the log keeps changes is dropped before it was ever merged)."""
        late: list[tuple[int, float, tuple[Any, ...], int]] = []  # by position
        ts, ats, logged, sizes = self._t, self._at, self._changes, self._sizes
        oldest = now - self.max_age
        recorded = False
        for t, changes in entries:
            if not changes:
                continue
            recorded = True
            if len(changes) > 1:
                # A key changed twice at one position (a bundle of writes, a key named
                # twice): its last change is what that position did to it.
                last = {_same(c[0]): c for c in changes}
                if len(last) < len(changes):
                    changes = _last_changes(changes)
            self._revise(t, changes)
            size = _size(changes)
            row = (t, now, tuple(changes), size)
            if not ts or ts[-1] < t or mutations.on(OUT_OF_ORDER):
                ts.append(t)
                ats.append(now)
                logged.append(row[2])
                sizes.append(size)
            else:
                insort(late, row, key=_first)  # (after the waiting at its position)
            self._count += len(changes)
            self._bytes += size
            self.recorded += len(changes)
            while True:  # trim's loop, with the waiting entries where they would be
                head = self._head
                first = bool(late) and (head >= len(ts) or late[0][0] < ts[head])
                over = self._count > self.max_changes or self._bytes > self.max_bytes
                # (a waiting entry at the head is as young as this batch: not too old)
                if not over and (first or head >= len(ts) or not ats[head] < oldest):
                    break
                if first:  # the oldest entry is a waiting one: it goes, never merged
                    gone = late.pop(0)
                    self._count -= len(gone[2])
                    self._bytes -= gone[3]
                    self.floor = gone[0]
                    continue
                if head >= len(ts):
                    break
                self._count -= len(logged[head])
                self._bytes -= sizes[head]
                self.floor = ts[head]
                self._head = head + 1
        if late:
            self._merge(late)
        if recorded:  # (the dropped front cut in bulk; nothing recorded, nothing trimmed)
            self.trim(now)

    def _merge(self, rows: list[tuple[int, float, tuple[Any, ...], int]]) -> None:
        """Rows older than the newest held, sorted by position, into the lists: each
        after those held at its position (as ``bisect_right`` puts one)."""
        ts = self._t
        i = bisect_right(ts, rows[0][0], self._head)
        # Two runs sorted by position: one merge, in C (stable: a held entry stays
        # before a waiting one at the same position).
        held = zip(ts[i:], self._at[i:], self._changes[i:], self._sizes[i:], strict=True)
        merged = sorted([*held, *rows], key=_first)
        columns = (ts, self._at, self._changes, self._sizes)
        for column, values in zip(columns, zip(*merged, strict=True), strict=True):
            del column[i:]
            column += values

    def _revise(self, t: int, changes: Iterable[Sequence[Any]]) -> None:
        """Each changed key's revision is ``t`` now (a delete: it has none); a key's
        changes come in position order, an older one never overrides."""
        revisions = self.revisions
        for key, kind, _ in changes:
            ident = _revision_ident(key)
            entry = t if ident is key and type(key) is not tuple else (key, t)
            old = revisions.get(ident)
            if old is not None and (old if type(old) is int else old[1]) > t:
                continue
            if kind == "delete":
                revisions.pop(ident, None)
            else:
                revisions[ident] = entry

    def _revisions_in(self, ranges: RangeSet) -> list[tuple[Any, Any, int]]:
        """``(ident, key, position)`` of every revision of a key in ``ranges``: a walk
        of every key held (a copy's start, a reconfiguration's pace)."""
        place = self.place
        out = []
        for ident, entry in self.revisions.items():
            key, t = (ident, entry) if type(entry) is int else entry
            if contains(ranges, place(key)):
                out.append((ident, key, t))
        return out

    def revisions_of(self, keys: Iterable[Any], ranges: RangeSet) -> list[list[Any]]:
        """``[key, position]`` of each of ``keys`` in ``ranges`` that has a revision."""
        out = []
        place, revisions = self.place, self.revisions
        for key in keys:
            entry = revisions.get(_revision_ident(key))
            t = entry if entry is None or type(entry) is int else entry[1]
            if t is not None and contains(ranges, place(key)):
                out.append([key, t])
        return out

    def record_all(self, changed: Sequence[tuple[int, Any]], now: float) -> None:
        """An engine batch's changes, ``(t, ((key, kind, value), ...))`` in ``t`` order:
        one entry per position (a bundle of writes is one message, one position).

        A position past every one held that changed one integer or string key (most
        writes) is logged here, written out as :meth:`record` logs it: its calls were
        a sixth of a storage process's work on a write."""
        ts, ats, logged, sizes = self._t, self._at, self._changes, self._sizes
        revisions = self.revisions
        n = len(changed)
        i = 0
        late: list[tuple[int, Any]] = []  # bundles, and positions older than the newest
        # Trimmed once a bound is passed by a 32nd (:data:`TRIM_SLACK`), down to the
        # bounds: trimmed at every change past them, a full log spent a third of its
        # recording on one trim call a change.  It never keeps less than it is told to.
        most_changes = self.max_changes + (self.max_changes >> TRIM_SLACK)
        most_bytes = self.max_bytes + (self.max_bytes >> TRIM_SLACK)
        oldest = now - self.max_age - self.max_age / (1 << TRIM_SLACK)
        while i < n:
            t, changes = changed[i]
            i += 1
            if i < n and changed[i][0] == t:  # several items at one position: a bundle
                entry = list(changes)
                while i < n and changed[i][0] == t:
                    entry += changed[i][1]
                    i += 1
                late.append((t, entry))
                continue
            if len(changes) != 1 or (ts and ts[-1] >= t):
                late.append((t, changes))
                continue
            if late:  # in the batch's order: a trim after them sees what it would
                self._record_many(late, now)
                late = []
                if ts and ts[-1] >= t:  # (a bundle among them came after this position)
                    late.append((t, changes))
                    continue
            key, kind, _ = change = changes[0]
            if type(key) is int or type(key) is str:  # its own revision entry: ``t``
                old = revisions.get(key)
                if old is None or (old if type(old) is int else old[1]) <= t:
                    if kind == "delete":
                        revisions.pop(key, None)
                    else:
                        revisions[key] = t
            else:
                self._revise(t, changes)
            size = _size(changes)
            ts.append(t)
            ats.append(now)
            logged.append(changes if type(changes) is tuple else (change,))
            sizes.append(size)
            self._count += 1
            self._bytes += size
            self.recorded += 1
            if self._count > most_changes or self._bytes > most_bytes or ats[self._head] < oldest:
                self.trim(now)
        if late:
            self._record_many(late, now)

    def changes_after(self, since: int, most: int) -> int:
        """How many changes the log holds after ``since``, counted until past ``most``:
        what a feed's page from there walks (every change of every position is tested
        against the reader's ranges, whoever's key it is).  The storage process judges
        by it whether the page is short enough to read on its event loop; a bulk write
        of 100,000 keys is one position and 100,000 changes."""
        n = 0
        changes = self._changes
        for i in range(bisect_right(self._t, since, self._head), len(self._t)):
            n += len(changes[i])
            if n > most:
                break
        return n

    def _live(self, since: int, upto: int) -> range:
        """Indices of the entries at positions in ``(since, upto)``."""
        lo = bisect_right(self._t, since, self._head)
        return range(lo, bisect_left(self._t, upto, lo))

    def _mine(self, i: int, ranges: RangeSet, keys: Any = None) -> list[list[Any]]:
        place = self.place
        return [
            [key, kind, value]
            for key, kind, value in self._changes[i]
            if contains(ranges, place(key))
            and (keys is None or keys[0] <= encode_key(changed_key(key)) < keys[1])
        ]

    def export(self, ranges: RangeSet, part_bytes: int) -> tuple[int, list[Any], list[Any]]:
        """Our changes of ``ranges`` for a copy of them (every change we hold: a send
        opens at the keyspace message's position, after every earlier write), in parts
        of about ``part_bytes``, the position they are complete after, and the keys'
        revisions in parts of :data:`REVISIONS_PART`."""
        parts: list[Any] = []
        part: list[Any] = []
        size = 0
        for i in self._live(-2, 1 << 62):
            mine = self._mine(i, ranges)
            if not mine:
                continue
            part.append([self._t[i], mine])
            size += len(msgpack.packb(mine, default=repr))
            if size >= part_bytes:
                parts.append(tuple(part))
                part, size = [], 0
        parts.append(tuple(part))
        revised: list[Any] = []
        part, size = [], 0
        for _ident, key, t in self._revisions_in(ranges):
            part.append((key, t))
            size += 16 + (len(key) if type(key) in (str, bytes) else len(repr(key)))
            if len(part) >= REVISIONS_PART or size >= part_bytes:
                revised.append(tuple(part))
                part, size = [], 0
        if part:
            revised.append(tuple(part))
        return self.held_after(ranges), parts, revised

    def adopt(
        self,
        ranges: RangeSet,
        after: Any,
        entries: list[Any],
        upto: int,
        revised: Any = (),
        *,
        now: float,
    ) -> None:
        """A copy's history from its source: our changes of ``ranges`` are complete
        after ``after`` now, not only after the keyspace message that gave them to us.
        The copy is the source's data as of that message's position ``upto``: up to it
        the source's history of ``ranges`` replaces whatever we logged of them (a
        repair copies a range we held incomplete, and what we logged of it then
        repeats, or contradicts, the source's); after it, our own log is the history
        (we applied every later write).  Malformed, it is not taken (the ranges stay
        as they were: a feed from before them is told it was compacted, never given
        a gap).  ``revised``: the source's revisions of the keys in ``ranges`` as of
        ``upto``; ours after it are the changes we logged since.  All are kept as of
        ``now``, when the copy came: the newest change's time of an empty log was 0."""
        try:
            adopted = [
                (int(t), tuple((c[0], _kind(c[1]), c[2]) for c in changes))
                for t, changes in entries
            ]
            after = int(after)
            revised = [(key, int(t)) for key, t in revised if int(t) <= upto]
            for key, _ in revised:
                sort_key(key)  # a key, or the whole history is refused
        except Exception:
            return
        adopted = [e for e in adopted if max(after, self.floor) < e[0] <= upto]
        self._starts = [*self._others(ranges), (ranges, after)]
        live = range(self._head, len(self._t))
        mine = []
        place = self.place
        for i in live:
            t, changes = self._t[i], self._changes[i]
            if t <= upto and not mutations.on(HISTORY_TWICE):
                kept = tuple(c for c in changes if not contains(ranges, place(c[0])))
                self._count -= len(changes) - len(kept)
                if not kept:
                    continue
                changes = kept
            mine.append((t, self._at[i], changes))
        merged = sorted([*mine, *((t, now, c) for t, c in adopted)], key=_position)
        self._t = [e[0] for e in merged]
        self._at = [e[1] for e in merged]
        self._changes = [e[2] for e in merged]
        self._sizes = [_size(c) for c in self._changes]
        self._bytes = sum(self._sizes)
        self._head = 0
        self._count += sum(len(c) for _, c in adopted)
        self._adopt_revisions(ranges, revised, upto)
        self.trim(now)

    def forget(self, ranges: RangeSet) -> None:
        """``ranges`` are no longer ours (their data was deleted here): their keys'
        revisions go (their changes stay until retention drops them, answered only for
        what we hold)."""
        for ident, _key, _t in self._revisions_in(ranges):
            del self.revisions[ident]

    def _adopt_revisions(self, ranges: RangeSet, revised: list[tuple[Any, int]], upto: int) -> None:
        self.forget(ranges)
        for key, t in revised:
            if contains(ranges, self.place(key)):
                self._revise(t, ((key, "put", None),))
        place = self.place
        for i in self._live(upto, 1 << 62):  # what we applied after the copy's position
            self._revise(self._t[i], [c for c in self._changes[i] if contains(ranges, place(c[0]))])

    def trim(self, now: float) -> None:
        head, n = self._head, len(self._t)
        at, changes, sizes, oldest = self._at, self._changes, self._sizes, now - self.max_age
        while head < n and (
            self._count > self.max_changes or self._bytes > self.max_bytes or at[head] < oldest
        ):
            self._count -= len(changes[head])
            self._bytes -= sizes[head]
            self.floor = self._t[head]
            head += 1
        if head > 1024 and head * 2 > n:  # cut the dropped front in bulk
            del self._t[:head], self._at[:head], self._changes[:head], self._sizes[:head]
            head = 0
        self._head = head

    def held_after(self, ranges: RangeSet) -> int:
        """The position after which every change of ``ranges`` is here."""
        after = self.floor
        for held, start in self._starts:
            if start > after and overlaps(held, ranges):
                after = start
        return after

    def read(self, since: int, ranges: RangeSet, upto: int, keys: Any = None) -> Any:
        """The changes in ``ranges`` at positions in ``(since, upto)``, as
        ``[[t, [[key, kind, value], ...]], ...]``; or the error naming where to continue
        from, if some of them may be gone.  ``keys``: an encoded key range to filter by
        (hash partitioning).  Past :attr:`page` changes the answer is cut after a whole
        position ``t`` and ends with ``[t, None]`` (:func:`merge`)."""
        if since == FROM_NOW:
            return []
        after = self.held_after(ranges)
        if since < after:
            return COMPACTED + str(after)
        out: list[Any] = []
        room = self.page
        for i in self._live(since, upto):
            mine = self._mine(i, ranges, keys)
            if mine:
                if room <= 0:
                    out.append([out[-1][0], None])
                    break
                out.append([self._t[i], mine])
                room -= len(mine)
        return out

    def share_after(self, since: int, now: float) -> float:
        """About what share of its span this log holds after ``since`` (1: a reader
        there is next to be compacted under; inf: it was), by whichever bound is nearer:
        changes, bytes (each taken as the entries' mean: a bisection, not a walk), age."""
        n, i = len(self._t), bisect_right(self._t, since, self._head)
        if since < self.floor or not self.enabled:
            return math.inf
        if i == n:
            return 0.0
        full = max(self._count / self.max_changes, self._bytes / self.max_bytes)
        return max((n - i) / (n - self._head) * full, (now - self._at[i]) / self.max_age)

    def changed_after(self, since: int, ranges: RangeSet, keys: Any = None) -> bool:
        """Has a key in ``ranges`` (and in the encoded key range ``keys``, if any) a
        change here after ``since``, or can this log not tell (some may be gone, or were
        made before the ranges came here, or past :data:`PEEK_CHANGES` are to test)?"""
        if since < self.held_after(ranges):
            return True
        place, room = self.place, PEEK_CHANGES
        changes = self._changes
        for i in range(bisect_right(self._t, since, self._head), len(self._t)):
            for key, _kind, _value in changes[i]:
                if contains(ranges, place(key)) and (
                    keys is None or keys[0] <= encode_key(changed_key(key)) < keys[1]
                ):
                    return True
                room -= 1
                if room <= 0:
                    return True
        return False

    def figures(self) -> dict[str, int]:
        return {"changes": self._count, "bytes": self._bytes, "floor": self.floor,
                "recorded": self.recorded}  # fmt: skip


def feed_answer(
    log: ChangeLog | None, incomplete: bool, m: Any, mine: RangeSet, t: int
) -> tuple[RangeSet, Any, str | None]:
    """A holder's answer to changes read ``m`` at position ``t``: what it covers, the
    changes, or an error.  A holder with gaps (an aborted copy) answers for nothing."""
    if log is None:
        return mine, None, NO_LOG
    since = m.header.get(H.SINCE)
    if incomplete:
        return NOTHING, None, None
    if type(since) is not int:
        return mine, None, "since is a position"
    found = log.read(since, mine, t, key_filter(m.payload))
    if type(found) is str:
        return mine, None, found
    return mine, found, None


def peek_answer(log: ChangeLog | None, msg: Peek, mine: RangeSet, version: int) -> Answer:
    """A holder's answer to a peek (:class:`Changed`) for ``mine``, the ranges it holds
    in full: True where a change of them is logged after ``msg.since`` or ``log``
    cannot tell (None: no log kept); an error for a malformed peek."""
    keys, since = msg.keys, msg.since
    ok = keys is None or (type(keys) in (list, tuple) and len(keys) == 2)
    if not ok or type(since) is not int or since < 0:
        return Answer(msg.request, NOTHING, None, "malformed peek", version, True)
    try:
        changed = log is None or log.changed_after(since, mine, keys)
    except TypeError:  # bounds of another type than the ring's keys
        return Answer(msg.request, NOTHING, None, "malformed peek", version, True)
    return Answer(msg.request, mine, changed, None, version, True)


def _revision_ident(key: Any) -> Any:
    """A key's entry in :attr:`ChangeLog.revisions`: a scalar (not a bool) or a table
    row's change key of an int or str row key is its own, any other key its sort form
    (a bool and an int, ``True`` and ``1``, are one dict key but two Rubberband keys)."""
    kt = type(key)
    if kt is int or kt is str or kt is bytes or kt is float:
        return key
    if kt is tuple and len(key) == 3 and key[0] == ROWS and type(key[2]) in _PLAIN:
        return key
    return sort_key(key)


def _same(key: Any) -> Any:
    """What two changes share when they change one key: ``True`` and ``1`` are two
    keys (and ``(True,)`` and ``(1,)``), ``1`` and ``1.0`` one."""
    return sort_key(key) if type(key) is tuple else (type(key) is bool, key)


def _size(changes: Iterable[Sequence[Any]]) -> int:
    """About the bytes ``changes`` hold in memory: cheap (no walk below a row's images),
    close enough to bound the log.  A key-value change of an int about 100; a table
    row's change with both 22-column images about 3,000."""
    n = 0
    for change in changes:
        value = change[2]
        t = type(value)
        if t is str or t is bytes:
            n += 100 + len(value)
        elif t is dict:
            n += 100 + 64 * len(value)
            for v in value.values():  # a row's images: one level down
                if type(v) is dict:
                    n += 100 + 64 * len(v)
        elif t is list or t is tuple:
            n += 100 + 48 * len(value)
        else:
            n += 100
    return n


_first = itemgetter(0)


def _last_changes(changes: Sequence[tuple[Any, str, Any]]) -> list[tuple[Any, str, Any]]:
    """Each key's last change, in first-seen order; a table row's keeps the first
    change's before image (the row before the position, not between its writes)."""
    last: dict[Any, tuple[Any, str, Any]] = {}
    for c in changes:
        k = _same(c[0])
        prev = last.get(k)
        if (
            prev is not None
            and changed_key(c[0]) is not c[0]
            and type(c[2]) is dict
            and type(prev[2]) is dict
        ):
            c = (c[0], c[1], {**c[2], "before": prev[2].get("before")})
        last[k] = c
    return list(last.values())


def revised_op(payload: Any, logged: bool) -> Any:
    """The read op of a :class:`Revisions` read's payload ``(op, keys)``, or the error
    it is answered with."""
    if not logged:
        return NO_LOG
    if not isinstance(payload, tuple) or len(payload) != 2 or type(payload[1]) is not tuple:
        return "a revisions read is (op, keys)"
    try:
        for key in payload[1]:
            sort_key(key)
    except BadKey as e:
        return f"a revisions read names a bad key: {e}"
    return payload[0]


def _kind(kind: Any) -> str:
    if kind not in ("put", "delete"):
        raise ValueError(f"no change is a {kind!r}")
    return str(kind)


def _position(entry: tuple[int, Any, Any]) -> int:
    return entry[0]


def key_filter(op: Any) -> Any:
    """A changes read's key range, encoded, from its payload (None: no filter)."""
    if type(op) not in (list, tuple) or len(op) != 3 or (op[1] is None and op[2] is None):
        return None
    lo = MIN_EKEY if op[1] is None else encode_key(op[1])
    hi = MAX_EKEY if op[2] is None else encode_key(op[2])
    return (lo, hi)


__all__ = ["COMPACTED", "ChangeLog", "Changed", "Changes", "Event", "Page", "Revisions",
           "changes_ranges", "key_filter", "merge", "page", "peek_answer",
           "revised_op"]  # fmt: skip
