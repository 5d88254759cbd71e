"""Cutting what a storage process answers: reads into the ring's segments, bundles into
their reads and writes.  Pure functions of a message and of what the process holds,
shared by every path that answers (sequential, snapshot, basic).

A bundle's payload is the msgpack bytes of a tuple of ``(op, ranges)`` pairs, opaque to
the routers (``rubberband.proto.bundle_header``); its header's ranges are what the
routers routed by, and what :func:`rubberband.storage.held_part` checked.  The reads' own ranges
are the client's word: nothing is answered outside the header's ranges whatever they
say, so a client that lies about a read's ranges misleads only itself.

A write of many keys travels packed too (``H.PACKED``: its operation's bytes), and is
unpacked as its storage process takes it in (:func:`unpack_writes`).
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

import msgpack

from ecast import Message
from ecast.core import mutations
from rubberband.keys import RangeSet, clip, intersect, is_range_set
from rubberband.placement import Keyspace
from rubberband.proto import H

BUNDLE_UNCLIPPED = mutations.declare(
    "bundle_unclipped", "storage", "each read of a bundle answered for all of every piece held"
)
BUNDLE_LAST_WRITE_DROPPED = mutations.declare(
    "bundle_last_write_dropped", "storage", "a write bundle's last write is applied nowhere"
)

ReadItem = tuple[int, Any, RangeSet, RangeSet | None]
"""``(index, op, piece, covered)``: read ``index`` of a bundle, run on ``piece``,
answering for ``covered`` (None: all of the read)."""
WriteItem = tuple[int, Any, RangeSet]
"""``(index, op, part)``: write ``index`` of a bundle, applied to ``part`` only."""


def _no_extension(code: int, data: bytes) -> Any:
    """A client's packed bytes carry plain data only.  An extension value stored as
    one would go out again in answers and feed pages, where E-Cast's codec reads
    extension codes as its typed messages: a reader's decoder would refuse the frame,
    and its link would send that frame again on every reconnect, stuck for good."""
    raise ValueError(f"extension type {code} in a client's packed bytes")


def unpack_payload(blob: bytes) -> Any:
    """``blob`` decoded as the wire decodes a payload (tuples for arrays, any key in a
    map), refusing extension values (:func:`_no_extension`)."""
    return msgpack.unpackb(
        blob, use_list=False, raw=False, strict_map_key=False, ext_hook=_no_extension
    )


def unpacked(msg: Message) -> Message:
    """A packed write (``H.PACKED``) with its operation in place of its bytes, as if it
    had come unpacked.  Anything else stays as it is: any other message, bytes that are
    no msgpack value or hold an extension value (every engine refuses a payload that is
    no operation, and tells its sender), or a packed write's payload that is not bytes
    (as if sent unpacked)."""
    blob, h = msg.payload, msg.header
    if type(blob) is not bytes or type(h) is not dict or H.PACKED not in h:
        return msg
    try:
        op = unpack_payload(blob)
    except Exception:
        return msg
    return msg._replace(payload=op)


def unpack_writes(deliveries: list[Any]) -> list[Any]:
    """``deliveries`` (:class:`ecast.Delivery`), each packed write among them unpacked
    in its place: the judge of a short step (``rubberband.steps.points_only``) weighs
    the operation, and the core then takes it as it is (it unpacks any other)."""
    for i, d in enumerate(deliveries):  # (a pass on a hot path: no call for the others)
        h = d.message.header
        if type(h) is dict and H.PACKED in h:
            deliveries[i] = d._replace(message=unpacked(d.message))
    return deliveries


def unbundle(msg: Message) -> tuple[Any, ...] | None:
    """A bundle's payload unpacked: a tuple of as many items as its header counts, else
    None (whatever the bytes are, they are not a bundle)."""
    blob, n = msg.payload, msg.header.get(H.COUNT)
    if type(blob) is not bytes or type(n) is not int:
        return None
    try:
        subs = unpack_payload(blob)
    except Exception:
        return None
    return subs if type(subs) is tuple and len(subs) == n else None


def cut(ranges: RangeSet, segments: Any) -> list[RangeSet]:
    """``ranges`` cut at ``segments`` (range sets, a ring's segments or what is held of
    them): the non-empty pieces in their order, or ``ranges`` whole if none meets it.
    Reads are answered, and writes applied, piece by piece."""
    pieces = [p for p in (intersect(ranges, seg) for seg in segments) if p]
    return pieces or [ranges]


class Segments:
    """What this process holds, cut at the ring's segments (cached per keyspace).

    Replicas of a segment cut it alike, so a client that hears from two replicas for one
    segment (each answers all it holds of the read) keeps one piece whole and drops the
    other whole.  Without the cut, answers overlap in part, and an answer that cannot be
    trimmed to a range (an aggregate, rows projected without their key) would be counted
    twice.  A point read touches one segment: one piece."""

    __slots__ = ("_held", "_keyspace")

    def __init__(self) -> None:
        self._keyspace: Keyspace | None = None
        self._held: tuple[RangeSet, ...] = ()

    def pieces(self, mine: RangeSet, keyspace: Keyspace | None, owned: RangeSet) -> list[RangeSet]:
        if keyspace is None or not mine:
            return [mine]
        if self._keyspace is not keyspace:
            self._held = tuple(
                p for p in (intersect(seg, owned) for seg in keyspace.segments()) if p
            )
            self._keyspace = keyspace
        if len(mine) == 1:  # most reads: one range, inside one held segment
            lo, hi = mine[0]
            for seg in self._held:
                for slo, shi in seg:
                    if slo <= lo and hi <= shi:
                        return [mine]
        return cut(mine, self._held)


def read_items(subs: tuple[Any, ...], pieces: list[RangeSet]) -> tuple[list[ReadItem] | None, bool]:
    """A bundle's reads cut at the ring's segments (the ``pieces`` of what this process
    holds of the bundle): an item for each read and each piece its ranges meet; None for
    a malformed bundle.  And whether every read is one item, whole, in payload order (the
    bundle can then be answered with a :class:`rubberband.proto.Whole`).

    The engine runs each read on the whole piece: a part of the header's ranges, never
    the read's own ranges, which nobody checked.  An engine answers an operation for the
    part of a range set the operation touches, so the answer is the read's answer for
    ``covered``."""
    if mutations.on(BUNDLE_UNCLIPPED):
        return [(i, s[0], p, s[1]) for i, s in enumerate(subs) for p in pieces], False
    # Each range of every piece, by its lower bound: a read of one range inside one of
    # them (most reads) finds its piece by one bisection instead of a clip per piece;
    # any other read is clipped to every piece.
    spans = sorted((lo, hi, piece) for piece in pieces for lo, hi in piece)
    los = [lo for lo, _, _ in spans]
    items: list[ReadItem] = []
    whole = 0
    try:
        for i, sub in enumerate(subs):
            if type(sub) is not tuple or len(sub) != 2 or type(sub[1]) is not tuple:
                return None, False
            op, ranges = sub
            if len(ranges) == 1:
                one = ranges[0]
                if type(one) is not tuple or len(one) != 2:
                    return None, False
                k = bisect_right(los, one[0]) - 1
                if k >= 0 and one[1] <= spans[k][1] and one[0] < one[1]:
                    items.append((i, op, spans[k][2], None))  # the read, whole
                    whole += 1
                    continue
                for piece in pieces:  # at most f: the segments this process holds
                    part = clip(one, piece)
                    if part:
                        items.append((i, op, piece, part))
                continue
            for piece in pieces:
                part = intersect(ranges, piece)
                if part:
                    items.append((i, op, piece, part))
    except (TypeError, ValueError, IndexError):  # ranges that are not range sets
        return None, False
    return items, whole == len(subs) == len(items)


def write_items(subs: tuple[Any, ...], mine: RangeSet) -> list[WriteItem] | None:
    """A write bundle's writes that touch what this process holds of it, in payload
    order; None for a malformed bundle.

    ``part`` is the write's own ranges (which nobody checked) clipped to ``mine`` (the
    header's range, checked, and what this process holds of it): an engine applies a
    write to the part of a range set it is given, so a write whose ranges do not name
    one of its keys changes that key nowhere, on no replica.  The whole bundle is
    checked before anything is applied, the same way on every replica (what a process
    holds plays no part in it): a malformed write anywhere in it, and no replica
    applies any."""
    for sub in subs:
        if type(sub) is not tuple or len(sub) != 2 or not is_range_set(sub[1]):
            return None
    items: list[WriteItem] = []
    for i, (op, ranges) in enumerate(subs):
        part = clip(ranges[0], mine) if len(ranges) == 1 else intersect(ranges, mine)
        if part:
            items.append((i, op, part))
    if mutations.on(BUNDLE_LAST_WRITE_DROPPED):
        return [item for item in items if item[0] != len(subs) - 1]
    return items
