"""Garbage collection of Paxos state and the executed log (3.5.5).

Every member reports its highest executed instance (in heartbeats and, under load, in its
votes); the minimum over the view is the watermark at or below which no member can ever
ask for anything again, so the log, accepted values and decided values there go.  The
leader's ``Commit`` carries its watermark back, so followers collect a round trip after
every member executed, not up to two heartbeats later.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ecast.core.effects import NodeId


class Watermark:
    __slots__ = ("reported", "value")

    def __init__(self) -> None:
        self.value = -1
        """Every member executed up to here: all Paxos state at or below is collected."""
        self.reported: dict[NodeId, int] = {}
        """Member -> its highest executed instance, as it last reported it."""

    def report(self, src: NodeId, executed: int) -> bool:
        """Record a report; True if it moved ``src`` forward."""
        if executed > self.reported.get(src, -2):
            self.reported[src] = executed
            return True
        return False

    def candidate(self, members: Iterable[NodeId], me: NodeId, executed: int) -> int | None:
        """The minimum executed instance over the view, or None while a member is unheard."""
        w = executed
        for m in members:
            if m != me:
                r = self.reported.get(m)
                if r is None:
                    return None
                w = min(w, r)
        return w


def prune(d: dict[int, Any], upto: int, floor: int) -> None:
    """Delete the keys ``<= upto`` of an instance-keyed dict whose keys are all ``> floor``.

    Walks the instance range when it is short and the keys when the range is longer, so a
    jump over millions of instances (a snapshot) costs no more than the dict's size.
    """
    if not d:
        return
    if upto - floor <= len(d):
        for inst in range(floor + 1, upto + 1):
            d.pop(inst, None)
    else:
        for inst in [i for i in d if i <= upto]:
            del d[inst]
