"""A header's ranges for a write of many keys (``Messages.routable``) and the ranges a
key-value write names (``KVOps.part_fun``), against their plain definitions: one hull a
piece of the ring from its lowest to its highest bound, and the keys' points sorted
and merged."""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from rubberband.engine import Placement
from rubberband.keys import after, encode_key, normalize
from rubberband.messages import EXACT_RANGES, MAX_RANGES, Messages
from rubberband.placement import Keyspace
from rubberband.views.define import row_key
from storage_adapters.memory import KVOps


def _hulls(ranges: Any, ids: Any) -> Any:
    """Per piece of the ring between two ids, the lowest and the highest bound."""
    hulls: dict[int, list[Any]] = {}
    for lo, hi in ranges:
        h = hulls.setdefault(bisect_right(ids, lo), [lo, hi])
        h[0], h[1] = min(h[0], lo), max(h[1], hi)
    out = normalize((lo, hi) for lo, hi in hulls.values())
    return ((ranges[0][0], ranges[-1][1]),) if len(out) > MAX_RANGES else out


ints = st.integers(0, 10_000)


@settings(max_examples=300, deadline=None)
@given(
    points=st.lists(ints, min_size=EXACT_RANGES + 1, max_size=400),
    widths=st.lists(st.integers(1, 50), min_size=400, max_size=400),
    cuts=st.lists(ints, max_size=12, unique=True),
)
def test_a_header_names_one_hull_a_piece_of_the_ring(
    points: list[int], widths: list[int], cuts: list[int]
) -> None:
    ranges = normalize(
        (encode_key(p), encode_key(p + w)) for p, w in zip(points, widths, strict=False)
    )
    messages = Messages(KVOps())
    if cuts:
        messages.keyspace = Keyspace(
            1, [(encode_key(c), f"s{i}") for i, c in enumerate(sorted(cuts))]
        )
    ids = messages.keyspace.ids if messages.keyspace is not None else ()
    got = messages.routable(ranges)
    if len(ranges) <= EXACT_RANGES:
        assert got == ranges
    else:
        assert got == _hulls(ranges, ids)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(-5, 50_000), st.sampled_from("ab")),
                min_size=1, max_size=120))  # fmt: skip
def test_a_write_of_many_keys_names_each_key_once_in_order(rows: list[Any]) -> None:
    pairs = tuple((row_key(f"v{v}", (g, k)), [3, {"g": g}]) for g, k, v in rows)
    part = KVOps().part_fun(("version", pairs, 0), Placement())
    assert part.ranges == normalize((encode_key(k), after(encode_key(k))) for k, _ in pairs)
