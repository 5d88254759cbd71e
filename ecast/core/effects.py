"""What a sans-IO core asks its runtime to do.

Every protocol core in `ecast` (the link layer, ufabcast, later the router and the
application endpoint) is a plain object whose methods take an input and the current time
and return an :class:`Effects`.  The runtime (the asyncio/TCP driver or the simulator)
performs the effects; the core never touches a socket, a clock or a thread.  This is the
shape of etcd's ``raft`` (Ready/Advance) and of ``h11``; see ``docs/architecture.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

NodeId = str
"""A process identifier.  Strings, so that ordering ties break the same way everywhere."""


class UnexpectedMessage(TypeError):
    """A well-formed message the core does not take, from ``peer`` (a process speaking the
    wrong role).  Raised before the core changes any state, so the runtime can drop that
    peer and still feed everyone else's messages of the same batch."""

    def __init__(self, core: str, peer: NodeId, kind: str) -> None:
        super().__init__(f"{core}: unknown message type {kind} from {peer}")
        self.peer = peer


@dataclass(slots=True, init=False)
class Effects:
    """Outputs of one call into a core.

    ``wake_at`` replaces a list of named timers: a core keeps its own deadlines and tells
    the runtime only the earliest one, so the runtime holds at most one timer per core and
    calls ``on_tick(now)`` when it fires (docs/decisions.md, "one wake-up per core").
    """

    send: list[tuple[NodeId, Any]] = field(default_factory=list)
    deliver: list[Any] = field(default_factory=list)
    wake_at: float | None = None
    forget: list[NodeId] = field(default_factory=list)
    drop: list[NodeId] = field(default_factory=list)
    """Peers whose link buffers can go: they left for good, but a later process under the
    same id starts a fresh channel (``LinkLayer.drop``; ``forget`` is permanent)."""

    def __init__(
        self,
        send: list[tuple[NodeId, Any]] | None = None,
        deliver: list[Any] | None = None,
        wake_at: float | None = None,
        forget: list[NodeId] | None = None,
        drop: list[NodeId] | None = None,
    ) -> None:
        # Written out: one is built per call into a core, and the generated __init__ with
        # default factories costs about twice as much.
        self.send = [] if send is None else send
        self.deliver = [] if deliver is None else deliver
        self.wake_at = wake_at
        self.forget = [] if forget is None else forget
        self.drop = [] if drop is None else drop

    def wake(self, at: float | None) -> None:
        """Ask to be ticked no later than ``at``."""
        if at is not None and (self.wake_at is None or at < self.wake_at):
            self.wake_at = at

    def extend(self, other: Effects) -> None:
        self.send.extend(other.send)
        self.deliver.extend(other.deliver)
        self.forget.extend(other.forget)
        self.drop.extend(other.drop)
        self.wake(other.wake_at)


class Core(Protocol):
    """What the runtime and the simulator drive: any sans-IO protocol core.

    ``on_messages`` gets every message of one link-layer frame from ``src``, in order;
    ``on_tick`` is called no later than the last ``Effects.wake_at`` asked for.  A core
    may also offer ``on_batch(((src, msgs), ...), now)`` to take what several senders
    brought in one step (the router does, so a packet from a process hosting many
    endpoints costs it one step).  A core raises :class:`UnexpectedMessage` for a message
    type it does not take, before changing any state.
    """

    def on_messages(
        self, src: NodeId, msgs: tuple[Any, ...] | list[Any], now: float
    ) -> Effects: ...

    def on_tick(self, now: float) -> Effects: ...


class Links(Protocol):
    """Where a core's sends go: a link layer, or a test's scripted queues."""

    def send(self, peer: NodeId, msg: Any) -> None: ...

    def forget(self, peer: NodeId) -> None: ...

    def drop(self, peer: NodeId) -> None: ...


def carry_out(fx: Effects, links: Links) -> None:
    """Hand a core's sends, forgets and drops to its links, in order.  Deliveries and the
    wake-up are the caller's: each host surfaces them its own way (an SDK queue, a
    simulator record, a benchmark counter)."""
    send = links.send
    for dst, msg in fx.send:
        send(dst, msg)
    if fx.forget:
        for peer in fx.forget:
            links.forget(peer)
    if fx.drop:
        for peer in fx.drop:
            links.drop(peer)
