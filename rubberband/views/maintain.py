"""A view's maintainer, sans I/O: base changes in, version writes out.

The maintainer follows its sources' change feeds (:mod:`rubberband.changelog`), each a
chain of reads in the total order, and turns each base write into the view rows it
changes (:class:`~rubberband.views.compute.Rows`), written as versions stamped with that
write's position (:mod:`rubberband.versions`).  With each batch of rows it writes its
progress ``W``, the position up to which every base write is in the view, in the same
atomic write, so a reader that sees ``W >= t`` sees every row version up to ``t``: the
view as of any position ``t <= W`` is exact (seed 000's *complete* consistency: every
base state is reflected, in order), and a read at a position waits only until ``W``
reaches it.  Basic reads, which ask each segment's replica apart and so see no one
position, trust a second progress, written once the rows under it are stable.

Several sources (a join's two tables) are merged by position: each feed is complete up
to its last page's position, so changes up to the smallest of those are final, and a
write that changed both sources is one event.

A maintainer keeps nothing durable of its own.  It starts (and restarts) from a
snapshot of its sources, read in pages each at its own position, applied at those
positions and written as versions at the last of them, ``S``; every row it held before
and no longer does is written absent at ``S``, and the view's floor rises to ``S``
(positions before it are not readable: :class:`~rubberband.errors.Compacted`).
Version merging is idempotent, so a maintainer that restarts repeats nothing harmful,
and a stale one still running beside its replacement writes only versions the
replacement writes too.

A row that leaves the view keeps its chain, ending in its absence, until its maintainer
drops it (:mod:`rubberband.versions`, "Reclaiming"): once a progress ``W`` of its own,
with floor ``F``, is stable, it writes the view's reclaim floor ``U = min(F, W -
WINDOW)`` (:func:`~rubberband.views.define.reclaim_key`), and once that is stable, drops
the rows it wrote absent at ``U`` or before.  Its writes carry the oldest position among
those not yet known applied, so a storage process that refuses one as too old refuses
every later one too.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from ecast.core import mutations
from rubberband import versions
from rubberband.bundles import unpack_payload
from rubberband.changelog import Event
from rubberband.engine import Placed
from rubberband.keys import EKey, encode_key, with_point
from rubberband.messages import placed_ranges
from rubberband.views.compute import ABSENT, Rows, base_change, source_bounds, source_place
from rubberband.views.define import ViewDef, meta_key, progress_keys, reclaim_key, row_key

PROGRESS_WITH_ROWS = mutations.declare(
    "progress_with_rows", "views",
    "a view's stable progress is written in the same message as the rows under it",
)  # fmt: skip
QUIET = 1
"""A progress's mark (its fourth element): the maintainer's last pages had no change."""
QUIET_PAGES = 3
"""Pages in a row without a change, of every source, before a progress is marked
:data:`QUIET`: a lone empty page happens under writes too, and a reader past a marked
progress first peeks at the sources (``rubberband.views.reads.unchanged_since``),
which under load waits behind a storage process's deliveries."""
BATCH_KEYS = 500
"""Row versions per write message (a message stays small, tens of kilobytes; a batch of
a backfill that needs more is split, its progress written with the last part)."""
BATCH_BYTES = 4 << 20
"""Bytes of row values per write message, at most (about: one row beyond it): a
message must fit E-Cast's frame (16 MiB), and 500 rows of a projection of large base
values would not.  Refused at the call, a message would be caught before anything after
it is sent; refused once queued, it could leave a later message's progress without
its rows."""


RECLAIMS = 4 * BATCH_KEYS
"""Dead rows one page's writes drop at most (four messages of keys, about 19 KB each):
a view defined anew with a narrower selection leaves every old row dead at its start,
and a million of them would otherwise go out in one pipelined batch."""
ROW_BYTES = 1 << 20
"""A view row's value, encoded, at most: the key-value engines' limit on a value
(``storage_adapters.memory.MAX_VALUE_BYTES``), which refuses a write of a larger one at
the call.  A view that must write a larger row (a join of two large values, an
aggregate of many) stops at the progress before it (:attr:`Maintainer.stopped`)
instead of failing its group's every round."""


class RowTooLarge(Exception):
    """A row version over :data:`ROW_BYTES` (its reason, for the operator)."""


