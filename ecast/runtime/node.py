"""The node driver: one logical process (a core and its link layer) under asyncio.

A node feeds its core what the runtime read, carries out the core's effects through its
link layer, and keeps one timer for the earlier of the core's wake-up and the link's
deadline.  Frames leave through the runtime (:mod:`ecast.runtime.mux`), which batches
every node's output of one loop turn into one packet per peer process.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ecast.core.effects import Core, Effects, NodeId, UnexpectedMessage, carry_out
from ecast.core.link import Frame, LinkLayer, LinkParams
from ecast.core.proto import Direct, Directory
from ecast.runtime.process import new_incarnation
from ecast.wire.codec import Packed

if TYPE_CHECKING:
    from ecast.runtime.mux import Runtime

log = logging.getLogger("ecast.runtime")

TCP_LINK = LinkParams(resend_timeout=float("inf"), ack_delay=0.1)
"""Over TCP nothing is lost inside a connection: resend only after a reconnect."""
CONGESTED = 1 << 30
UNSAFE_BUFFER = 4 << 20
"""Unsent bytes to a process past which unsafe copies to it are shed (``unsafe_lag``)."""
"""What ``Node.lag`` adds for a peer whose connection is congested."""
UPKEEP = 0.25
"""A node with nothing to wake for still ticks this often, for connection upkeep."""

DeliverFn = Callable[["Node", list[Any]], None]


class Node:
    """One logical process: a core, its link layer, its timer."""

    def __init__(
        self,
        runtime: Runtime,
        node_id: NodeId,
        core: Core,
        *,
        on_deliver: DeliverFn | None = None,
        on_directs: Callable[[NodeId, list[Any]], None] | None = None,
        advertise: bool = False,
        keep_connected: Callable[[], list[NodeId]] | None = None,
    ) -> None:
        self.runtime = runtime
        self.node_id = node_id
        self.core = core
        self.incarnation = new_incarnation()
        self.link = LinkLayer(node_id, self.incarnation, TCP_LINK)
        self.on_deliver = on_deliver
        self.on_directs = on_directs
        """Takes ``Direct`` payloads from other application processes, those of one frame
        from one peer in one call (in their order: a client that gets thousands of
        answers a second takes each frame's in one step of its core); without it they go
        to the core like any other message."""
        self.advertise = advertise
        """Gossip the address directory to peers (routers do)."""
        self.keep_connected = keep_connected
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self._core_wake: float | None = None
        self.stopped = False
        self.stats = {"frames_in": 0, "frames_out": 0, "core_errors": 0}

    # ------------------------------------------------------------------ lifecycle
    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self.runtime.loop

    def start(self) -> None:
        self._arm_timer(self.loop.time())
        self.feed(lambda core, now: core.on_tick(now))

    async def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        if self._timer is not None:
            self._timer.cancel()
        self.runtime.remove_node(self)

    # ------------------------------------------------------------------ driving the core
    def now(self) -> float:
        return self.loop.time()

    def feed(self, call: Callable[[Any, float], Effects]) -> Effects | None:
        """Run ``call(core, now)`` and carry out its effects."""
        if self.stopped:
            return None
        fx = call(self.core, self.loop.time())
        self._apply(fx)
        return fx

    def _apply(self, fx: Effects) -> None:
        carry_out(fx, self.link)
        self._core_wake = fx.wake_at
        if fx.deliver and self.on_deliver is not None:
            self.on_deliver(self, fx.deliver)
        if fx.send:
            self.runtime.schedule(self)
        self.rearm()

    def rearm(self) -> None:
        wake = self._core_wake
        deadline = self.link.next_deadline()
        if deadline is not None and (wake is None or deadline < wake):
            wake = deadline
        if wake is not None:
            self._arm_timer(wake)

    def _arm_timer(self, at: float) -> None:
        if at >= self._timer_at or self.stopped:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = self.loop.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = float("inf")
        if self.stopped:
            return
        now = self.loop.time()
        self.feed(lambda core, t: core.on_tick(t))
        self.runtime.route(self, self.link.on_tick(now))
        if self.keep_connected is not None:
            routes = self.runtime.routes
            for peer in self.keep_connected():
                if peer not in routes and peer != self.node_id:
                    self.runtime.want(peer)
        self.rearm()
        if self._timer is None:
            self._arm_timer(now + UPKEEP)

    # ------------------------------------------------------------------ receiving
    def on_frames(
        self,
        frames: list[tuple[NodeId, Frame, int]] | tuple[tuple[NodeId, Frame, int], ...],
    ) -> None:
        """Frames for this node, in arrival order, each with its bytes on the wire (0 for
        a colocated node's): through the link layer, to the core."""
        if self.stopped:
            return
        self.stats["frames_in"] += len(frames)
        now = self.loop.time()
        link = self.link
        batch: list[tuple[NodeId, list[Any]]] = []
        for src, frame, size in frames:
            msgs = link.on_frame(src, frame, now, size)
            if msgs:
                msgs = self._side_channel(src, msgs)
                if msgs:
                    batch.append((src, msgs))
        if not batch:
            self.rearm()
            return
        self._feed_batch(batch)

    def _side_channel(self, src: NodeId, msgs: list[Any]) -> list[Any]:
        """Take out what the runtime consumes itself (directories, direct payloads when
        the host takes them)."""
        on_directs = self.on_directs
        if not any(type(m) is Directory or type(m) is Direct for m in msgs):
            return msgs
        rest = []
        payloads = []
        for m in msgs:
            if type(m) is Directory:
                self.runtime.directory_from(src, m.entries)
            elif type(m) is Direct:
                payload = m.payload
                if type(payload) is Packed:  # from a colocated node: never encoded
                    payload = payload.unpacked()
                if on_directs is not None:
                    payloads.append(payload)
                else:
                    rest.append(m if payload is m.payload else Direct(payload))
            else:
                rest.append(m)
        if payloads:
            on_directs(src, payloads)  # type: ignore[misc]
        return rest

    def _feed_batch(self, batch: list[tuple[NodeId, list[Any]]]) -> None:
        on_batch = getattr(self.core, "on_batch", None)
        if on_batch is None or len(batch) == 1:
            for src, msgs in batch:
                try:
                    self.feed(lambda core, now, s=src, m=msgs: core.on_messages(s, m, now))
                except Exception:
                    self._core_error((src,))
            return
        try:
            self.feed(lambda core, now: core.on_batch(batch, now))
        except UnexpectedMessage as e:
            # The core refused the batch before changing anything: drop the offender only.
            self._core_error((e.peer,))
            rest = [(s, m) for s, m in batch if s != e.peer]
            if rest:
                self._feed_batch(rest)
        except Exception:
            self._core_error(tuple(dict.fromkeys(s for s, _ in batch)))

    def _core_error(self, peers: tuple[NodeId, ...]) -> None:
        self.stats["core_errors"] += 1
        log.error(
            "event=core_error node=%s peer=%s detail=%r",
            self.node_id,
            ",".join(peers),
            traceback.format_exc(limit=5),
        )
        for peer in peers:
            self.runtime.disconnect(peer, "input the protocol could not handle")

    # ------------------------------------------------------------------ conveniences
    def lag(self, peer: NodeId) -> int:
        """How far ``peer`` lags: link messages it has not acknowledged, or "very far" while
        the connection to its process is congested.  A link message may carry thousands of
        copies, so the count alone let a flood of unsafe messages fill the send buffers of
        a slow receiver process (the leader grew to 300 MB); cores that shed best-effort
        traffic (``Router.link_lag``) read this."""
        n = self.link.unacked_messages(peer)
        return n + CONGESTED if self.runtime.congested(peer) else n

    def unsafe_lag(self, peer: NodeId) -> int:
        """How far ``peer`` lags for best-effort traffic (``Router.link_lag``): link
        messages it has not acknowledged, or "very far" once the connection to its
        process holds more than ``UNSAFE_BUFFER`` unsent bytes.

        Not :meth:`lag`'s congestion mark (asyncio's 64 KiB): a process that hosts many
        destinations (16 storage processes share one connection in the benchmarks) passes
        that mark in every burst of reads, and the leader shed every snapshot read to all
        of them while they idled.  The byte bound still stops a flood of unsafe copies
        from growing the buffers of a slow receiver without bound."""
        n = self.link.unacked_messages(peer)
        return n + CONGESTED if self.runtime.buffered(peer) > UNSAFE_BUFFER else n

    def send_direct(self, peer: NodeId, payload: Any) -> None:
        """Send ``payload`` to another application process over an authenticated link.
        Its size (packed, or raw bytes) lets the link keep each frame under the limit."""
        data = payload.data if type(payload) is Packed else payload
        self.link.send(peer, Direct(payload), len(data) if type(data) is bytes else 0)
        self.runtime.schedule(self)

    async def connect(self, address: str, timeout: float = 5.0) -> NodeId:
        """Reach the process at ``address``; return the (first) node that runs there."""
        return await self.runtime.connect_node(address, timeout)
