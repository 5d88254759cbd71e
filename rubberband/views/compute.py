"""A view's rows from its base rows: incrementally, change by change, and from scratch.

:class:`Rows` keeps what a view's maintainer needs to turn one base change into the view
rows it changes, without reading anything back: the view's current rows, and for each
base key what it contributes (000's auxiliary views: the reverse map of an index, each
key's group and values for an aggregate, both sides of a join by join value, the
REVERSE-JOIN view).  MIN and MAX keep every value of their group in order, so a delete
of the minimum finds the next one (000, III-B).

:func:`recompute` builds the same rows from a whole base state: the backfill of a new
view, and the checker's reference (:mod:`rubberband.checkers.views`), which compares
every read with it.  ``Rows`` fed the changes of a base history must equal
``recompute`` of the base state at every position (a property test holds them to it).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from fractions import Fraction
from typing import Any

from sortedcontainers import SortedList

from rubberband.keys import BadKey, encode_key
from rubberband.views.define import CATALOG, VIEW, ViewDef

ABSENT: Any = object()
"""A view row that is not there (a delete)."""


def _get(value: Any, name: Any) -> Any:
    if name is None:
        return value
    return value.get(name) if type(value) is dict else None


def _sort_key(value: Any) -> Any:
    try:
        return encode_key(value)
    except BadKey:
        return None


def _keyable(value: Any) -> bool:
    return _sort_key(value) is not None


_COMPARE = {
    "=": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


def matches(view: ViewDef, value: Any) -> bool:
    for name, op, const in view.where:
        got = _sort_key(_get(value, name))
        if got is None or not _COMPARE[op](got, encode_key(const)):
            return False
    return True


def shown(view: ViewDef, value: Any) -> Any:
    """What a row shows of a base value (its ``columns``, or all of it)."""
    if view.columns is None:
        return value
    return {c: _get(value, c) for c in view.columns}


def in_source(view: ViewDef, side: int, key: Any) -> bool:
    if type(key) is tuple and key[:1] in ((VIEW,), (CATALOG,)):
        return False  # the views' own rows are never a base
    lo, hi = view.sources[side]
    e = encode_key(key)
    return (lo is None or encode_key(lo) <= e) and (hi is None or e < encode_key(hi))


class _Group:
    __slots__ = ("counts", "n", "numbers", "orders", "sums")

    def __init__(self) -> None:
        self.n = 0
        self.counts: dict[str, int] = {}
        self.numbers: dict[str, int] = {}
        self.sums: dict[str, int | Fraction] = {}
        """Exact (floats as fractions), so a sum never depends on the order of changes."""
        self.orders: dict[str, SortedList] = {}


def _plain(total: int | Fraction) -> int | float:
    return total if type(total) is int else float(total)


class Rows:
    """A view's rows, maintained one base change at a time (:meth:`change`)."""

    def __init__(self, view: ViewDef) -> None:
        self.view = view
        self.rows: dict[Any, Any] = {}
        self._of: list[dict[Any, Any]] = [{}, {}]  # per side: base key -> what it adds
        self._groups: dict[Any, _Group] = {}
        self._sides: dict[Any, tuple[dict[Any, Any], dict[Any, Any]]] = {}  # join value ->

    def change(self, side: int, key: Any, value: Any) -> dict[Any, Any]:
        """Base ``key`` of source ``side`` is now ``value`` (:data:`ABSENT`: deleted):
        the view rows that changed, ``{row key: value or ABSENT}``."""
        out: dict[Any, Any] = {}
        kind = self.view.kind
        if value is not ABSENT and not matches(self.view, value):
            value = ABSENT
        if kind in ("selection", "projection"):
            self._set(out, key, ABSENT if value is ABSENT else shown(self.view, value))
        elif kind == "index":
            self._index(out, key, value)
        elif kind == "aggregate":
            self._aggregate(out, key, value)
        else:
            self._join(out, side, key, value)
        return out

    def _set(self, out: dict[Any, Any], vkey: Any, value: Any) -> None:
        if value is ABSENT:
            if vkey in self.rows:
                del self.rows[vkey]
                out[vkey] = ABSENT
        elif self.rows.get(vkey, ABSENT) != value or vkey not in self.rows:
            self.rows[vkey] = value
            out[vkey] = value

    # ------------------------------------------------------------------ index
    def _index(self, out: dict[Any, Any], key: Any, value: Any) -> None:
        of = self._of[0]
        old = of.pop(key, None)
        new = None
        if value is not ABSENT:
            sv = _get(value, self.view.on)
            if _keyable(sv):
                new = (sv, key)
        if old is not None and old != new:
            self._set(out, old, ABSENT)
        if new is not None:
            of[key] = new
            self._set(out, new, shown(self.view, value))

    # ------------------------------------------------------------------ aggregate
    def _aggregate(self, out: dict[Any, Any], key: Any, value: Any) -> None:
        of = self._of[0]
        old = of.pop(key, None)
        if old is not None:
            self._contribute(old[0], old[1], -1)
        touched = [] if old is None else [old[0]]
        if value is not ABSENT:
            group = _get(value, self.view.group_by)
            if _keyable(group):
                fields = {c: _get(value, c) for _n, _f, c in self.view.aggregates if c is not None}
                of[key] = (group, fields)
                self._contribute(group, fields, 1)
                touched.append(group)
        for group in dict.fromkeys(touched):
            g = self._groups.get(group)
            self._set(out, group, ABSENT if g is None else self._result(g))

    def _contribute(self, group: Any, fields: dict[Any, Any], sign: int) -> None:
        g = self._groups.get(group)
        if g is None:
            g = self._groups[group] = _Group()
        g.n += sign
        for c, v in fields.items():
            if v is None:
                continue
            g.counts[c] = g.counts.get(c, 0) + sign
            if type(v) is int or (type(v) is float and math.isfinite(v)):
                total = g.sums.get(c, 0)
                g.sums[c] = (
                    total + sign * v if type(v) is int else Fraction(total) + sign * Fraction(v)
                )
                g.numbers[c] = g.numbers.get(c, 0) + sign
            k = _sort_key(v)
            if k is not None:
                order = g.orders.setdefault(c, SortedList())
                if sign > 0:
                    order.add((k, v))
                else:
                    order.remove((k, v))
        if g.n == 0:
            del self._groups[group]

    def _result(self, g: _Group) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, fn, c in self.view.aggregates:
            if fn == "count":
                out[name] = g.n if c is None else g.counts.get(c, 0)
            elif fn == "sum":
                out[name] = _plain(g.sums.get(c, 0))
            elif fn == "avg":
                n = g.numbers.get(c, 0)
                out[name] = float(Fraction(g.sums[c]) / n) if n else None
            else:
                order = g.orders.get(c)
                out[name] = (order[0] if fn == "min" else order[-1])[1] if order else None
        return out

    # ------------------------------------------------------------------ join
    def _join(self, out: dict[Any, Any], side: int, key: Any, value: Any) -> None:
        of = self._of[side]
        on = self.view.on if side == 0 else self.view.right_on
        old = of.pop(key, None)
        if old is not None:
            jv, _ = old
            mine, theirs = self._pair(jv, side)
            del mine[key]
            for other in theirs:
                self._set(out, self._row(jv, side, key, other), ABSENT)
            if not mine and not theirs:
                del self._sides[jv]
        if value is ABSENT:
            return
        jv = _get(value, on)
        if not _keyable(jv):
            return
        of[key] = (jv, value)
        mine, theirs = self._pair(jv, side)
        mine[key] = value
        for other, ov in theirs.items():
            pair = (value, ov) if side == 0 else (ov, value)
            self._set(out, self._row(jv, side, key, other), {
                "left": shown(self.view, pair[0]), "right": shown(self.view, pair[1])})  # fmt: skip

    def _pair(self, jv: Any, side: int) -> tuple[dict[Any, Any], dict[Any, Any]]:
        both = self._sides.get(jv)
        if both is None:
            both = self._sides[jv] = ({}, {})
        return both[side], both[1 - side]

    @staticmethod
    def _row(jv: Any, side: int, key: Any, other: Any) -> Any:
        return (jv, key, other) if side == 0 else (jv, other, key)


def recompute(view: ViewDef, bases: Iterable[dict[Any, Any]]) -> dict[Any, Any]:
    """The view's rows of whole base states (one per source): ``{row key: value}``."""
    rows = Rows(view)
    for side, base in enumerate(bases):
        for key, value in sorted(base.items(), key=lambda kv: encode_key(kv[0])):
            if in_source(view, side, key):
                rows.change(side, key, value)
    return rows.rows
