"""What the simulator reads off the protocol to check it (not to drive it): the copies a
keyspace message plans and what its ring would lose to a failure, whether a basic
read's answer overreaches what its process holds, which keys a segment holds.  The
drivers never decide on these; the checks of a run (:mod:`rubberband.sim.run`) and its
nemesis (:mod:`rubberband.sim.nemesis`) do."""

from __future__ import annotations

from typing import Any, NamedTuple

from ecast import Effects
from rubberband.keys import NOTHING, RangeSet, describe, difference, encode_key, intersect, union
from rubberband.optimizer import Copy, instructions_from_wire
from rubberband.placement import Keyspace
from rubberband.proto import KEYSPACE, Answer, BasicRead, H
from rubberband.storage import StorageCore, next_keyspace


def keyspace_version(header: Any) -> int | None:
    """The version a keyspace message was planned from (None: not a keyspace message)."""
    if type(header) is dict and header.get("kind") == KEYSPACE:
        v = header.get(H.VERSION)
        return v if type(v) is int else None
    return None


class Planned(NamedTuple):
    """A keyspace message a super sent, not yet applied."""

    version: int
    """The version it makes."""
    copies: list[Copy]
    """Its copies."""
    op: Any
    """Its operation (``("expand", name, id)``...), as the message carries it."""

    @property
    def edges(self) -> list[tuple[str, str]]:
        """Its copies as ``(source, receiver)``."""
        return [(c.src, c.dst) for c in self.copies]


def planned_copies(header: Any) -> Planned | None:
    """What a keyspace message will do once applied (None: not a keyspace message)."""
    v = keyspace_version(header)
    if v is None:
        return None
    instructions = instructions_from_wire(header.get(H.INSTRUCTIONS, ()))
    return Planned(v + 1, [i for i in instructions if isinstance(i, Copy)], header.get(H.OP))


def basic_read_overreach(s: StorageCore, payload: Any, fx: Effects) -> list[str]:
    """Basic reads are configuration-consistent: an answer covers only ranges its
    process holds in full at the moment it answers.  The ranges of each answer in
    ``fx`` (the storage core's effects for ``payload``) it does not hold."""
    if type(payload) is not BasicRead:
        return []
    whole = NOTHING if s.incomplete else difference(s.owned, s.receiving)
    out = []
    for _, d in fx.send:
        a = d.payload
        if type(a) is Answer and a.error is None and a.ok and a.covered:
            extra = difference(a.covered, whole)
            if extra:
                out.append(describe(extra))
    return out


def in_segment(key: Any, segment: Any) -> bool:
    e = encode_key(key)
    return any(lo <= e < hi for lo, hi in segment)


def coming_ring(ks: Keyspace, planned: Planned) -> Keyspace | None:
    """The ring ``planned`` makes of ``ks`` once applied (None: the config refuses it, so
    it is never applied)."""
    try:
        return next_keyspace(ks, planned.op)
    except Exception:
        return None


def lost_in(ring: Keyspace, planned: Planned, failed: set[str]) -> RangeSet:
    """What ``ring`` (the one ``planned`` makes) would hold nowhere whole with the
    processes ``failed`` gone: a receiver lacks what it receives from a failed source
    (only that: it holds the rest, or gets it from another), and a range is lost where
    every holder of its segment lacks it."""
    lacks: dict[str, RangeSet] = {}
    for copy in planned.copies:
        if copy.src in failed:
            lacks[copy.dst] = union(lacks.get(copy.dst, NOTHING), copy.ranges)
    lost: RangeSet = NOTHING
    for i, segment in enumerate(ring.segments()):
        left = segment
        for h in ring.holders_of_segment(i):
            if h not in failed:
                left = intersect(left, lacks.get(h, NOTHING))
        lost = union(lost, left)
    return lost
