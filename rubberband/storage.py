"""The storage process core: an engine fed in delivery order, and its answers.

Sans-IO (dissertation 4.4.1, 5.4).  The host hands it E-Cast's upcalls (deliveries in
``t`` order, the process's own join) and direct messages from peers
(:mod:`rubberband.proto`); it returns ``ecast`` :class:`~ecast.Effects`: direct messages
to send, and in ``deliver`` messages to submit (:class:`~rubberband.outputs.Submit`) or
a stop (:class:`~rubberband.outputs.Stop`).  The host runs it on one worker thread (its
engine may block), never two calls at once.

**Order.**  Every delivered operation and instruction runs at its position in the total
order, or later but as if there: an item whose ranges overlap a range still being
received (or an item queued before it) waits in a queue, everything else runs at once.
When a receive completes, the queue drains in order.  So a write to a range arrives
before the range's base and is applied after it, a read of it waits for it, and a send
or delete of it runs after the writes that preceded it, whatever the transfer's speed.

**Reconfiguration.**  A keyspace message's instructions concern copies
(:mod:`rubberband.migration`) and deletes; a delete runs at its position, and the
engine's cursors are snapshots, so a delete never reaches into a send opened before it.
When every instruction of a keyspace message that concerns this process is done, it
submits ``ready``; until then the routers keep reads away from it where another replica
exists.

**Failures.**  An engine error other than a ``BadOperation`` stops the process
(fail-stop): a replica never skips a write and carries on.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ecast import JOIN, KIND, PART, ROUTERS, SUSPECT, Delivery, Direct, Effects, Message, NodeId
from ecast.core import mutations
from rubberband.applying import Apply, answer_bundle, not_a_read
from rubberband.bundles import Segments, unpacked
from rubberband.changelog import ChangeLog, peek_answer, revised_op
from rubberband.config import CLIENTS, STORAGE, SUPER
from rubberband.engine import BadOperation, Engine, Placement, changed_key
from rubberband.holds import FEED_KEY, Holds
from rubberband.keys import (
    AFTER_TAIL,
    NOTHING,
    Bounds,
    RangeSet,
    covers,
    difference,
    intersect,
    is_key_quick,
    is_range_set,
    overlaps,
    union,
)
from rubberband.migration import Migration
from rubberband.optimizer import Copy, Delete, instructions_from_wire
from rubberband.outputs import Stop, Submit
from rubberband.placement import BadKeyspace, Keyspace
from rubberband.proto import (
    KEYSPACE,
    REPORTED_CLIENTS,
    Abort,
    Answer,
    BasicRead,
    Chunk,
    FeedRead,
    H,
    History,
    LevelApply,
    LevelAsk,
    Peek,
    Pull,
    Refuse,
    Stale,
    ready_header,
)
from rubberband.restart import answer_level, drop_kept, restored
from rubberband.steps import short_batches as short_batches  # the host's judge of a step
from rubberband.versions import CATALOG_KEYS

CHUNK_BYTES = 256 * 1024
_NOW = 1 << 62
"""A position after everything delivered so far (what blocks an answer given now)."""
_KEY = H.KEY

DELETE_BEFORE_SEND = mutations.declare(
    "delete_before_send", "storage", "a keyspace message's deletes run before its sends open"
)
MUTE_ANSWERS = mutations.declare(
    "mute_answers", "storage", "no client ever hears from a storage process"
)
SKIP_VERSION_CHECK = mutations.declare(
    "skip_version_check", "storage", "basic reads answered whatever the client's version"
)
NO_RECEIVE_BUFFERING = mutations.declare(
    "no_receive_buffering", "storage", "writes to a range being received are applied at once"
)


@dataclass(slots=True)
class _Queued:
    """An item that waits for a range being received: a data message or an instruction."""

    ranges: RangeSet
    msg: Message | None = None
    t: int = 0
    action: tuple[Any, ...] = ()
    keyspace: Keyspace | None = None
    """The keyspace as of the message's position: a write is applied segment by
    segment, cut where the ring was then, as every replica that did not wait cut it
    (a later keyspace may cut it elsewhere)."""


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

    URGENT: tuple[type, ...] = (Pull, Chunk, Abort, Refuse, History)
    """Direct messages to take ahead of deliveries waiting for the engine: a pull
    answered, or a chunk taken in, only after thousands of writes made every round trip
    of a copy wait for the whole backlog (seconds on a slow engine).  They may: a source
    reads a snapshot taken at the keyspace message's position, and a receiver holds back
    every write to the ranges it receives until the copy is complete."""

    def __init__(
        self,
        me: NodeId,
        engine: Engine,
        *,
        chunk_bytes: int = CHUNK_BYTES,
        changes: ChangeLog | None = None,
        kept: tuple[NodeId, ...] | None = None,
        holds: Holds | None = None,
    ) -> None:
        """``kept``: the names the data an earlier process left in the engine was
        written under (``--keep-data``; :func:`rubberband.restart.drop_kept`)."""
        if not me.startswith(STORAGE):
            raise ValueError(f"a storage process is named {STORAGE}..., not {me!r}")
        self.me = me
        self.engine = engine
        if not callable(getattr(engine, "is_read", None)):
            raise TypeError(
                f"{type(engine).__name__} has no is_read(op): a storage process runs "
                "an operation sent as a read only if its engine says it reads"
            )
        self.keyspace: Keyspace | None = None
        """The keyspace mirror, from our join on (None before it)."""
        self.version = 0
        self.owned: RangeSet = NOTHING
        """What we answer for as of the last keyspace message delivered."""
        self.held = Bounds(NOTHING)  # ``owned``'s bounds, as of some time (held_part)
        self.catalog_held = False  # ``owned`` ever reached views' definitions (owned_bounds)
        self.broken: RangeSet = NOTHING
        """Ranges whose transfer was aborted: incomplete until a super repairs us."""
        self.incomplete = False
        """A receive of ours was aborted while we were on the ring: the routers send us
        no reads until a super repairs us (contract or replace), and we answer none."""
        self.suspected: set[NodeId] = set()
        """Processes the history suspected since our join (a transfer with one is void)."""
        self.migration = Migration(self, chunk_bytes)
        self.delivered = -1
        """The position of the last message delivered to us."""
        self.queue: list[_Queued] = []
        self._queued_ranges: RangeSet = NOTHING
        self.unfinished: dict[int, int] = {}
        """Keyspace version -> our instructions of it not yet done."""
        self.stopped: str | None = None
        self.stats = StorageStats()
        self.senders: set[NodeId] = set()
        """Who sent what this process applied or answered since its last figures: the
        supers count the clients at work from them (light clients join no group)."""
        self._segments = Segments()
        self._fx = Effects()
        self._mute = False
        self.changes = changes or ChangeLog()
        """What changed at which position (change feeds), if the engine reports it."""
        self._logged = self.changes.enabled and hasattr(engine, "apply_logged")
        self._positions = getattr(engine, "positions", False) is True
        self._wholes = self._positions and hasattr(engine, "whole")
        self.changes.place = lambda key: self.engine.placement.ekey(changed_key(key))
        self.now = 0.0
        self.holds = holds or Holds()
        """The maintainers' holds on this process's intake (the host paces by them)."""
        self.kept = kept
        self.level_next: dict[Any, int] = {}  # (super, round) -> the next slice it takes
        self.level_tail: Any = None  # ((epoch, position, after), records) last sent

    # ================================================================== outputs
    def send(self, dst: NodeId, msg: Any) -> None:
        if self._mute and not dst.startswith(STORAGE):
            return
        self._fx.send.append((dst, Direct(msg)))

    def submit(self, header: dict[str, Any]) -> None:
        self._fx.deliver.append(Submit(header))

    def stop(self, reason: str) -> None:
        if self.stopped is None:
            self.stopped = reason
            self._fx.deliver.append(Stop(reason))

    def _begin(self) -> Effects:
        fx = self._fx = Effects()
        self._mute = mutations.on(MUTE_ANSWERS)
        return fx

    # ================================================================== inputs
    def joined(self, state: Any) -> Effects:
        """Our own join was delivered with the config's state (``joiner_state``)."""
        fx = self._begin()
        rb = state.get("rubberband") if isinstance(state, dict) else None
        if not isinstance(rb, list | tuple) or len(rb) < 4:
            self.stop("the join carried no Rubberband configuration")
            return fx
        try:
            self.keyspace = Keyspace.from_state((rb[0], [(_tuple(e), p) for e, p in rb[3]]))
        except (BadKeyspace, TypeError, ValueError) as e:
            self.stop(f"the join carried a bad keyspace: {e}")
            return fx
        if rb[1] not in ("range", "hash"):
            self.stop(f"the join carried an unknown partitioning {rb[1]!r}")
            return fx
        if self.engine.placement.partitioning != rb[1]:
            # The cluster's partitioning, not the engine's default: under hash
            # partitioning every range this process is handed is one of hashes (5.3).
            self.engine.placement = Placement(rb[1])
        self.version = int(rb[2])
        self.owned = self.keyspace.partition(self.me)
        if self.version > 0:  # a live cluster: what we kept is no part of it
            drop_kept(self)
        return fx

    def on_deliveries(self, deliveries: Iterable[Delivery], now: float = 0.0) -> Effects:
        """E-Cast's deliveries to this process, in ``t`` order: safe ones run in engine
        batches, each unsafe one (a snapshot read) is answered where it falls in the
        stream, and our own join hands us the keyspace."""
        fx = self._begin()
        self.now = now
        self._deliver(deliveries)
        _hold(self)
        return fx

    def deliver(self, items: Iterable[tuple[int, Message]]) -> Effects:
        """Safe deliveries ``(t, message)`` in ``t`` order (E-Cast guarantees it); our
        own join among them is passed over (:meth:`joined` takes its state)."""
        fx = self._begin()
        self._deliver([Delivery(t, m) for t, m in items], joins=False)
        _hold(self)
        return fx

    def deliver_unsafe(self, msg: Message, frontier: int | None, accepted: bool) -> Effects:
        fx = self._begin()
        answer_unsafe(self, msg, frontier, accepted)
        return fx

    def on_direct(self, src: NodeId, msg: Any, now: float | None = None) -> Effects:
        """A peer's pull, chunk, abort or refusal, or a client's basic read."""
        return self.on_directs(((src, msg),), now)

    def on_directs(self, items: Iterable[tuple[NodeId, Any]], now: float | None = None) -> Effects:
        """Several direct messages in their order, as :meth:`on_direct` takes each, with
        one set of effects: basic reads come by the thousand per second.  ``now``: the
        time, if given (a copy's history is logged at it)."""
        fx = self._begin()
        if now is not None:
            self.now = now
        for src, msg in items:
            self._direct(src, msg)
        return fx

    def _direct(self, src: NodeId, msg: Any) -> None:
        if self.stopped is not None:
            return
        t = type(msg)
        mig = self.migration
        if t is BasicRead:
            self.senders.add(src)
            _basic(self, src, msg)
        elif t is Peek:
            self.senders.add(src)
            mine = basic_cover(self, src, msg) if is_range_set(msg.ranges) else None
            if mine is not None:
                log = self.changes if self._logged else None
                self.send(src, peek_answer(log, msg, mine, self.version))
        elif t is Pull:
            mig.on_pull(src, msg)
        elif t is Chunk:
            mig.on_chunk(src, msg)
        elif t is Abort:
            mig.on_abort(src, msg)
        elif t is Refuse:
            mig.on_refuse(src, msg)
        elif t is History:
            mig.on_history(src, msg)
        elif t is FeedRead and src.startswith(STORAGE) and len(msg.feed) == FEED_KEY:
            # A replica beside this one answered a maintainer's feed read.
            self.holds.read(msg.reader, msg.resume, self.now, msg.feed, msg.read_at, msg.since)
        elif (t is LevelAsk or t is LevelApply) and src.startswith(SUPER):
            answer_level(self, src, msg)  # a whole-cluster restart, before the restore

    def on_tick(self, now: float) -> Effects:
        return Effects()

    # ================================================================== delivering
    def _deliver(self, deliveries: Iterable[Delivery], joins: bool = True) -> None:
        # One pass over the deliveries: under writes nearly every one is a write of one
        # key that joins the engine batch, and a loop step costs about as much as the
        # write's own work here (a storage process's CPU is most of a write's cost above
        # an E-Cast message's).
        if self.stopped is not None:
            return
        batch: list[tuple[Message, RangeSet, int]] = []
        senders = self.senders
        gated = self._queued_ranges or self.migration.incoming
        los, his = owned_bounds(self)
        t = self.delivered
        for d in deliveries:
            dt, msg, unsafe = d[0], d[1], d[2]  # (a Delivery's t, message, unsafe)
            senders.add(msg.sender)
            h = msg.header
            kind = h.get(KIND) if type(h) is dict else None
            if kind is None and not unsafe:
                t = dt
                # held_part's one-key road, written out for a header that names one key
                # and nothing else: the call took a storage core on the null engine from
                # 0.67 to 0.75 us a delivery.
                key = h.get(_KEY)
                if key is not None and len(h) == 1 and is_key_quick(key):
                    hi = key + AFTER_TAIL
                    i = bisect_right(los, key) - 1
                    mine = ((key, hi),) if i >= 0 and hi <= his[i] else held_part(self, h)
                else:
                    mine = held_part(self, h)
                if mine is None:
                    continue
                if H.PACKED in h:  # as if it had come unpacked
                    msg = unpacked(msg)
                # (most deliveries: nothing queued, nothing received, nothing to ask)
                if gated and self._blocked(mine, t):
                    if H.READS in h:
                        self.stats.reads_held += 1
                    self._enqueue(_Queued(mine, msg=msg, t=t, keyspace=self.keyspace))
                else:
                    batch.append((msg, mine, t))
                continue
            if batch:
                self._apply(batch)
                batch = []
            if unsafe:
                answer_unsafe(self, msg, d.frontier, d.accepted)
            elif kind == JOIN and joins and msg.sender == self.me:
                fx = self._fx
                fx.extend(self.joined(msg.payload))
                self._fx = fx
            else:
                t = dt
                if kind == KEYSPACE and msg.sender.startswith(SUPER):
                    self._keyspace(t, msg)
                elif kind == SUSPECT and msg.sender.startswith(SUPER):
                    self._suspected(h.get("who"))
                elif kind == SUSPECT and msg.sender == ROUTERS:
                    _leases_out(self, h.get("who"))
                elif kind == PART and msg.sender != self.me and msg.sender.startswith(STORAGE):
                    self._gone(msg.sender)
            if self.stopped is not None:
                break
            gated = self._queued_ranges or self.migration.incoming
            los, his = owned_bounds(self)  # (a keyspace message changes what we own)
        if batch and self.stopped is None:
            self._apply(batch)
        self.delivered = t
        if self.migration.early_pulls:
            self.migration.expire_early_pulls()

    def _answer(
        self, to: NodeId, rid: Any, op: Any, mine: RangeSet, position: Any, keys: Any = None
    ) -> None:
        """Answer ``op`` piece by piece; with ``keys`` (a revisions read), each piece's
        answer carries their revisions beside its result."""
        if not self.engine.is_read(op):
            self.send(to, Answer(rid, mine, None, not_a_read(op), position, True))
            return
        pieces = self._pieces(mine)
        try:
            batch = [(op, piece, -1) if self._positions else (op, piece) for piece in pieces]
            results = self.engine.apply(batch)
        except Exception as e:
            self.stop(f"engine failed: {type(e).__name__}: {e}")
            return
        for piece, res in zip(pieces, results, strict=True):
            if isinstance(res, BadOperation):
                self.send(to, Answer(rid, piece, None, str(res), position, True))
            else:
                if keys is not None:
                    res = [res, self.changes.revisions_of(keys, piece)]
                self.send(to, Answer(rid, piece, res, None, position, True))

    def _pieces(self, mine: RangeSet) -> list[RangeSet]:
        return self._segments.pieces(mine, self.keyspace, self.owned)

    # ================================================================== the queue
    def _blocked(self, ranges: RangeSet, t: int) -> bool:
        """Whether an item at position ``t`` must wait: it overlaps a receive begun by an
        earlier keyspace message, or an item already waiting (which is earlier)."""
        # Checked for every delivery: most find nothing queued and nothing being received,
        # and return before building a generator (a tenth of a storage process's time
        # under writes went here).
        if self._queued_ranges and overlaps(ranges, self._queued_ranges):
            return True
        incoming = self.migration.incoming
        if not incoming or mutations.on(NO_RECEIVE_BUFFERING):
            return False
        return any(rec.t < t and overlaps(ranges, rec.ranges) for rec in incoming.values())

    @property
    def receiving(self) -> RangeSet:
        return self.migration.receiving

    def _enqueue(self, item: _Queued) -> None:
        self.queue.append(item)
        # An item inside a range still being received (a receive begun before it) needs
        # no entry of its own: whatever overlaps it overlaps that receive too, and waits
        # for it anyway (nor does one inside what earlier waiting items hold).  Entering
        # every one made each write to a busy range re-sort a union of thousands of
        # points, so a receiver under load fell behind and its migration never finished.
        t, ranges = item.t, item.ranges
        held = covers(self._queued_ranges, ranges) or any(
            r.t < t and covers(r.ranges, ranges) for r in self.migration.incoming.values()
        )
        if not held:
            self._queued_ranges = union(self._queued_ranges, ranges)
        if len(self.queue) > self.stats.queued_max:
            self.stats.queued_max = len(self.queue)

    def order(self, ranges: RangeSet, t: int, action: tuple[Any, ...]) -> None:
        """Run an instruction now, or queue it behind what it must follow."""
        if self._blocked(ranges, t):
            self._enqueue(_Queued(ranges, t=t, action=action))
        else:
            self._run_action(action)

    def _run_action(self, action: tuple[Any, ...]) -> None:
        kind = action[0]
        if kind == "send":
            _, tid, dst, ranges, v = action
            self.migration.start_send(tid, dst, ranges, v)
        elif kind == "pull":
            self.migration.start_pull(action[1])
        elif kind == "delete":
            _, ranges, v = action
            try:
                self.engine.delete(ranges)
            except Exception as e:
                self.stop(f"engine failed to delete: {e}")
                return
            self.changes.forget(ranges)
            if v:
                self.instruction_done(v)

    def drain(self) -> None:
        """Run queued items whose ranges are free now, in order; the rest keep waiting
        (an item also waits for any earlier queued item it overlaps)."""
        queue, self.queue = self.queue, []
        self._queued_ranges = NOTHING
        batch: list[tuple[Message, RangeSet, int]] = []
        cuts: dict[int, Keyspace] = {}  # each message's keyspace, where it is not ours now
        for item in queue:
            if self.stopped is not None:
                return
            if self._blocked(item.ranges, item.t):
                self._enqueue(item)
                continue
            if item.msg is not None:
                batch.append((item.msg, item.ranges, item.t))
                if item.keyspace is not None and item.keyspace is not self.keyspace:
                    cuts[id(item.msg)] = item.keyspace
                continue
            if batch:
                self._apply(batch, cuts)
                batch, cuts = [], {}
            self._run_action(item.action)
        if batch and self.stopped is None:
            self._apply(batch, cuts)

    def queued_sends(self) -> set[Any]:
        return {q.action[1] for q in self.queue if q.action[:1] == ("send",)}

    # ================================================================== applying
    def _apply(self, batch: list[tuple[Message, RangeSet, int]], cuts: Any = None) -> None:
        Apply(self, batch, cuts).run()  # (cuts: see drain)

    # ================================================================== reconfiguration
    def _keyspace(self, t: int, msg: Message) -> None:
        h = msg.header
        ks = self.keyspace
        if ks is None:
            return
        op = h.get(H.OP)
        if not (isinstance(op, list | tuple) and op and op[0] == "restore"):
            drop_kept(self)
        try:
            new = next_keyspace(ks, op)
            instructions = instructions_from_wire(h.get(H.INSTRUCTIONS, ()))
        except Exception as e:
            self.stop(f"cannot follow keyspace message {op!r:.80}: {e}")
            return
        if mutations.on(DELETE_BEFORE_SEND):
            # A keyspace message's deletes run before its copies open their cursors: a
            # process that both sends a range and deletes it sends nothing.
            instructions = sorted(instructions, key=lambda i: not isinstance(i, Delete))
        old_owned = self.owned
        self.keyspace = new
        self.version += 1
        v = self.version
        self.owned = new.partition(self.me)
        self.changes.gained(difference(self.owned, old_owned), t)
        if op[0] == "restore":  # the whole cluster restarted from its disks
            restored(self, t, op[4] if len(op) > 4 and type(op[4]) is int else None)
            return
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
                    self.order(ins.ranges, t, ("send", tid, ins.dst, ins.ranges, v))
                elif ins.dst == me:
                    self.migration.receive(tid, ins.src, ins.ranges, v)
            elif ins.process == me:
                deleted = union(deleted, ins.ranges)
                self.order(ins.ranges, t, ("delete", ins.ranges, v))
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
            self.order(extra, t, ("delete", extra, 0))
        if v in self.unfinished:
            self.instruction_done(v, count=0)

    def instruction_done(self, v: int, count: int = 1) -> None:
        """``count`` of our instructions of version ``v`` are done: ``ready`` when all."""
        left = self.unfinished.get(v)
        if left is None:
            return
        left -= count
        if left <= 0:
            del self.unfinished[v]
            if not self.incomplete:
                self.submit(ready_header(v))
        else:
            self.unfinished[v] = left

    def _suspected(self, who: Any) -> None:
        if type(who) not in (list, tuple) or len(who) != 1 or type(who[0]) is not str:
            return
        self._gone(who[0])

    def _gone(self, gone: NodeId) -> None:
        """``gone`` was voted out, or parted: every transfer with it is void."""
        self.suspected.add(gone)
        self.migration.suspected(gone)
        # Writes waiting for an aborted range run now: the range is broken (no reads come
        # here any more) but later transfers and deletes must not wait for ever.
        self.drain()

    # ================================================================== introspection
    @property
    def incoming(self) -> dict[Any, Any]:
        return self.migration.incoming

    @property
    def outgoing(self) -> dict[Any, Any]:
        return self.migration.outgoing

    @property
    def early_pulls(self) -> dict[Any, Any]:
        return self.migration.early_pulls

    def figures(self) -> dict[str, Any]:
        return figures_of(self)

    def status(self) -> dict[str, Any]:
        return status_of(self)


