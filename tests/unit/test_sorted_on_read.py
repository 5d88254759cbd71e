"""The memory and log engines' map orders its slots only when asked: whatever the mix
of new keys, overwrites, deletes, pops, updates and ordered reads, it answers as a
sorted map does."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sortedcontainers import SortedDict

from storage_adapters.memory.ordered import SortedOnRead

SLOTS = st.tuples(st.sampled_from([2, 3]), st.integers(0, 30))
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("set"), SLOTS, st.integers()),
        st.tuples(st.just("set_raw"), SLOTS, st.integers()),  # as the engines' puts write
        st.tuples(st.just("del"), SLOTS),
        st.tuples(st.just("pop"), SLOTS, st.booleans()),
        st.tuples(st.just("update"), st.dictionaries(SLOTS, st.integers(), max_size=4)),
        st.tuples(st.just("range"), SLOTS, SLOTS, st.booleans(), st.booleans()),
        st.tuples(st.just("values")),
        st.tuples(st.just("clear")),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(STEPS)
def test_the_map_answers_as_a_sorted_map(steps: list[Any]) -> None:
    got, model = SortedOnRead(), SortedDict()
    for step in steps:
        kind = step[0]
        if kind == "set":
            got[step[1]] = model[step[1]] = step[2]
        elif kind == "set_raw":
            if step[1] not in got:
                got._new.add(step[1])
            dict.__setitem__(got, step[1], step[2])
            model[step[1]] = step[2]
        elif kind == "del":
            if step[1] in model:
                del got[step[1]]
                del model[step[1]]
            else:
                with pytest.raises(KeyError):
                    del got[step[1]]
        elif kind == "pop":
            if step[2]:
                assert got.pop(step[1], None) == model.pop(step[1], None)
            elif step[1] in model:
                assert got.pop(step[1]) == model.pop(step[1])
            else:
                with pytest.raises(KeyError):
                    got.pop(step[1])
        elif kind == "update":
            got.update(step[1])
            model.update(step[1])
        elif kind == "range":
            lo, hi, a, b = step[1:]
            assert list(got.irange(lo, hi, inclusive=(a, b))) == list(
                model.irange(lo, hi, inclusive=(a, b))
            )
        elif kind == "values":
            assert got.values() == list(model.values())
            copied = copy.deepcopy(got)
            assert dict(copied) == dict(got) and list(copied.ordered()) == list(model)
        else:
            got.clear()
            model.clear()
        assert dict(got) == dict(model)
    assert list(got.ordered()) == list(model)


def test_a_way_out_that_would_skip_the_order_is_refused() -> None:
    m = SortedOnRead()
    m[(2, 1)] = 1
    for call in (m.popitem, lambda: m.setdefault((2, 2), 2)):
        with pytest.raises(TypeError):
            call()
    with pytest.raises(TypeError):
        m |= {(2, 3): 3}
    assert list(m.ordered()) == [(2, 1)]
