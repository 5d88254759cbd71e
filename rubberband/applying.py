"""A storage process's delivered batches, applied: one engine call per batch of
delivered messages (writes, reads, bundles of either, changes reads and revisions
reads), and the answers it makes (dissertation 4.4.1, 4.5).  Part of
:class:`rubberband.storage.StorageCore`, kept apart to keep each file readable."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ecast import Message
from ecast.core import mutations
from rubberband.bundles import cut, read_items, unbundle, write_items
from rubberband.changelog import FROM_NOW, feed_answer, revised_op
from rubberband.config import MAINTAINER
from rubberband.engine import BadOperation
from rubberband.holds import feed_key
from rubberband.keys import NOTHING, RangeSet, covers, difference, is_range_set
from rubberband.proto import Answer, Answers, FeedRead, H, Whole, written
from rubberband.versions import (
    CATALOG_KEYS,
    MAINTAINED_KEYS,
    is_version_op,
    names_catalog,
    too_old,
)

if TYPE_CHECKING:
    from rubberband.placement import Keyspace
    from rubberband.storage import StorageCore

_READS, _COUNT, _ANSWER, _WRITES = H.READS, H.COUNT, H.ANSWER, H.WRITES
_CATALOG_LO, _CATALOG_HI = CATALOG_KEYS[0]

WRITES_WHOLE = mutations.declare(
    "writes_whole", "storage", "a write that reaches several segments is applied whole"
)
ANY_ROWS_WRITER = mutations.declare(
    "any_rows_writer", "storage", "views' rows and definitions written by any client"
)

MALFORMED_BUNDLE = (
    "a bundle is a tuple of (op, ranges) pairs, as many as its count, and a read "
    "bundle's operations all reads"
)
"""The error every read of a malformed bundle gets (and a write bundle's sender: no
write of it is applied)."""


def not_a_read(op: Any) -> str:
    """The error a read message gets whose operation is no read of the engine's
    (:meth:`rubberband.engine.Engine.is_read`).  A read goes to one replica of each
    range, or to a replica outside the order: run there, a write would change that
    replica alone, and the replicas would disagree from then on."""
    return (
        f"not a read: {op!r:.60} (a read reaches one replica of each range; a write "
        "must be sent as a write)"
    )


def answer_bundle(core: StorageCore, msg: Message, mine: RangeSet, position: Any) -> None:
    """A snapshot read's bundle of reads, answered at once (4.5.2)."""
    rid = msg.header.get(H.REQUEST, msg.id)
    items, whole = _bundle_items(core, msg, mine)
    if items is None:
        core.send(msg.sender, Answer(rid, mine, None, MALFORMED_BUNDLE, position, True))
        return
    try:
        results = core.engine.apply(
            _read_ops(core, items, position if type(position) is int else -1)
        )
    except Exception as e:
        core.stop(f"engine failed: {type(e).__name__}: {e}")
        return
    _answer_reads(core, msg, items, whole and len(results) == len(items), results, position)


def _bundle_items(core: StorageCore, msg: Message, mine: RangeSet) -> tuple[Any, bool]:
    """A read bundle's items on what this process holds, and whether each read is one
    item, whole (:func:`~rubberband.bundles.read_items`); None for a malformed one."""
    subs = unbundle(msg)
    if subs is None:
        return None, False
    is_read = core.engine.is_read
    for sub in subs:  # (a malformed pair is read_items' to refuse)
        if type(sub) is tuple and len(sub) == 2 and not is_read(sub[0]):
            return None, False
    return read_items(subs, core._pieces(mine))


def _read_ops(core: StorageCore, items: list[Any], t: int) -> list[Any]:
    """The engine's operations for a bundle's read items (with their position ``t`` for
    an engine that stamps positions)."""
    if core._positions:
        return [(op, piece, t) for _, op, piece, _ in items]
    return [(op, piece) for _, op, piece, _ in items]