def _basic(core: StorageCore, src: NodeId, msg: BasicRead) -> None:
    """A basic read (4.5.2): straight from the client, answered from the current state if
    the client routed it by this process's keyspace version; only the ranges held in full
    are answered (``covered``), the client asks another replica for the rest."""
    if not is_range_set(msg.ranges):
        return
    if mutations.on(SKIP_VERSION_CHECK):
        core._answer(src, msg.request, msg.op, msg.ranges, core.version)
        return
    mine = basic_cover(core, src, msg)
    if mine is not None:
        core._answer(src, msg.request, msg.op, mine, core.version)


def _leases_out(core: StorageCore, who: Any) -> None:
    """The routers declared these clients faulty, their leases run out: a maintainer
    among them reads no more, and holds no one back from now on."""
    if type(who) in (list, tuple):
        for name in who:
            if type(name) is str:
                core.holds.forget(name)


def _hold(core: StorageCore) -> None:
    """The maintainers' holds on the intake, after a step (:mod:`rubberband.holds`)."""
    if core.holds.readers:
        now, log = core.now, core.changes
        core.holds.update(lambda since: log.share_after(since, now), now)


def answer_unsafe(core: StorageCore, msg: Message, frontier: int | None, accepted: bool) -> None:
    """A snapshot read (4.5.2): answered at once if this process delivered exactly what
    the router had sent it when it routed the read (``accepted``) and holds every
    range of it in full; otherwise refused, and the client retries the whole read."""
    h = msg.header
    if core.stopped is not None or type(h) is not dict or H.READS not in h:
        return
    mine = held_part(core, h)
    if mine is None:
        return
    rid = h.get(H.REQUEST, msg.id)
    if not accepted or core.incomplete or core._blocked(mine, _NOW):
        core.send(msg.sender, Answer(rid, mine, None, None, frontier, False))
    elif H.COUNT in h:
        answer_bundle(core, msg, mine, frontier)
    elif H.REVISIONS in h:
        op = revised_op(msg.payload, core._logged)
        if type(op) is str:
            core.send(msg.sender, Answer(rid, mine, None, op, frontier, True))
        else:
            core._answer(msg.sender, rid, op, mine, frontier, msg.payload[1])
    else:
        core._answer(msg.sender, rid, msg.payload, mine, frontier)


