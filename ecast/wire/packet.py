"""The packet format: what one write between two processes carries (wire protocol v6).

After the handshake (``ecast.runtime.transport``) every packet is
``4-byte big-endian length || body``, and the body is a msgpack array of *items*:

- a frame: ``(src, dst, src_inc, dst_inc, seq, ack, msgs)``, a link-layer
  :class:`~ecast.core.link.Frame` flattened, from node ``src`` on the sending process to
  node ``dst`` on the receiving one (:class:`FrameItem` once decoded);
- ``("nodes", ((node, incarnation), ...))``: nodes that now run on the sender
  (:class:`Nodes`);
- ``("gone", (node, ...))``: nodes that stopped there (:class:`Gone`);
- ``("acks", ((sender_node, receiver_node, count), ...))``: "my node ``sender_node``
  holds ``count`` frames in order from your node ``receiver_node``", the per-channel
  resend point (:class:`Acks`);
- ``("error", reason)``: why the sender is about to close the connection
  (:class:`PeerError`);
- ``("part", (bytes, last))``: a slice of one packed item too big for a packet of its
  own (a frame a core filled with more than the packet limit), in order, the last one
  marked; the receiver joins the slices and decodes the item they make (:class:`Part`,
  :func:`split_item`);
- ``("m", (message, ...))``: the packet's message table, first if present, which the
  packet's ``Deliver`` messages index into (``Encoder.pack_packet``); it never leaves
  :func:`decode_packet`.

Decoding checks every item's shape and types and returns typed items, so the runtime
dispatches on types, never on lengths.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

from ecast.core.link import Frame
from ecast.wire import codec
from ecast.wire.codec import DecodeError, Encoder

LENGTH = struct.Struct(">I")
"""The length prefix of every packet (and of every handshake message)."""
TABLE = codec.TABLE


class FrameItem(NamedTuple):
    src: str
    dst: str
    frame: Frame


class Nodes(NamedTuple):
    nodes: tuple[tuple[str, int], ...]


class Gone(NamedTuple):
    nodes: tuple[str, ...]


class Acks(NamedTuple):
    acks: tuple[tuple[str, str, int], ...]


class PeerError(NamedTuple):
    reason: str


class Part(NamedTuple):
    data: bytes
    last: bool


Control = Nodes | Gone | Acks | PeerError | Part
Item = FrameItem | Control
_KIND: dict[type, str] = {
    Nodes: "nodes", Gone: "gone", Acks: "acks", PeerError: "error", Part: "part",
}  # fmt: skip


def frame_item(src: str, dst: str, frame: Frame) -> tuple[Any, ...]:
    """A frame as a packet item: flat, not an extension object of its own (one object
    fewer to pack and decode per frame, and frames are many)."""
    return (src, dst, frame.src_inc, frame.dst_inc, frame.seq, frame.ack, frame.msgs)


def control_item(item: Control) -> tuple[str, Any]:
    """A control item as it goes on the wire: ``(kind, data)``."""
    if type(item) is Part:
        return ("part", (item.data, item.last))
    return (_KIND[type(item)], item[0])


def split_item(encoder: Encoder, packed: bytes, limit: int) -> list[bytes]:
    """``packed`` (one item, over ``limit`` bytes) as packed ``part`` items of at most
    ``limit`` bytes each, in order.  A frame has one sequence number the link layer
    resends whole, so it is cut as bytes, not as messages: any item, even a single
    message over the limit, crosses (up to the receiver's ``MAX_ASSEMBLED``)."""
    step = limit - 64  # a part's own header and flag
    n = len(packed)
    return [
        encoder.pack(control_item(Part(packed[i : i + step], i + step >= n)))
        for i in range(0, n, step)
    ]


MAX_ASSEMBLED = 8 * codec.MAX_FRAME
"""Bytes of parts one connection joins into one item at most; more is a protocol
violation.  A sender's link frame over this is refused (the sender logs
``packet_oversize``)."""


def join_part(pieces: list[bytes], held: int, part: Part) -> tuple[int, list[Item] | None]:
    """Add ``part`` to a connection's ``pieces`` (``held`` bytes so far): the new count,
    and the item they make once the last part is in (else ``None``)."""
    held += len(part.data)
    if held > MAX_ASSEMBLED:
        raise DecodeError(f"parts of one item exceed {MAX_ASSEMBLED} bytes")
    pieces.append(part.data)
    if not part.last:
        return held, None
    body = array_header(1) + b"".join(pieces)
    pieces.clear()
    items = decode_packet(body)
    if any(type(item) is Part for item in items):
        raise DecodeError("a part inside a part")
    return 0, items


def array_header(n: int) -> bytes:
    """The msgpack header of an ``n``-item array (items are packed one by one)."""
    if n < 16:
        return bytes((0x90 | n,))
    if n < 0x10000:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def encode_items(encoder: Encoder, items: list[Any]) -> list[bytes]:
    """The packed items of one packet (frames already flat, controls as ``(kind, data)``),
    led by its message table if it needs one.  The array header comes separately, so a
    large packet can be written as its pieces."""
    return encoder.pack_packet(items)


def _control(kind: Any, data: Any) -> Control:
    if kind == "nodes":
        if type(data) is tuple and all(
            type(x) is tuple and len(x) == 2 and type(x[0]) is str and type(x[1]) is int
            for x in data
        ):
            return Nodes(data)
        raise DecodeError("nodes: expected (node id, incarnation) pairs")
    if kind == "acks":
        if type(data) is tuple and all(
            type(x) is tuple
            and len(x) == 3
            and type(x[0]) is str
            and type(x[1]) is str
            and type(x[2]) is int
            and x[2] >= 0
            for x in data
        ):
            return Acks(data)
        raise DecodeError("acks: expected (node, node, count >= 0) triples")
    if kind == "gone":
        if type(data) is tuple and all(type(x) is str for x in data):
            return Gone(data)
        raise DecodeError("gone: expected node ids")
    if kind == "error":
        return PeerError(str(data)[:500])
    if kind == "part":
        if (
            type(data) is tuple
            and len(data) == 2
            and type(data[0]) is bytes
            and type(data[1]) is bool
        ):
            return Part(data[0], data[1])
        raise DecodeError("part: expected (bytes, last)")
    raise DecodeError(f"unknown control item {kind!r:.40}")


def decode_packet(data: bytes | memoryview) -> list[Item]:
    """A packet body as typed items; any malformation is a :class:`DecodeError`."""
    codec.begin_packet()
    items = codec.unpack(data)
    if type(items) is not tuple:
        raise DecodeError("a packet is an array of items")
    out: list[Item] = []
    table = None
    first = items[0] if items else None
    if type(first) is tuple and len(first) == 2 and first[0] == TABLE:
        table = codec.decode_message_table(first[1])
        items = items[1:]
    for item in items:
        n = len(item) if type(item) is tuple else 0
        if n == 7:
            src, dst, src_inc, dst_inc, seq, ack, msgs = item
            if (
                type(src) is not str
                or type(dst) is not str
                or type(src_inc) is not int
                or type(dst_inc) is not int
                or type(seq) is not int
                or type(ack) is not int
                or type(msgs) is not tuple
            ):
                raise DecodeError(f"bad frame header {item[:6]!r:.80}")
            if table is not None:
                msgs = codec.resolve_references(msgs, table)
            out.append(FrameItem(src, dst, Frame(src_inc, dst_inc, seq, ack, msgs)))
        elif n == 2:
            out.append(_control(item[0], item[1]))
        else:
            raise DecodeError(f"bad packet item {item!r:.60}")
    codec.end_packet()
    return out
