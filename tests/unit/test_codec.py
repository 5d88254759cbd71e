"""The frame decoder: every message round-trips; anything else is a DecodeError, never a crash."""

from __future__ import annotations

import contextlib

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ecast.core.link import Frame
from ecast.core.message import Message, Submission
from ecast.core.proto import (
    Confirm,
    Deliver,
    DeliverUnsafe,
    Detach,
    Direct,
    KeepAlive,
    Leader,
    Route,
    RouteCmd,
    Stable,
    StableCmd,
)
from ecast.core.ufabcast.messages import Accept, AppCmd, Heartbeat, JoinCmd, PartCmd, Promise, View
from ecast.wire.codec import (
    DELIVER_REFS,
    PACKER_BUFFER,
    TABLE,
    DecodeError,
    Encoder,
    Packed,
    pack,
    pack_plain,
    plain_default,
    unpack,
)
from ecast.wire.packet import (
    MAX_ASSEMBLED,
    FrameItem,
    Gone,
    Part,
    array_header,
    decode_packet,
    frame_item,
    join_part,
    split_item,
)

names = st.text(st.characters(codec="utf-8"), min_size=1, max_size=8)
ints = st.integers(-(2**40), 2**40)
session = st.tuples(names, st.integers(0, 2**31), st.text(max_size=4))
msg_id = st.tuples(session, st.integers(1, 2**31))
payloads = st.one_of(st.none(), st.binary(max_size=64), ints, st.text(max_size=16))
headers = st.one_of(st.none(), st.dictionaries(st.text(max_size=6), payloads, max_size=3))
messages = st.builds(Message, names, msg_id, headers, payloads)
submissions = st.builds(Submission, msg_id, headers, payloads)
commands = st.one_of(
    st.builds(
        AppCmd, names, st.integers(1, 2**31), st.tuples(st.builds(RouteCmd, st.tuples(messages)))
    ),
    st.builds(JoinCmd, names, names),
    st.builds(PartCmd, names, names),
)
ballot = st.tuples(st.integers(0, 100), names)
wire = st.one_of(
    st.builds(Deliver, st.lists(st.tuples(st.integers(0, 2**40), messages), max_size=4).map(tuple)),
    st.builds(
        DeliverUnsafe,
        st.lists(st.tuples(st.one_of(st.none(), ints), ints, messages), max_size=3).map(tuple),
    ),
    st.builds(Route, st.lists(submissions, max_size=4).map(tuple)),
    st.builds(
        Stable,
        st.lists(st.tuples(msg_id, st.one_of(st.none(), ints), st.booleans()), max_size=3).map(
            tuple
        ),
    ),
    st.builds(Confirm, ints),
    st.builds(Leader, ints, st.lists(names, max_size=4).map(tuple)),
    st.builds(Accept, ints, ballot, ints, st.lists(commands, max_size=3).map(tuple)),
    st.builds(
        Promise,
        ints,
        ballot,
        ints,
        st.lists(
            st.tuples(ints, ballot, st.lists(commands, max_size=2).map(tuple)), max_size=2
        ).map(tuple),
    ),
    st.builds(Heartbeat, ints, ints),
    st.builds(StableCmd, st.lists(st.tuples(ints, st.booleans()), max_size=3).map(tuple)),
    st.builds(View, ints, st.lists(names, max_size=3).map(tuple), ints),
)
frames = st.builds(
    Frame,
    st.integers(0, 2**50),
    st.integers(0, 2**50),
    ints,
    ints,
    st.lists(wire, max_size=4).map(tuple),
)


@settings(max_examples=300, deadline=None)
@given(frames)
def test_every_message_round_trips(frame: Frame) -> None:
    packet = pack([frame_item("a", "b", frame), ("gone", ("c",))])
    assert decode_packet(packet) == [FrameItem("a", "b", frame), Gone(("c",))]


