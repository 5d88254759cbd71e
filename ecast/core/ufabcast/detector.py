"""Failure detection among the routers of a view (3.5.5).

A member silent for the failure timeout is suspected, and the router proposes to part
it, but only while it hears from a majority of the view without its suspects: every
part it proposes then leaves a view whose members it hears.  Hearing from a suspect
again (any message) withdraws the suspicion locally; the part, once proposed, stands.

Why the majority: a part that cannot be decided without its target waits in the log
until the target is back, and is then decided by the target's own vote.  With three
routers, one crashed and the other two cut apart, each of the two suspected the other;
once the cut healed, the part of the live one was decided, and left a view of two with
its other member dead, which no router could ever change again.  Holding the part
while the rest of the view is not heard instead parts the dead one once the cut heals.

A tick much later than the heartbeat period means this process itself stalled (starved
of CPU, paused), and what peers sent meanwhile may still wait unread, so the stall is
not counted as their silence.
"""

from __future__ import annotations

from collections.abc import Iterable

from ecast.core.effects import NodeId


class FailureDetector:
    __slots__ = ("_last_tick", "last_heard", "stalls_excused", "suspected")

    def __init__(self) -> None:
        self.last_heard: dict[NodeId, float | None] = {}
        """Member -> when we last heard from it; None: not yet, the clock starts at the
        first tick."""
        self.suspected: set[NodeId] = set()
        self._last_tick: float | None = None
        self.stalls_excused = 0

    def heard(self, src: NodeId, now: float) -> None:
        if src in self.last_heard:
            self.last_heard[src] = now
            self.suspected.discard(src)

    def watch(self, members: Iterable[NodeId], me: NodeId, now: float | None) -> None:
        """Watch exactly ``members`` (a new view); newcomers' clocks start at ``now``."""
        members = set(members)
        for m in members:
            if m != me and m not in self.last_heard:
                self.last_heard[m] = now
        for m in [m for m in self.last_heard if m not in members]:
            del self.last_heard[m]
            self.suspected.discard(m)

    def detect(
        self, members: Iterable[NodeId], me: NodeId, now: float, timeout: float, heartbeat: float
    ) -> None:
        """Suspect the members silent for ``timeout``."""
        last, self._last_tick = self._last_tick, now
        stall = 0.0 if last is None else now - last - 2 * heartbeat
        if stall > 0:
            self.stalls_excused += 1
            for m, heard in self.last_heard.items():
                if heard is not None:
                    self.last_heard[m] = min(now, heard + stall)
        for m in members:
            if m == me or m in self.suspected:
                continue
            heard = self.last_heard.get(m)
            if heard is None:
                self.last_heard[m] = now
            elif now - heard > timeout:
                self.suspected.add(m)

    def to_part(
        self, members: Iterable[NodeId], me: NodeId, now: float, fresh: float, majority: int
    ) -> list[NodeId]:
        """The suspects to propose parting now: all of them, if this router heard within
        ``fresh`` from enough unsuspected members to make, with itself, a ``majority`` of
        the view; none otherwise."""
        if not self.hears_majority(members, me, now, fresh, majority):
            return []
        return [m for m in members if m in self.suspected and m != me]

    def hears_majority(
        self, members: Iterable[NodeId], me: NodeId, now: float, within: float, majority: int
    ) -> bool:
        """True if this router heard within ``within`` from enough unsuspected members to
        make, with itself, a ``majority`` of the view."""
        heard_from = 1  # this router
        for m in members:
            if m == me or m in self.suspected:
                continue
            heard = self.last_heard.get(m)
            if heard is not None and now - heard <= within:
                heard_from += 1
        return heard_from >= majority

    def next_deadline(self, timeout: float) -> float | None:
        best = None
        for m, heard in self.last_heard.items():
            if heard is not None and m not in self.suspected:
                t = heard + timeout + 1e-6
                if best is None or t < best:
                    best = t
        return best

    def watched(self) -> set[NodeId]:
        return set(self.last_heard)
