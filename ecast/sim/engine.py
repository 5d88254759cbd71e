"""A deterministic, seeded discrete-event simulator for sans-IO cores.

Every process in a run is a core (anything with ``on_message`` and ``on_tick`` returning
:class:`~ecast.core.effects.Effects`) behind the real :class:`~ecast.core.link.LinkLayer`.  The
network between link layers is simulated: per-connection delay with jitter (frames on one
connection stay in order, different connections reorder freely), loss, partitions, slow
nodes and crashes.  Lost frames are recovered by the link layer, so loss injection tests
the same resend code the TCP runtime uses.

Determinism: one ``random.Random(seed)`` drives every choice, events are ordered by
(time, insertion counter), and nothing iterates a set.  The trace digest covers every
processed event and every upcall, so two runs with one seed can be compared byte for byte,
also under different ``PYTHONHASHSEED`` values.
"""

from __future__ import annotations

import hashlib
import heapq
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ecast.core.effects import Core, Effects, NodeId, carry_out
from ecast.core.link import Frame, LinkLayer, LinkParams

_FRAME = 0
_TICK = 1
_CALL = 2
_INF = float("inf")


@dataclass(slots=True)
class NetParams:
    delay: float = 0.0005
    """Base one-way latency of a frame."""
    jitter: float = 0.0015
    """Uniform extra latency per frame, drawn independently for every frame."""
    loss: float = 0.0
    """Probability that a frame is dropped on the wire."""
    min_tick: float = 0.0001
    """A core may not ask to be woken sooner than this after now (guards busy loops)."""
    codec: bool = False
    """Send every frame through the real wire codec (encoded into a packet and decoded
    again, with every check the runtime applies): a message the codec cannot carry, or
    carries wrongly, fails the run instead of passing in memory."""


class SimNode:
    __slots__ = ("alive", "core", "id", "link", "slow", "tick_at", "tick_token", "wake")

    def __init__(self, node_id: NodeId, core: Core, link: LinkLayer) -> None:
        self.id = node_id
        self.core = core
        self.link = link
        self.alive = True
        self.slow = 0.0
        self.wake: float | None = None
        self.tick_at = _INF
        self.tick_token = 0