def test_an_object_shared_by_frames_is_encoded_once_per_flush() -> None:
    calls: list[str] = []

    class Counting(Encoder):
        def _default(self, obj: object) -> object:
            calls.append(type(obj).__name__)
            return super()._default(obj)

    m = Message("s", (("s", 0, ""), 1), None, b"x" * 1000)
    accept = Accept(0, (0, "r"), 1, (AppCmd("r", 1, (RouteCmd((m,)),)),))
    enc = Counting()
    first = enc.pack(Frame(1, 2, 2, 0, (accept,)))
    second = enc.pack(Frame(1, 3, 2, 0, (accept,)))  # the same Accept to a second follower
    assert len(first) > 1000 and len(second) == len(first)
    # The second frame reused the first's encoding of the Accept: only the Frame was new.
    assert calls == ["Frame", "Accept", "AppCmd", "RouteCmd", "Frame", "Accept"]
    enc.reset()
    enc.pack(Frame(1, 2, 3, 0, (accept,)))
    assert calls[-4:] == ["Frame", "Accept", "AppCmd", "RouteCmd"]  # a new flush packs again


def test_a_packer_that_outgrew_its_buffer_is_replaced_and_small_ones_are_kept() -> None:
    # A Packer's buffer keeps the size of the largest object it packed; a process that
    # once packed a huge Paxos instance would hold that memory for good.
    enc = Encoder()
    small = Accept(0, (0, "r"), 1, (AppCmd("r", 1, b"x" * 100),))
    big = Accept(0, (0, "r"), 2, (AppCmd("r", 2, b"y" * (PACKER_BUFFER + 1)),))
    enc.pack(Frame(1, 2, 1, 0, (small,)))
    top, nested = enc._packer, list(enc._packers)
    enc.pack(Frame(1, 2, 2, 0, (small,)))
    assert enc._packer is top and enc._packers == nested  # reused
    encoded = enc.pack(Frame(1, 2, 3, 0, (big,)))
    assert enc._packer is not top and enc._packers[0] is not nested[0]
    assert unpack(encoded) == Frame(1, 2, 3, 0, (big,))  # and what it packed is intact
    assert unpack(enc.pack(Frame(1, 2, 4, 0, (small,)))) == Frame(1, 2, 4, 0, (small,))


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_crash_the_decoder(data: bytes) -> None:
    with contextlib.suppress(DecodeError):
        decode_packet(data)


@settings(max_examples=500, deadline=None)
@given(frames, st.data())
def test_mutated_frames_decode_or_raise_decode_error(frame: Frame, data: st.DataObject) -> None:
    raw = bytearray(pack([frame_item("a", "b", frame)]))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    try:
        decoded = decode_packet(bytes(raw[:cut]))
    except DecodeError:
        return
    for item in decoded:
        assert len(item) == 2 or isinstance(item[2], Frame)


def test_unknown_codes_wrong_shapes_and_wrong_types_are_refused() -> None:
    def item(*msgs: object) -> tuple[object, ...]:
        return ("a", "b", 1, 1, 1, 1, msgs)

    cases = [
        msgpack.packb([item(msgpack.ExtType(120, b"\x90"))]),  # a code nobody registered
        pack([item(Confirm(3))])[:-1],  # truncated
        msgpack.packb([item(msgpack.ExtType(3, msgpack.packb([1, 2])))]),  # a Message of 2 fields
        pack([item(Confirm("x"))]),  # a wrongly typed field
        pack([item(Leader(1, ("r", 2)))]),  # a wrongly typed tuple element
        pack([("a", "b", 1, "1", 1, 1, ())]),  # a wrongly typed frame header
        pack([("a", "b", 1, 1, 1)]),  # an item of no known shape
        msgpack.packb([1, 2, 3]),  # items that are not tuples
        msgpack.packb({"a": 1}),  # not a packet at all
    ]
    for raw in cases:
        try:
            decode_packet(raw)
        except DecodeError:
            continue
        raise AssertionError(f"accepted {raw!r}")
    assert unpack(pack(Confirm(3))) == Confirm(3)


