"""Catch-up: a learner that misses chosen values fetches them from a peer's log (3.5.5).

A learner notices it is behind in two ways: a ``Commit`` names an instance whose value it
never saw (``missing_from`` the committer), or its position has not moved for a
heartbeat while peers report executing further.  It then asks one peer for the executed
instances from its position; when stalled it asks the peers ahead in turn, so one that
died or left cannot keep it waiting.
"""

from __future__ import annotations

from ecast.core.effects import NodeId


class CatchUp:
    __slots__ = ("_check_at", "_last", "_turn", "missing_from")

    def __init__(self) -> None:
        self._check_at = 0.0
        self._last = -2
        self._turn = 0
        self.missing_from: NodeId | None = None
        """A peer that committed an instance whose value we lack."""

    def whom_to_ask(
        self, now: float, executed: int, reported: dict[NodeId, int], me: NodeId, period: float
    ) -> NodeId | None:
        """At most once per ``period``: the peer to ask for what follows ``executed``."""
        if now < self._check_at:
            return None
        self._check_at = now + period
        best = self.missing_from
        if best is None and executed == self._last:
            ahead = sorted(p for p, e in reported.items() if e > executed and p != me)
            if ahead:
                self._turn += 1
                best = ahead[self._turn % len(ahead)]
        self._last = executed
        self.missing_from = None
        return best
