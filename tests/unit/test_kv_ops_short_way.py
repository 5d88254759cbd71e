"""A client's ``KVOps.part_fun`` takes a short way for a put of one plain key; it must
say what the general way says of every operation: the same part, or a refusal."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rubberband.engine import BadOperation, Placement
from storage_adapters.memory import MAX_VALUE_BYTES, KVOps

KEYS = st.one_of(
    st.integers(min_value=-(2**64), max_value=2**65),  # some outside what msgpack carries
    st.text(max_size=3),
    st.binary(max_size=3),
    st.booleans(),
    st.none(),
    st.floats(width=16),  # NaN included: no key
    st.tuples(st.integers(0, 3), st.text(max_size=2)),
    st.just(("~rows", "t", 1)),  # a table row's change key: refused as key-value data
    st.just([1, 2]),
    st.just({"a": 1}),
)
VALUES = st.one_of(
    st.integers(),
    st.text(max_size=4),
    st.none(),
    st.just(b"v" * (MAX_VALUE_BYTES - 5)),  # the largest value there is
    st.just(b"v" * (MAX_VALUE_BYTES - 4)),  # one byte over
    st.just({1, 2}),  # cannot be encoded
)


def _said(op: Any, placement: Placement) -> Any:
    try:
        return KVOps().part_fun(op, placement)
    except BadOperation as e:
        return ("refused", str(e))


@settings(max_examples=400, deadline=None)
@given(
    key=KEYS,
    value=VALUES,
    hashed=st.booleans(),
    extra=st.sampled_from([(), ("more",)]),
    pair_as_list=st.booleans(),
)
def test_a_put_of_one_key_is_placed_as_the_general_way_places_it(
    key: Any, value: Any, hashed: bool, extra: tuple[Any, ...], pair_as_list: bool
) -> None:
    placement = Placement("hash" if hashed else "range")
    pair: Any = [key, value] if pair_as_list else (key, value)
    short = ("put", (pair,), *extra)  # a tuple: the short way, if its shape allows
    general = ["put", [list(pair)], *extra]  # a list: always the general way
    got, want = _said(short, placement), _said(general, placement)
    if type(want) is tuple and want[0] == "refused":
        # the same refusal, but a list shows itself otherwise in a "malformed" message
        assert type(got) is tuple and got[0] == "refused", (short, got, want)
    else:
        assert got == want, (short, got, want)
        assert type(got).__name__ == "Part" and got.kind == "write"


@pytest.mark.parametrize(
    "op",
    [
        ("put", ((1, b"v" * (MAX_VALUE_BYTES - 4)),)),
        ("put", ((1, {1}),)),
        ("put", ((2**64, 1),)),
        ("put", ((float("nan"), 1),)),
        ("put", ((("~rows", "t", 1), 1),)),
        ("put", (([1], 1),)),
    ],
)
def test_a_put_the_short_way_cannot_place_is_refused(op: Any) -> None:
    with pytest.raises(BadOperation):
        KVOps().part_fun(op, Placement())
