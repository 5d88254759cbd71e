"""A view's rows maintained change by change equal the rows computed from the whole base
state, after every change, for every kind (the aggregates exact, MIN and MAX through
deletes of the extreme value, a join through either side's key changing its join value)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rubberband.errors import BadKey, BadOperation
from rubberband.keys import encode_key
from rubberband.views.compute import ABSENT, Rows, in_source, recompute, same
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
    view_def(
        "whole",
        "aggregate",
        (None, None),
        aggregates={"sum": ["sum", None], "lo": ["min", None], "avg": ["avg", None]},
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


def _ek(v: Any) -> Any:
    try:
        return encode_key(v)
    except BadKey:
        return None


def _field(v: Any, f: Any) -> Any:
    return v if f is None else (v.get(f) if isinstance(v, dict) else None)


def reference(view: ViewDef, base: dict[Any, Any]) -> dict[Any, Any]:
    """The view's rows straight from its definition, as SQL would compute them, by
    another road than :class:`Rows`: ``{encoded row key: (row key, value)}``."""
    import math
    from fractions import Fraction

    ops = {
        "=": "__eq__",
        "!=": "__ne__",
        "<": "__lt__",
        "<=": "__le__",
        ">": "__gt__",
        ">=": "__ge__",
    }

    def kept(v: Any) -> bool:
        for f, op, c in view.where:
            e = _ek(_field(v, f))
            if e is None or not getattr(e, ops[op])(encode_key(c)):
                return False
        return True

    def show(v: Any) -> Any:
        return v if view.columns is None else {c: _field(v, c) for c in view.columns}

    def of(side: int) -> list[tuple[Any, Any]]:
        lo, hi = view.sources[side]
        return [
            (k, v) for k, v in base.items()
            if (lo is None or encode_key(lo) <= encode_key(k))
            and (hi is None or encode_key(k) < encode_key(hi)) and kept(v)
        ]  # fmt: skip

    rows: dict[Any, Any] = {}
    if view.kind in ("selection", "projection"):
        rows = {k: show(v) for k, v in of(0)}
    elif view.kind == "index":
        rows = {(_field(v, view.on), k): show(v) for k, v in of(0) if _ek(_field(v, view.on))}
    elif view.kind == "join":
        for lk, lv in of(0):
            for rk, rv in of(1):
                jl, jr = _ek(_field(lv, view.on)), _ek(_field(rv, view.right_on))
                if jl is not None and jl == jr:
                    rows[(_field(lv, view.on), lk, rk)] = {"left": show(lv), "right": show(rv)}
    else:
        groups: dict[Any, list[Any]] = {}
        for _k, v in of(0):
            g = None if view.group_by is None else _field(v, view.group_by)
            if _ek(g) is not None:
                groups.setdefault(_ek(g), [g, []])[1].append(v)
        for g, vs in groups.values():
            out: dict[str, Any] = {}
            for name, fn, c in view.aggregates:
                got = [_field(v, c) for v in vs] if c is not None else vs
                got = [x for x in got if x is not None]
                nums = [x for x in got if type(x) is int or (type(x) is float and math.isfinite(x))]
                total = sum((Fraction(x) for x in nums), Fraction(0))
                floaty = any(type(x) is float for x in nums)
                ordered = sorted(
                    (x for x in got if _ek(x) is not None),
                    key=lambda x: (_ek(x), __import__("msgpack").packb(x)),
                )
                out[name] = {
                    "count": len(vs) if c is None else len(got),
                    "sum": float(total) if floaty else int(total),
                    "avg": float(total / len(nums)) if nums else None,
                    "min": ordered[0] if ordered else None,
                    "max": ordered[-1] if ordered else None,
                }[fn]
            rows[g] = out
    return {encode_key(k): (k, v) for k, v in rows.items()}


def _equal(a: dict[Any, Any], b: dict[Any, Any]) -> bool:
    return a.keys() == b.keys() and all(same(a[e][1], b[e][1]) for e in a)


@pytest.mark.parametrize("view", VIEWS, ids=lambda v: v.name)
@settings(max_examples=150, deadline=None)
@given(history=changes)
def test_rows_maintained_change_by_change_equal_the_rows_of_the_whole_base(
    view: ViewDef, history: list[tuple[int, Any]]
) -> None:
    """After every change: the incremental rows, the rows recomputed from the whole base,
    and the definition's own reference (by another road) are the same rows, with values
    equal as stored (``1``, ``1.0`` and ``True`` apart)."""
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
        want = reference(view, base)
        assert _equal(rows.rows, want), (key, value, rows.rows, want)
        assert _equal(recompute(view, [base] * len(view.sources)), want)


def test_a_change_reports_exactly_the_rows_it_changed() -> None:
    def changed(out: dict[Any, Any]) -> dict[Any, Any]:
        return {k: v for k, v in out.values()}

    rows = Rows(VIEWS[2])  # the index on g
    assert changed(rows.change(0, 1, {"g": "a", "n": 1})) == {("a", 1): {"n": 1}}
    assert changed(rows.change(0, 1, {"g": "a", "n": 1})) == {}  # nothing changed
    assert changed(rows.change(0, 1, {"g": "a", "n": True})) == {("a", 1): {"n": True}}
    assert changed(rows.change(0, 1, {"g": "b", "n": 1})) == {("a", 1): ABSENT, ("b", 1): {"n": 1}}
    assert changed(rows.change(0, 1, ABSENT)) == {("b", 1): ABSENT}
    rows.change(0, 2, {"g": 1, "n": 0})
    rows.change(0, 3, {"g": True, "n": 0})  # True and 1 are two keys
    assert len(rows.rows) == 2
    agg = Rows(VIEWS[3])
    agg.change(0, 1, {"g": "a", "n": 5})
    agg.change(0, 2, {"g": "a", "n": 1})
    assert changed(agg.change(0, 2, ABSENT))["a"]["lo"] == 5  # MIN after the minimum's delete
    assert changed(agg.change(0, 1, ABSENT)) == {"a": ABSENT}


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
        ({"name": "v", "kind": "selection", "source": (("~view", "w"), None)}, "base range"),
        (
            {"name": "v", "kind": "selection", "source": (0, 1), "over": "v", "base": [(0, 1)]},
            "over a view",
        ),
        ({"name": "v", "kind": "selection", "source": (0, 1), "over": "w"}, "over a view"),
        (
            {"name": "v", "kind": "join", "source": (0, 1), "over": "w", "base": [(0, 1)]},
            "not a join",
        ),
        (
            {"name": "v", "kind": "selection", "source": (0, 1), "over": "-", "base": [(0, 1)]},
            "a view name",
        ),
    ],
)
def test_a_bad_definition_is_refused_naming_what_is_wrong(
    kwargs: dict[str, Any], says: str
) -> None:
    with pytest.raises(BadOperation, match=says):
        view_def(**kwargs)


scalars = st.one_of(
    st.integers(-(2**64), 2**64), st.text(max_size=3), st.booleans(), st.none(),
    st.floats(allow_nan=False), st.binary(max_size=3),
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(secondary=st.one_of(scalars, st.tuples(scalars)), key=st.one_of(scalars, st.tuples(scalars)))
def test_an_index_row_is_named_as_any_key_of_its_value_and_base_key_is(
    secondary: Any, key: Any
) -> None:
    """An index row's key is ``(secondary value, base key)``, its encoded form built from
    the two encoded forms it already has: it is exactly the pair's, and a value that is
    no key makes no row."""
    view = view_def("ix", "index", (None, None), on="g")
    rows = Rows(view)
    try:
        ek = encode_key(key)
    except BadKey:
        return
    changed = rows.change(0, key, {"g": secondary}, ek)
    try:
        want = encode_key((secondary, key))
    except BadKey:
        assert changed == {}
        return
    assert list(changed) == [want] and changed[want][0] == (secondary, key)


def test_a_value_nested_too_deep_for_a_rows_key_makes_no_row() -> None:
    """A row's key is ``(VIEW, name, row key)``, so what it holds sits a level or two
    down: a value that is a key alone but would nest deeper there is no index entry, no
    group and no join value, as a value that is no key at all (an index on it raised
    in the maintainer; the other kinds made a write every try refused)."""
    from rubberband.keys import encode_key
    from rubberband.views.define import row_key

    def nested(depth: int) -> Any:
        value: Any = 1
        for _ in range(depth):
            value = (value,)
        return value

    every = (None, None)
    index = Rows(view_def("i", "index", every, on="g"))
    group = Rows(view_def("a", "aggregate", every, group_by="g", aggregates={"n": ["count", None]}))
    select = Rows(view_def("s", "selection", every))
    join = Rows(view_def("j", "join", (0, 10), on="g", right=(10, 20), right_on="g"))
    assert index.change(0, 1, {"g": nested(6)}) and not index.change(0, 2, {"g": nested(7)})
    assert group.change(0, 1, {"g": nested(7)}) and not group.change(0, 2, {"g": nested(8)})
    assert select.change(0, nested(7), 1) and not select.change(0, nested(8), 1)
    join.change(0, 1, {"g": nested(6)})
    join.change(0, 2, {"g": nested(7)})
    assert join.change(1, 11, {"g": nested(6)}) and not join.change(1, 12, {"g": nested(7)})
    assert not join.change(1, 12, ABSENT)  # its rows were never there to go
    for rows in (index, group, select, join):
        for vkey, _value in rows.rows.values():
            encode_key(row_key(rows.view.name, vkey))  # every row's key is a key
