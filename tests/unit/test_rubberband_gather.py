"""A read's answers gathered by range: complete once they cover the read, each range
taken once, refused by a refusal or by parts from two positions (snapshot reads)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from rubberband.client import Gather
from rubberband.keys import clip, intersect, key_range, normalize

WHOLE = normalize([key_range(0, 100)])
LOW = normalize([key_range(0, 50)])
HIGH = normalize([key_range(50, 100)])


def test_one_answer_for_all_of_it_completes_the_read() -> None:
    g = Gather("op", WHOLE)
    assert not g.complete
    g.add(WHOLE, "all", None, 7, True)
    assert g.complete and not g.refused and g.pieces == [(WHOLE, "all")] and g.position == 7
    g.add(WHOLE, "again", None, 7, True)  # a second replica's answer is taken once
    assert g.pieces == [(WHOLE, "all")]


def test_parts_complete_it_together_and_overlaps_count_once() -> None:
    g = Gather("op", WHOLE)
    g.add(LOW, "low", None, 3, True)
    assert not g.complete and g.missing() == HIGH
    g.add(WHOLE, "whole", None, 3, True)  # only the part still missing is kept
    assert g.complete and g.pieces == [(LOW, "low"), (HIGH, "whole")]


def test_parts_from_two_positions_or_a_refusal_refuse_the_read() -> None:
    g = Gather("op", WHOLE)
    g.add(LOW, "low", None, 3, True)
    g.add(HIGH, "high", None, 4, True)
    assert g.complete and g.refused
    g = Gather("op", WHOLE)
    g.add(WHOLE, None, None, 3, False)
    assert g.complete and g.refused and not g.pieces
    g = Gather("op", WHOLE)
    g.add(LOW, None, "bad op", None, True)
    assert g.complete and g.error == "bad op"


_bounds = st.integers(0, 60).map(lambda i: (2, i))


@given(
    st.lists(st.tuples(_bounds, _bounds), max_size=12),
    st.tuples(_bounds, _bounds),
)
def test_clip_is_intersect_of_one_range(ranges: list[Any], rng: Any) -> None:
    rs = normalize(ranges)
    want = intersect(normalize([rng]), rs) if rng[0] < rng[1] else ()
    assert clip(rng, rs) == want