def held_part(core: StorageCore, h: Any) -> RangeSet | None:
    """What ``core`` holds of the ranges a delivered write or read names (None: a header
    that names none, or not as a range set)."""
    if type(h) is not dict:
        return None
    key = h.get(H.KEY)
    if key is not None and h.get(H.WRITES) is None:
        # A write of one key (most deliveries; the routers refuse it beside reads).
        if not is_key_quick(key):
            return None
        lo, hi = key, key + AFTER_TAIL  # concatenated: unpacking ``key`` took twice as long
        ranges: RangeSet = ((lo, hi),)
    else:  # ranges written (they win over a key beside them), else ranges read
        ranges = h.get(H.WRITES)
        if ranges is None:
            ranges = h.get(H.READS)
        if type(ranges) is not tuple or not is_range_set(ranges):
            return None
        if len(ranges) != 1:
            return intersect(ranges, core.owned)
        lo, hi = ranges[0]
    # Most deliveries name one key, held whole by the owned range that starts at or
    # below it: one bisection of plain bounds, where ``intersect`` compares ranges.
    los, his = owned_bounds(core)
    i = bisect_right(los, lo) - 1
    if i >= 0 and hi <= his[i]:
        return ranges
    return intersect(ranges, core.owned)


def owned_bounds(core: StorageCore) -> tuple[list[Any], list[Any]]:
    """The owned ranges' lower and upper bounds (``held``, made again if ``owned`` is
    new since), and whether ``owned`` ever reached views' definitions, the keys a write
    of one key names through these (``held_part``; ``rubberband.applying``)."""
    held = core.held
    if held.ranges is not core.owned:
        held = core.held = Bounds(core.owned)
        core.catalog_held = core.catalog_held or bool(intersect(core.owned, CATALOG_KEYS))
    return held.los, held.his