def _answer_reads(
    core: StorageCore, msg: Message, items: list[Any], whole: bool, results: list[Any], at: Any
) -> int:
    """A bundle's answer: its results whole, or read by read with what each covers (a
    rejection read by read).  How many of its reads were rejected."""
    rid = msg.header.get(H.REQUEST, msg.id)
    if whole and not any(isinstance(r, BadOperation) for r in results):
        core.send(msg.sender, Whole(rid, at, tuple(results)))
        return 0
    rows = tuple(
        (i, c, None, str(res)) if isinstance(res, BadOperation) else (i, c, res, None)
        for (i, _, _, c), res in zip(items, results, strict=True)
    )
    core.send(msg.sender, Answers(rid, at, True, rows))
    return len({row[0] for row in rows if row[3] is not None})


_REFUSABLE = frozenset({"version", "reclaim"})
"""The operations :func:`refusal` may refuse whatever keys they name: views' rows (a
plain write is refused only if it names a view's definition)."""
_GUARDED = _REFUSABLE | {"delete_range"}
"""The operations a sender's role or a position may refuse or restrict (checked by name
first: most writes are none of them)."""


def _deletable(sender: str, ranges: RangeSet) -> RangeSet:
    """What of ``ranges`` a ``delete_range`` from ``sender`` deletes: all of them for a
    maintainer, the rest without views' rows and definitions for anyone else.  Those
    are their maintainers' (proven by their credentials): a client that deleted rows
    made a view show a state that no base position had, and every reader trusted it.
    A client's range delete is of base data, which the views then follow.  It reads
    the sender alone, so every replica applies the same part of the write."""
    if sender.startswith(MAINTAINER) or mutations.on(ANY_ROWS_WRITER):
        return ranges
    return difference(ranges, MAINTAINED_KEYS)


def may_reach_catalog(header: dict[str, Any], ordered: bool) -> bool:
    """May a write under ``header`` name a view's definition (a key ``(CATALOG,
    ...)``)?  Under range partitioning only if the ranges the header names reach the
    catalog's keys (an engine writes nothing outside them); under hash partitioning
    they say nothing of keys, and it may.  Where it may, the operation itself says
    (:func:`~rubberband.versions.names_catalog`).  It reads the whole message, never
    the part of it a replica holds, so every replica decides alike (a batch takes the
    short road at one replica and the general one at another)."""
    if not ordered:
        return True
    ranges = written(header)
    return type(ranges) is tuple and any(
        type(r) is tuple and len(r) == 2 and r[0] < _CATALOG_HI and r[1] > _CATALOG_LO
        for r in ranges
    )


def _whole(sender: str, sub: Any, t: int, catalog: bool) -> Any:
    """``(op, ranges)`` as every replica applies it, for an engine's record of whole
    writes: None if refused, its ranges without views' rows and definitions if only
    those are barred.  ``catalog``: the message's header reaches the catalog's keys
    (:func:`may_reach_catalog`; its operation is looked at here)."""
    if type(sub) is not tuple or len(sub) != 2:
        return sub  # (a malformed bundle: no replica applies any of it)
    op, ranges = sub
    if refusal(sender, op, t, catalog and names_catalog(op)):
        return None
    if type(op) is tuple and op and op[0] == "delete_range" and is_range_set(ranges):
        ranges = _deletable(sender, ranges)
        return (op, ranges) if ranges else None
    return sub


def refusal(sender: str, op: Any, t: int, catalog: bool = False) -> str | None:
    """Why a write is refused whole at every replica and never applied, or None: a
    ``version`` or ``reclaim`` (views' rows), or a plain write that names a view's
    definition (``catalog``: :func:`may_reach_catalog` allowed it, and it does), from a
    process that is not a maintainer, whose credential proved its name (a client that
    wrote a row's version made a view show a state no base position had, and readers
    trusted it; one that wrote a definition made readers trust sources the view is not
    of, and maintainers keep, or stop keeping, a view nobody with the role defined); or
    a version write delivered too far behind the positions it holds
    (:func:`~rubberband.versions.too_old`: a stale maintainer cannot bring back a row
    its view dropped).  All read only the operation, its sender, its header and its
    position, which every replica has alike."""
    if type(op) is not tuple or not op:
        return None
    name = op[0]
    if name not in _REFUSABLE and not catalog:
        return None
    if not sender.startswith(MAINTAINER) and not mutations.on(ANY_ROWS_WRITER):
        if catalog:
            return f"{name} names a view's definition, which only maintainers ({MAINTAINER}*) write"
        return f"{name} writes views' rows, which only maintainers ({MAINTAINER}*) write"
    return too_old(op, t) if name == "version" else None


