"""Paxos state of one router: its acceptor role per view, and its tenure as a proposer.

Kept per view: a router that closed a view drops that view's state and refuses to take
part in it again, which is safe because refusing is always safe in Paxos (3.2.3).
"""

from __future__ import annotations

from ecast.core.effects import NodeId
from ecast.core.ufabcast.messages import Ballot, Value
from ecast.core.ufabcast.progress import Progress

LOWEST: Ballot = (0, "")


class Acceptor:
    """Acceptor state for one view."""

    __slots__ = ("accepted", "promised", "seen")

    def __init__(self) -> None:
        self.promised: Ballot = LOWEST
        self.accepted: dict[int, tuple[Ballot, Value]] = {}
        self.seen: dict[int, tuple[Ballot, Value]] = {}
        """Values of ``Accept`` messages we had to reject; a learner may need them
        (``value_for``)."""

    def value_for(self, inst: int, ballot: Ballot) -> Value | None:
        """The value chosen at ``ballot``: any proposal at a ballot >= it carries it (P2b)."""
        entry = self.accepted.get(inst)
        if entry is not None and entry[0] >= ballot:
            return entry[1]
        entry = self.seen.get(inst)
        if entry is not None and entry[0] >= ballot:
            return entry[1]
        return None

    def accepted_from(self, start: int) -> tuple[tuple[int, Ballot, Value], ...]:
        return tuple((i, b, v) for i, (b, v) in sorted(self.accepted.items()) if i >= start)


class Tenure:
    """This router's hold on a ballot in one view, while it leads or tries to (phase 1)."""

    __slots__ = (
        "ballot",
        "committed",
        "first_inst",
        "next_inst",
        "preparing",
        "progress",
        "promises",
        "view",
    )

    def __init__(self, view: int, ballot: Ballot, start: int, preparing: bool) -> None:
        self.view = view
        self.ballot = ballot
        self.preparing = preparing
        self.promises: dict[NodeId, tuple[tuple[int, Ballot, Value], ...]] = {}
        self.first_inst = start
        self.next_inst = start
        self.committed = start - 1
        self.progress = Progress()

    def in_flight(self) -> int:
        return self.next_inst - 1 - self.committed
