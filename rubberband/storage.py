"""The storage process core: an engine fed in delivery order, and partial live migration.

Sans-IO (dissertation 4.4.1, 5.4).  The host hands it E-Cast deliveries in ``t`` order and
direct messages from peers; it returns :data:`Output` tuples: direct messages to send,
configuration messages to submit, or a stop.  The host runs it on one worker thread (its
engine may block), never two calls at once.

**Order.**  Every delivered operation and instruction runs at its position in the total
order, or later but as if there: an item whose ranges overlap a range still being
received (or an item queued before it) waits in a queue, everything else runs at once.
When a receive completes, the queue drains in order.  So a write to a range arrives
before the range's base and is applied after it, a read of it waits for it, and a send
or delete of it runs after the writes that preceded it, whatever the transfer's speed.

**Migration.**  A keyspace message carries instructions (:mod:`rubberband.optimizer`).
A ``copy`` makes the source open a consistent cursor on the ranges at the message's
position and the destination pull it in bounded chunks over the direct channel (the
receiver paces the sender; nothing unbounded is buffered on either side).  A ``delete``
runs at its position: the engine's cursors are snapshots, so a delete never reaches into
a send opened before it.  Transfers are named by ``(t, index)``: the keyspace message's
position and the instruction's index, the same on both sides.  When every instruction of
a keyspace message that concerns this process is done, it submits ``ready``; until then
the routers keep reads away from it where another replica exists.

**Failures.**  A source suspected mid-transfer leaves its receiver *incomplete*: it
submits ``incomplete``, the routers send it no more reads, and a super repairs it (replace
or contract).  An engine error other than a :class:`BadOperation` stops the process
(fail-stop): a replica never skips a write and carries on.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ecast import KIND, SUSPECT, Message, NodeId
from rubberband.config import (
    BUNDLE,
    KEYSPACE,
    STORAGE,
    SUPER,
    incomplete_header,
    ready_header,
)
from rubberband.keys import (
    NOTHING,
    RangeSet,
    clip,
    covers,
    difference,
    intersect,
    is_range_set,
    overlaps,
    union,
)
from rubberband.optimizer import Copy, Delete, instructions_from_wire
from rubberband.placement import BadKeyspace, Keyspace
from storage_adapters.base import BadOperation, Engine, Placement, SendCursor

Output = tuple[Any, ...]
"""``("direct", dst, payload)``, ``("submit", header, payload)`` or ``("stop", reason)``."""

CHUNK_BYTES = 256 * 1024
_NOW = 1 << 62
"""A position after everything delivered so far (what blocks an answer given now)."""
TransferId = tuple[int, int]

# Direct message tags (first element of the payload).
RESULT = "res"
"""storage -> client: ``("res", id, covered, result, error, position, ok)``.

``covered`` is the part of the request this answer is for (the request intersected with
what this process holds), ``error`` the message of a :class:`BadOperation` (else None).
``position`` and ``ok`` depend on the read: a sequential read has None and True; a
snapshot read the router's frontier and whether this process could answer as of it; a
basic read this process's keyspace version and whether the client's version matched."""
RESULTS = "resn"
"""storage -> client: ``("resn", id, position, ok, answers)``: the answers to a bundle of
reads (one message carrying many, see :data:`BUNDLE`); each answer is ``(index, covered,
result, error)`` for one read of the bundle and one piece of what this process holds of
it (:data:`rubberband.config.BUNDLE`), ``covered`` None for all of the read's ranges.
``position`` and ``ok`` as in :data:`RESULT`; a refusal or a malformed bundle is one
:data:`RESULT` for all of its reads.  A bundle of writes is answered only for the writes
the engine rejected, with the same message."""
WHOLE = "resw"
"""storage -> client: ``("resw", id, position, results)``: the answers to a bundle of
reads that this process answers every one of whole and without error (most bundles),
``results[i]`` for read ``i``, ``ok`` True.  :data:`RESULTS` says the same with an index,
a ``covered`` and an error beside every result: four objects a read that its responder
built and packed and its client unpacked and checked, for nothing in the common case."""
MALFORMED_BUNDLE = "a bundle is a tuple of (op, ranges) pairs, as many as its count"
"""The error every read of a malformed bundle gets (and a write bundle's sender: no
write of it is applied)."""
BASIC = "basic"
"""client -> storage: ``("basic", request_id, op, ranges, version)``: a basic read."""
STALE = "stale"
"""storage -> client: ``("stale", request_id, version, keyspace state)``: refresh and retry."""
PULL = "pull"
"""receiver -> source: ``("pull", tid, n)``: send chunk ``n``."""
CHUNK = "chunk"
"""source -> receiver: ``("chunk", tid, n, data, last)``."""
ABORT = "abort"
"""source -> receiver: ``("abort", tid)``: the source's own copy is incomplete (its
receive of those ranges was aborted), so the receiver's copy would be too."""
REFUSE = "refuse"
"""receiver -> source: ``("refuse", tid)``: a chunk was malformed or held keys outside
the copy's ranges; the receiver gave the transfer up (its ranges are broken, and a
super repairs it from another replica), so the source stops sending."""
MAX_EARLY_PULLS = 64
"""Pulls one storage process may have waiting for the keyspace message that makes us
its source (one per copy of a reconfiguration; a reconfiguration has a few)."""