def figures_of(core: StorageCore) -> dict[str, Any]:
    """What this process's heartbeat answers report to the supers (4.2.3): operations
    applied so far (the supers turn it into a rate), the engine's items and bytes,
    items waiting for their ranges, and the clients heard from since the last figures
    (at most ``REPORTED_CLIENTS`` names, and their number).  On the engine's thread:
    ``stats`` may sum over blocks or ask a server."""
    f: dict[str, Any] = {"applied": core.stats.applied}
    clients = sorted(s for s in core.senders if s.startswith(CLIENTS))
    core.senders = set()
    f["clients"] = clients[:REPORTED_CLIENTS]
    f["client_count"] = len(clients)
    try:
        e = core.engine.stats()
        f["items"] = int(e.get("items", 0))
        f["bytes"] = int(e.get("bytes", 0))
    except Exception:  # an engine's figures are informative: a failure is no answer
        pass
    f["queued"] = len(core.queue)
    return f


def status_of(core: StorageCore) -> dict[str, Any]:
    """A storage process's state for its ``/health`` and metrics, and for tests."""
    return {
        "name": core.me,
        "version": core.version,
        "active": core.keyspace is not None and core.me in core.keyspace,
        "owned": core.owned,
        "receiving": core.receiving,
        "broken": core.broken,
        "incomplete": core.incomplete,
        "queued": len(core.queue),
        "reads_held": core.stats.reads_held,
        "chunks_sent": core.stats.chunks_sent,
        "chunks_received": core.stats.chunks_received,
        "chunks_refused": core.stats.chunks_refused,
        "unfinished": len(core.unfinished),
        "stopped": core.stopped,
        "changes": core.changes.figures() if core._logged else None,
        **core.migration.status(),
    }


