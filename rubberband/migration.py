"""Partial live migration between storage processes (dissertation 4.4.1, 5.4).

A keyspace message carries instructions (:mod:`rubberband.optimizer`).  A ``copy``
makes the source open a consistent cursor on the ranges at the message's position and
the destination pull it in bounded chunks over the direct channel: the receiver paces
the sender, and nothing unbounded is buffered on either side.  Transfers are named by
``(t, index)``: the keyspace message's position and the instruction's index, the same
on both sides.  A chunk is taken only whole and inside the copy's ranges (the engine
checks, ``Engine.receive``); a bad one gives the transfer up.

A source suspected mid-transfer, or one that sends a bad chunk, leaves its receiver
*incomplete*: the receiver submits ``incomplete``, the routers send it no more reads,
and a super repairs it (replace or contract), copying from another replica.

:class:`Migration` holds one storage process's transfers; the storage core orders its
actions (a pull, a send) among the deliveries (:meth:`StorageCore.order`) and is told
when a version's part of the work is done (:meth:`StorageCore.instruction_done`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ecast import NodeId
from ecast.core import mutations
from rubberband.config import STORAGE
from rubberband.engine import BadOperation, SendCursor
from rubberband.keys import NOTHING, RangeSet, difference, intersect, overlaps, union
from rubberband.proto import Abort, Chunk, History, Pull, Refuse, TransferId, incomplete_header

if TYPE_CHECKING:
    from rubberband.storage import StorageCore

MAX_EARLY_PULLS = 64
"""Pulls one storage process may have waiting for the keyspace message that makes us
its source (one per copy of a reconfiguration; a reconfiguration has a few)."""
HISTORY_DROPPED = mutations.declare(
    "history_dropped", "storage", "a copy's receiver claims its source's history but keeps none"
)
ABORTED_RECEIVE_READY = mutations.declare(
    "aborted_receive_ready", "storage", "a receive whose source died says ready, not incomplete"
)


@dataclass(slots=True)
class Incoming:
    src: NodeId
    ranges: RangeSet
    version: int
    t: int
    """The keyspace message's position: the receive blocks later items, not earlier."""
    next: int = 0
    started: bool = False
    history: list[Any] = field(default_factory=list)
    """The source's change log of the ranges, as it arrives (:class:`History`)."""
    revised: list[Any] = field(default_factory=list)
    """The source's revisions of the ranges' keys, as they arrive."""
    after: int | None = None
    """Set once the whole history came: the position it is complete after."""


@dataclass(slots=True)
class Outgoing:
    dst: NodeId
    ranges: RangeSet
    version: int
    cursor: SendCursor | None = None
    next: int = 0
    """The next chunk to send."""
    history: tuple[int, list[Any], list[Any]] | None = None
    """Our change log of the ranges at the send's position and its keys' revisions, in
    parts: sent first."""
    asked: int = -1
    """The chunk the receiver asked for and has not been sent yet (-1: none)."""


