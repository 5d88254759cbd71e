"""What a leader knows of its followers, and what a majority of them makes chosen.

etcd's raft keeps a ``Progress`` per follower and a ``quorum`` package that turns their
match indexes into a commit index; these are the same two things for Multi-Paxos with
pipelined phase 2 (3.5.4): each member acknowledges ranges (``Accepted(upto)``), and an
instance is chosen once a majority of the view accepted it at the leader's ballot.
"""

from __future__ import annotations

from collections.abc import Sequence

from ecast.core.effects import NodeId


def chosen_upto(
    acked: dict[NodeId, int], members: Sequence[NodeId], majority: int, floor: int
) -> int:
    """The highest instance a majority of ``members`` acknowledged (``floor`` for a
    member not heard from): every instance up to it is chosen."""
    acks = sorted((acked.get(m, floor) for m in members), reverse=True)
    return acks[majority - 1]


def first_voters(members: Sequence[NodeId], leader: NodeId, majority: int) -> list[NodeId]:
    """The members whose votes a leader waits for first: with the leader's own vote, the
    first ``majority`` of the view in member order.  The others may hold their votes a
    little and send them together (``UfabParams.vote_delay``)."""
    need = majority - (1 if leader in members else 0)
    return [m for m in members if m != leader][:need]


class Progress:
    """A leader's tenure's acknowledgements: member -> highest instance accepted."""

    __slots__ = ("acked",)

    def __init__(self) -> None:
        self.acked: dict[NodeId, int] = {}

    def ack(self, member: NodeId, upto: int) -> bool:
        """Record ``Accepted(upto)``; True if it moved ``member`` forward."""
        if upto > self.acked.get(member, -1):
            self.acked[member] = upto
            return True
        return False

    def chosen(self, members: Sequence[NodeId], majority: int, floor: int) -> int:
        return chosen_upto(self.acked, members, majority, floor)
