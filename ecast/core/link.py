"""Quasi-reliable, loss-less FIFO channels (dissertation 3.3.4, 3.5.1) as a sans-IO core.

E-Cast's correctness argument assumes that between two correct processes every message is
eventually received (quasi-reliability), in send order (FIFO), and never with a hole in the
middle (loss-less).  The wait-free Multi-Paxos of 3.5.4 leans on exactly this: a leader
sends phase-2 messages back to back and never waits for their acknowledgements.

TCP alone gives FIFO within one connection but not across reconnects, and the simulator
drops frames on purpose.  This module restores the guarantees with per-channel sequence
numbers, cumulative acknowledgements, a reorder buffer and resend of unacknowledged frames.
The same class runs under the simulator (lossy, delaying network) and under the TCP
runtime (reconnects).

Incarnations: a process that restarts is a *new* process (fail-silent model, 3.5.4).  Each
frame names the sender's incarnation and the incarnation of the receiver it was meant for.
A frame from a newer incarnation of a peer resets the channel, and nothing buffered for the
old incarnation is ever resent to the new one.

One frame per peer per flush carries every message queued for that peer since the last
flush, so the per-message cost of the runtime is paid once per batch (Python's cost is per message);
messages whose size the host states (direct messages, packed once) are cut into several
frames of at most ``frame_bytes``, so a burst can never make a frame the peer must refuse.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from ecast.core.effects import NodeId

DATAGRAM = -1
_INF = float("inf")


@dataclass(slots=True)
class Frame:
    """The unit a channel puts on the wire.

    ``seq`` is 0 for a frame that only carries an acknowledgement and -1 for a best-effort
    datagram (see :meth:`LinkLayer.forget`).  ``ack`` is the highest sequence number
    received in order from the peer's current incarnation.
    """

    src_inc: int
    dst_inc: int
    seq: int
    ack: int
    msgs: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class LinkParams:
    resend_timeout: float = 0.2
    """Resend a frame that has not been acknowledged for this long."""
    ack_delay: float = 0.01
    """Send a bare acknowledgement if no data frame carried one within this delay."""
    reorder_window: int = 4096
    """Frames further ahead than this are dropped on receipt (they will be resent)."""
    reorder_bytes: int = 8 * 1024 * 1024
    """Bytes of frames held ahead of a gap, per channel, at most (as the host measured
    them on the wire; frames beyond are dropped, and resent once the gap is filled).  A
    gap on a TCP connection lasts until the peer resends after a reconnect, so a small
    buffer costs a resend at worst; a large one is memory a hostile peer fills."""
    reorder_total_bytes: int = 64 * 1024 * 1024
    """The same over every channel of the process."""
    frame_bytes: int = 8 * 1024 * 1024
    """Bytes of sized messages (``LinkLayer.send``'s ``size``) one frame carries at most;
    a message bigger than this goes alone.  Below the wire's frame limit with room for
    the unsized messages beside them: a frame over that limit is refused by the peer,
    resent after the reconnect, refused again, and the channel is stuck for good (a
    migration's history, 19 MB of direct messages in one flush, did that)."""
    dropped_memory: int = 65536
    """How many dropped peers (``LinkLayer.drop``) are remembered, to talk to one that
    comes back by datagram rather than through a channel that no longer lines up."""


@dataclass(slots=True)
class _Channel:
    peer_inc: int = 0  # 0 until the peer's incarnation is known
    ended: int = 0
    """The latest incarnation of the peer known to have stopped (``peer_stopped``): it
    and every older one are stale; the next one to show up takes the channel."""
    next_out: int = 1
    unacked: deque[tuple[int, tuple[Any, ...], float]] = field(default_factory=deque)
    next_in: int = 1
    reorder: dict[int, tuple[tuple[Any, ...], int]] = field(default_factory=dict)
    """Frames ahead of a gap: sequence number -> (messages, bytes)."""
    reorder_bytes: int = 0
    ack_due_at: float | None = None
    ack_sent: int = 0
    unacked_msgs: int = 0


class LinkLayer:
    """All channels of one process.

    Usage per event: feed inbound frames to :meth:`on_frame` (which returns the messages now
    deliverable, in order), queue outbound messages with :meth:`send`, then call
    :meth:`flush` once to obtain the frames to transmit.  Call :meth:`on_tick` at
    :meth:`next_deadline` for resends and delayed acknowledgements.
    """

    def __init__(self, me: NodeId, incarnation: int, params: LinkParams | None = None) -> None:
        if incarnation <= 0:
            raise ValueError("incarnation must be positive")
        self.me = me
        self.incarnation = incarnation
        self.params = params or LinkParams()
        self._chans: dict[NodeId, _Channel] = {}
        self._outbox: dict[NodeId, list[Any]] = {}
        self._cuts: dict[NodeId, list[int]] = {}
        """Per peer with sized messages queued: ``[bytes of the open frame, index where
        each further frame starts, ...]``."""
        self._forgotten: set[NodeId] = set()
        self._dropped: OrderedDict[NodeId, int] = OrderedDict()
        """Dropped peer -> the incarnation whose channel went (bounded, oldest first)."""
        self.reorder_bytes = 0
        """Bytes held ahead of gaps over every channel."""
        self.stats = {
            "frames_sent": 0,
            "frames_resent": 0,
            "frames_dropped_stale": 0,
            "frames_dropped_reorder": 0,
        }

    # -- sending -------------------------------------------------------------------------
    def send(self, peer: NodeId, msg: Any, size: int = 0) -> None:
        """Queue ``msg`` for ``peer``; it leaves with the next :meth:`flush`.  ``size``:
        its bytes on the wire if the host knows them (frames are cut to
        ``frame_bytes``); 0 for the cores' own messages, small or bounded elsewhere."""
        box = self._outbox.get(peer)
        if box is None:
            box = self._outbox[peer] = []
        if size:
            cuts = self._cuts.get(peer)
            if cuts is None:
                cuts = self._cuts[peer] = [0]
            if cuts[0] + size > self.params.frame_bytes and box:
                cuts.append(len(box))
                cuts[0] = 0
            cuts[0] += size
        box.append(msg)

    def flush(self, now: float) -> list[tuple[NodeId, Frame]]:
        """One frame per peer with everything queued (more where sized messages pass
        ``frame_bytes``), plus acknowledgements that are due."""
        out: list[tuple[NodeId, Frame]] = []
        if self._outbox:
            boxes, self._outbox = self._outbox, {}
            cuts, self._cuts = self._cuts, {}
            for peer, msgs in boxes.items():
                cut = cuts.get(peer)
                if cut is None or len(cut) == 1:
                    self._frame(out, peer, tuple(msgs), now)
                    continue
                starts = [0, *cut[1:], len(msgs)]
                for lo, hi in pairwise(starts):
                    self._frame(out, peer, tuple(msgs[lo:hi]), now)
        self.stats["frames_sent"] += len(out)
        return out

    def _frame(
        self, out: list[tuple[NodeId, Frame]], peer: NodeId, payload: tuple[Any, ...], now: float
    ) -> None:
        if peer in self._forgotten or peer in self._dropped:
            out.append((peer, Frame(self.incarnation, 0, DATAGRAM, 0, payload)))
            return
        ch = self._chan(peer)
        seq = ch.next_out
        ch.next_out += 1
        ch.unacked.append((seq, payload, now))
        ch.unacked_msgs += len(payload)
        ack = ch.next_in - 1
        ch.ack_sent = ack
        ch.ack_due_at = None
        out.append((peer, Frame(self.incarnation, ch.peer_inc, seq, ack, payload)))

    # -- receiving -----------------------------------------------------------------------
    def on_frame(self, src: NodeId, frame: Frame, now: float, size: int = 0) -> list[Any]:
        """Accept a frame from ``src``; return the messages that became deliverable in
        order.  ``size``: its bytes on the wire, as the host knows them (what a frame held
        ahead of a gap is charged)."""
        if frame.seq == DATAGRAM or src in self._forgotten:
            return list(frame.msgs)  # best effort, no channel state
        dropped = self._dropped.get(src)
        if dropped is not None:
            if frame.src_inc <= dropped:
                # The incarnation we dropped is still talking: its channel is gone, so
                # what it says arrives as a datagram and the core can answer it.
                return list(frame.msgs) if frame.seq > 0 else []
            del self._dropped[src]  # a new process under the name: a fresh channel
        ch = self._chan(src)
        if frame.dst_inc not in (0, self.incarnation):
            # Meant for an earlier incarnation of this process.  Answer with a bare ack so
            # the sender learns our incarnation and resets its side of the channel.
            self.stats["frames_dropped_stale"] += 1
            if frame.src_inc >= ch.peer_inc and frame.src_inc > ch.ended:
                ch.peer_inc = frame.src_inc
                if ch.ack_due_at is None:
                    ch.ack_due_at = now + self.params.ack_delay
            return []
        if frame.src_inc < ch.peer_inc or frame.src_inc <= ch.ended:
            self.stats["frames_dropped_stale"] += 1
            return []  # from a dead incarnation of the peer
        if frame.src_inc > ch.peer_inc:
            if ch.peer_inc != 0:
                # The peer restarted: it is a new process.  Forget both directions.
                self.reorder_bytes -= ch.reorder_bytes
                ch = _Channel(ended=ch.ended)
                self._chans[src] = ch
            ch.peer_inc = frame.src_inc
        self._on_ack(ch, frame.ack)
        if frame.seq == 0:
            return []
        delivered: list[Any] = []
        if frame.seq == ch.next_in:
            delivered.extend(frame.msgs)
            ch.next_in += 1
            reorder = ch.reorder
            while reorder:
                held = reorder.pop(ch.next_in, None)
                if held is None:
                    break
                delivered.extend(held[0])
                ch.reorder_bytes -= held[1]
                self.reorder_bytes -= held[1]
                ch.next_in += 1
        elif ch.next_in < frame.seq <= ch.next_in + self.params.reorder_window:
            # Ahead of a gap: wait for the resend, within the byte bounds.
            p = self.params
            if frame.seq in ch.reorder:
                pass
            elif (
                ch.reorder_bytes + size > p.reorder_bytes
                or self.reorder_bytes + size > p.reorder_total_bytes
            ):
                self.stats["frames_dropped_reorder"] += 1
            else:
                ch.reorder[frame.seq] = (frame.msgs, size)
                ch.reorder_bytes += size
                self.reorder_bytes += size
        # Duplicates and gaps both need the sender to hear our position soon.
        if ch.ack_due_at is None:
            ch.ack_due_at = now + self.params.ack_delay
        return delivered

    def _on_ack(self, ch: _Channel, ack: int) -> None:
        unacked = ch.unacked
        while unacked and unacked[0][0] <= ack:
            ch.unacked_msgs -= len(unacked.popleft()[1])

    # -- time ----------------------------------------------------------------------------
    def on_tick(self, now: float) -> list[tuple[NodeId, Frame]]:
        """Resend overdue frames and send acknowledgements that are due."""
        out: list[tuple[NodeId, Frame]] = []
        timeout = self.params.resend_timeout
        for peer, ch in self._chans.items():
            ack = ch.next_in - 1
            resent = False
            if ch.unacked and ch.unacked[0][2] + timeout <= now:
                fresh: deque[tuple[int, tuple[Any, ...], float]] = deque()
                for seq, msgs, _sent in ch.unacked:
                    out.append((peer, Frame(self.incarnation, ch.peer_inc, seq, ack, msgs)))
                    fresh.append((seq, msgs, now))
                    self.stats["frames_resent"] += 1
                ch.unacked = fresh
                resent = True
            if resent:
                ch.ack_sent = ack
                ch.ack_due_at = None
            elif ch.ack_due_at is not None and ch.ack_due_at <= now:
                out.append((peer, Frame(self.incarnation, ch.peer_inc, 0, ack)))
                ch.ack_sent = ack
                ch.ack_due_at = None
        return out

    def next_deadline(self) -> float | None:
        best = _INF
        timeout = self.params.resend_timeout
        for ch in self._chans.values():
            unacked = ch.unacked
            if unacked:
                t = unacked[0][2] + timeout
                if t < best:
                    best = t
            due = ch.ack_due_at
            if due is not None and due < best:
                best = due
        return None if best == _INF else best

    # -- connections ---------------------------------------------------------------------
    def received_from(self, peer: NodeId, peer_inc: int) -> int:
        """What we hold in order from ``peer``'s incarnation (sent in a reconnect handshake)."""
        ch = self._chans.get(peer)
        if ch is None or ch.peer_inc != peer_inc:
            return 0
        return ch.next_in - 1

    def known_incarnation(self, peer: NodeId) -> int:
        ch = self._chans.get(peer)
        return ch.peer_inc if ch is not None else 0

    def ended_incarnation(self, peer: NodeId) -> int:
        """The latest incarnation of ``peer`` known to have stopped (0: none)."""
        ch = self._chans.get(peer)
        return ch.ended if ch is not None else 0

    def peer_stopped(self, peer: NodeId, peer_inc: int) -> None:
        """``peer``'s incarnation ``peer_inc`` stopped for good (its process said so).

        Its channel goes, with every frame it did not acknowledge: those were meant for
        that process.  What is sent to ``peer`` from now on waits in a fresh channel for
        the next incarnation under the name, as for a peer never talked to; ``peer_inc``
        and older incarnations stay stale.  A channel already on a newer incarnation is
        left alone, and so is a peer without a channel.
        """
        ch = self._chans.get(peer)
        if ch is None or ch.peer_inc > peer_inc:
            return  # never talked to (or forgotten, or dropped), or already a newer one
        self.reorder_bytes -= ch.reorder_bytes
        self._chans[peer] = _Channel(ended=max(peer_inc, ch.ended))

    def on_connected(
        self, peer: NodeId, peer_inc: int, peer_ack: int, now: float
    ) -> list[tuple[NodeId, Frame]]:
        """A (re)connection to ``peer`` is up: return the frames to send again at once.

        ``peer_ack`` is what the peer holds of our frames, so only what it misses is resent.
        A new incarnation is a new process: its channel starts afresh and nothing buffered
        for its predecessor goes to it.
        """
        if peer in self._forgotten:
            return []
        dropped = self._dropped.get(peer)
        if dropped is not None:
            if peer_inc <= dropped:
                return []
            del self._dropped[peer]
        ch = self._chan(peer)
        if peer_inc <= ch.ended:
            return []  # a stopped incarnation
        if ch.peer_inc not in (0, peer_inc):
            self.reorder_bytes -= ch.reorder_bytes
            ch = _Channel(ended=ch.ended)
            self._chans[peer] = ch
        ch.peer_inc = peer_inc
        self._on_ack(ch, peer_ack)
        ack = ch.next_in - 1
        frames = []
        fresh: deque[tuple[int, tuple[Any, ...], float]] = deque()
        for seq, msgs, _sent in ch.unacked:
            frames.append((peer, Frame(self.incarnation, peer_inc, seq, ack, msgs)))
            fresh.append((seq, msgs, now))
        ch.unacked = fresh
        if frames:
            ch.ack_sent = ack
            ch.ack_due_at = None
            self.stats["frames_resent"] += len(frames)
        return frames

    # -- membership ----------------------------------------------------------------------
    def forget(self, peer: NodeId) -> None:
        """Drop every buffer for ``peer`` (it was parted or declared faulty) for good.

        Later traffic with ``peer`` is best effort in both directions: we still want to tell
        a parted router that it was parted, but owe it no ordering or resend.  Ids are never
        reused (a restarted process comes back under a fresh id), so this is permanent.
        """
        ch = self._chans.pop(peer, None)
        if ch is not None:
            self.reorder_bytes -= ch.reorder_bytes
        self._forgotten.add(peer)  # what is queued still leaves, as a datagram

    def drop(self, peer: NodeId) -> None:
        """Free the channel of an application process that left (parted or declared
        faulty, and collected), with every frame it did not acknowledge.

        The incarnation is remembered (the latest ``dropped_memory`` of them): if that
        process talks again (it was paused, or cut off, past being declared faulty), its
        channel no longer lines up with ours, so both directions fall back to datagrams
        and the core can still tell it to stop.  A later incarnation gets a fresh channel.

        What is queued for ``peer`` and not flushed yet still leaves, once, as a datagram
        (as with :meth:`forget`): a router drops a departed process in the very step that
        queues the acknowledgement of its part, the last thing it owes it.
        """
        ch = self._chans.pop(peer, None)
        if ch is not None:
            self.reorder_bytes -= ch.reorder_bytes
        dropped = self._dropped
        dropped[peer] = ch.peer_inc if ch is not None else 0
        dropped.move_to_end(peer)
        while len(dropped) > self.params.dropped_memory:
            dropped.popitem(last=False)

    def release_reordered(self, peer: NodeId) -> None:
        """Let go of the frames from ``peer`` held ahead of a gap: the connection they came
        on is gone, and the peer resends everything we did not acknowledge once it is
        connected again (our acknowledgement never covered them)."""
        ch = self._chans.get(peer)
        if ch is not None and ch.reorder:
            self.reorder_bytes -= ch.reorder_bytes
            ch.reorder = {}
            ch.reorder_bytes = 0

    def unacked(self, peer: NodeId) -> int:
        ch = self._chans.get(peer)
        return len(ch.unacked) if ch else 0

    def unacked_messages(self, peer: NodeId) -> int:
        """Messages sent to ``peer`` and not yet acknowledged: how far behind it is.

        Protocol cores read it to shed best-effort traffic (unsafe copies) for a peer that
        does not keep up, before its buffers grow without bound.
        """
        ch = self._chans.get(peer)
        return ch.unacked_msgs if ch else 0

    def peers(self) -> list[NodeId]:
        return list(self._chans)

    def _chan(self, peer: NodeId) -> _Channel:
        ch = self._chans.get(peer)
        if ch is None:
            ch = _Channel()
            self._chans[peer] = ch
        return ch
