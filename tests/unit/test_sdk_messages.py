"""The SDK's message check, without daemons: the size it computes never undercounts
what the routers will see, and every refusal is a typed error, never a TypeError."""

from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ecast.errors import InvalidMessage, MessageTooLarge
from ecast.sdk import check_batch, message_size

simple = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=40),
    st.binary(max_size=40),
)
nested = st.recursive(simple, lambda inner: st.lists(inner, max_size=3), max_leaves=6)
shaped = st.recursive(
    simple,
    lambda inner: (
        st.lists(inner, max_size=20)
        | st.lists(inner, max_size=20).map(tuple)
        | st.dictionaries(
            st.text(max_size=5) | st.integers(-(2**63), 2**64 - 1), inner, max_size=20
        )
    ),
    max_leaves=40,
)
"""Payloads as applications send them: tuples, lists and dicts of scalars, short and
long, flat and deep."""


@given(
    payload=st.binary(max_size=300),
    header=st.none() | st.dictionaries(st.text(max_size=10), nested, max_size=10),
)
def test_the_size_is_the_packed_message(payload: bytes, header: Any) -> None:
    if header is not None:
        header.pop("kind", None)
    size = message_size(payload, header, 1 << 30)
    packed = len(msgpack.packb(payload, use_bin_type=True))
    if header is not None:
        packed += len(msgpack.packb(header, use_bin_type=True))
    assert size == packed


@given(payload=shaped, header=st.none() | st.dictionaries(st.text(max_size=10), shaped))
def test_the_size_of_any_shaped_message_is_never_below_the_packed_message(
    payload: Any, header: Any
) -> None:
    if header is not None:
        header.pop("kind", None)
    packed = len(msgpack.packb(payload, use_bin_type=True))
    if header is not None:
        packed += len(msgpack.packb(header, use_bin_type=True))
    assert message_size(payload, header, 1 << 30) >= packed
    # Only what is really too large is refused.
    assert message_size(payload, header, packed) == packed
    with pytest.raises(MessageTooLarge, match=f"a message of {packed} bytes"):
        message_size(payload, header, packed - 1)


@pytest.mark.parametrize(
    ("payload", "text"),
    [
        (("put", 1, {2, 3}), "payload cannot be encoded"),
        ([[[[[[[[[object()]]]]]]]]], "payload cannot be encoded"),
        ({"k": 2**64}, "payload cannot be encoded"),
        ("\ud800", "payload cannot be encoded"),
    ],
)
def test_bad_payloads_raise_typed_errors(payload: Any, text: str) -> None:
    with pytest.raises(InvalidMessage, match=text):
        message_size(payload, None, 1 << 20)


@pytest.mark.parametrize(
    ("header", "error", "text"),
    [
        ({"kind": "join"}, InvalidMessage, "reserved for membership"),
        ({"kind": "suspect"}, InvalidMessage, "reserved for membership"),
        ({"k": {1, 2}}, InvalidMessage, "header cannot be encoded"),
        ({1: object()}, InvalidMessage, "header cannot be encoded"),
        ({"k": 2**64}, InvalidMessage, "header cannot be encoded"),
        ([("k", 1)], InvalidMessage, "a header is a dict"),
        ({"k": "x" * 200}, MessageTooLarge, "exceeds the routers' limit"),
    ],
)
def test_bad_headers_raise_typed_errors(header: Any, error: type, text: str) -> None:
    with pytest.raises(error, match=text):
        message_size(b"x", header, 100)


@pytest.mark.parametrize(
    "header",
    [
        {"\u0800": -(2**31) - 1},  # a key of 3 UTF-8 bytes in 1 character
        {"k" * 70_000: "\U0001f600" * 70_000},  # str32 headers, 4-byte characters
        {"a": 1.5, "b": None, "c": True, "d": b"\xff" * 300, "e": 2**64 - 1},
    ],
)
def test_the_size_of_wide_headers_is_never_undercounted(header: Any) -> None:
    packed = len(msgpack.packb(b"", use_bin_type=True)) + len(
        msgpack.packb(header, use_bin_type=True)
    )
    assert message_size(b"", header, 1 << 30) >= packed


def test_an_unhashable_kind_is_an_ordinary_header_value() -> None:
    # Not a membership kind, so allowed; it used to escape as TypeError from a set lookup.
    assert message_size(b"x", {"kind": [1]}, 100) >= len(msgpack.packb({"kind": [1]}))


@pytest.mark.parametrize("n", [0, 255, 256, 65_535, 65_536, 70_000])
def test_a_bytes_payload_is_measured_with_its_bin_header(n: int) -> None:
    payload = bytes(n)
    assert message_size(payload, None, 1 << 30) == len(msgpack.packb(payload, use_bin_type=True))


def _outcome(check: Any) -> tuple[type, str] | None:
    try:
        check()
    except (InvalidMessage, MessageTooLarge) as e:
        return type(e), str(e)
    return None


bad_or_good_header = (
    st.none()
    | st.dictionaries(st.text(max_size=5), shaped, max_size=4)
    | (
        st.sampled_from(
            [
                {"kind": "join"},
                {"kind": "part"},
                {"kind": [1]},
                {"k": {1, 2}},
                {"k": 2**64},
                [("k", 1)],
                {"k": "x" * 3000},
            ]
        )
    )
)


@given(
    items=st.lists(
        st.tuples(st.binary(max_size=300) | shaped | st.just({1, 2}), bad_or_good_header),
        max_size=12,
    ),
    limit=st.sampled_from([64, 512, 2048, 1 << 20]),
)
def test_a_batch_is_refused_as_its_first_refused_message_would_be(
    items: list[tuple[Any, Any]], limit: int
) -> None:
    # ``check_batch`` packs a batch in one call; it must refuse exactly the batches with
    # a message that ``message_size`` refuses, with that first message's error.
    def one_by_one() -> None:
        for payload, header in items:
            message_size(payload, header, limit)

    assert _outcome(lambda: check_batch(items, limit)) == _outcome(one_by_one)


def test_a_batch_that_fits_only_message_by_message_is_accepted() -> None:
    # 40 messages of 300 bytes each fit a limit of 1,000; all together they do not.
    items = [(b"x" * 250, {"key": f"k{i}"}) for i in range(40)]
    check_batch(items, 1000)
    with pytest.raises(MessageTooLarge, match="exceeds the routers' limit"):
        check_batch([*items, (b"x" * 990, {"key": "big"})], 1000)
