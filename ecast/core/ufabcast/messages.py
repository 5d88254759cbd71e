"""Commands, messages and upcalls of ufabcast (dissertation 3.5.4, 3.5.5).

Commands are what the replicated state machine executes; messages are what routers send to
each other to agree on them; upcalls are what ufabcast hands to the layer above it.
All are frozen, slotted dataclasses; their wire encoding lives in one codec module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ecast.core.effects import NodeId

Ballot = tuple[int, NodeId]
"""(round, proposer).  Round 0 belongs to the first member of a view and needs no phase 1."""


# --------------------------------------------------------------------------- commands
@dataclass(frozen=True, slots=True)
class AppCmd:
    """A command proposed by the layer above.

    ``(proposer, seq)`` is its identity for life: a command proposed again after a view
    change or a leader change keeps it, which is what lets the FIFO layer drop the second
    copy when one command is chosen in two instances.
    """

    proposer: NodeId
    seq: int
    payload: Any


@dataclass(frozen=True, slots=True)
class JoinCmd:
    """Add ``router`` at the end of the succession order (a stop sign, 3.5.4)."""

    proposer: NodeId
    router: NodeId


@dataclass(frozen=True, slots=True)
class PartCmd:
    """Remove ``router`` for good; it may come back only under a fresh id (a stop sign)."""

    proposer: NodeId
    router: NodeId


Command = AppCmd | JoinCmd | PartCmd
Value = tuple[Command, ...]
"""What one Paxos instance decides: a clump of commands.  The empty tuple is a no-op."""


@dataclass(frozen=True, slots=True)
class View:
    """A router group configuration.  ``members`` is the succession (join) order, 3.5.2."""

    number: int
    members: tuple[NodeId, ...]
    start: int
    """First instance that belongs to this view."""

    @property
    def majority(self) -> int:
        return len(self.members) // 2 + 1


# --------------------------------------------------------------------------- messages
@dataclass(frozen=True, slots=True)
class Forward:
    """Commands for the Paxos leader; ``ttl`` bounds relaying by routers that are not it."""

    cmds: tuple[Command, ...]
    ttl: int = 1


@dataclass(frozen=True, slots=True)
class Prepare:
    view: int
    ballot: Ballot
    start: int


@dataclass(frozen=True, slots=True)
class Promise:
    view: int
    ballot: Ballot
    start: int
    accepted: tuple[tuple[int, Ballot, Value], ...]
    """(instance, ballot, value) for every instance >= start this acceptor accepted."""


@dataclass(frozen=True, slots=True)
class Accept:
    view: int
    ballot: Ballot
    instance: int
    value: Value


@dataclass(frozen=True, slots=True)
class Accepted:
    """The sender accepted every ``Accept`` of this ballot it received up to ``upto``.

    One range acknowledgement per leader per flush instead of one per instance; FIFO
    channels make "everything up to" exact.  ``executed`` is the sender's highest executed
    instance: under load it reaches the leader within a round trip, so the leader can
    collect garbage without waiting for the next heartbeat (3.5.5).
    """

    view: int
    ballot: Ballot
    upto: int
    executed: int


@dataclass(frozen=True, slots=True)
class Nack:
    """The sender has promised ``promised``, which beats the ballot it was asked to use."""

    view: int
    promised: Ballot


@dataclass(frozen=True, slots=True)
class Commit:
    """Instances ``lo..hi`` of ``view`` are chosen with the values of ``ballot``.

    ``collected`` is the leader's GC watermark: every member has executed every instance
    up to it, so a follower may forget them too (3.5.5) without waiting for heartbeats.
    """

    view: int
    ballot: Ballot
    lo: int
    hi: int
    collected: int


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Liveness and the sender's highest executed instance (GC, catch-up), 3.5.5."""

    view: int
    executed: int


@dataclass(frozen=True, slots=True)
class CatchUpRequest:
    start: int


@dataclass(frozen=True, slots=True)
class CatchUpReply:
    entries: tuple[tuple[int, int, Value], ...]
    """(instance, view, value) of executed instances."""


@dataclass(frozen=True, slots=True)
class JoinRequest:
    pass


@dataclass(frozen=True, slots=True)
class Snapshot:
    """State of a router right after executing instance ``tag``, sent to a joiner."""

    tag: int
    view: View
    fifo_next: tuple[tuple[NodeId, int], ...]
    held: tuple[AppCmd, ...]
    retired: tuple[NodeId, ...]
    app_state: Any


@dataclass(frozen=True, slots=True)
class Parted:
    """Tells a router that it was parted (it executes nothing more and stops)."""

    view: int
    """The sender's view.  A retiring router whose new view has since been replaced
    needs no more confirmations: that later view was decided by a majority of the one it
    left for, so they all executed its stop sign (see :mod:`.retirement`)."""
    members: tuple[NodeId, ...]
    """The sender's view's members: where the group is.  A router parted while it was cut
    off, whose old view's members have all left since, learns it is out only from a
    router outside that view, and points its application processes there (their own
    lists may name only routers that are gone)."""


UFAB_MESSAGES = (
    Forward,
    Prepare,
    Promise,
    Accept,
    Accepted,
    Nack,
    Commit,
    Heartbeat,
    CatchUpRequest,
    CatchUpReply,
    JoinRequest,
    Snapshot,
    Parted,
)


# --------------------------------------------------------------------------- upcalls
@dataclass(frozen=True, slots=True)
class Executed:
    """An application command released in per-proposer FIFO order."""

    proposer: NodeId
    seq: int
    payload: Any
    instance: int


@dataclass(frozen=True, slots=True)
class ViewChanged:
    view: View
    joined: tuple[NodeId, ...]
    parted: tuple[NodeId, ...]


@dataclass(frozen=True, slots=True)
class SnapshotNeeded:
    """The layer above must call ``provide_snapshot(joiner, tag, state)`` with its state now.

    It appears in the upcall stream exactly where that state is the right one: after every
    ``Executed`` up to ``tag`` and before any later one.
    """

    joiner: NodeId
    tag: int


@dataclass(frozen=True, slots=True)
class Installed:
    """A joiner received its snapshot; later upcalls continue from ``tag + 1``."""

    tag: int
    view: View
    app_state: Any


@dataclass(frozen=True, slots=True)
class Stopped:
    reason: str
    successor: Parted | None = None
    """The ``Parted`` that stopped us, when it named a later view than ours: where the
    group is, and where our application processes should go."""
