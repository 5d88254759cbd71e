"""Hostile bytes against every decoder entry point: a DecodeError or a value, never a crash.

These run in the pytest process on purpose: a decoder that overflowed the C stack would
kill the whole run (a SIGSEGV), so the nesting limit has to hold for the suite to finish.
"""

from __future__ import annotations

import contextlib
import struct

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ecast.core.proto import Direct, Leader
from ecast.wire.codec import _CODE, MAX_NESTING, DecodeError, pack, unpack
from ecast.wire.packet import decode_packet

DIRECT = _CODE[Direct]


def nested(depth: int, code: int = DIRECT, leaf: bytes = b"\xc0") -> bytes:
    """``depth`` extension values, each the only field of the one around it."""
    data = leaf
    for _ in range(depth):
        data = msgpack.packb(msgpack.ExtType(code, b"\x91" + data))
    return data


def decoders() -> list[tuple[str, object]]:
    from ecast.runtime.handshake import decode_handshake

    return [("unpack", unpack), ("decode_packet", decode_packet), ("handshake", decode_handshake)]


def must_not_crash(decode: object, data: bytes) -> None:
    with contextlib.suppress(DecodeError):
        decode(data)  # type: ignore[operator]


@pytest.mark.parametrize("depth", [MAX_NESTING + 1, 200, 300, 5_000, 50_000])
def test_deep_nesting_is_refused_not_a_crash(depth: int) -> None:
    data = nested(depth)
    with pytest.raises(DecodeError, match="nested deeper"):
        unpack(data)
    with pytest.raises(DecodeError):
        decode_packet(b"\x91" + data)


def test_legitimate_nesting_still_decodes() -> None:
    value: object = Leader(3, ("r1", "r2"))
    for _ in range(MAX_NESTING - 1):
        value = Direct(value)
    assert unpack(pack(value)) == value


def test_the_nesting_limit_does_not_leak_between_values() -> None:
    """A refused value leaves nothing behind: the next decode starts at the outermost level."""
    with pytest.raises(DecodeError):
        unpack(nested(MAX_NESTING + 5))
    value: object = None
    for _ in range(MAX_NESTING):
        value = Direct(value)
    assert unpack(pack(value)) == value


# ------------------------------------------------------------------ generated hostility
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.binary(max_size=40),
    st.text(max_size=20),
    st.floats(allow_nan=True),
)


def _ext(children: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    return st.builds(
        lambda code, inner: msgpack.ExtType(code, msgpack.packb(inner, use_bin_type=True)),
        st.sampled_from([*range(0, 50), 63, 64, 99, 127]),
        children,
    )


values = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=6),
        st.dictionaries(
            st.one_of(st.text(max_size=5), st.integers(-9, 2**40)), children, max_size=4
        ),
        _ext(st.lists(children, max_size=6)),
        _ext(children),
    ),
    max_leaves=60,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values, st.data())
def test_generated_structures_truncated_or_whole_never_crash(
    value: object, data: st.DataObject
) -> None:
    raw = msgpack.packb(value, use_bin_type=True)
    cut = data.draw(st.integers(0, len(raw)))
    for _name, decode in decoders():
        must_not_crash(decode, raw)
        must_not_crash(decode, raw[:cut])
        must_not_crash(decode, raw + raw[:cut])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_never_crash(raw: bytes) -> None:
    for _name, decode in decoders():
        must_not_crash(decode, raw)


@pytest.mark.parametrize(
    "header",
    [
        b"\xdd" + struct.pack(">I", 2**32 - 1),  # array of 4 G items
        b"\xdf" + struct.pack(">I", 2**32 - 1),  # map of 4 G pairs
        b"\xc6" + struct.pack(">I", 2**32 - 1),  # bin of 4 GiB
        b"\xdb" + struct.pack(">I", 2**32 - 1),  # str of 4 GiB
        b"\xc9" + struct.pack(">I", 2**32 - 1) + bytes([DIRECT]),  # ext of 4 GiB
        b"\x91\xdd" + struct.pack(">I", 2**31),  # a huge array inside a packet
    ],
)
def test_huge_length_headers_are_refused_without_allocating(header: bytes) -> None:
    for _name, decode in decoders():
        with pytest.raises(DecodeError):
            decode(header + b"\x00" * 16)


def test_nesting_inside_packets_and_handshakes_is_refused() -> None:
    from ecast.runtime.handshake import decode_handshake

    deep = nested(10_000)
    with pytest.raises(DecodeError):
        decode_packet(b"\x91" + msgpack.packb(["nodes", []])[:-1] + deep)
    with pytest.raises(DecodeError):
        decode_handshake(msgpack.packb(["hello", 8]) + deep)
    arrays = b"\x91" * 100_000 + b"\xc0"  # nested plain arrays: msgpack's own stack limit
    for _name, decode in decoders():
        with pytest.raises(DecodeError):
            decode(arrays)