@dataclass
class Figures:
    """A maintainer's figures (its daemon's ``/metrics``): progress, and how fresh it is."""

    position: int = -1
    floor: int = 0
    rows: int = 0
    events: int = 0
    versions: int = 0
    reclaimed: int = 0
    """Rows that left the view, sent to be dropped (module docstring)."""
    dead_rows: int = 0
    """Rows that left the view and wait for the reclaim floor (:attr:`Maintainer.dead_rows`)."""
    starts: int = 0
    """Times it started from a snapshot (the first, and each start over)."""
    failures: int = 0
    compacted: int = 0
    """Failures that were its feed compacted under it (counted in ``failures`` too):
    the base's changes it had yet to read went out of a change log.  Storage processes
    hold their writers back so that this stays 0 (:mod:`rubberband.holds`)."""
    published_at: float = 0.0
    """When the last progress was written."""
    fresh_as_of: float = 0.0
    """When the pages that progress reflects were asked for: the view then was behind
    the base by at most the time since."""
    seen: int = -1
    """The newest position of the base the maintainer has read (its last page's): how
    far the view is behind, in positions, is ``seen - position``."""
    page_seconds: float = 0.0
    """Seconds between its last two feed pages: a round of its loop (a page read, its
    rows computed and written).  Rounds that grow with :attr:`page_changes` say the
    maintainer is falling behind: each longer round leaves more changes for the next
    page, whose read waits behind more rows where the machine has no core to spare."""
    page_changes: int = 0
    """Base changes its last feed page held."""
    page_at: float = 0.0
    """When its last feed page came (once :attr:`pages` says one did)."""
    pages: int = 0
    """Feed pages it has read: one a round of its loop.  Its rate against that of
    :attr:`events` is the changes a round takes in: a view's upkeep costs a round's
    fixed work (the read, the progress writes) besides each change's, and at a low
    write rate rounds come as fast as round trips allow."""
    stopped: str = ""
    """Why the view stopped, if it did (:attr:`Maintainer.stopped`, or the view it is
    over stopped): it is not kept until it (or that view) is defined anew or its
    maintainer restarts."""
    stopped_by: str = ""
    """The view whose row is over the limit: this one, or one it is over."""

    @property
    def halted(self) -> int:
        return 1 if self.stopped else 0