def test_a_packet_carries_each_message_once_and_every_deliver_gets_it_back() -> None:
    # Three receivers in one process get the same message: the packet holds it once.
    m = Message("c", (("s", 0, ""), 1), {"key": 7}, b"x" * 300)
    other = Message("c", (("s", 0, ""), 2), None, b"y")
    items = [
        frame_item("r1", f"d{i}", Frame(1, 2, 3, 0, (Deliver(((5, m), (6, other))),)))
        for i in range(3)
    ]
    enc = Encoder()
    parts = enc.pack_packet(items)
    packet = array_header(len(parts)) + b"".join(parts)
    assert packet.count(b"x" * 300) == 1
    decoded = decode_packet(packet)
    assert [(s, d, f) for s, d, f in decoded] == [
        ("r1", f"d{i}", Frame(1, 2, 3, 0, (Deliver(((5, m), (6, other))),))) for i in range(3)
    ]
    # Packed outside a packet (tests, control items) a Deliver stays inline, and so does
    # one inside another object: only a frame's own messages are resolved.
    assert unpack(pack(Deliver(((5, m),)))) == Deliver(((5, m),))
    nested = frame_item("a", "b", Frame(1, 2, 3, 0, (Direct(Deliver(((5, m),))),)))
    parts = Encoder().pack_packet([nested])
    assert decode_packet(array_header(len(parts)) + b"".join(parts)) == [
        ("a", "b", Frame(1, 2, 3, 0, (Direct(Deliver(((5, m),))),)))
    ]


def test_bad_references_are_refused() -> None:
    m = Message("c", (("s", 0, ""), 1), None, b"")

    def packet(table: object, refs: object, code: int = DELIVER_REFS) -> bytes:
        ref = msgpack.ExtType(code, msgpack.packb(refs))
        frame = ("r1", "d1", 1, 2, 3, 0, (ref,))
        return msgpack.packb([(TABLE, table), frame] if table is not None else [frame])

    assert decode_packet(packet((tuple(m),), [(5, 0)]))[0][2].msgs == (Deliver(((5, m),)),)
    for bad in (
        packet((tuple(m),), [(5, 1)]),  # past the table
        packet((tuple(m),), [(5, -1)]),
        packet((tuple(m),), [(5, "0")]),
        packet((tuple(m),), [5]),
        packet(None, [(5, 0)]),  # no table
        packet(((1, 2),), [(5, 0)]),  # a table entry that is no message
        packet(7, [(5, 0)]),
        msgpack.packb([(TABLE, (tuple(m),)), ("x", msgpack.ExtType(DELIVER_REFS, b"\x90"))]),
    ):
        with pytest.raises(DecodeError):
            decode_packet(bad)


@settings(max_examples=200, deadline=None)
@given(st.lists(frames, min_size=1, max_size=4), st.lists(messages, min_size=1, max_size=3))
def test_every_packet_round_trips_with_its_message_table(
    fs: list[Frame], shared: list[Message]
) -> None:
    # Delivers that share messages with each other, besides whatever the frames carry.
    extra = Frame(1, 2, 3, 4, tuple(Deliver(((i, m),)) for i, m in enumerate(shared)) * 2)
    items = [frame_item("a", f"d{i}", f) for i, f in enumerate([*fs, extra])]
    parts = Encoder().pack_packet([*items, ("gone", ("c",))])
    decoded = decode_packet(array_header(len(parts)) + b"".join(parts))
    assert decoded == [
        *[FrameItem("a", f"d{i}", f) for i, f in enumerate([*fs, extra])],
        Gone(("c",)),
    ]


