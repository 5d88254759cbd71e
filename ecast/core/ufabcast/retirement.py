"""Retirement: a router that executed its own ``part`` lingers before it vanishes.

The members that stay may still need it: its last acknowledgements and commits, and its
executed log, may be the only record of how the old view ended (in a 2-member view the
leaving member's vote was half the majority).  So a retiring router has stopped for the
layer above, but keeps answering catch-up requests and announcing its final position to
old and new members, until a majority of the new view confirms (by telling it that it
was parted) that it executed the stop sign (docs/decisions.md).
"""

from __future__ import annotations

from ecast.core.effects import NodeId
from ecast.core.ufabcast.messages import View


class Retirement:
    __slots__ = ("confirmed", "old_members")

    def __init__(self, old_members: tuple[NodeId, ...]) -> None:
        self.old_members = old_members
        self.confirmed: set[NodeId] = set()

    def confirm(self, src: NodeId, their_view: int, view: View) -> bool:
        """``src``, in view ``their_view``, told us we were parted; True once a majority
        of ``view`` (the one we left for) did, or once anyone tells it from a later view.

        A later view was decided in ``view`` by a majority of its members, all of whom had
        executed our stop sign to be there.  Without that rule a retiree waits for ever
        when members of ``view`` leave before they confirm: their majority is gone."""
        if their_view > view.number:
            return True
        if src in view.members:
            self.confirmed.add(src)
        return len(self.confirmed) >= view.majority

    def audience(self, members: tuple[NodeId, ...], me: NodeId) -> list[NodeId]:
        """Whom the retiring router keeps telling its final position."""
        return [m for m in sorted(set(self.old_members) | set(members)) if m != me]
