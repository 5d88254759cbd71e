"""A read's answers gathered by range: complete once they cover the read, each range
taken once, refused by a refusal or by parts from two positions (snapshot reads)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from rubberband.client import Gather
from rubberband.keys import clip, intersect, key_range, normalize
from rubberband.messages import Messages

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


def test_answers_each_all_their_own_need_no_trimming_and_an_overlap_does() -> None:
    g = Gather("op", WHOLE)
    g.add(WHOLE, "all", None, 7, True)
    assert g.exact  # one answer for all of it
    g = Gather("op", WHOLE)
    g.add(LOW, "low", None, 3, True)
    g.add(HIGH, "high", None, 3, True)
    assert g.complete and g.exact  # two halves, each all its own
    g = Gather("op", WHOLE)
    g.add(LOW, "low", None, 3, True)
    g.add(WHOLE, "whole", None, 3, True)
    assert g.complete and not g.exact  # the second answer's low half is another's
    g = Gather("op", LOW)
    g.add(WHOLE, "more", None, 3, True)
    assert g.complete and not g.exact  # an answer for more than the read asked


class _Ops:
    """Operations whose ``restrict`` keeps the rows of its ranges, and is counted."""

    def __init__(self) -> None:
        self.restricted = 0

    def combine(self, op: Any, answers: list[Any]) -> Any:
        return sorted(row for a in answers for row in a)

    def restrict(self, result: Any, ranges: Any, placement: Any) -> Any:
        self.restricted += 1
        return [k for k in result if any(lo <= (2, k) < hi for lo, hi in ranges)]


def test_a_read_trims_only_an_answer_that_another_overlapped() -> None:
    ops = _Ops()
    client = Messages(ops)
    g = Gather(("scan", 0, 100), WHOLE)
    g.add(LOW, list(range(50)), None, 3, True)
    g.add(HIGH, list(range(50, 100)), None, 3, True)
    assert client.result(g) == list(range(100)) and ops.restricted == 0
    g = Gather(("scan", 0, 100), WHOLE)
    g.add(LOW, list(range(50)), None, 3, True)
    g.add(WHOLE, list(range(100)), None, 3, True)  # its low half is the first answer's
    assert client.result(g) == list(range(100)) and ops.restricted == 2