class Maintainer:
    """One view's maintenance.  Feed it :meth:`start` once, then :meth:`page` for each
    page of each source's feed; each returns the writes to make, in order (the last
    carries the progress: make it only after the others are stable)."""

    def __init__(self, view: ViewDef) -> None:
        self.view = view
        self.rows = Rows(view)
        n = 1 if view.over is not None else len(view.sources)
        self.since: list[int] = [0] * n
        """Per source: the position its feed has reached (the next page starts there)."""
        self.position = -1
        """``W``: every base write up to it is in the view (-1: not started)."""
        self.floor = 0
        self._pending: list[deque[Event]] = [deque() for _ in range(n)]
        self._empty = [0] * n  # per source: its last pages in a row without a change
        self._marks: deque[tuple[float, int]] = deque()  # (time, W) for the floor
        self._start = 0
        self._old: list[tuple[Any, bool]] = []  # (row key, absent already) at its start
        self.events = 0
        self.versions = 0
        self.emitted: list[Event] | None = None
        """Set to a list, it collects the view's own row changes, an event per base
        position (the input of the views defined over this one)."""
        self._part = view.part
        self._prefix = encode_key(row_key(view.name, 0))[1][:2]
        """The encoded elements a row key starts with (:meth:`_place`)."""
        self._splits = [encode_key(p) for p in view.parts]
        """A split view's unit keeps the rows of its part alone (it computes them all:
        a row's part is known only once its key is)."""
        self.stopped = ""
        """Why the view stopped, if it did: a row it must write is over
        :data:`ROW_BYTES`.  It writes nothing more: read as of its progress, it stays
        exact; the rows after it are never written in part."""
        self.written_floor = 0
        """The floor its last writes said (:attr:`floor` may have risen since)."""
        self.dead: deque[tuple[int, bytes]] = deque()
        """The rows it wrote absent, in position order, a group a write: ``(the
        group's highest position, its row keys packed)``.  They are kept until the
        reclaim floor passes them, a ``WINDOW`` of positions (minutes under load), and
        an index on a full table moves a row with most base writes: about 7 million dead
        rows at 15,000 writes a second.  As ``(position, key)`` pairs a dead row took 266
        bytes in three objects, each walked by the collector (nearly two gigabytes at that
        rate); packed, 17 bytes (``rubberband bench maintainer``'s keys)."""
        self.reclaimed = 0
        """Dead rows it has asked to drop."""
        self.dead_rows = 0
        """Rows it wrote absent and has not asked to drop yet (those in :attr:`dead`).
        Each stays meanwhile at every replica of its segment, as its version chain ending
        in the absence: its old value and all (about 1,100 bytes in the memory engine for a
        row of one small field), so on a full table an index whose rows move holds
        gigabytes of them at each replica under a sustained load (docs/views.md).  An
        operator reads it as ``rubberband_view_dead_rows``."""
        self.housekeeping = 0
        """How many of its last writes (the first ones) are drops and its reclaim floor:
        a few bytes each, not rows (a maintainer's pipeline counts rows' messages)."""
        self._sent: deque[tuple[int, int]] = deque()  # (W, low) of writes not yet applied
        self._upto = -1  # the reclaim floor written and stable: dead rows at or below go
        self._want = -1  # the reclaim floor its stable progress allows
        self._floor_sent: tuple[int, int] | None = None  # (U, W) of its write not yet applied

    # ------------------------------------------------------------------ inputs
    def start(
        self,
        old_rows: Sequence[tuple[Any, Any]],
        snapshots: Sequence[Sequence[tuple[Any, int]]],
        now: float,
        fed: Sequence[tuple[int, Sequence[Event]] | None] = (),
    ) -> list[Any]:
        """``old_rows``: the view's rows as they are (``(row key, chain)``): rebuilt
        anew, and those no longer there written absent; ``snapshots``: per source, its
        pages in key order, each ``(rows, position)`` of a sequential scan with a limit
        that starts after the last page's last key (the whole source in one page when
        it fits).  Each page is exact as of its own position; the feed is followed from
        the first one's, and a change carries a key's whole new value, so the pages
        and the changes applied in position order give every key its value at the last
        page's position (a change before its key's page is repeated by the page).  The
        view starts at the last page's position, once every source's feed has reached
        it.  ``fed``: per source, its feed as read meanwhile (where to, and its events)
        or None: its events after the first page's position join the pages in position
        order, and the feed goes on from where it was read to."""
        self._start = start = max(position for pages in snapshots for _rows, position in pages)
        meta = meta_key(self.view.name)
        self._old = [(k, versions.dead_by(chain, start)) for k, chain in old_rows if k != meta]
        for side, pages in enumerate(snapshots):
            self.since[side] = first = pages[0][1]
            events = [Event(position, tuple((k, "put", v) for k, v in rows))
                      for rows, position in pages]  # fmt: skip
            got = fed[side] if side < len(fed) else None
            if got is not None and got[0] > first:
                events += [e for e in got[1] if e.position > first]
                events.sort(key=lambda e: e.position)
                self.since[side] = got[0]
            self._pending[side].extend(events)
        return self._advance(now)

    def page(self, side: int, position: int, events: Sequence[Event], now: float) -> list[Any]:
        """A page of source ``side``'s feed: its ``events`` before ``position``."""
        if position <= self.since[side] or self.stopped:
            return []
        self.since[side] = position
        self._pending[side].extend(events)
        self._empty[side] = 0 if events else self._empty[side] + 1
        return self._advance(now)

    def published(self, position: int, floor: int) -> None:
        """Its progress ``position`` with ``floor`` is stable: every write it made up to
        there was applied.  Moves the dead rows it may drop (module docstring)."""
        while self._sent and self._sent[0][0] <= position:
            self._sent.popleft()
        if self._floor_sent is not None and self._floor_sent[1] <= position:
            self._upto = max(self._upto, self._floor_sent[0])
            self._floor_sent = None
        self._want = max(self._want, min(floor, position - versions.WINDOW))

    def draining(self, head: int) -> bool:
        """Must its writes in flight be waited for before it writes more?  Each write
        names the oldest position of every write before it not yet known applied, and
        under steady load some always is: so that position would stay where it was
        until the window refused them all.  Waited for once it is a quarter window
        behind this maintainer and half a window behind ``head`` (the newest position
        its group knows, where its writes are delivered), it starts afresh."""
        if not self._sent:
            return False
        low = self._sent[-1][1]
        return self.position - low > versions.WINDOW >> 2 and head - low > versions.WINDOW >> 1

    # ------------------------------------------------------------------ internals
    def _advance(self, now: float) -> list[Any]:
        if self.stopped:
            return []
        written = self.position
        emitted = len(self.emitted) if self.emitted is not None else 0
        horizon = min(self.since)
        entries: list[tuple[Any, list[Any]]] = []
        places: list[EKey] = []  # each entry's row key, encoded
        if self.position < 0:
            start = self._start
            if horizon < start:
                return []
            self._pending_up_to(start, [])  # the state at the start: written whole, below
            name = self.view.name
            for ek, (k, v) in self.rows.rows.items():
                if self._mine(ek):
                    entries.append((row_key(name, k), [start, v]))
                    places.append(self._place(ek))
            there = set(places)
            gone: list[Any] = []
            for key, dead in self._old:
                place = encode_key(key)
                if place in there:
                    continue
                if dead:
                    # Absent already (its chain ends in an absence: a row that left the
                    # view under an earlier maintainer, which started over before it
                    # dropped it): no reader at the start or after can see it, written
                    # absent again or not.  It is only to be dropped, in its turn, as
                    # if written absent at the start.  Under a sustained load an index
                    # on a full table held hundreds of thousands of such rows, and a
                    # start that wrote each of them again (three replicas apiece) took
                    # half a minute, after which its feed was compacted under it again.
                    gone.append(key)
                else:
                    entries.append((key, [start]))
                    places.append(place)
            if gone:
                self._bury(start, gone)
            self.position = self.floor = start
            self._marks.append((now, start))
        if horizon > self.position:
            entries += self._pending_up_to(horizon, places)
            self.position = horizon
        elif not entries:
            return []
        dead = [(entry[0], key) for key, entry in entries if len(entry) == 1]
        if dead:
            self._bury(max(at for at, _key in dead), [k for _, k in dead])
        try:
            writes = self._writes(entries, places)
        except RowTooLarge as e:
            at = f"at position {written}" if written >= 0 else "before its start"
            self.stopped = f"view {self.view.name!r} stopped {at}: {e}"
            self.position = written  # what the view says: nothing after it is written
            if self.emitted is not None:  # nor do the views over it see those rows
                del self.emitted[emitted:]
            return []
        self._mark(now)
        self.versions += len(entries)
        return writes

    def _pending_up_to(self, horizon: int, places: list[EKey]) -> list[tuple[Any, list[Any]]]:
        """Apply every pending event at or before ``horizon``, in position order; the
        row versions they make (their row keys, encoded, appended to ``places``)."""
        name = self.view.name
        ready: dict[int, list[tuple[int, Event]]] = {}
        for side, q in enumerate(self._pending):
            while q and q[0].position <= horizon:
                e = q.popleft()
                ready.setdefault(e.position, []).append((side, e))
        out: list[tuple[Any, list[Any]]] = []
        view, change = self.view, self.rows.change
        bounds = [source_bounds(view, side) for side in range(len(self._pending))]
        for position in sorted(ready):
            changed: dict[EKey, tuple[Any, Any]] = {}
            for side, event in ready[position]:
                for key, how, value in event.changes:
                    ek = source_place(view, side, key, bounds[side])
                    if ek is not None:
                        changed.update(change(side, *base_change(view, side, key, how, value), ek))
            self.events += 1
            if self.emitted is not None and changed:
                self.emitted.append(Event(position, tuple(
                    (k, "delete", None) if v is ABSENT else (k, "put", v)
                    for k, v in changed.values()
                )))  # fmt: skip
            for ek, (k, v) in changed.items():
                if self._mine(ek):
                    out.append((row_key(name, k), [position] if v is ABSENT else [position, v]))
                    places.append(self._place(ek))
        return out

    def _place(self, ek: EKey) -> EKey:
        """The encoded form of the row key of a row :class:`Rows` keeps under ``ek``:
        its key encoded as it sits in the row key (``compute._row_form``), so composed."""
        return (5, (*self._prefix, ek))

    def _mine(self, ek: EKey) -> bool:
        """Is the row kept under ``ek`` in this unit's part?"""
        return self._part is None or bisect_right(self._splits, ek) == self._part

    def _mark(self, now: float) -> None:
        marks = self._marks
        marks.append((now, self.position))
        cut = now - self.view.retention
        while len(marks) > 1 and marks[1][0] <= cut:
            marks.popleft()
        if marks[0][0] <= cut:
            self.floor = max(self.floor, marks[0][1])

    def _writes(self, entries: list[tuple[Any, list[Any]]], places: list[EKey]) -> list[Any]:
        """Version writes of ``entries`` (:class:`~rubberband.engine.Placed` by
        ``places``, their keys encoded), then the progress alone (both keys): made once
        the rows are stable, a basic read that sees it sees the rows at any replica.
        :meth:`in_order` makes the ordered progress sooner."""
        floor = self.floor
        # The progress says where this maintainer started: a row version below it was
        # written by another one (a stale maintainer behind it, perhaps after this one
        # read the view's old rows) and is no part of this one's view, which wrote every
        # row it holds at its start (:func:`rubberband.views.reads.progress_of`).
        said: list[Any] = [floor, self._start]
        if self._part is not None:  # the split points the part is of: readers check them
            said.append(list(self.view.parts))
        if not entries and min(self._empty) >= QUIET_PAGES:
            # Its sources' last pages had no change: a sequential read past this
            # progress need not wait for the next page (rubberband.views.reads.quiet).
            said += [[], QUIET] if len(said) == 2 else [QUIET]
        ordered, stable = progress_keys(self.view.name, self._part)
        entry = [self.position, said]
        progress = ((ordered, entry), (stable, entry))
        parts = _parts(entries)
        self.written_floor = floor
        # The oldest position of this write and of every earlier one not yet known
        # applied (each of those said its own, so a refused one's low carries on).
        oldest = min((e[0] for _, e in entries), default=self.position)
        low = min([oldest, *(low for _, low in self._sent)])
        self._sent.append((self.position, low))
        rows: list[Any] = []
        i = 0
        for part in parts:
            j = i + len(part)
            mine = tuple(places[i:j])
            rows.append(Placed(("version", tuple(part), floor, low), placed_ranges(mine), mine))
            i = j
        # (with rows only: :meth:`in_order` adds the ordered progress to the last row write)
        extra = self._reclaims(low) if rows else []
        self.housekeeping = len(extra)
        return [*extra, *rows, ("version", progress, floor, low)]

    def _bury(self, at: int, keys: list[Any]) -> None:
        """Keep ``keys``, rows absent since ``at`` or before, until the reclaim floor
        passes ``at`` (:meth:`_reclaims` drops them)."""
        self.dead.append((at, _pack_keys(keys)))
        self.dead_rows += len(keys)

    def _reclaims(self, low: int) -> list[Any]:
        """The drops of the dead rows at or below the stable reclaim floor, and the
        write of a higher one if its stable progress allows it (module docstring)."""
        out: list[Any] = []
        dead, keys = self.dead, []
        while dead and dead[0][0] <= self._upto and len(keys) < RECLAIMS:
            at, packed = dead.popleft()
            group = _unpack_keys(packed)
            room = RECLAIMS - len(keys)
            if len(group) > room:  # the rest first next time
                dead.appendleft((at, _pack_keys(group[room:])))
                group = group[:room]
            keys += group
        for i in range(0, len(keys), BATCH_KEYS):
            out.append(("reclaim", tuple(keys[i : i + BATCH_KEYS]), self._upto))
        self.reclaimed += len(keys)
        self.dead_rows -= len(keys)
        step = max(versions.WINDOW, self.position - self._want) * (len(self.view.parts) + 1) >> 8
        if self._floor_sent is None and self._want > self._upto + step:
            # (each floor write adds a version to the floor's chain, which keeps at most
            # MAX_ENTRIES, and every part of a split view writes it: in steps of the
            # floor's lag behind the progress, times the parts, over 256, the chain
            # holds about 256 versions above its floor)
            self._floor_sent = (self._want, self.position)
            out.append(("version", ((reclaim_key(self.view.name), [self.position]),),
                        self._want, low))  # fmt: skip
        return out

    @staticmethod
    def in_order(writes: list[Any]) -> tuple[tuple[Any, ...], Any]:
        """A page's writes (rows, then the progress) as two: the rows with the
        progress ordered reads wait for in the last rows' write (one message, so atomic
        in the total order; sent in one batch after the other rows' messages, it is
        ordered after them: a sequential or snapshot read that sees it sees every row,
        a round trip sooner than the stable progress), and the progress basic reads
        trust, to be made once those writes are stable (a basic read asks each
        segment's replica apart, and one could see the progress before a row's replica
        had it)."""
        *rows, progress = writes
        ordered, stable = progress[1]
        last = (*rows[-1][1], ordered) if rows else (ordered,)
        if mutations.on(PROGRESS_WITH_ROWS):
            last = (*last, stable)
        op: Any = ("version", last, *progress[2:])
        if rows and type(rows[-1]) is Placed:
            ranges, places = rows[-1].ranges, rows[-1].places
            for key, _entry in last[len(rows[-1][1]) :]:
                place = encode_key(key)
                ranges = with_point(ranges, place)
                places = None if places is None else (*places, place)
            op = Placed(op, ranges, places)  # (its last pair a progress: sent last)
        ops = (*rows[:-1], op)
        # (the stable progress goes out only once those are known applied: no low)
        return ops, ("version", (stable,), progress[2])


