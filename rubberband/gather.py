"""A read's answers combined by range, and whom answers are taken from (4.5).

Every answer says which ranges it covers; a read completes when the answers cover the
request, and a range answered twice is taken once (replicas agree at one position).
"""

from __future__ import annotations

from typing import Any

from ecast.core import mutations
from rubberband.keys import NOTHING, RangeSet, covers, difference, intersect, union
from rubberband.placement import Keyspace

NO_DUPLICATE_FILTER = mutations.declare(
    "no_duplicate_filter", "client", "a read keeps every answer, ranges answered twice too"
)


class Gather:
    """The answers of one read, combined by range.  A plain class with slots: a client
    makes one per read (a dataclass's generated constructor cost 5 % of a client at
    saturation).  ``exact``: every piece is the whole of what its answer covers, so no
    answer needs trimming (an engine reports only keys inside the ranges it is given,
    :mod:`rubberband.engine`); trimming a million rows held a client's loop for a second."""

    __slots__ = ("covered", "error", "exact", "op", "pieces", "position", "ranges", "refused")

    def __init__(self, op: Any, ranges: RangeSet) -> None:
        self.op = op
        self.ranges = ranges
        self.covered: RangeSet = NOTHING
        self.pieces: list[tuple[RangeSet, Any]] = []
        self.error: str | None = None
        self.position: Any = None
        self.refused = False
        self.exact = True

    def __repr__(self) -> str:
        return f"Gather({self.op!r:.60}, covered={self.covered!r:.60}, refused={self.refused})"

    def add(
        self, covered: RangeSet | None, result: Any, error: str | None, position: Any, ok: bool
    ) -> None:
        """One answer: ``covered`` is what it answers for (None: all of the read)."""
        if covered is None:
            covered = self.ranges
        if not ok:
            self.refused = True
            return
        if error is not None:
            self.error = error
            return
        if not self.covered and covered == self.ranges:  # one answer for all of it
            self.pieces.append((covered, result))
            self.covered = covered
            self.position = position
            return
        if mutations.on(NO_DUPLICATE_FILTER):
            fresh = intersect(covered, self.ranges)  # a range answered twice, kept twice
        else:
            fresh = difference(intersect(covered, self.ranges), self.covered)
        if not fresh:
            return
        if fresh != covered:
            self.exact = False  # part of it came from another answer: trim this one
        self.pieces.append((fresh, result))
        self.covered = union(self.covered, fresh)
        if self.position is None:
            self.position = position
        elif position != self.position:
            self.refused = True  # a snapshot read's parts from different frontiers

    @property
    def complete(self) -> bool:
        return (
            self.error is not None
            or self.refused
            or self.covered == self.ranges
            or covers(self.covered, self.ranges)
        )

    def missing(self) -> RangeSet:
        return difference(self.ranges, self.covered)


class Holders:
    """Who may answer for what: the ranges each storage process holds under the client's
    recent keyspaces.  A client takes an answer only from a process that one of them
    says holds what the answer covers (a read ordered before a reconfiguration the
    client already knows of is answered by the holders of its own time, so the last few
    keyspaces count, not only the newest).  The partitions are kept per process, so the
    check is one or two comparisons per answer."""

    __slots__ = ("_parts", "keep", "keyspaces")

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self.keyspaces: list[Keyspace] = []
        """The newest last."""
        self._parts: dict[str, list[RangeSet]] = {}

    def learn(self, keyspace: Keyspace) -> None:
        self.keyspaces.append(keyspace)
        del self.keyspaces[: -self.keep]
        self._parts.clear()

    def parts(self, process: str) -> list[RangeSet]:
        """What ``process`` held under each recent keyspace (empty where nothing)."""
        parts = self._parts.get(process)
        if parts is None:
            if len(self._parts) > 4096:
                self._parts.clear()
            parts = [p for ks in self.keyspaces if (p := ks.partition(process))]
            self._parts[process] = parts
        return parts

    def holds(self, process: str, ranges: RangeSet) -> bool:
        return any(covers(part, ranges) for part in self.parts(process))


def op_name(op: Any) -> str:
    """An operation's name for messages: the first item of a tuple (the key-value
    engines) or the ``op`` field of a dict (the scan engine)."""
    if isinstance(op, dict):
        return str(op.get("op"))
    if isinstance(op, (tuple, list)) and op:
        return str(op[0])
    return type(op).__name__