class EngineFailed(RuntimeError):
    """The engine failed for a reason other than the operation: the process must stop."""


@dataclass
class _Incoming:
    src: NodeId
    ranges: RangeSet
    version: int
    t: int
    """The keyspace message's position: the receive blocks later items, not earlier."""
    next: int = 0
    started: bool = False


@dataclass
class _Outgoing:
    dst: NodeId
    ranges: RangeSet
    version: int
    cursor: SendCursor | None = None
    next: int = 0
    """The chunk number the receiver asked for and has not been sent yet (-1: none)."""
    asked: int = -1


@dataclass
class _Queued:
    """An item that waits for a range being received: a data message or an instruction."""

    ranges: RangeSet
    msg: Message | None = None
    t: int = 0
    action: tuple[Any, ...] = ()


@dataclass
class StorageStats:
    applied: int = 0
    rejected: int = 0
    queued_max: int = 0
    reads_held: int = 0
    """Sequential reads that had to wait for a copy into this process.  The config sends
    reads to a receiver still being filled only when no other holder of the range is
    left (4.4.1), so outside double faults this stays at zero; the fault-injection suite
    checks that it does."""
    chunks_sent: int = 0
    chunks_received: int = 0
    chunks_refused: int = 0
    transfers: dict[str, int] = field(default_factory=lambda: {"in": 0, "out": 0, "aborted": 0})