def _pack_keys(keys: list[Any]) -> bytes:
    return msgpack.packb(keys, use_bin_type=True)  # type: ignore[no-any-return]


def _unpack_keys(packed: bytes) -> list[Any]:
    """Keys as :func:`_pack_keys` had them, decoded as the wire decodes a payload: a
    key's tuples come back as tuples, its bytes as bytes, its strings as strings."""
    return list(unpack_payload(packed))


def _parts(entries: list[tuple[Any, list[Any]]]) -> list[list[tuple[Any, list[Any]]]]:
    """``entries`` cut into messages of at most :data:`BATCH_KEYS` rows and about
    :data:`BATCH_BYTES` bytes of values.  Most messages' values together are far below
    :data:`ROW_BYTES` (500 rows of a few fields: tens of kilobytes), and then no row is
    over it nor any message over :data:`BATCH_BYTES`: their values are measured in one
    encoding a message, where measuring each row apart was about a twentieth of an
    index view's maintainer.  Otherwise each row is measured (:func:`_measured`)."""
    chunks = [entries[i : i + BATCH_KEYS] for i in range(0, len(entries), BATCH_KEYS)]
    packer = msgpack.Packer(use_bin_type=True)
    try:
        if all(len(packer.pack([e[1] for e in chunk])) <= ROW_BYTES for chunk in chunks):
            return chunks
    except (TypeError, ValueError, OverflowError):
        pass  # (a value that does not encode: the write's own encoding says why)
    return _measured(entries)