class Apply:
    """One engine batch of delivered messages, and the answers it makes."""

    __slots__ = ("batch", "bundles", "core", "cuts", "feeds", "items", "writes")

    def __init__(
        self,
        core: StorageCore,
        batch: list[tuple[Message, RangeSet, int]],
        cuts: dict[int, Keyspace] | None = None,
    ) -> None:
        self.core = core
        self.batch = batch
        self.cuts = cuts
        """The keyspace each message that waited for a copy was delivered under (by
        ``id``), where it is not the process's now: its writes are cut at that ring's
        segments (:meth:`_write`)."""
        self.items: list[tuple[Message, Any, RangeSet, RangeSet | None, int, int]] = []
        """``(message, op, ranges, covered, index, t)``: the engine runs ``op`` on
        ``ranges``, the answer covers ``covered`` (None: all of a bundled read); index -1
        for a message's own op, else the read's index in a bundle; ``t`` its position."""
        self.feeds: list[tuple[Message, RangeSet, int]] = []
        """Changes reads: answered from the change log, after this batch's writes."""
        self.bundles: dict[int, list[Any]] = {}
        """``[message, answers, whole]`` of each bundle (by ``id``): a whole read bundle
        collects its results alone, for a ``Whole``, until an engine rejects one of its
        reads."""
        self.writes: set[int] = set()
        """Bundles of writes (by ``id``), answered only for rejected writes."""

    def run(self) -> None:
        core = self.core
        batch = self.batch
        plain = _plain(batch, core.engine.placement.ordered, core.catalog_held)
        if not plain and self._reads():
            return
        refused: dict[int, BadOperation] = {}
        changed: Any = None
        if plain:
            n = len(batch)
            if core._positions:
                ops: list[Any] = [(m.payload, r, t) for m, r, t in batch]
            else:
                ops = [(m.payload, r) for m, r, _ in batch]
        else:
            items = self.items
            for m, mine, t in batch:
                h = m.header
                if _READS in h or _COUNT in h:
                    self._item(m, mine, t)
                else:  # a write of its own (most items): its op, on its part
                    self._write(m, m.payload, mine, -1, t)
            n = len(items)
            refused = self._refused()
            if core._positions:
                ops = [(op, r, t) for _, op, r, _, _, t in items]
            else:
                ops = [(op, r) for _, op, r, _, _, _ in items]
            if refused:
                ops = [op for j, op in enumerate(ops) if j not in refused]
        try:
            if core._wholes:
                self._wholes()
            if core._logged:
                results, changed = core.engine.apply_logged(ops)  # type: ignore[attr-defined]
            else:
                results = core.engine.apply(ops)
        except Exception as e:
            core.stop(f"engine failed: {type(e).__name__}: {e}")
            return
        if refused and len(results) == len(ops):
            results, changed = _spliced(results, changed, refused, n)
        if len(results) != n or (changed is not None and len(changed) != n):
            core.stop("engine returned a wrong number of results")
            return
        core.stats.applied += len(batch)
        if plain:
            if changed is not None:  # no reads among them: every change, in order
                pending = [(t, c) for (_, _, t), c in zip(batch, changed, strict=True) if c]
                core.changes.record_all(pending, core.now)
            if results.count(None) != n:  # some write was rejected: answer it
                self.items = [(m, m.payload, r, r, -1, t) for m, r, t in batch]
                self._answer(results, {})
            return
        revised = self._record(changed) if changed is not None else {}
        self._answer(results, revised)
        for m, mine, t in self.feeds:
            self._feed(m, mine, t)

    def _reads(self) -> bool:
        """A batch of read bundles and nothing else (sequential reads under load): each
        answered from one engine call for the batch, without the per-read items, the
        refusal pass and the answer bookkeeping of a mixed batch (reads change nothing,
        so their order within the batch is free).  False, with nothing done, for any
        other batch, or on a copy with gaps."""
        core = self.core
        batch = self.batch
        if core.incomplete:
            return False
        for m, _, _ in batch:
            h = m.header
            if _COUNT not in h or _READS not in h:
                return False
        bundles = []
        ops: list[Any] = []
        for m, mine, t in batch:
            items, whole = _bundle_items(core, m, mine)
            if items is None:
                rid = m.header.get(H.REQUEST, m.id)
                core.send(m.sender, Answer(rid, NOTHING, None, MALFORMED_BUNDLE, None, True))
                continue
            bundles.append((m, t, items, whole, len(ops)))
            ops += _read_ops(core, items, t)
        try:
            results = core.engine.apply(ops)
        except Exception as e:
            core.stop(f"engine failed: {type(e).__name__}: {e}")
            return True
        if len(results) != len(ops):
            core.stop("engine returned a wrong number of results")
            return True
        core.stats.applied += len(batch)
        for m, t, items, whole, start in bundles:
            mine = results[start : start + len(items)]
            core.stats.rejected += _answer_reads(core, m, items, whole, mine, t)
        return True

    def _refused(self) -> dict[int, BadOperation]:
        """The writes refused whole, never applied (:func:`refusal`), by item index."""
        out = {}
        ordered = self.core.engine.placement.ordered
        # The messages (by ``id``) from others than maintainers that may name a view's
        # definition: under range partitioning, almost never one.
        catalog = {
            id(m) for m, _, _ in self.batch
            if not m.sender.startswith(MAINTAINER) and H.READS not in m.header
            and may_reach_catalog(m.header, ordered)
        }  # fmt: skip
        for j, (m, op, _, _, _, t) in enumerate(self.items):
            # Only views' rows and definitions can be: the rest pass without a call.
            if type(op) is not tuple or not op:
                continue
            if op[0] in _REFUSABLE:
                named = False
            elif catalog and id(m) in catalog and names_catalog(op):
                named = True
            else:
                continue
            if H.READS not in m.header and (why := refusal(m.sender, op, t, named)):
                out[j] = BadOperation(why)
        return out

    def _wholes(self) -> None:
        """Hand an engine that keeps them (``whole``) every write of each message that
        reaches beyond this replica's ranges: after a crash of the whole cluster, the
        replicas that missed the message are brought level from any one that has it,
        all of it (a replica applies only its part of a write; none that was refused)."""
        engine: Any = self.core.engine
        ordered = engine.placement.ordered
        for m, mine, t in self.batch:
            h = m.header
            full = written(h)
            if H.READS in h or full is None or covers(mine, full):
                continue
            catalog = may_reach_catalog(h, ordered)
            if H.COUNT not in h:
                kept = [_whole(m.sender, (m.payload, full), t, catalog)]
            elif (subs := unbundle(m)) is not None:
                # every write of it, this replica's or not: a refused one is no part of it
                kept = [_whole(m.sender, sub, t, catalog) for sub in subs]
            else:
                continue
            if any(kept):
                engine.whole(t, [sub for sub in kept if sub])

    def _record(self, changed: list[Any]) -> dict[int, Any]:
        """Log the batch's changes in position order, and look each revisions read's
        keys up between them, at its own position: a write after the read in the same
        batch is not in its answer.  The revisions by item index.  A view's rows
        (``version`` writes) are not logged: they are read as the view, never as a
        feed, and logging each row's whole version chain was a tenth of a storage
        process's work with one index view."""
        core = self.core
        revised: dict[int, Any] = {}
        pending: list[tuple[int, Any]] = []
        for j, (item, c) in enumerate(zip(self.items, changed, strict=True)):
            m = item[0]
            if H.REVISIONS in m.header and H.READS in m.header and item[4] < 0:
                core.changes.record_all(pending, core.now)
                pending = []
                revised[j] = core.changes.revisions_of(m.payload[1], item[3] or NOTHING)
            elif c and not is_version_op(item[1]):
                pending.append((item[5], c))
        core.changes.record_all(pending, core.now)
        return revised

    def _feed(self, m: Message, mine: RangeSet, t: int) -> None:
        core = self.core
        rid = m.header.get(H.REQUEST, m.id)
        covered, found, error = feed_answer(
            core.changes if core._logged else None, core.incomplete, m, mine, t
        )
        core.send(m.sender, Answer(rid, covered, found, error, t, True))
        if error is None and type(found) is list:
            # Where the read started (it may be asked again from there) and where the
            # next starts (the page's cut, or the read's position); by the ranges it
            # reads: a maintainer follows a feed for each group of views.
            since = m.header[H.SINCE]  # an int: feed_answer checked
            since = t if since == FROM_NOW else since
            resume = found[-1][0] if found and found[-1][1] is None else t
            feed = feed_key(m.header.get(H.READS))
            if core.holds.read(m.sender, resume, core.now, feed, t, since) and core.keyspace:
                # The other holders of what it read hear of it too: the next read of
                # these ranges may go to any of them, and one never asked could not hold.
                note = FeedRead(m.sender, feed, t, since, resume)
                peers = core.keyspace.overlapping(mine) - core.suspected - {core.me}
                for peer in sorted(peers):
                    core.send(peer, note)

    def _item(self, m: Message, mine: RangeSet, t: int) -> None:
        core = self.core
        h = m.header
        items = self.items
        if H.READS not in h:  # a bundle of writes (a write of its own is taken by run)
            subs = unbundle(m)
            writes = None if subs is None else write_items(subs, mine)
            if writes is None:
                rid = h.get(H.REQUEST, m.id)
                core.send(m.sender, Answer(rid, NOTHING, None, MALFORMED_BUNDLE, None, True))
                return
            self.bundles[id(m)] = [m, [], False, t]
            self.writes.add(id(m))
            for i, op, part in writes:
                self._write(m, op, part, i, t)
        elif H.COUNT in h:
            rid = h.get(H.REQUEST, m.id)
            reads, whole = (None, False) if core.incomplete else _bundle_items(core, m, mine)
            if reads is None:  # nothing answered from a copy with gaps, or malformed
                error = None if core.incomplete else MALFORMED_BUNDLE
                core.send(m.sender, Answer(rid, NOTHING, None, error, None, True))
                return
            self.bundles[id(m)] = [m, [], whole, t]
            items.extend((m, op, piece, c, i, t) for i, op, piece, c in reads)
        elif H.SINCE in h:
            self.feeds.append((m, mine, t))
        else:
            op = m.payload
            if H.REVISIONS in h:
                op = revised_op(op, core._logged)
                if type(op) is str:
                    rid = h.get(H.REQUEST, m.id)
                    core.send(m.sender, Answer(rid, mine, None, op, t, True))
                    return
            if not core.engine.is_read(op):
                rid = h.get(H.REQUEST, m.id)
                core.send(m.sender, Answer(rid, mine, None, not_a_read(op), t, True))
                return
            if not core.incomplete:
                items.extend((m, op, p, p, -1, t) for p in core._pieces(mine))
            else:
                items.append((m, op, mine, mine, -1, t))

    def _write(self, m: Message, op: Any, part: RangeSet, i: int, t: int) -> None:
        """Item(s) for write ``op`` (index ``i`` of a bundle, -1 alone) on ``part``: one
        per segment of the ring it reaches.

        Every holder of a segment holds all of it, but the holders of one segment need
        not hold the next: run whole, a write whose validity depends on the data (an
        append to a key that holds no list, a version of a row that is no chain, a
        table's insert of a row that exists) was refused at a replica holding a bad key
        and applied at one holding only its other keys, and the replicas of those keys
        disagreed for good (a hypothesis test of random client messages found it).  Run
        per segment, each piece's outcome depends on that segment's data alone, the same
        at every holder: a write is all or nothing within each segment it reaches."""
        if type(op) is tuple and op and op[0] == "delete_range":
            part = _deletable(m.sender, part)
            if not part:
                return  # all of it views' rows (unanswered: a range delete is not)
        if (len(part) == 1 and _one_key(part[0])) or mutations.on(WRITES_WHOLE):
            self.items.append((m, op, part, part, i, t))
            return
        # One that waited for a copy, across a keyspace change: cut where the ring was.
        then = self.cuts.get(id(m)) if self.cuts else None
        pieces = self.core._pieces(part) if then is None else cut(part, then.segments())
        for piece in pieces:
            self.items.append((m, op, piece, piece, i, t))

    def _answer(self, results: list[Any], revised: dict[int, Any]) -> None:
        core = self.core
        bundles, writes = self.bundles, self.writes
        counted: Any = None
        for j, ((m, _, _, mine, i, t), res) in enumerate(zip(self.items, results, strict=True)):
            bad = isinstance(res, BadOperation)
            if bad and counted != (id(m), i):  # a read's pieces are one operation
                counted = (id(m), i)
                core.stats.rejected += 1
            if i >= 0:
                entry = bundles[id(m)]
                if entry[2] and not bad:  # a whole bundle: read i's result is the i-th
                    entry[1].append(res)
                elif id(m) not in writes:
                    if entry[2]:  # its first rejection: it is answered read by read
                        entry[1] = [(j, None, r, None) for j, r in enumerate(entry[1])]
                        entry[2] = False
                    entry[1].append((i, mine, None, str(res)) if bad else (i, mine, res, None))
                elif bad:
                    entry[1].append((i, mine, None, str(res)))
                continue
            h = m.header
            # Reads are answered; writes when the client asked (an operation whose
            # validity depends on the data, such as an append) or when rejected.
            if H.READS in h or bad or h.get(H.ANSWER):
                rid = h.get(H.REQUEST, m.id)
                if core.incomplete and not bad:
                    mine = NOTHING  # never answer from a copy with gaps
                if bad:
                    core.send(m.sender, Answer(rid, mine, None, str(res), t, True))
                else:
                    if H.REVISIONS in h and H.READS in h:  # its keys' revisions, then
                        res = [res, revised.get(j, []) if mine else []]
                    core.send(m.sender, Answer(rid, mine, res, None, t, True))
        for m, answers, whole, t in bundles.values():
            rid = m.header.get(H.REQUEST, m.id)
            if whole:
                core.send(m.sender, Whole(rid, t, tuple(answers)))
            elif answers or id(m) not in writes:
                core.send(m.sender, Answers(rid, t, True, tuple(answers)))


