"""What the simulator reads off the protocol to check it (not to drive it): the copies a
keyspace message plans, whether a basic read's answer overreaches what its process
holds, which keys a segment holds.  The drivers never decide on these; the checks of a
run (:mod:`rubberband.sim.run`) do."""

from __future__ import annotations

from typing import Any

from ecast import Effects
from rubberband.keys import NOTHING, describe, difference, encode_key
from rubberband.optimizer import Copy, instructions_from_wire
from rubberband.proto import KEYSPACE, Answer, BasicRead, H
from rubberband.storage import StorageCore


def keyspace_version(header: Any) -> int | None:
    """The version a keyspace message was planned from (None: not a keyspace message)."""
    if type(header) is dict and header.get("kind") == KEYSPACE:
        v = header.get(H.VERSION)
        return v if type(v) is int else None
    return None


def planned_copies(header: Any) -> tuple[int, list[tuple[str, str]]] | None:
    """The version a keyspace message makes and its copies ``(source, receiver)``."""
    v = keyspace_version(header)
    if v is None:
        return None
    edges = [
        (i.src, i.dst)
        for i in instructions_from_wire(header.get(H.INSTRUCTIONS, ()))
        if isinstance(i, Copy)
    ]
    return v + 1, edges


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
