"""A view's rows maintained change by change equal the rows computed from the whole base
state, after every change, for every kind (the aggregates exact, MIN and MAX through
deletes of the extreme value, a join through either side's key changing its join value)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rubberband.errors import BadOperation
from rubberband.views.compute import ABSENT, Rows, in_source, recompute
from rubberband.views.define import ViewDef, view_def

VIEWS = [
    view_def("sel", "selection", (0, 30), where=[("n", ">=", 2)]),
    view_def("proj", "projection", (None, None), columns=["g"], where=[("g", "!=", "c")]),
    view_def("idx", "index", (0, 30), on="g", columns=["n"]),
    view_def(
        "agg",
        "aggregate",
        (0, 30),
        group_by="g",
        aggregates={
            "rows": ["count", None],
            "ns": ["count", "n"],
            "sum": ["sum", "n"],
            "avg": ["avg", "n"],
            "lo": ["min", "n"],
            "hi": ["max", "n"],
        },
    ),
    view_def(
        "total", "aggregate", (10, None), aggregates={"sum": ["sum", "n"], "hi": ["max", "g"]}
    ),
    view_def("join", "join", (0, 20), on="g", right=(10, 30), right_on="g", columns=["n"]),
]

values = st.one_of(
    st.fixed_dictionaries(
        {
            "g": st.sampled_from(["a", "b", "c"]),
            "n": st.one_of(st.integers(-3, 9), st.floats(-2, 2), st.none()),
        }
    ),
    st.integers(0, 3),
    st.just({"other": 1}),
)
changes = st.lists(
    st.tuples(st.integers(0, 35), st.one_of(st.none(), values)), min_size=1, max_size=40
)


@pytest.mark.parametrize("view", VIEWS, ids=lambda v: v.name)
@settings(max_examples=150, deadline=None)
@given(history=changes)
def test_rows_maintained_change_by_change_equal_the_rows_of_the_whole_base(
    view: ViewDef, history: list[tuple[int, Any]]
) -> None:
    rows = Rows(view)
    base: dict[int, Any] = {}
    for key, value in history:
        if value is None:
            base.pop(key, None)
        else:
            base[key] = value
        for side in range(len(view.sources)):
            if in_source(view, side, key):
                rows.change(side, key, ABSENT if value is None else value)
        want = recompute(view, [base] * len(view.sources))
        assert rows.rows == want, (key, value)


def test_a_change_reports_exactly_the_rows_it_changed() -> None:
    view = VIEWS[2]  # the index on g
    rows = Rows(view)
    assert rows.change(0, 1, {"g": "a", "n": 1}) == {("a", 1): {"n": 1}}
    assert rows.change(0, 1, {"g": "a", "n": 1}) == {}  # nothing changed
    assert rows.change(0, 1, {"g": "b", "n": 1}) == {("a", 1): ABSENT, ("b", 1): {"n": 1}}
    assert rows.change(0, 1, ABSENT) == {("b", 1): ABSENT}
    agg = Rows(VIEWS[3])
    agg.change(0, 1, {"g": "a", "n": 5})
    agg.change(0, 2, {"g": "a", "n": 1})
    assert agg.change(0, 2, ABSENT)["a"]["lo"] == 5  # MIN after the minimum's delete
    assert agg.change(0, 1, ABSENT) == {"a": ABSENT}


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"name": "9x", "kind": "selection", "source": (0, 1)}, "name"),
        ({"name": "v", "kind": "cube", "source": (0, 1)}, "kind"),
        ({"name": "v", "kind": "selection", "source": (5, 1)}, "empty"),
        ({"name": "v", "kind": "selection", "source": (0, 1), "where": [("n", "~", 1)]}, "where"),
        ({"name": "v", "kind": "projection", "source": (0, 1)}, "columns"),
        ({"name": "v", "kind": "index", "source": (0, 1)}, "on="),
        ({"name": "v", "kind": "aggregate", "source": (0, 1)}, "aggregates"),
        (
            {
                "name": "v",
                "kind": "aggregate",
                "source": (0, 1),
                "aggregates": {"x": ["median", "n"]},
            },
            "median",
        ),
        ({"name": "v", "kind": "join", "source": (0, 1), "on": "g"}, "right="),
        ({"name": "v", "kind": "selection", "source": (("~view", "w"), None)}, "base table"),
    ],
)
def test_a_bad_definition_is_refused_naming_what_is_wrong(
    kwargs: dict[str, Any], says: str
) -> None:
    with pytest.raises(BadOperation, match=says):
        view_def(**kwargs)