def _plain(batch: list[tuple[Message, RangeSet, int]], ordered: bool, held: bool) -> bool:
    """Is every item of ``batch`` a write of its own that asks for no answer and is no
    view's rows or definition (most batches under writes)?  Then nothing can be
    refused, every change is logged, only a rejected write is answered, and the engine's
    operations are taken from the batch as it is.  A write of more than one key may
    reach more than one segment: it takes the general road, which applies it segment
    by segment (:meth:`Apply._write`).  ``held``: whether this process ever held a
    view's definition (``StorageCore.catalog_held``); until it has, the key of a write
    of one key delivered here (its header's, ``may_reach_catalog``) names none."""
    for m, mine, _ in batch:
        h = m.header
        op = m.payload
        if (
            _READS in h
            or _COUNT in h
            or _ANSWER in h
            or (type(op) is tuple and op and op[0] in _GUARDED)
            or len(mine) != 1
            or (_WRITES in h and not _one_key(mine[0]))  # (else a header of one key)
            or (
                names_catalog(op)  # a view's definition? (the header tells no key)
                if not ordered
                else (held and _CATALOG_LO <= mine[0][0] < _CATALOG_HI)
                if _WRITES not in h
                else may_reach_catalog(h, True) and names_catalog(op)
            )
        ):
            return False
    return True


def _one_key(r: tuple[Any, Any]) -> bool:
    """Does range ``r`` (placement space) hold one key alone, ``[k, k + (0,))``?"""
    lo, hi = r
    return len(hi) == len(lo) + 1 and hi[-1] == 0


def _spliced(
    results: list[Any], changed: Any, refused: dict[int, BadOperation], n: int
) -> tuple[list[Any], Any]:
    """The engine's ``results`` (and ``changed``) of the items it ran, with the
    ``refused`` ones' refusals (and no changes) put back in their places among ``n``."""
    done = iter(results)
    out = [refused[j] if j in refused else next(done) for j in range(n)]
    if changed is None:
        return out, None
    made = iter(changed)
    return out, [() if j in refused else next(made) for j in range(n)]