class Migration:
    """The transfers of one storage process, in and out."""

    def __init__(self, core: StorageCore, chunk_bytes: int) -> None:
        self.core = core
        self.chunk_bytes = chunk_bytes
        self.incoming: dict[TransferId, Incoming] = {}
        self.outgoing: dict[TransferId, Outgoing] = {}
        self.early_pulls: dict[TransferId, tuple[NodeId, int]] = {}
        """Pulls for copies whose keyspace message we have not delivered yet."""
        self.aborted: RangeSet = NOTHING
        """Ranges of aborted receives: a queued send of them aborts instead of sending."""
        self.last_refusal: str | None = None
        """Why the last chunk refused was refused (``status``)."""

    @property
    def receiving(self) -> RangeSet:
        r: RangeSet = NOTHING
        for rec in self.incoming.values():
            r = union(r, rec.ranges)
        return r

    # ------------------------------------------------------------------ instructions
    def receive(self, tid: TransferId, src: NodeId, ranges: RangeSet, v: int) -> None:
        """A copy into this process: it blocks later items at once; its first pull waits
        for every earlier item on its ranges (a delete queued before it must not erase
        what arrives)."""
        core = self.core
        core.stats.transfers["in"] += 1
        rec = self.incoming[tid] = Incoming(src, ranges, v, tid[0])
        if src in core.suspected:  # the source was suspected before this message
            self.abort_incoming(tid, rec)
            return
        core.order(ranges, tid[0], ("pull", tid))

    def start_pull(self, tid: TransferId) -> None:
        rec = self.incoming.get(tid)
        if rec is not None and not rec.started:  # None: aborted meanwhile
            rec.started = True
            self.core.send(rec.src, Pull(tid, 0))

    def start_send(self, tid: TransferId, dst: NodeId, ranges: RangeSet, v: int) -> None:
        core = self.core
        if dst in core.suspected:
            core.instruction_done(v)  # nobody to send to any more
            return
        if overlaps(ranges, self.aborted) or overlaps(ranges, core.broken):
            core.send(dst, Abort(tid))
            core.instruction_done(v)
            return
        try:
            cursor = core.engine.open_send(ranges)
        except Exception as e:
            core.stop(f"engine failed to open a send: {e}")
            return
        send = self.outgoing[tid] = Outgoing(dst, ranges, v, cursor)
        if core._logged:
            send.history = core.changes.export(ranges, self.chunk_bytes)
        core.stats.transfers["out"] += 1
        early = self.early_pulls.pop(tid, None)
        if early is not None and early[0] == dst:
            send.asked = early[1]
            self._serve(tid, send)

    # ------------------------------------------------------------------ direct messages
    def on_pull(self, src: NodeId, msg: Pull) -> None:
        send = self.outgoing.get(msg.transfer)
        if send is None or send.dst != src:
            self._early_pull(src, msg.transfer, msg.chunk)
            return
        send.asked = msg.chunk
        self._serve(msg.transfer, send)

    def on_refuse(self, src: NodeId, msg: Refuse) -> None:
        send = self.outgoing.get(msg.transfer)
        if send is not None and send.dst == src:
            self._close_send(msg.transfer, send)

    def on_abort(self, src: NodeId, msg: Abort) -> None:
        rec = self.incoming.get(msg.transfer)
        if rec is not None and rec.src == src:
            self.abort_incoming(msg.transfer, rec)
            self.core.drain()

    def on_history(self, src: NodeId, msg: History) -> None:
        rec = self.incoming.get(msg.transfer)
        if rec is None or rec.src != src or rec.after is not None:
            return
        rec.history.extend(msg.entries)
        rec.revised.extend(msg.revisions)
        if msg.last:
            rec.after = msg.after

    def on_chunk(self, src: NodeId, msg: Chunk) -> None:
        tid = msg.transfer
        rec = self.incoming.get(tid)
        if rec is None or rec.src != src or not rec.started or msg.chunk != rec.next:
            return
        core = self.core
        if msg.data:
            try:
                core.engine.receive(msg.data, rec.ranges)
            except BadOperation as e:
                # Not the engine failing: the source sent what is no part of the copy.
                # Give the transfer up as for a source that failed: the ranges are
                # broken here, a super repairs us from another replica, and the
                # reconfiguration completes without our ready.
                core.stats.chunks_refused += 1
                self.last_refusal = f"a chunk from {src} of transfer {tid}: {e}"
                core.send(src, Refuse(tid))
                self.abort_incoming(tid, rec)
                core.drain()
                return
            except Exception as e:
                core.stop(f"engine failed to receive: {e}")
                return
        core.stats.chunks_received += 1
        rec.next += 1
        if not msg.last:
            core.send(rec.src, Pull(tid, rec.next))
            return
        del self.incoming[tid]
        if rec.after is not None:
            history = [] if mutations.on(HISTORY_DROPPED) else rec.history
            core.changes.adopt(rec.ranges, rec.after, history, rec.t, rec.revised, now=core.now)
        self.aborted = difference(self.aborted, rec.ranges)  # whole again
        core.drain()
        core.instruction_done(rec.version)

    def _serve(self, tid: TransferId, send: Outgoing) -> None:
        if send.asked != send.next or send.cursor is None:
            return
        core = self.core
        if send.history is not None:  # before the first chunk, on the same channel
            after, parts, revised = send.history
            send.history = None
            out = [*((part, ()) for part in parts), *(((), part) for part in revised)]
            for i, (part, revisions) in enumerate(out):
                core.send(send.dst, History(tid, after, part, i == len(out) - 1, revisions))
        try:
            data = send.cursor.next_chunk(self.chunk_bytes)
        except Exception as e:
            core.stop(f"engine failed while sending: {e}")
            return
        last = data is None
        core.send(send.dst, Chunk(tid, send.next, data if data is not None else (), last))
        core.stats.chunks_sent += 1
        send.next += 1
        if last:
            send.cursor.close()
            del self.outgoing[tid]
            core.instruction_done(send.version)

    def _close_send(self, tid: TransferId, send: Outgoing) -> None:
        if send.cursor is not None:
            send.cursor.close()
        del self.outgoing[tid]
        self.core.stats.transfers["aborted"] += 1
        self.core.instruction_done(send.version)

    # ------------------------------------------------------------------ early pulls
    def _early_pull(self, src: NodeId, tid: TransferId, n: int) -> None:
        """A pull that came before the keyspace message that makes us its source (the
        receiver delivered it first).  Kept only from a storage process, only for a
        position we have not delivered yet, and at most ``MAX_EARLY_PULLS`` per process:
        junk from anyone else can neither fill the table nor push a real pull out.
        Those whose position we delivered go then, unless their send waits in our queue
        (behind a receive of ours)."""
        if not src.startswith(STORAGE) or (
            tid[0] <= self.core.delivered and tid not in self.core.queued_sends()
        ):
            return
        pulls = self.early_pulls
        if tid not in pulls and sum(1 for s, _ in pulls.values() if s == src) >= MAX_EARLY_PULLS:
            return
        pulls[tid] = (src, n)

    def expire_early_pulls(self) -> None:
        queued = self.core.queued_sends()
        delivered = self.core.delivered
        self.early_pulls = {
            tid: pull
            for tid, pull in self.early_pulls.items()
            if tid[0] > delivered or tid in queued
        }

    # ------------------------------------------------------------------ failures
    def suspected(self, gone: NodeId) -> None:
        """``gone`` was declared faulty: every transfer with it is void."""
        for tid, rec in list(self.incoming.items()):
            if rec.src == gone:
                self.abort_incoming(tid, rec)
        for tid, send in list(self.outgoing.items()):
            if send.dst == gone:
                self._close_send(tid, send)

    def abort_incoming(self, tid: TransferId, rec: Incoming) -> None:
        """A receive that cannot complete: its ranges are broken here, and every copy of
        them this process was to send is broken too (the flood of 4.4.2's ranking)."""
        core = self.core
        del self.incoming[tid]
        core.stats.transfers["aborted"] += 1
        if mutations.on(ABORTED_RECEIVE_READY):
            core.instruction_done(rec.version)
            return
        lost = intersect(rec.ranges, core.owned)
        core.broken = union(core.broken, lost)
        if core.keyspace is not None and core.me in core.keyspace:
            core.incomplete = True
        # Reported even when we hold none of it any more: the routers must stop waiting
        # for our ready of that reconfiguration.
        core.submit(incomplete_header(rec.version, rec.ranges))
        for otid, send in list(self.outgoing.items()):
            if overlaps(send.ranges, rec.ranges):
                if send.cursor is not None:
                    send.cursor.close()
                del self.outgoing[otid]
                core.send(send.dst, Abort(otid))
                core.instruction_done(send.version)
        # Sends still queued behind this receive abort when they come to run.
        self.aborted = union(self.aborted, rec.ranges)

    def status(self) -> dict[str, Any]:
        return {
            "transfers_in": len(self.incoming),
            "transfers_out": len(self.outgoing),
            "early_pulls": len(self.early_pulls),
            "last_refusal": self.last_refusal,
        }