class Simulator:
    def __init__(
        self,
        seed: int,
        net: NetParams | None = None,
        link_params: LinkParams | None = None,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.net = net or NetParams()
        self.link_params = link_params or LinkParams()
        self.now = 0.0
        self.nodes: dict[NodeId, SimNode] = {}
        self._queue: list[tuple[float, int, int, Any, Any, Any]] = []
        self._counter = 0
        self._incarnations = 0
        self._cut: set[tuple[NodeId, NodeId]] = set()
        self._last_arrival: dict[tuple[NodeId, NodeId], float] = {}
        self._digest = hashlib.blake2b(digest_size=16)
        self.observer: Callable[[NodeId, float, list[Any]], None] | None = None
        self.events = 0
        self.frames = 0
        self.frames_lost = 0

    # ------------------------------------------------------------------ topology
    def add(self, node_id: NodeId, core: Core) -> SimNode:
        if node_id in self.nodes:
            raise ValueError(f"node {node_id!r} exists; a restarted process needs a fresh id")
        self._incarnations += 1
        node = SimNode(node_id, core, LinkLayer(node_id, self._incarnations, self.link_params))
        self.nodes[node_id] = node
        self._schedule_tick(node, self.now)
        return node

    def crash(self, node_id: NodeId) -> None:
        node = self.nodes[node_id]
        node.alive = False
        self._trace("crash", node_id)

    def partition(self, *groups: Iterable[NodeId]) -> None:
        """Cut every link between nodes of different groups (nodes in no group keep all)."""
        sets = [list(g) for g in groups]
        for i, a_group in enumerate(sets):
            for b_group in sets[i + 1 :]:
                for a in a_group:
                    for b in b_group:
                        self._cut.add((a, b))
                        self._cut.add((b, a))
        self._trace("partition", repr(sets))

    def cut(self, a: NodeId, b: NodeId) -> None:
        self._cut.add((a, b))
        self._cut.add((b, a))
        self._trace("cut", f"{a}-{b}")

    def heal(self) -> None:
        self._cut.clear()
        self._trace("heal", "")

    def set_slow(self, node_id: NodeId, extra: float) -> None:
        self.nodes[node_id].slow = extra
        self._trace("slow", f"{node_id}={extra!r}")

    def set_loss(self, loss: float) -> None:
        self.net.loss = loss
        self._trace("loss", repr(loss))

    def is_cut(self, a: NodeId, b: NodeId) -> bool:
        return (a, b) in self._cut

    # ------------------------------------------------------------------ driving
    def at(self, t: float, fn: Callable[[], None]) -> None:
        """Run ``fn()`` at virtual time ``t`` (for workloads, faults and probes)."""
        self._push(max(t, self.now), _CALL, fn, None, None)

    def call(self, node_id: NodeId, fn: Callable[[Any, float], Effects]) -> bool:
        """Invoke ``fn(core, now)`` on a live node now and carry out its effects."""
        node = self.nodes[node_id]
        if not node.alive:
            return False
        self._apply(node, fn(node.core, self.now))
        self._after(node)
        return True

    def run(self, until: float, stop: Callable[[], bool] | None = None) -> None:
        queue = self._queue
        nodes = self.nodes
        while queue:
            if queue[0][0] > until:
                break
            t, _n, kind, a, b, c = heapq.heappop(queue)
            self.now = t
            self.events += 1
            if kind == _FRAME:
                node = nodes[a]
                if not node.alive or (b, a) in self._cut:
                    continue
                self._on_frame(node, b, c)
            elif kind == _TICK:
                node = a
                if not node.alive or b != node.tick_token:
                    continue
                node.tick_at = _INF
                self._on_tick(node)
            else:
                a()
            if stop is not None and stop():
                return
        self.now = max(self.now, until)

    def digest(self) -> str:
        return self._digest.hexdigest()

    # ------------------------------------------------------------------ internals
    def _trace(self, what: str, detail: str) -> None:
        self._digest.update(f"{self.now!r} {what} {detail}\n".encode())

    def _push(self, t: float, kind: int, a: Any, b: Any, c: Any) -> None:
        self._counter += 1
        heapq.heappush(self._queue, (t, self._counter, kind, a, b, c))

    def _on_frame(self, node: SimNode, src: NodeId, frame: Frame) -> None:
        msgs = node.link.on_frame(src, frame, self.now)
        if msgs:
            self._apply(node, node.core.on_messages(src, msgs, self.now))
        self._after(node)

    def _on_tick(self, node: SimNode) -> None:
        self._apply(node, node.core.on_tick(self.now))
        for dst, frame in node.link.on_tick(self.now):
            self._transmit(node, dst, frame)
        self._after(node)

    def _apply(self, node: SimNode, fx: Effects) -> None:
        carry_out(fx, node.link)
        if fx.deliver:
            self._digest.update(f"{self.now!r} {node.id} {fx.deliver!r}\n".encode())
            if self.observer is not None:
                self.observer(node.id, self.now, fx.deliver)
        node.wake = fx.wake_at

    def _after(self, node: SimNode) -> None:
        for dst, frame in node.link.flush(self.now):
            self._transmit(node, dst, frame)
        wake = node.wake
        deadline = node.link.next_deadline()
        if deadline is not None and (wake is None or deadline < wake):
            wake = deadline
        if wake is not None:
            self._schedule_tick(node, wake)

    def _schedule_tick(self, node: SimNode, t: float) -> None:
        t = max(t, self.now + self.net.min_tick)
        if t < node.tick_at:
            node.tick_token += 1
            node.tick_at = t
            self._push(t, _TICK, node, node.tick_token, None)

    def _transmit(self, node: SimNode, dst: NodeId, frame: Frame) -> None:
        self.frames += 1
        src = node.id
        target = self.nodes.get(dst)
        if target is None or (src, dst) in self._cut:
            self.frames_lost += 1
            return
        net = self.net
        rng = self.rng
        if net.loss and rng.random() < net.loss:
            self.frames_lost += 1
            return
        if net.codec:
            frame = _through_codec(src, dst, frame)
        delay = net.delay + rng.random() * net.jitter + node.slow + target.slow
        key = (src, dst)
        arrival = self.now + delay
        last = self._last_arrival.get(key, 0.0)
        if arrival < last:
            arrival = last  # one connection delivers in order
        self._last_arrival[key] = arrival
        self._push(arrival, _FRAME, dst, src, frame)


_CODEC: Any = None
"""``(encoder, pack_packet's helpers)``, made at the first frame (the simulator imports
the wire only when a schedule runs through it)."""


def _through_codec(src: NodeId, dst: NodeId, frame: Frame) -> Frame:
    """``frame`` as the receiving runtime would see it after the wire."""
    global _CODEC
    if _CODEC is None:
        from ecast.wire.codec import Encoder
        from ecast.wire.packet import array_header, decode_packet, frame_item

        _CODEC = (Encoder(), array_header, decode_packet, frame_item)
    encoder, array_header, decode_packet, frame_item = _CODEC
    try:
        parts = encoder.pack_packet([frame_item(src, dst, frame)])
    finally:
        encoder.reset()
    (item,) = decode_packet(array_header(len(parts)) + b"".join(parts))
    return item.frame  # type: ignore[union-attr]
