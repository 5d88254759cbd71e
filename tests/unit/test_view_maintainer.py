"""A maintainer started from a paged snapshot: each page of a source is exact as of its
own position, the feed follows from the first page's, and the view it starts with
(and keeps) equals the view of the whole base at every position."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rubberband.changelog import Event
from rubberband.keys import encode_key
from rubberband.views.compute import recompute
from rubberband.views.define import meta_key, stable_key, view_def
from rubberband.views.maintain import Maintainer

VIEW = view_def("by_g", "index", (0, 100), on="g")

writes = st.lists(
    st.tuples(st.integers(0, 30), st.one_of(st.none(), st.integers(0, 3))), max_size=40
)


def _apply(base: dict[int, Any], key: int, g: int | None) -> None:
    if g is None:
        base.pop(key, None)
    else:
        base[key] = {"g": g}


@settings(max_examples=200, deadline=None)
@given(
    initial=st.dictionaries(st.integers(0, 30), st.integers(0, 3), max_size=25),
    history=writes,
    page_rows=st.integers(1, 8),
    pages_every=st.integers(1, 4),
)
def test_a_paged_snapshot_starts_the_view_exact_at_every_later_position(
    initial: dict[int, int], history: list[tuple[int, int | None]], page_rows: int,
    pages_every: int,
) -> None:  # fmt: skip
    """Writes go on while the pages are read (``pages_every`` writes between two
    pages): the view rows written up to each position equal the view of the base then."""
    base: dict[int, Any] = {k: {"g": g} for k, g in initial.items()}
    states = {0: dict(base)}
    events: list[Event] = []
    position = 0
    pages: list[tuple[list[Any], int]] = []
    after_key: int | None = None
    i = 0

    def write() -> None:
        nonlocal position, i
        position += 1
        key, g = history[i]
        i += 1
        _apply(base, key, g)
        how = "delete" if g is None else "put"
        events.append(Event(position, ((key, how, None if g is None else {"g": g}),)))
        states[position] = dict(base)

    while True:
        for _ in range(pages_every):
            if i < len(history):
                write()
        position += 1  # the page's read has a position of its own
        keys = sorted(k for k in base if after_key is None or k > after_key)
        rows = [(k, base[k]) for k in keys[:page_rows]]
        pages.append((rows, position))
        if len(keys) <= page_rows:
            break
        after_key = rows[-1][0]
    while i < len(history):
        write()
    m = Maintainer(VIEW)
    versions: dict[Any, list[Any]] = {}

    def take(writes_out: list[Any]) -> None:
        for _name, entries, *_ in writes_out:
            for key, entry in entries:
                if key not in (meta_key(VIEW.name), stable_key(VIEW.name)):  # not a row
                    versions.setdefault(encode_key(key[2]), []).append((key, entry))

    take(m.start([], [pages], 0.0))
    feed = [e for e in events if e.position > m.since[0]]  # the feed from where it asks
    take(m.page(0, position + 1, feed, 0.0))
    assert m.position == position + 1
    for t in range(pages[-1][1], position + 1):
        state = states[max(p for p in states if p <= t)]
        want = {ek: v for ek, (_k, v) in recompute(VIEW, [state]).items()}
        got = {}
        for ek, chain in versions.items():
            entries = [e for _k, e in chain if e[0] <= t]
            if entries and len(entries[-1]) == 2:
                got[ek] = entries[-1][1]
        assert got == want, (t, pages)


def test_split_points_are_checked_and_a_view_over_a_view_is_not_split() -> None:
    from rubberband.errors import BadOperation
    from rubberband.views import view_def

    for parts, says in [
        ([(5,), (2,)], "increasing"),
        ([(2,), (2,)], "increasing"),
        ([object()], "key value"),
        (list(range(70)), "at most 63"),
    ]:
        with pytest.raises(BadOperation, match=says):
            view_def("v", "index", (0, 10), on="g", parts=parts)
    with pytest.raises(BadOperation, match="one part"):
        view_def("w", "selection", (None, None), over="v", base=[(0, 10)], parts=[1])
    assert view_def("v", "index", (0, 10), on="g", parts=[[2, "x"]]).parts == ((2, "x"),)


def test_a_pages_rows_are_cut_into_messages_by_count_and_by_bytes() -> None:
    """Rows of large values travel in messages of about ``BATCH_BYTES``: 500 rows of a
    projection of 64 KB values would not fit E-Cast's frame in one."""
    from rubberband.views.maintain import BATCH_BYTES, BATCH_KEYS, _parts

    small = [((i,), [1, {"n": i}]) for i in range(BATCH_KEYS + 1)]
    assert [len(p) for p in _parts(small)] == [BATCH_KEYS, 1]
    big = [((i,), [1, "x" * (64 << 10)]) for i in range(200)]
    parts = _parts(big)
    assert [e for p in parts for e in p] == big  # every row once, in order
    assert all(sum(len(e[1][1]) for e in p) <= BATCH_BYTES for p in parts)
    assert len(parts) == 4  # 63 values of 64 KiB (and their headers) in 4 MiB
    absent = [((0,), [5])]  # a row's absence: no value
    assert _parts(absent) == [absent]