class StorageCore:
    """One storage process: standby until a keyspace message places it on the ring."""

    MUTATIONS = frozenset({"delete_before_send", "mute_answers"})
    """Planted bugs (tests only: ``rubberband storage --mutation NAME`` under
    ``ECAST_TEST_MUTATIONS=1``, or the simulator's ``--mutation``)."""

    @classmethod
    def plant(cls, name: str) -> None:
        """Switch a planted bug on in this process, for every storage core."""
        if name not in cls.MUTATIONS:
            raise ValueError(f"unknown mutation {name!r}; known: {', '.join(cls.MUTATIONS)}")
        if name == "mute_answers":
            # No client ever hears from a storage process: every read and every answered
            # write waits out its timeout (what must still end a run).
            for method in ("deliver", "deliver_unsafe", "direct"):
                orig = getattr(cls, method)

                def muted(core: StorageCore, *args: Any, _orig: Any = orig) -> list[Output]:
                    return [
                        o
                        for o in _orig(core, *args)
                        if not (o[0] == "direct" and str(o[1]).startswith("client:"))
                    ]

                setattr(cls, method, muted)
            return
        # A keyspace message's deletes run before its copies open their cursors: a
        # process that both sends a range and deletes it sends nothing.
        orig = cls._keyspace

        def keyspace(core: StorageCore, t: int, msg: Message, out: list[Output]) -> None:
            h = dict(msg.header)
            h["ins"] = tuple(sorted(h.get("ins", ()), key=lambda i: i[0] != "delete"))
            orig(core, t, msg._replace(header=h), out)

        cls._keyspace = keyspace  # type: ignore[method-assign]

    def __init__(self, me: NodeId, engine: Engine, *, chunk_bytes: int = CHUNK_BYTES) -> None:
        if not me.startswith(STORAGE):
            raise ValueError(f"a storage process is named {STORAGE}..., not {me!r}")
        self.me = me
        self.engine = engine
        self.chunk_bytes = chunk_bytes
        self.keyspace: Keyspace | None = None
        """The keyspace mirror, from our join on (None before it)."""
        self.version = 0
        self.owned: RangeSet = NOTHING
        """What we answer for as of the last keyspace message delivered."""
        self.broken: RangeSet = NOTHING
        self.incomplete = False
        """A receive of ours was aborted while we were on the ring: the routers send us
        no reads until a super repairs us (contract or replace), and we answer none."""
        self._aborted: RangeSet = NOTHING
        self.suspected: set[NodeId] = set()
        """Processes the history suspected since our join (a transfer with one is void)."""
        """Ranges of aborted receives: a queued send of them aborts instead of sending."""
        """Ranges whose transfer was aborted: incomplete until a super repairs us."""
        self.incoming: dict[TransferId, _Incoming] = {}
        self.outgoing: dict[TransferId, _Outgoing] = {}
        self.early_pulls: dict[TransferId, tuple[NodeId, int]] = {}
        """Pulls for copies whose keyspace message we have not delivered yet."""
        self.delivered = -1
        """The position of the last message delivered to us."""
        self.last_refusal: str | None = None
        """Why the last chunk refused was refused (``status``)."""
        self.queue: list[_Queued] = []
        self._queued_ranges: RangeSet = NOTHING
        self.unfinished: dict[int, int] = {}
        """Keyspace version -> our instructions of it not yet done."""
        self.stopped: str | None = None
        self.stats = StorageStats()
        self._segment_cache: tuple[Keyspace, tuple[RangeSet, ...]] | None = None

    # ================================================================== inputs
    def joined(self, state: Any) -> list[Output]:
        """Our own join was delivered with the config's state (``joiner_state``)."""
        rb = state.get("rubberband") if isinstance(state, dict) else None
        if not isinstance(rb, list | tuple) or len(rb) < 4:
            return self._stop("the join carried no Rubberband configuration")
        try:
            self.keyspace = Keyspace.from_state((rb[0], [(_tuple(e), p) for e, p in rb[3]]))
        except (BadKeyspace, TypeError, ValueError) as e:
            return self._stop(f"the join carried a bad keyspace: {e}")
        if rb[1] not in ("range", "hash"):
            return self._stop(f"the join carried an unknown partitioning {rb[1]!r}")
        if self.engine.placement.partitioning != rb[1]:
            # The cluster's partitioning, not the engine's default: under hash
            # partitioning every range this process is handed is one of hashes (5.3).
            self.engine.placement = Placement(rb[1])
        self.version = int(rb[2])
        self.owned = self.keyspace.partition(self.me)
        return []

    def deliver(self, items: Iterable[tuple[int, Message]]) -> list[Output]:
        """Deliveries in ``t`` order (E-Cast guarantees it); data runs in engine batches."""
        out: list[Output] = []
        batch: list[tuple[Message, RangeSet]] = []
        t = self.delivered
        for t, msg in items:  # the last position is kept below
            if self.stopped is not None:
                break
            h = msg.header
            kind = h.get(KIND) if type(h) is dict else None
            if kind is None:
                mine = self._mine(h)
                if mine is None:
                    continue
                if self._blocked(mine, t):
                    if "r" in h:
                        self.stats.reads_held += 1
                    self._enqueue(_Queued(mine, msg=msg, t=t))
                else:
                    batch.append((msg, mine))
                continue
            if batch:
                self._apply(batch, out)
                batch = []
            if kind == KEYSPACE and msg.sender.startswith(SUPER):
                self._keyspace(t, msg, out)
            elif kind == SUSPECT and msg.sender.startswith(SUPER):
                self._suspected(h.get("who"), out)
        if batch and self.stopped is None:
            self._apply(batch, out)
        self.delivered = t
        if self.early_pulls:
            self._expire_early_pulls()
        return out

    def deliver_unsafe(self, msg: Message, frontier: int | None, accepted: bool) -> list[Output]:
        """A snapshot read (4.5.2): answered at once if this process delivered exactly what
        the router had sent it when it routed the read (``accepted``) and holds every
        range of it in full; otherwise refused, and the client retries the whole read."""
        out: list[Output] = []
        h = msg.header
        if self.stopped is not None or type(h) is not dict or "r" not in h:
            return out
        mine = self._mine(h)
        if mine is None:
            return out
        ok = accepted and not self.incomplete and not self._blocked(mine, _NOW)
        if not ok:
            rid = h.get("q", msg.id)
            out.append(("direct", msg.sender, (RESULT, rid, mine, None, None, frontier, False)))
            return out
        if BUNDLE in h:
            self._answer_bundle(msg, mine, frontier, out)
        else:
            self._answer(msg.sender, h.get("q", msg.id), msg.payload, mine, frontier, out)
        return out

    def _answer_bundle(
        self, msg: Message, mine: RangeSet, position: Any, out: list[Output]
    ) -> None:
        rid = msg.header.get("q", msg.id)
        subs, whole = self._bundle_items(msg, mine)
        if subs is None:
            error = MALFORMED_BUNDLE
            out.append(("direct", msg.sender, (RESULT, rid, mine, None, error, position, True)))
            return
        try:
            results = self.engine.apply([(op, piece) for _, op, piece, _ in subs])
        except Exception as e:
            self._stop(f"engine failed: {type(e).__name__}: {e}", out)
            return
        whole = whole and len(results) == len(subs)
        if whole and not any(isinstance(r, BadOperation) for r in results):
            out.append(("direct", msg.sender, (WHOLE, rid, position, tuple(results))))
            return
        answers = tuple(
            (i, c, None, str(res)) if isinstance(res, BadOperation) else (i, c, res, None)
            for (i, _, _, c), res in zip(subs, results, strict=True)
        )
        out.append(("direct", msg.sender, (RESULTS, rid, position, True, answers)))

    def _bundle_items(
        self, msg: Message, mine: RangeSet
    ) -> tuple[list[tuple[int, Any, RangeSet, RangeSet | None]] | None, bool]:
        """A bundle's reads cut at the ring's segments (as :meth:`_pieces` cuts one read):
        ``(index, op, piece, covered)`` for each read and each piece of what this process
        holds of the bundle that the read's ranges meet, ``covered`` being what the read
        has of the piece, None where that is the whole read (most reads: the answer then
        need not repeat the read's ranges back to its client); None for a malformed
        bundle.  And whether every read is one item, whole, in payload order (the
        bundle can then be answered with :data:`WHOLE`).

        The engine runs each read on the whole ``piece``: a part of the header's union,
        which :meth:`_mine` checked, never the read's own ranges, which nobody checked.
        An engine answers an operation for the part of a range set the operation
        touches, so the answer is the read's answer for ``covered``; a client that lies
        about a read's ranges misleads only itself."""
        subs = _unbundle(msg)
        if subs is None:
            return None, False
        pieces = self._pieces(mine)
        # Each range of every piece, by its lower bound: a read of one range inside one
        # of them (most reads) finds its piece by one bisection instead of a clip per
        # piece; any other read is clipped to every piece.
        spans = sorted((lo, hi, piece) for piece in pieces for lo, hi in piece)
        los = [lo for lo, _, _ in spans]
        items: list[tuple[int, Any, RangeSet, RangeSet | None]] = []
        whole = 0
        try:
            for i, sub in enumerate(subs):
                if type(sub) is not tuple or len(sub) != 2 or type(sub[1]) is not tuple:
                    return None, False
                op, ranges = sub
                if len(ranges) == 1:
                    one = ranges[0]
                    if type(one) is not tuple or len(one) != 2:
                        return None, False
                    k = bisect_right(los, one[0]) - 1
                    if k >= 0 and one[1] <= spans[k][1] and one[0] < one[1]:
                        items.append((i, op, spans[k][2], None))  # the read, whole
                        whole += 1
                        continue
                    for piece in pieces:  # at most f: the segments this process holds
                        part = clip(one, piece)
                        if part:
                            items.append((i, op, piece, part))
                    continue
                for piece in pieces:
                    part = intersect(ranges, piece)
                    if part:
                        items.append((i, op, piece, part))
        except (TypeError, ValueError, IndexError):  # ranges that are not range sets
            return None, False
        return items, whole == len(subs) == len(items)

    def _answer(
        self, to: NodeId, rid: Any, op: Any, mine: RangeSet, position: Any, out: list[Output]
    ) -> None:
        pieces = self._pieces(mine)
        try:
            results = self.engine.apply([(op, piece) for piece in pieces])
        except Exception as e:
            self._stop(f"engine failed: {type(e).__name__}: {e}", out)
            return
        for piece, res in zip(pieces, results, strict=True):
            if isinstance(res, BadOperation):
                out.append(("direct", to, (RESULT, rid, piece, None, str(res), position, True)))
            else:
                out.append(("direct", to, (RESULT, rid, piece, res, None, position, True)))

    def _pieces(self, mine: RangeSet) -> list[RangeSet]:
        """A read's ranges cut at the ring's segments, answered one piece each.

        Replicas of a segment cut it alike, so a client that hears from two replicas for
        one segment (each answers all it holds of the read) keeps one piece whole and
        drops the other whole.  Without the cut, answers overlap in part, and an answer
        that cannot be trimmed to a range (an aggregate, rows projected without their
        key) would be counted twice.  A point read touches one segment: one piece."""
        ks = self.keyspace
        if ks is None or not mine:
            return [mine]
        cached = self._segment_cache
        if cached is None or cached[0] is not ks:
            held = tuple(p for p in (intersect(seg, self.owned) for seg in ks.segments()) if p)
            cached = self._segment_cache = (ks, held)
        pieces = [p for p in (intersect(mine, seg) for seg in cached[1]) if p]
        return pieces or [mine]

    def _basic(self, src: NodeId, payload: tuple[Any, ...], out: list[Output]) -> None:
        """A basic read (4.5.2): straight from the client, answered from the current state
        if the client routed it by this process's keyspace version; only the ranges held
        in full are answered (``covered``), the client asks another replica for the rest."""
        _, rid, op, ranges, version = payload
        if type(ranges) is not tuple or not is_range_set(ranges) or type(version) is not int:
            return
        if version != self.version or self.keyspace is None:
            state = self.keyspace.to_state() if self.keyspace is not None else None
            out.append(("direct", src, (STALE, rid, self.version, state)))
            return
        mine = (
            NOTHING
            if self.incomplete
            else difference(intersect(ranges, self.owned), self.receiving)
        )
        if self.queue:
            mine = difference(mine, self._queued_ranges)
        self._answer(src, rid, op, mine, self.version, out)

    def direct(self, src: NodeId, payload: Any) -> list[Output]:
        """A peer's pull or chunk, or a client's basic read."""
        out: list[Output] = []
        if self.stopped is not None or type(payload) is not tuple or not payload:
            return out
        tag = payload[0]
        if tag == BASIC and len(payload) == 5:
            self._basic(src, payload, out)
        elif tag == PULL and len(payload) == 3:
            tid, n = _tid(payload[1]), payload[2]
            if tid is None or type(n) is not int:
                return out
            send = self.outgoing.get(tid)
            if send is None or send.dst != src:
                self._early_pull(src, tid, n)
                return out
            send.asked = n
            self._serve(tid, send, out)
        elif tag == REFUSE and len(payload) == 2:
            tid = _tid(payload[1])
            send = self.outgoing.get(tid) if tid is not None else None
            if send is not None and send.dst == src:
                if send.cursor is not None:
                    send.cursor.close()
                del self.outgoing[tid]  # type: ignore[arg-type]
                self.stats.transfers["aborted"] += 1
                self._maybe_ready(send.version, out)
        elif tag == ABORT and len(payload) == 2:
            tid = _tid(payload[1])
            rec = self.incoming.get(tid) if tid is not None else None
            if rec is not None and rec.src == src:
                self._abort_incoming(tid, rec, out)  # type: ignore[arg-type]
                self._drain(out)
        elif tag == CHUNK and len(payload) == 5:
            tid = _tid(payload[1])
            rec = self.incoming.get(tid) if tid is not None else None
            if rec is None or rec.src != src or not rec.started or payload[2] != rec.next:
                return out
            self._received(tid, rec, payload[3], bool(payload[4]), out)  # type: ignore[arg-type]
        return out

    def _early_pull(self, src: NodeId, tid: TransferId, n: int) -> None:
        """A pull that came before the keyspace message that makes us its source (the
        receiver delivered it first).  Kept only from a storage process, only for a
        position we have not delivered yet, and at most ``MAX_EARLY_PULLS`` per process:
        junk from anyone else can neither fill the table nor push a real pull out.
        Those whose position we delivered go then, unless their send waits in our queue
        (behind a receive of ours)."""
        if not src.startswith(STORAGE) or (
            tid[0] <= self.delivered and tid not in self._queued_sends()
        ):
            return
        pulls = self.early_pulls
        if tid not in pulls and sum(1 for s, _ in pulls.values() if s == src) >= MAX_EARLY_PULLS:
            return
        pulls[tid] = (src, n)

    def _expire_early_pulls(self) -> None:
        queued = self._queued_sends()
        self.early_pulls = {
            tid: pull
            for tid, pull in self.early_pulls.items()
            if tid[0] > self.delivered or tid in queued
        }

    def _queued_sends(self) -> set[TransferId]:
        return {q.action[1] for q in self.queue if q.action[:1] == ("send",)}

    # ================================================================== data
    def _mine(self, h: Any) -> RangeSet | None:
        ranges = h.get("w") if type(h) is dict else None
        if ranges is None and type(h) is dict:
            ranges = h.get("r")
        if type(ranges) is not tuple or not is_range_set(ranges):
            return None
        return intersect(ranges, self.owned)

    def _blocked(self, ranges: RangeSet, t: int) -> bool:
        """Whether an item at position ``t`` must wait: it overlaps a receive begun by an
        earlier keyspace message, or an item already waiting (which is earlier)."""
        # Checked for every delivery: most find nothing queued and nothing being received,
        # and return before building a generator (a tenth of a storage process's time
        # under writes went here).
        if self._queued_ranges and overlaps(ranges, self._queued_ranges):
            return True
        if not self.incoming:
            return False
        return any(rec.t < t and overlaps(ranges, rec.ranges) for rec in self.incoming.values())

    @property
    def receiving(self) -> RangeSet:
        r: RangeSet = NOTHING
        for rec in self.incoming.values():
            r = union(r, rec.ranges)
        return r

    def _enqueue(self, item: _Queued) -> None:
        self.queue.append(item)
        # An item inside a range still being received (a receive begun before it) needs
        # no entry of its own: whatever overlaps it overlaps that receive too, and waits
        # for it anyway.  Entering every one made each write to a busy range re-sort a
        # union of thousands of points, so a receiver under load fell further behind
        # with every write and its migration never finished.
        t, ranges = item.t, item.ranges
        for rec in self.incoming.values():
            if rec.t < t and covers(rec.ranges, ranges):
                break
        else:
            self._queued_ranges = union(self._queued_ranges, ranges)
        if len(self.queue) > self.stats.queued_max:
            self.stats.queued_max = len(self.queue)

    def _apply(self, batch: list[tuple[Message, RangeSet]], out: list[Output]) -> None:
        items: list[tuple[Message, Any, RangeSet, RangeSet | None, int]] = []
        """``(message, op, ranges, covered, index)``: the engine runs ``op`` on
        ``ranges``, the answer covers ``covered`` (None: all of a bundled read); index -1
        for a message's own op, else the read's index in a bundle (see
        :meth:`_bundle_items`)."""
        bundles: dict[int, list[Any]] = {}
        """``[message, answers, whole]`` of each bundle (by ``id``): a whole read bundle
        (:meth:`_bundle_items`) collects its results alone, for :data:`WHOLE`, until an
        engine rejects one of its reads."""
        writes: set[int] = set()
        """Bundles of writes (by ``id``), answered only for rejected writes."""
        for m, mine in batch:
            h = m.header
            if "r" not in h:
                if BUNDLE not in h:
                    items.append((m, m.payload, mine, mine, -1))
                    continue
                subs = self._write_items(m, mine)
                if subs is None:
                    rid = h.get("q", m.id)
                    answer = (RESULT, rid, NOTHING, None, MALFORMED_BUNDLE, None, True)
                    out.append(("direct", m.sender, answer))
                    continue
                bundles[id(m)] = [m, [], False]
                writes.add(id(m))
                items.extend((m, op, part, part, i) for i, op, part in subs)
            elif BUNDLE in h:
                rid = h.get("q", m.id)
                subs, whole = (None, False) if self.incomplete else self._bundle_items(m, mine)
                if subs is None:  # nothing answered from a copy with gaps, or malformed
                    error = None if self.incomplete else MALFORMED_BUNDLE
                    answer = (RESULT, rid, NOTHING, None, error, None, True)
                    out.append(("direct", m.sender, answer))
                    continue
                bundles[id(m)] = [m, [], whole]
                items.extend((m, op, piece, c, i) for i, op, piece, c in subs)
            elif not self.incomplete:
                items.extend((m, m.payload, p, p, -1) for p in self._pieces(mine))
            else:
                items.append((m, m.payload, mine, mine, -1))
        try:
            results = self.engine.apply([(op, r) for _, op, r, _, _ in items])
        except Exception as e:
            self._stop(f"engine failed: {type(e).__name__}: {e}", out)
            return
        if len(results) != len(items):
            self._stop("engine returned a wrong number of results", out)
            return
        self.stats.applied += len(batch)
        counted: Any = None
        for (m, _, _, mine, i), res in zip(items, results, strict=True):
            bad = isinstance(res, BadOperation)
            if bad and counted != (id(m), i):  # a read's pieces are one operation
                counted = (id(m), i)
                self.stats.rejected += 1
            if i >= 0:
                entry = bundles[id(m)]
                if entry[2] and not bad:  # a whole bundle: read i's result is the i-th
                    entry[1].append(res)
                elif id(m) not in writes:
                    if entry[2]:  # its first rejection: it is answered read by read
                        entry[1] = [(j, None, r, None) for j, r in enumerate(entry[1])]
                        entry[2] = False
                    answer = (i, mine, None, str(res)) if bad else (i, mine, res, None)
                    entry[1].append(answer)
                elif bad:
                    entry[1].append((i, mine, None, str(res)))
                continue
            h = m.header
            # Reads are answered; writes when the client asked ("a": an operation whose
            # validity depends on the data, such as an append) or when rejected.
            if "r" in h or bad or h.get("a"):
                rid = h.get("q", m.id)
                if self.incomplete and not bad:
                    mine = NOTHING  # never answer from a copy with gaps
                payload = (RESULT, rid, mine, None if bad else res, str(res) if bad else None)
                out.append(("direct", m.sender, (*payload, None, True)))
        for m, answers, whole in bundles.values():
            rid = m.header.get("q", m.id)
            if whole:
                out.append(("direct", m.sender, (WHOLE, rid, None, tuple(answers))))
            elif answers or id(m) not in writes:
                out.append(("direct", m.sender, (RESULTS, rid, None, True, tuple(answers))))

    def _write_items(self, msg: Message, mine: RangeSet) -> list[tuple[int, Any, RangeSet]] | None:
        """A write bundle's writes that touch what this process holds of it: ``(index,
        op, part)``, the engine applying ``op`` to ``part`` only, in payload order; None
        for a malformed bundle.

        ``part`` is the write's own ranges (which nobody checked) clipped to ``mine``
        (the header's range, which :meth:`_mine` checked, and what this process holds
        of it): an engine applies a write to the part of a range set it is given, so a
        write whose ranges do not name one of its keys changes that key nowhere, on no
        replica.  The whole bundle is checked before anything is applied, the same way
        on every replica (what a process holds plays no part in it): a malformed write
        anywhere in it, and no replica applies any."""
        subs = _unbundle(msg)
        if subs is None:
            return None
        for sub in subs:
            if type(sub) is not tuple or len(sub) != 2 or not is_range_set(sub[1]):
                return None
        items: list[tuple[int, Any, RangeSet]] = []
        for i, (op, ranges) in enumerate(subs):
            part = clip(ranges[0], mine) if len(ranges) == 1 else intersect(ranges, mine)
            if part:
                items.append((i, op, part))
        return items

    # ================================================================== reconfiguration
    def _keyspace(self, t: int, msg: Message, out: list[Output]) -> None:
        h = msg.header
        ks = self.keyspace
        if ks is None:
            return
        op = h.get("op")
        try:
            if op[0] == "expand":
                new = ks.expand(_tuple(op[2]), op[1])
            elif op[0] == "contract":
                new = ks.contract(op[1])
            elif op[0] == "replace":
                new = ks.replace(op[1], op[2])
            else:
                new = ks.rebalance(op[1], _tuple(op[2]))
            instructions = instructions_from_wire(h.get("ins", ()))
        except Exception as e:
            self._stop(f"cannot follow keyspace message {op!r:.80}: {e}", out)
            return
        old_owned = self.owned
        self.keyspace = new
        self.version += 1
        v = self.version
        self.owned = new.partition(self.me)
        me = self.me
        # Broken ranges we no longer hold are no longer our problem (a contract or a
        # replace repairs an incomplete process: it holds nothing afterwards).
        self.broken = intersect(self.broken, self.owned)
        if me not in new:
            self.incomplete = False  # repaired: off the ring, holding nothing
        mine = [
            ins
            for ins in instructions
            if (isinstance(ins, Copy) and me in (ins.src, ins.dst))
            or (isinstance(ins, Delete) and ins.process == me)
        ]
        # Involved as the routers count it: named by the operation or an instruction.
        if mine or me in op[1:]:
            self.unfinished[v] = len(mine)
        deleted = NOTHING
        for i, ins in enumerate(instructions):
            tid = (t, i)
            if isinstance(ins, Copy):
                if ins.src == me:
                    self._order(
                        _Queued(ins.ranges, t=t, action=("send", tid, ins.dst, ins.ranges, v)), out
                    )
                elif ins.dst == me:
                    self._start_receive(tid, ins.src, ins.ranges, v, out)
            elif ins.process == me:
                deleted = union(deleted, ins.ranges)
                self._order(_Queued(ins.ranges, t=t, action=("delete", ins.ranges, v)), out)
        if self.incomplete:
            # An incomplete process is no source and gets no copies (the super plans
            # around it until it repairs it): what it gains now, it gains without data.
            received = NOTHING
            for ins in mine:
                if isinstance(ins, Copy) and ins.dst == me:
                    received = union(received, ins.ranges)
            gained = difference(difference(self.owned, old_owned), received)
            if gained:
                self.broken = union(self.broken, gained)
        # Ranges we lose that no instruction deletes (nobody needed them) go at once.
        extra = difference(difference(old_owned, self.owned), deleted)
        if extra:
            self._order(_Queued(extra, t=t, action=("delete", extra, 0)), out)
        if v in self.unfinished:
            self._maybe_ready(v, out, count=0)

    def _order(self, item: _Queued, out: list[Output]) -> None:
        """Run an instruction now, or queue it behind what it must follow."""
        if self._blocked(item.ranges, item.t):
            self._enqueue(item)
        else:
            self._run_action(item.action, out)

    def _run_action(self, action: tuple[Any, ...], out: list[Output]) -> None:
        if action[0] == "send":
            _, tid, dst, ranges, v = action
            if dst in self.suspected:
                self._maybe_ready(v, out)  # nobody to send to any more
                return
            if overlaps(ranges, self._aborted) or overlaps(ranges, self.broken):
                out.append(("direct", dst, (ABORT, tid)))
                self._maybe_ready(v, out)
                return
            try:
                cursor = self.engine.open_send(ranges)
            except Exception as e:
                self._stop(f"engine failed to open a send: {e}", out)
                return
            send = _Outgoing(dst, ranges, v, cursor)
            self.outgoing[tid] = send
            self.stats.transfers["out"] += 1
            early = self.early_pulls.pop(tid, None)
            if early is not None and early[0] == dst:
                send.asked = early[1]
                self._serve(tid, send, out)
        elif action[0] == "pull":
            rec = self.incoming.get(action[1])
            if rec is not None and not rec.started:  # None: aborted meanwhile
                rec.started = True
                out.append(("direct", rec.src, (PULL, action[1], 0)))
        elif action[0] == "delete":
            _, ranges, v = action
            try:
                self.engine.delete(ranges)
            except Exception as e:
                self._stop(f"engine failed to delete: {e}", out)
                return
            if v:
                self._maybe_ready(v, out)

    def _start_receive(
        self, tid: TransferId, src: NodeId, ranges: RangeSet, v: int, out: list[Output]
    ) -> None:
        """The receive blocks later items at once; its first pull waits for every earlier
        item on its ranges (a delete queued before it must not erase what arrives)."""
        t = tid[0]
        self.stats.transfers["in"] += 1
        self.incoming[tid] = _Incoming(src, ranges, v, t)
        if src in self.suspected:  # the source was suspected before this message
            self._abort_incoming(tid, self.incoming[tid], out)
            return
        self._order(_Queued(ranges, t=t, action=("pull", tid)), out)

    def _serve(self, tid: TransferId, send: _Outgoing, out: list[Output]) -> None:
        if send.asked != send.next or send.cursor is None:
            return
        try:
            data = send.cursor.next_chunk(self.chunk_bytes)
        except Exception as e:
            self._stop(f"engine failed while sending: {e}", out)
            return
        last = data is None
        out.append(
            ("direct", send.dst, (CHUNK, tid, send.next, data if data is not None else (), last))
        )
        self.stats.chunks_sent += 1
        send.next += 1
        if last:
            send.cursor.close()
            del self.outgoing[tid]
            self._maybe_ready(send.version, out)

    def _received(
        self, tid: TransferId, rec: _Incoming, data: Any, last: bool, out: list[Output]
    ) -> None:
        if data:
            try:
                self.engine.receive(data, rec.ranges)
            except BadOperation as e:
                # Not the engine failing: the source sent what is no part of the copy.
                # Give the transfer up as for a source that failed: the ranges are
                # broken here, a super repairs us from another replica, and the
                # reconfiguration completes without our ready.
                self.stats.chunks_refused += 1
                self.last_refusal = f"a chunk from {rec.src} of transfer {tid}: {e}"
                out.append(("direct", rec.src, (REFUSE, tid)))
                self._abort_incoming(tid, rec, out)
                self._drain(out)
                return
            except Exception as e:
                self._stop(f"engine failed to receive: {e}", out)
                return
        self.stats.chunks_received += 1
        rec.next += 1
        if not last:
            out.append(("direct", rec.src, (PULL, tid, rec.next)))
            return
        del self.incoming[tid]
        self._aborted = difference(self._aborted, rec.ranges)  # whole again
        self._drain(out)
        self._maybe_ready(rec.version, out)

    def _drain(self, out: list[Output]) -> None:
        """Run queued items whose ranges are free now, in order; the rest keep waiting
        (an item also waits for any earlier queued item it overlaps)."""
        queue, self.queue = self.queue, []
        self._queued_ranges = NOTHING
        batch: list[tuple[Message, RangeSet]] = []
        for item in queue:
            if self.stopped is not None:
                return
            if self._blocked(item.ranges, item.t):
                self._enqueue(item)
                continue
            if item.msg is not None:
                batch.append((item.msg, item.ranges))
                continue
            if batch:
                self._apply(batch, out)
                batch = []
            self._run_action(item.action, out)
        if batch and self.stopped is None:
            self._apply(batch, out)

    def _maybe_ready(self, v: int, out: list[Output], count: int = 1) -> None:
        left = self.unfinished.get(v)
        if left is None:
            return
        left -= count
        if left <= 0:
            del self.unfinished[v]
            if not self.incomplete:
                out.append(("submit", ready_header(v), None))
        else:
            self.unfinished[v] = left

    # ================================================================== failures
    def _suspected(self, who: Any, out: list[Output]) -> None:
        if type(who) not in (list, tuple) or len(who) != 1 or type(who[0]) is not str:
            return
        gone = who[0]
        self.suspected.add(gone)
        for tid, rec in list(self.incoming.items()):
            if rec.src == gone:
                self._abort_incoming(tid, rec, out)
        for tid, send in list(self.outgoing.items()):
            if send.dst == gone:
                if send.cursor is not None:
                    send.cursor.close()
                del self.outgoing[tid]
                self.stats.transfers["aborted"] += 1
                self._maybe_ready(send.version, out)
        # Writes waiting for an aborted range run now: the range is broken (no reads come
        # here any more) but later transfers and deletes must not wait for ever.
        self._drain(out)

    def _abort_incoming(self, tid: TransferId, rec: _Incoming, out: list[Output]) -> None:
        """A receive that cannot complete: its ranges are broken here, and every copy of
        them this process was to send is broken too (the flood of 4.4.2's ranking)."""
        del self.incoming[tid]
        self.stats.transfers["aborted"] += 1
        lost = intersect(rec.ranges, self.owned)
        self.broken = union(self.broken, lost)
        if self.keyspace is not None and self.me in self.keyspace:
            self.incomplete = True
        # Reported even when we hold none of it any more: the routers must stop waiting
        # for our ready of that reconfiguration.
        out.append(("submit", incomplete_header(rec.version, rec.ranges), None))
        for otid, send in list(self.outgoing.items()):
            if overlaps(send.ranges, rec.ranges):
                if send.cursor is not None:
                    send.cursor.close()
                del self.outgoing[otid]
                out.append(("direct", send.dst, (ABORT, otid)))
                self._maybe_ready(send.version, out)
        # Sends still queued behind this receive abort when they come to run.
        self._aborted = union(self._aborted, rec.ranges)

    def _stop(self, reason: str, out: list[Output] | None = None) -> list[Output]:
        self.stopped = reason
        if out is not None:
            out.append(("stop", reason))
            return out
        return [("stop", reason)]

    # ================================================================== introspection
    def status(self) -> dict[str, Any]:
        return {
            "name": self.me,
            "version": self.version,
            "active": self.keyspace is not None and self.me in self.keyspace,
            "owned": self.owned,
            "receiving": self.receiving,
            "broken": self.broken,
            "incomplete": self.incomplete,
            "queued": len(self.queue),
            "reads_held": self.stats.reads_held,
            "transfers_in": len(self.incoming),
            "transfers_out": len(self.outgoing),
            "chunks_sent": self.stats.chunks_sent,
            "chunks_received": self.stats.chunks_received,
            "chunks_refused": self.stats.chunks_refused,
            "early_pulls": len(self.early_pulls),
            "last_refusal": self.last_refusal,
            "unfinished": len(self.unfinished),
            "stopped": self.stopped,
        }


def _unbundle(msg: Message) -> tuple[Any, ...] | None:
    """A bundle's payload unpacked: a tuple of as many items as its header counts, else
    None (whatever the bytes are, they are not a bundle)."""
    blob, n = msg.payload, msg.header.get(BUNDLE)
    if type(blob) is not bytes or type(n) is not int:
        return None
    try:
        subs = msgpack.unpackb(blob, use_list=False, raw=False, strict_map_key=False)
    except Exception:
        return None
    return subs if type(subs) is tuple and len(subs) == n else None


def _tid(value: Any) -> TransferId | None:
    if type(value) is tuple and len(value) == 2 and all(type(x) is int for x in value):
        return value  # type: ignore[return-value]
    return None


def _tuple(value: Any) -> Any:
    if type(value) in (list, tuple):
        return tuple(_tuple(v) for v in value)
    return value
