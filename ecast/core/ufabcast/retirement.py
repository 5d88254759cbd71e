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


class Retirement:
    __slots__ = ("confirmed", "old_members")

    def __init__(self, old_members: tuple[NodeId, ...]) -> None:
        self.old_members = old_members
        self.confirmed: set[NodeId] = set()

    def confirm(self, src: NodeId, members: tuple[NodeId, ...], majority: int) -> bool:
        """``src`` told us we were parted; True once a majority of the new view did."""
        if src in members:
            self.confirmed.add(src)
        return len(self.confirmed) >= majority

    def audience(self, members: tuple[NodeId, ...], me: NodeId) -> list[NodeId]:
        """Whom the retiring router keeps telling its final position."""
        return [m for m in sorted(set(self.old_members) | set(members)) if m != me]
