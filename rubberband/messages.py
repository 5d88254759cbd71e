"""The client's messages: operations into E-Cast messages, answers into results (4.5).

Sans-IO.  The client computes what an operation touches with the engine's ``part_fun``
(routers never parse payloads) and turns the storage processes' answers back into one
result.  Three read isolation levels (4.5.2):

* **sequential**: the read is an ordinary E-Cast message, ordered with every write; the
  responders (a cover of its ranges) answer when they deliver it.  Sequentially
  consistent: a read sees every write ordered before it, including the client's own.
* **snapshot**: the read travels as an unsafe message, outside the total order, and each
  responder answers at once if it had delivered exactly what the router had sent it when
  it routed the read; every part then reflects the same prefix of the history (the
  router's frontier), a consistent cut.  A part refused, or parts at different frontiers,
  and the whole read is tried again.
* **basic**: the client sends the read straight to storage processes chosen from its copy
  of the keyspace; each answers from its current state the ranges it holds in full, if
  the client's keyspace version is its own.  No ordering at all, but never an answer from
  a process that does not hold the data (configuration-consistent).

Every answer says which ranges it covers; a read completes when the answers cover the
request, and a range answered twice is taken once (replicas agree at one position).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

import msgpack

from rubberband.changelog import Changed, Changes, Revisions, changes_ranges, page
from rubberband.engine import BadOperation, Placed, Placement, changed_key
from rubberband.errors import Rejected, Unavailable
from rubberband.gather import Gather, Holders, op_name
from rubberband.keys import (
    MAX_EKEY,
    EKey,
    RangeSet,
    after,
    contains,
    covers,
    intersect,
    normalize,
    points,
)
from rubberband.placement import BadKeyspace, Keyspace
from rubberband.placement import Unavailable as NoHolder
from rubberband.proto import (
    MAX_RANGES,
    H,
    bundle_header,
    read_header,
    write_bundle_header,
    write_header,
)
from rubberband.versions import names_catalog

Isolation = Literal["sequential", "snapshot", "basic"]
ISOLATION_LEVELS = ("sequential", "snapshot", "basic")

EXACT_RANGES = 32
"""Ranges a header names exactly; an operation of more (a write of many keys: a view's
rows, a bulk put) names one hull per piece of the ring instead (:meth:`routable`)."""


def placed_ranges(places: Sequence[EKey]) -> RangeSet:
    """The ranges a write of the keys encoded as ``places`` names
    (:attr:`~rubberband.engine.Placed.ranges`): their points, or for more than
    :data:`EXACT_RANGES` the one range from the lowest to just past the highest.  A
    header names no more (:meth:`Messages.routable` widens to a range per piece of the
    ring, and a view's rows go a message a piece: :meth:`Messages._pieces`), and the
    points of a view's 500 rows a message, each key flattened and all of them sorted,
    were about a tenth of a view maintainer's CPU."""
    if len(places) <= EXACT_RANGES:
        return points(list(places))
    return ((min(places), after(max(places))),)


class Messages:
    """An engine's operations, the client's copy of the keyspace, and the messages that
    carry reads and writes (:class:`rubberband.client.ClientCore` adds the requests
    in flight)."""

    def __init__(self, ops: Any, placement: Placement | None = None) -> None:
        self.ops = ops
        self.placement = placement or Placement()
        self.keyspace: Keyspace | None = None
        self.holders = Holders()
        """Whom answers are taken from (only holders: an answer from any other process,
        a client's above all, is not an answer)."""
        self.version = -1
        self._offset = 0
        self._packer = msgpack.Packer(use_bin_type=True)
        """Bundles' payloads: one Packer reused (``packb`` makes one per call, at three
        times the cost); a client core is used from one thread."""

    def answered(self, op: Any) -> bool:
        """Must a holder answer write ``op`` before it is reported done?  One whose
        validity depends on the data (``ops.answered``: an append to a value that is no
        list), and a plain write naming a view's definition, which every holder refuses
        from anyone but a maintainer (:func:`~rubberband.applying.refusal`): left
        unanswered, a client's redefinition was reported done and never applied."""
        answered = getattr(self.ops, "answered", None)
        return (answered is not None and bool(answered(op))) or names_catalog(op)

    # ------------------------------------------------------------------ configuration
    def learn(self, version: int, keyspace_state: Any, partitioning: str | None = None) -> bool:
        """A newer keyspace, from a super: only supers (and the total order, which they
        follow) say what the keyspace is; a storage process that finds ours stale only
        says so."""
        if type(version) is not int or version <= self.version:
            return False
        try:
            ks = Keyspace.from_state(_tuples(keyspace_state))
        except (BadKeyspace, TypeError, ValueError):
            return False
        self.keyspace = ks
        self.holders.learn(ks)
        self.version = version
        if partitioning is not None and partitioning != self.placement.partitioning:
            self.placement = Placement(partitioning)  # type: ignore[arg-type]
        return True

    # ------------------------------------------------------------------ messages
    def write_message(self, op: Any) -> tuple[Any, dict[str, Any]]:
        """``(payload, header)`` of a write; raises :class:`BadOperation` for a bad op."""
        ranges = self._write_ranges(op)
        if type(op) is Placed:
            keys = len(op.places) if op.places is not None and self.placement.ordered else None
            return self._alone(tuple(op), ranges, keys)
        return self._alone(op, ranges)

    def _alone(
        self, op: Any, ranges: RangeSet, keys: int | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """``(payload, header)`` of a write that travels alone, of ``keys`` keys (None:
        as many as ``ranges``, its points).  One of more than :data:`EXACT_RANGES` keys
        (a view's rows, a bulk put) travels packed (``H.PACKED``): its operation's
        bytes, which the routers pass on as they are, where they decoded and encoded
        each of its keys at every hop (half a microsecond a key each time); its holders
        unpack it as it is delivered.  A few keys travel as the operation itself:
        packing it apart would cost them more."""
        header = write_header(self.routable(ranges))
        if (len(ranges) if keys is None else keys) <= EXACT_RANGES:
            return op, header
        try:
            payload = self._packer.pack(op)
        except (TypeError, ValueError, OverflowError):
            return op, header  # (E-Cast's encoder says what it cannot carry)
        header[H.PACKED] = 1
        return payload, header

    def routable(self, ranges: RangeSet) -> RangeSet:
        """The ranges a header names for an operation of ``ranges``: those, or past
        :data:`MAX_RANGES` (a write or read of thousands of keys) one range from the
        lowest to the highest bound in each piece of the ring between two ids, as the
        client's keyspace cuts it.  The same holders receive it, and each applies or
        answers the operation only for its own keys inside what it holds: a superset
        changes no outcome.  One message still carries the whole operation, so a write
        of many keys stays atomic.  Without a keyspace, one range around all of them."""
        if len(ranges) <= EXACT_RANGES:
            return ranges
        ks = self.keyspace
        ids = ks.ids if ks is not None else ()
        # A range set is sorted and disjoint: the ranges starting in one piece (between
        # two ids) are a run, found by one bisection a piece, not a call a range.
        hulls: list[tuple[Any, Any]] = []
        i, n = 0, len(ranges)
        while i < n:
            k = bisect_right(ids, ranges[i][0])
            j = bisect_left(ranges, (ids[k],), i + 1) if k < len(ids) else n
            hulls.append((ranges[i][0], ranges[j - 1][1]))
            i = j
        out = normalize(hulls)
        if len(out) > MAX_RANGES:
            out = ((ranges[0][0], ranges[-1][1]),)
        return out

    def _write_ranges(self, op: Any) -> RangeSet:
        if type(op) is Placed:
            if self.placement.ordered:
                return op.ranges
            op = tuple(op)
        part = self.ops.part_fun(op, self.placement)
        if part.kind != "write":
            raise BadOperation(f"{op_name(op)!r} is a read, not a write")
        return part.ranges

    def writes_of(
        self,
        ops: list[Any],
        limit: int,
        max_bytes: int,
        alone: Callable[[Any], bool] | None = None,
    ) -> list[tuple[tuple[int, ...], Any, dict[str, Any]]]:
        """The messages that carry a batch of writes, in the order to submit them:
        ``(indices, payload, header)``, ``indices`` being the positions in ``ops`` of the
        writes a message carries.  Raises :class:`BadOperation` for a bad op, before
        anything is built.

        Writes of one key's segment that touch one range each travel up to ``limit`` to
        a message (:func:`rubberband.config.write_bundle_header`), its payload at most
        ``max_bytes`` unless it carries one write: one message to that segment's holders
        for all of them, where each alone cost every role a message.  The writes of a
        batch are independent: writes to different segments may be ordered in any order
        among themselves, while two writes that touch a common key stay in batch order
        (same segment, same message or an earlier one), and every write of a batch is
        ordered after the writes of earlier batches.  A write of several ranges, of a
        range across segments, or one for which ``alone`` is true (default: those the
        client waits to hear about, ``ops.answered``) travels alone, after every bundle
        begun before it (a view's rows in a message per piece of the ring:
        :meth:`_pieces`).  Grouped by the client's copy of the keyspace: with a stale
        copy a bundle may reach more holders than one segment's, and each applies what
        it holds."""
        parts = [self._write_ranges(op) for op in ops]
        placed = ops
        # (a placed write travels as the plain tuple it is: a receiver reads types)
        ops = [tuple(op) if type(op) is Placed else op for op in ops]
        ks = self.keyspace
        if ks is None or not len(ks) or limit <= 1:
            out: list[tuple[tuple[int, ...], Any, dict[str, Any]]] = []
            for i, r in enumerate(parts):
                if len(r) <= EXACT_RANGES and type(placed[i]) is not Placed:
                    out.append(((i,), ops[i], write_header(r)))  # (most: as they stand)
                else:
                    out.extend(self._pieces(i, ops[i], r, placed[i]))
            return out
        answered = alone if alone is not None else self.answered
        ids = ks.ids
        uppers = (*ids, MAX_EKEY)
        out = []
        groups: dict[int, list[int]] = {}
        """Indices waiting to travel, by piece of the ring (``bisect_right(ids, key)``:
        the two ends of the wrapping segment are two pieces, each with its own bundle)."""

        def flush() -> None:
            for group in groups.values():
                if group:
                    out.extend(self._write_bundles(ops, parts, group, max_bytes))
            groups.clear()

        for i, ranges in enumerate(parts):
            k = -1
            if len(ranges) == 1 and not answered(ops[i]):
                lo, hi = ranges[0]
                k = bisect_right(ids, lo)
                if hi > uppers[k]:
                    k = -1
            if k < 0:  # travels alone, behind everything begun before it
                flush()
                out.extend(self._pieces(i, ops[i], ranges, placed[i]))
                continue
            group = groups.get(k)
            if group is None:
                group = groups[k] = []
            group.append(i)
            if len(group) >= limit:
                out.extend(self._write_bundles(ops, parts, group, max_bytes))
                groups[k] = []
        flush()
        return out

    def _pieces(
        self, i: int, op: Any, ranges: RangeSet, placed: Any
    ) -> list[tuple[tuple[int, ...], Any, dict[str, Any]]]:
        """Write ``i`` as it travels alone: one message, or, for a placed write whose
        pairs need not be applied together (``Placed.places``: a view's rows), one
        message for the pairs of each piece of the ring, to that piece's holders
        alone, the piece of its last pair last (a view's progress, which its readers
        take as the sign that every row before it is there).  Whole, every holder of
        any of its rows decoded all of them: each of 16 storage processes 500 rows for
        the 94 it holds."""
        places = placed.places if type(placed) is Placed and self.placement.ordered else None
        ks = self.keyspace
        if places is None or len(places) != len(op[1]):
            return [((i,), *self._alone(op, ranges))]
        if ks is None:
            return [((i,), *self._alone(op, ranges, len(places)))]
        ids = ks.ids
        pieces: dict[int, list[int]] = {}
        k = 0
        for j, place in enumerate(places):
            k = bisect_right(ids, place)
            got = pieces.get(k)
            if got is None:
                pieces[k] = [j]
            else:
                got.append(j)
        if len(pieces) < 2:
            return [((i,), *self._alone(op, ranges, len(places)))]
        last = k  # the last pair's piece
        out = []
        for k in [*(k for k in sorted(pieces) if k != last), last]:
            js = pieces[k]
            part = (op[0], tuple(op[1][j] for j in js), *op[2:])
            out.append(((i,), *self._alone(part, placed_ranges([places[j] for j in js]), len(js))))
        return out

    def _write_bundles(
        self, ops: list[Any], parts: list[RangeSet], group: list[int], max_bytes: int
    ) -> list[tuple[tuple[int, ...], Any, dict[str, Any]]]:
        """One piece's writes as messages (halves in order where too large)."""
        if len(group) == 1:
            i = group[0]
            return [((i,), ops[i], write_header(parts[i]))]
        payload = self._packer.pack(tuple((ops[i], parts[i]) for i in group))
        if len(payload) > max_bytes:
            half = len(group) // 2
            return self._write_bundles(ops, parts, group[:half], max_bytes) + (
                self._write_bundles(ops, parts, group[half:], max_bytes)
            )
        lo = min(parts[i][0][0] for i in group)
        hi = max(parts[i][0][1] for i in group)
        return [(tuple(group), payload, write_bundle_header(((lo, hi),), len(group)))]

    def read_message(
        self, op: Any, within: RangeSet | None = None
    ) -> tuple[Any, dict[str, Any], Gather]:
        """``(payload, header, gather)`` of a sequential or snapshot read; the offset turns
        per read so that load spreads over the replicas (4.3).  ``within`` restricts the
        read to part of the placement space (one storage range of a parallel export):
        responders answer only for what the header names."""
        gather = self.gather(op, within)
        return op, self.header(gather), gather

    def gather(self, op: Any, within: RangeSet | None = None) -> Gather:
        """What a read of ``op`` will gather (:meth:`read_message` without its message, for a
        read that may travel in a bundle); raises :class:`BadOperation` for a bad op."""
        if type(op) is Changes:
            return Gather(op, changes_ranges(op, self.placement.ordered))
        if type(op) is Changed:
            if type(op.since) is not int:
                raise BadOperation(f"a peek names a position (an int, 0 or more), not {op.since!r}")
            return Gather(op, changes_ranges(op, self.placement.ordered))
        if type(op) is Revisions:
            keys = op.keys
            if type(keys) not in (list, tuple) or not keys:
                raise BadOperation("a revisions read names its keys (a non-empty sequence)")
            ranges = self.gather(op.op, within).ranges
            wanted = normalize((p, after(p)) for p in map(self.change_place, keys))
            if not covers(ranges, wanted):
                raise BadOperation("a revisions read names keys its read does not cover")
            return Gather(Revisions(op.op, tuple(keys)), ranges)
        part = self.ops.part_fun(op, self.placement)
        if part.kind != "read":
            raise BadOperation(f"{op_name(op)!r} is a write, not a read")
        ranges = part.ranges if within is None else intersect(part.ranges, within)
        # No range (``k = 1 AND k = 2``): nothing any process holds can match, so the
        # read is complete as it is, its answer the engine's combination of no answers
        # (empty rows, a count of 0), and no message is sent for it.
        return Gather(op, ranges)

    def change_place(self, key: Any) -> Any:
        """Where a change's key lives: a table row's change by the row's key."""
        return self.placement.ekey(changed_key(key))

    def gathers(self, ops: list[Any]) -> list[Gather]:
        """:meth:`gather` of every op of a batch, in one loop (it runs for every read a
        client sends); raises :class:`BadOperation` for the first bad op."""
        part_fun, placement = self.ops.part_fun, self.placement
        out: list[Gather] = []
        for op in ops:
            kind, ranges = part_fun(op, placement)
            out.append(Gather(op, ranges) if kind == "read" else self.gather(op))
        return out

    def header(self, gather: Gather) -> dict[str, Any]:
        """The header of a read sent alone, at the next offset."""
        self._offset += 1
        return read_header(self.routable(gather.ranges), self._offset)

    def bundles(self, gathers: list[Gather], limit: int) -> tuple[list[list[int]], int]:
        """Which reads of a batch share a message (:data:`rubberband.config.BUNDLE`), and
        the offset their headers carry: indices grouped by the holder the routers' cover
        picks for them at that offset, at most ``limit`` to a group, a group of one for a
        read of several ranges.

        At offset ``r`` the cover reads segment ``s`` from the holder at ring position
        ``s + (r - s) mod m`` (``m`` holders per segment, :class:`Routing`): one holder
        for ``m`` consecutive segments.  Reads grouped by that holder reach one
        responder, so a bundle costs the routers one cover and its responder one
        message; the offset turns with every batch, so every holder takes its turn.
        Grouped by the client's copy of the keyspace: a stale copy (or a holder the
        routers avoid) only spreads a bundle over more responders, each answering what
        it holds."""
        groups, offset = self._groups(gathers, limit)
        return [group for group, _ in groups], offset

    def _groups(
        self, gathers: list[Gather], limit: int
    ) -> tuple[list[tuple[list[int], dict[int, list[Any]] | None]], int]:
        """:meth:`bundles`, each group with its hulls (as :meth:`_hulls` makes them, None
        for a read of several ranges), found in the same pass: :meth:`reads` then needs
        no second search of the ring per read."""
        ks = self.keyspace
        if ks is None or not len(ks) or limit <= 1:
            return [([i], None) for i in range(len(gathers))], 0
        self._offset += 1
        r, ids, m = self._offset, ks.ids, ks.group_size
        n = len(ids)
        out: list[tuple[list[int], dict[int, list[Any]] | None]] = []
        groups: dict[int, tuple[list[int], dict[int, list[Any]]]] = {}
        for i, g in enumerate(gathers):
            ranges = g.ranges
            if len(ranges) != 1:
                out.append(([i], None))
                continue
            lo, hi = ranges[0]
            k = bisect_right(ids, lo)
            s = (k - 1) % n
            holder = (s + (r - s) % m) % n
            entry = groups.get(holder)
            if entry is None:
                entry = groups[holder] = ([], {})
            group, hulls = entry
            group.append(i)
            _widen(hulls, k, lo, hi)
            if len(group) >= limit:
                out.append(entry)
                del groups[holder]
        out.extend(groups.values())
        return out, r

    def _hulls(self, gathers: Iterable[Gather]) -> dict[int, list[Any]]:
        """For each piece of the ring between two ids that ``gathers`` touch (``k`` of
        ``bisect_right(ids, key)``), ``[lo, hi]`` from their lowest to their highest
        bound there."""
        ks = self.keyspace
        ids = ks.ids if ks is not None else ()
        hulls: dict[int, list[Any]] = {}
        for g in gathers:
            lo, hi = g.ranges[0][0], g.ranges[-1][1]
            _widen(hulls, bisect_right(ids, lo), lo, hi)
        return hulls

    def bundle(
        self, reads: list[tuple[Any, Gather]], offset: int | None = None
    ) -> tuple[bytes, dict[str, Any]]:
        """``(payload, header)`` of one message carrying ``reads`` (``(op, gather)``
        pairs from :meth:`gather`) at ``offset`` (from :meth:`bundles`; None: the next
        one): each read keeps its own ranges inside the payload's bytes; the header
        names, for each piece of the ring between two ids that the reads touch, the
        range from their lowest to their highest bound there (a few ranges, never the
        whole ring for reads on both sides of its wrap).  Raises ``TypeError`` for an op
        msgpack cannot encode, as a read alone does at its submission."""
        if offset is None:
            self._offset += 1
            offset = self._offset
        ranges = normalize((lo, hi) for lo, hi in self._hulls(g for _, g in reads).values())
        payload = self._packer.pack(tuple((op, g.ranges) for op, g in reads))
        _bundled(g for _, g in reads)
        return payload, bundle_header(ranges, offset, len(reads))

    def read_messages(
        self, ops: list[Any], gathers: list[Gather], limit: int, max_bytes: int
    ) -> list[tuple[tuple[int, ...], Any, dict[str, Any]]]:
        """The messages that carry a batch of sequential or snapshot reads (``gathers``
        from :meth:`gather`, one per op): ``(indices, payload, header)``, as
        :meth:`writes_of` gives them.  Grouped as :meth:`bundles` groups them; a message
        of one read carries it alone (its op and :meth:`header`); a bundle's payload is
        at most ``max_bytes`` unless it carries one read (halves otherwise).  The
        batch's form of :meth:`bundles` and :meth:`bundle`, in one pass over the reads:
        this runs for every read a client sends."""
        groups, offset = self._groups(gathers, limit)
        out: list[tuple[tuple[int, ...], Any, dict[str, Any]]] = []
        for group, hulls in groups:
            self._read_bundles(ops, gathers, group, hulls, offset, max_bytes, out)
        return out

    def _read_bundles(
        self,
        ops: list[Any],
        gathers: list[Gather],
        group: list[int],
        hulls: dict[int, list[Any]] | None,
        offset: int,
        max_bytes: int,
        out: list[tuple[tuple[int, ...], Any, dict[str, Any]]],
    ) -> None:
        if len(group) == 1:
            i = group[0]
            out.append(((i,), ops[i], self.header(gathers[i])))
            return
        payload = self._packer.pack([(ops[i], gathers[i].ranges) for i in group])
        if len(payload) > max_bytes:  # large reads: fewer to a message
            half = len(group) // 2
            for part in (group[:half], group[half:]):
                self._read_bundles(ops, gathers, part, None, offset, max_bytes, out)
            return
        if hulls is None:
            hulls = self._hulls(gathers[i] for i in group)
        ranges = normalize((lo, hi) for lo, hi in hulls.values())
        _bundled(gathers[i] for i in group)
        out.append((tuple(group), payload, bundle_header(ranges, offset, len(group))))

    def basic_targets(
        self, gather: Gather, avoid: frozenset[str] = frozenset()
    ) -> dict[str, RangeSet]:
        """Storage processes to ask for what ``gather`` still misses (a cover from the
        client's keyspace, rotated per read, avoiding processes that failed it)."""
        ks = self.keyspace
        if ks is None or not len(ks):
            raise Unavailable("the client knows no storage process yet")
        self._offset += 1
        try:
            return ks.read_cover(gather.missing(), self._offset, exclude=avoid)
        except NoHolder as e:
            raise Unavailable(str(e)) from None

    def result(self, gather: Gather) -> Any:
        op = gather.op
        if type(op) is Changes:
            return page(gather.pieces, gather.position, gather.error, self.change_place)
        if gather.error is not None:
            raise Rejected(gather.error)
        if type(op) is Changed:
            return any(res is not False for _r, res in gather.pieces)
        if type(op) is Revisions:  # each answer: [result, [[key, position], ...]]
            ekey = self.change_place
            revisions = {
                k: t for r, res in gather.pieces for k, t in res[1] if contains(r, ekey(k))
            }
            pieces = [(r, res[0]) for r, res in gather.pieces]
            return self.ops.combine(op.op, self._answers(gather.exact, pieces)), revisions
        return self.ops.combine(op, self._answers(gather.exact, gather.pieces))

    def _answers(self, exact: bool, pieces: list[tuple[RangeSet, Any]]) -> list[Any]:
        """Engines answer for the ranges they were given; the client keeps each range
        once, so where an answer's piece is less than it covered (not ``exact``,
        :attr:`Gather.exact`) an engine's ``restrict`` (if any) trims it to its piece."""
        restrict = getattr(self.ops, "restrict", None)
        if exact or restrict is None:
            return [res for _r, res in pieces]
        return [restrict(res, r, self.placement) for r, res in pieces]


def _bundled(gathers: Iterable[Gather]) -> None:
    """These reads go in a bundle: a responder's engine runs each on the bundle's whole
    piece (:func:`rubberband.bundles.read_items`), which may hold keys beyond the read's
    own ranges, so their answers are trimmed (:attr:`Gather.exact`)."""
    for g in gathers:
        g.exact = False


def _widen(hulls: dict[int, list[Any]], k: int, lo: Any, hi: Any) -> None:
    """Widen the hull of ring piece ``k`` to take in ``[lo, hi)``."""
    h = hulls.get(k)
    if h is None:
        hulls[k] = [lo, hi]
        return
    if lo < h[0]:
        h[0] = lo
    if hi > h[1]:
        h[1] = hi


def _tuples(value: Any) -> Any:
    if type(value) in (list, tuple):
        return tuple(_tuples(v) for v in value)
    return value
