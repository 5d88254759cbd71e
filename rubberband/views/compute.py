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
from collections.abc import Iterable, Sequence
from fractions import Fraction
from typing import Any

import msgpack
from sortedcontainers import SortedList

from ecast.core import mutations
from rubberband.engine import ROWS
from rubberband.keys import BadKey, EKey, encode_key
from rubberband.views.define import CATALOG, VIEW, ViewDef

ABSENT: Any = object()
"""A view row that is not there (a delete)."""
COUNTED_TWICE = mutations.declare(
    "aggregate_counted_twice", "views",
    "a base key's new values are added to its group without its old ones taken out",
)  # fmt: skip
NO_REVERSE_JOIN = mutations.declare(
    "join_without_reverse", "views", "a join's right side changes without its rows changing"
)


def _get(value: Any, name: Any) -> Any:
    if name is None:
        return value
    return value.get(name) if type(value) is dict else None


def _sort_key(value: Any) -> Any:
    try:
        return encode_key(value)
    except BadKey:
        return None


def _row_form(vkey: Any) -> EKey | None:
    """``vkey`` encoded as it sits in its row's key, ``(VIEW, name, vkey)``, one level
    down (None if it cannot: a key nested as deep as keys go is no row's key)."""
    try:
        return encode_key(vkey, 1)
    except BadKey:
        return None


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
    """Is the change of ``key`` (as the feed names it) one of source ``side``'s?  A
    table's rows are named ``(ROWS, table, row key)``, key-value data by its key."""
    if view.over is not None:
        return True  # its base is the other view's rows, every one
    return source_place(view, side, key, source_bounds(view, side)) is not None


def source_bounds(view: ViewDef, side: int) -> tuple[EKey | None, EKey | None]:
    """Source ``side``'s bounds, encoded (None: unbounded), for :func:`source_place`."""
    lo, hi = view.sources[side]
    return (None if lo is None else encode_key(lo)), (None if hi is None else encode_key(hi))


def source_place(
    view: ViewDef, side: int, key: Any, bounds: tuple[EKey | None, EKey | None]
) -> EKey | None:
    """:func:`in_source` as the encoded base key that :meth:`Rows.change` takes (None:
    not the source's), with the source's ``bounds`` encoded once: a maintainer encoded
    both bounds and the key for each change, then the key again to change its rows."""
    if view.over is not None:
        return encode_key(key)
    table = view.table_of(side)
    if table is None:
        if type(key) is tuple and key[:1] in ((VIEW,), (CATALOG,), (ROWS,)):
            return None  # the views' own rows and tables' rows are no key-value base
    elif type(key) is tuple and len(key) == 3 and key[0] == ROWS and key[1] == table[0]:
        key = key[2]
    else:
        return None
    lo, hi = bounds
    e = encode_key(key)
    return e if (lo is None or lo <= e) and (hi is None or e < hi) else None


def base_change(view: ViewDef, side: int, key: Any, how: str, value: Any) -> tuple[Any, Any]:
    """A change of source ``side`` (``in_source``) as the base key and its new value
    (:data:`ABSENT` for a delete): a table row's key and the row."""
    if how == "delete":
        return (key if view.table_of(side) is None else key[2]), ABSENT
    if view.table_of(side) is None:
        return key, value
    return key[2], value["row"]


class _Group:
    __slots__ = ("counts", "floats", "n", "numbers", "orders", "sums")

    def __init__(self) -> None:
        self.n = 0
        self.counts: dict[str, int] = {}
        self.numbers: dict[str, int] = {}
        self.floats: dict[str, int] = {}
        """Floats among the numbers: a sum is a float while there is one, else an int."""
        self.sums: dict[str, int | Fraction] = {}
        """Exact (floats as fractions), so a sum never depends on the order of changes."""
        self.orders: dict[str, SortedList] = {}


def same(a: Any, b: Any) -> bool:
    """Equal as stored: ``1``, ``1.0`` and ``True`` are three values (Python's ``==``
    says one), tuples and lists one (the wire's arrays)."""
    if a is b:
        return True
    try:
        return bool(msgpack.packb(a) == msgpack.packb(b))
    except (TypeError, ValueError, OverflowError):
        return bool(a == b)