def test_every_message_class_has_a_decoder() -> None:
    # A class whose annotations the decoder generator cannot check is refused on the wire
    # at its first use (Direct was, for its payload: object): build them all up front.
    from ecast.wire.codec import _CODE, _decoder

    for cls, code in _CODE.items():
        assert callable(_decoder(code)), cls.__name__


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-(2**63), 2**64 - 1)
        | st.floats(allow_nan=False)
        | st.text(max_size=20)
        | st.binary(max_size=20),
        lambda inner: (
            st.lists(inner, max_size=4).map(tuple)
            | st.dictionaries(st.text(max_size=5), inner, max_size=4)
        ),
        max_leaves=20,
    )
)
def test_a_packed_direct_payload_goes_on_the_wire_as_the_payload_itself(value: object) -> None:
    """The SDK packs a direct payload once, for its size check, and the encoder splices
    those bytes in: the packet is byte for byte the one the payload would have made,
    and decodes to the payload."""
    data = msgpack.Packer(use_bin_type=True).pack(value)
    plain = Encoder().pack_packet([frame_item("a", "b", Frame(1, 2, 3, 0, (Direct(value),)))])
    packed = Encoder().pack_packet(
        [frame_item("a", "b", Frame(1, 2, 3, 0, (Direct(Packed(data)),)))]
    )
    assert packed == plain
    ((_, _, frame),) = decode_packet(array_header(len(packed)) + b"".join(packed))
    assert frame.msgs == (Direct(Packed(data).unpacked()),)
    assert unpack(pack(Direct(Packed(data)))) == unpack(pack(Direct(value)))


@pytest.mark.parametrize(
    "msg",
    [
        KeepAlive(),
        Detach(),
        Leader(7, ("router:a", "router:b")),
        Direct(b"x" * 300),
        Direct(Leader(1, ())),  # a message in a message's fields
        Direct(Direct(KeepAlive())),
        Direct(b"y" * 70_000),  # a 32-bit extension header
        (KeepAlive(), Leader(2, ("r",))),  # messages inside a plain value
        {"k": (1, 2.5, None)},
    ],
)
def test_a_direct_payload_packs_as_the_plain_packer_would_and_decodes_back(msg: object) -> None:
    """``pack_plain`` (the SDK's packer of direct payloads) writes the extension's header
    itself: byte for byte what a Packer with ``plain_default`` writes, and what the
    frame encoder writes for the same object; decoding builds equal objects."""
    data = pack_plain(msg)
    assert data == msgpack.Packer(default=plain_default, use_bin_type=True).pack(msg)
    assert data == Encoder().pack(msg)
    back = unpack(data)
    assert back == msg
    assert type(back) is type(msg)
    if not isinstance(msg, dict):
        assert hash(back) == hash(msg)


def test_an_item_over_the_packet_limit_crosses_in_parts_and_joins_back() -> None:
    """A frame too big for one packet (a burst of large messages, even one message over
    the limit) goes as byte slices; the receiver joins them into the frame it was."""
    mid = (("a", 1, ""), 1)
    msgs = (Deliver(((7, Message("a", mid, None, b"x" * 5000)),)), Direct(b"y" * 3000))
    frame = Frame(1, 2, 3, 4, msgs)
    enc = Encoder()
    whole = enc.pack(frame_item("a", "b", frame))
    pieces = split_item(enc, whole, 1024)
    assert len(pieces) > 7 and all(len(p) <= 1024 for p in pieces)
    held: list[bytes] = []
    n, got = 0, None
    for raw in pieces:
        (part,) = decode_packet(array_header(1) + raw)
        assert type(part) is Part and got is None
        n, got = join_part(held, n, part)
    assert got == [FrameItem("a", "b", frame)] and held == [] and n == 0


def test_parts_that_are_malformed_too_big_or_nested_are_refused() -> None:
    with pytest.raises(DecodeError, match="part"):
        decode_packet(pack([("part", ("not bytes", True))]))
    with pytest.raises(DecodeError, match="exceed"):
        join_part([], MAX_ASSEMBLED - 10, Part(b"z" * 11, False))
    inner = Encoder().pack(("part", (b"q", True)))
    with pytest.raises(DecodeError, match="part inside a part"):
        join_part([], 0, Part(inner, True))
    with pytest.raises(DecodeError):
        join_part([], 0, Part(b"\xc1 not msgpack", True))