def next_keyspace(ks: Keyspace, op: Any) -> Keyspace:
    """The keyspace after ``op`` (the config applied it, so it is valid)."""
    if op[0] == "expand":
        return ks.expand(_tuple(op[2]), op[1])
    if op[0] == "contract":
        return ks.contract(*op[1:])
    if op[0] == "replace":
        return ks.replace(op[1], op[2])
    if op[0] == "restore":
        return Keyspace(ks.f, ((_tuple(e), str(p)) for e, p in op[1]))
    return ks.rebalance(op[1], _tuple(op[2]))


def _tuple(value: Any) -> Any:
    if type(value) in (list, tuple):
        return tuple(_tuple(v) for v in value)
    return value


def basic_cover(core: StorageCore, src: NodeId, msg: BasicRead | Peek) -> RangeSet | None:
    """What a basic read (or peek) routed by ``msg.version`` may be answered for: the
    ranges held in full, none queued behind a copy; None: refused as :class:`Stale`
    (the client routed it by another keyspace version)."""
    if msg.version != core.version or core.keyspace is None:
        core.send(src, Stale(msg.request, core.version))
        return None
    if core.incomplete:
        return NOTHING
    mine = intersect(msg.ranges, core.owned)
    if core.migration.incoming:  # most reads: nothing is being received
        mine = difference(mine, core.migration.receiving)
    if core.queue:
        mine = difference(mine, core._queued_ranges)
    return mine