class Rows:
    """A view's rows, maintained one base change at a time (:meth:`change`).  Keys are
    told apart as Rubberband orders them (by :func:`encode_key`: ``True`` and ``1`` are
    two keys, ``1`` and ``1.0`` one), never by Python's ``==``."""

    def __init__(self, view: ViewDef) -> None:
        self.view = view
        self.rows: dict[EKey, tuple[Any, Any]] = {}
        """The view: ``{encoded row key: (row key, value)}``."""
        self._of: list[dict[EKey, Any]] = [{}, {}]  # per side: base key -> what it adds
        self._groups: dict[EKey, _Group] = {}
        self._sides: dict[EKey, tuple[dict[EKey, Any], dict[EKey, Any]]] = {}  # join value ->

    def change(
        self, side: int, key: Any, value: Any, ek: EKey | None = None
    ) -> dict[EKey, tuple[Any, Any]]:
        """Base ``key`` of source ``side`` is now ``value`` (:data:`ABSENT`: deleted):
        the view rows that changed, ``{encoded row key: (row key, value or ABSENT)}``
        (``ek``: ``key`` encoded, if known)."""
        out: dict[EKey, tuple[Any, Any]] = {}
        kind = self.view.kind
        if value is not ABSENT and not matches(self.view, value):
            value = ABSENT
        ek = encode_key(key) if ek is None else ek
        if kind in ("selection", "projection"):
            row = ek if ek[0] != 5 else _row_form(key)  # (a tuple may nest too deep)
            if row is not None:
                self._set(out, key, ABSENT if value is ABSENT else shown(self.view, value), row)
        elif kind == "index":
            self._index(out, key, ek, value)
        elif kind == "aggregate":
            self._aggregate(out, ek, value)
        else:
            self._join(out, side, key, ek, value)
        return out

    def _set(self, out: dict[EKey, Any], vkey: Any, value: Any, ek: EKey | None = None) -> None:
        ek = _row_form(vkey) if ek is None else ek
        if ek is None:
            return  # no row can have it (a join's value nested too deep)
        if value is ABSENT:
            if ek in self.rows:
                del self.rows[ek]
                out[ek] = (vkey, ABSENT)
        else:
            old = self.rows.get(ek)
            if old is None or not same(old[1], value):
                self.rows[ek] = (vkey, value)
                out[ek] = (vkey, value)

    # ------------------------------------------------------------------ index
    def _index(self, out: dict[EKey, Any], key: Any, ek: EKey, value: Any) -> None:
        of = self._of[0]
        old = of.pop(ek, None)
        new = new_ek = None
        if value is not ABSENT:
            sv = _get(value, self.view.on)
            sek = _sort_key(sv)
            if sek is not None:
                # A pair of scalars is encoded as its two encoded forms (keys nest
                # only so deep: a tuple is encoded whole).
                scalars = type(sv) is not tuple and type(key) is not tuple
                new_ek = (5, (sek, ek)) if scalars else _row_form((sv, key))
                if new_ek is not None:
                    new = (sv, key)
        if old is not None and old[1] != new_ek:
            self._set(out, old[0], ABSENT, old[1])
        if new is not None:
            of[ek] = (new, new_ek)
            self._set(out, new, shown(self.view, value), new_ek)

    # ------------------------------------------------------------------ aggregate
    def _aggregate(self, out: dict[EKey, Any], ek: EKey, value: Any) -> None:
        of = self._of[0]
        old = of.pop(ek, None)
        if old is not None and not mutations.on(COUNTED_TWICE):
            self._contribute(old[1], old[2], -1)
        touched = {} if old is None else {old[1]: old[0]}
        if value is not ABSENT:
            by = self.view.group_by
            group = None if by is None else _get(value, by)  # no group_by: one group
            gek = _row_form(group)
            if gek is not None:
                fields = {  # field None: the value itself (but COUNT of None counts rows)
                    c: _get(value, c)
                    for _n, fn, c in self.view.aggregates
                    if c is not None or fn != "count"
                }
                of[ek] = (group, gek, fields)
                self._contribute(gek, fields, 1)
                touched[gek] = group
        for gek, group in touched.items():
            g = self._groups.get(gek)
            self._set(out, group, ABSENT if g is None else self._result(g), gek)

    def _contribute(self, gek: EKey, fields: dict[Any, Any], sign: int) -> None:
        g = self._groups.get(gek)
        if g is None:
            g = self._groups[gek] = _Group()
        g.n += sign
        for c, v in fields.items():
            if v is None:
                continue
            g.counts[c] = g.counts.get(c, 0) + sign
            if type(v) is int or (type(v) is float and math.isfinite(v)):
                total = g.sums.get(c, 0)
                if type(v) is int:
                    g.sums[c] = total + sign * v
                else:
                    g.sums[c] = Fraction(total) + sign * Fraction(v)
                    g.floats[c] = g.floats.get(c, 0) + sign
                g.numbers[c] = g.numbers.get(c, 0) + sign
            k = _sort_key(v)
            if k is not None:
                # Ties in key order (1 and 1.0) broken by the stored form, alike everywhere.
                item = (k, msgpack.packb(v), v)
                order = g.orders.setdefault(c, SortedList())
                if sign > 0:
                    order.add(item)
                else:
                    order.remove(item)
        if g.n == 0:
            del self._groups[gek]

    def _result(self, g: _Group) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, fn, c in self.view.aggregates:
            if fn == "count":
                out[name] = g.n if c is None else g.counts.get(c, 0)
            elif fn == "sum":
                total = g.sums.get(c, 0)
                out[name] = float(total) if g.floats.get(c) else int(total)
            elif fn == "avg":
                n = g.numbers.get(c, 0)
                out[name] = float(Fraction(g.sums[c]) / n) if n else None
            else:
                order = g.orders.get(c)
                out[name] = (order[0] if fn == "min" else order[-1])[2] if order else None
        return out

    # ------------------------------------------------------------------ join
    def _join(self, out: dict[EKey, Any], side: int, key: Any, ek: EKey, value: Any) -> None:
        of = self._of[side]
        on = self.view.on if side == 0 else self.view.right_on
        old = of.pop(ek, None)
        if old is not None:
            jv, jek = old
            mine, theirs = self._pair(jek, side)
            del mine[ek]
            for other, _ov in theirs.values():
                self._set(out, self._row(jv, side, key, other), ABSENT)
            if not mine and not theirs:
                del self._sides[jek]
        if value is ABSENT:
            return
        jv = _get(value, on)
        jek = _sort_key(jv)
        if jek is None:
            return
        of[ek] = (jv, jek)
        mine, theirs = self._pair(jek, side)
        mine[ek] = (key, value)
        if side == 1 and mutations.on(NO_REVERSE_JOIN):
            return
        for other, ov in theirs.values():
            pair = (value, ov) if side == 0 else (ov, value)
            self._set(out, self._row(jv, side, key, other), {
                "left": shown(self.view, pair[0]), "right": shown(self.view, pair[1])})  # fmt: skip

    def _pair(self, jek: EKey, side: int) -> tuple[dict[EKey, Any], dict[EKey, Any]]:
        both = self._sides.get(jek)
        if both is None:
            both = self._sides[jek] = ({}, {})
        return both[side], both[1 - side]

    @staticmethod
    def _row(jv: Any, side: int, key: Any, other: Any) -> Any:
        return (jv, key, other) if side == 0 else (jv, other, key)


def recompute(view: ViewDef, bases: Iterable[dict[Any, Any]]) -> dict[EKey, tuple[Any, Any]]:
    """The view's rows of whole base states (one per source), as :attr:`Rows.rows`;
    keys and values as the feed has them (a table's rows named ``(ROWS, table, key)``
    with ``{"row": row}``)."""
    rows = Rows(view)
    for side, base in enumerate(bases):
        for key, value in sorted(base.items(), key=lambda kv: encode_key(kv[0])):
            if in_source(view, side, key):
                rows.change(side, *base_change(view, side, key, "put", value))
    return rows.rows


def recompute_over(chain: Sequence[ViewDef], bases: Iterable[dict[Any, Any]]) -> dict[EKey, Any]:
    """The rows of the last view of ``chain`` (a view, then each view defined over the
    one before it) of whole base states of the first one's sources."""
    rows = recompute(chain[0], bases)
    for view in chain[1:]:
        over = Rows(view)
        for ek in sorted(rows):  # by encoded key: True and 1 are two rows, not one
            over.change(0, *rows[ek])
        rows = over.rows
    return rows