def _measured(entries: list[tuple[Any, list[Any]]]) -> list[list[tuple[Any, list[Any]]]]:
    """:func:`_parts`, each row's value measured apart: a row over :data:`ROW_BYTES`
    is refused (:class:`RowTooLarge`), and a message is cut before the row that takes
    its values past :data:`BATCH_BYTES`."""
    parts: list[list[tuple[Any, list[Any]]]] = []
    part: list[tuple[Any, list[Any]]] = []
    size = 0
    for entry in entries:
        n = _size(entry[1])
        if n > ROW_BYTES:
            raise RowTooLarge(
                f"row {entry[0][2]!r:.60} at position {entry[1][0]} is {n:,} bytes encoded, "
                f"over the {ROW_BYTES:,}-byte limit of a row"
            )
        if part and (len(part) >= BATCH_KEYS or size + n > BATCH_BYTES):
            parts.append(part)
            part, size = [], 0
        part.append(entry)
        size += n
    if part:
        parts.append(part)
    return parts


def _size(version: list[Any]) -> int:
    """A row version's value's size, encoded (0 if it does not encode: the write's
    own encoding says why)."""
    if len(version) < 2:
        return 0
    try:
        return len(msgpack.packb(version[1]))
    except (TypeError, ValueError, OverflowError):
        return 0
