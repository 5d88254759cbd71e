"""The log engine's live index orders its slots only when asked: whatever the mix of
new keys, overwrites, deletes and ordered reads, it answers as a sorted map does."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sortedcontainers import SortedDict

from storage_adapters.log.index import LiveMap

SLOTS = st.tuples(st.sampled_from([2, 3]), st.integers(0, 30))
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("set"), SLOTS, st.integers()),
        st.tuples(st.just("set_raw"), SLOTS, st.integers()),  # as LogIndex.supersede writes
        st.tuples(st.just("del"), SLOTS),
        st.tuples(st.just("range"), SLOTS, SLOTS, st.booleans(), st.booleans()),
        st.tuples(st.just("clear")),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(STEPS)
def test_the_live_map_answers_as_a_sorted_map(steps: list[Any]) -> None:
    live, model = LiveMap(), SortedDict()
    for step in steps:
        kind = step[0]
        if kind == "set":
            live[step[1]] = model[step[1]] = step[2]
        elif kind == "set_raw":
            if step[1] not in live:
                live._new.add(step[1])
            dict.__setitem__(live, step[1], step[2])
            model[step[1]] = step[2]
        elif kind == "del":
            if step[1] in model:
                del live[step[1]]
                del model[step[1]]
            else:
                with pytest.raises(KeyError):
                    del live[step[1]]
        elif kind == "range":
            lo, hi, a, b = step[1:]
            got = list(live.irange(lo, hi, inclusive=(a, b)))
            assert got == list(model.irange(lo, hi, inclusive=(a, b)))
        else:
            live.clear()
            model.clear()
        assert dict(live) == dict(model)
    assert list(live.ordered()) == list(model)


def test_a_removal_that_would_skip_the_order_is_refused() -> None:
    live = LiveMap()
    live[(2, 1)] = 1
    for call in (lambda: live.pop((2, 1)), live.popitem, lambda: live.update({}),
                 lambda: live.setdefault((2, 2), 2)):  # fmt: skip
        with pytest.raises(TypeError):
            call()
    assert list(live.ordered()) == [(2, 1)]
