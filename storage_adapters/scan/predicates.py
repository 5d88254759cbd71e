"""Predicates (dissertation 2.2) as typed atoms, and their normal form per column.

An operation's ``where`` is a conjunction of *atoms*: ``[column, op, constant]`` with
``op`` one of ``= != < <= > >= prefix in``, or ``[column, "is null"]`` /
``[column, "is not null"]``.  SQL's three-valued logic applies: a comparison with a NULL
value is unknown, so it never selects the row (only ``is null`` does); comparing with a
NULL *constant* is refused, since it could never be true (say ``is null``).

For scanning, the atoms on one column are folded into a :class:`Constraint` over the
column's *domain*, the numbers the scan compares:

* integers, dates (day numbers) and booleans (0/1): integers, so ``x < 2.5`` becomes
  ``x <= 2`` and every interval is closed;
* floats: closed intervals too, strict bounds moved by one ulp (``nextafter``);
* strings: ranks in the column's dictionary (:mod:`.dictionary`), so ``=``, ranges and
  ``prefix`` are intervals of ranks.

A constraint is a union of disjoint closed intervals (an ``in`` list is many points),
values excluded by ``!=``, and a null requirement.  Any value condition implies NOT NULL.
An operation's ranges (Rubberband's placement ranges) become one more constraint, on the
key column under range placement or on the hidden hash column under hash placement.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rubberband.engine import BadOperation, RangeSet
from storage_adapters.scan.dictionary import StringDictionary, prefix_successor
from storage_adapters.scan.schema import Column, check_utf8, scalar

COMPARISONS = ("=", "!=", "<", "<=", ">", ">=")
BINARY = (*COMPARISONS, "prefix", "in")
UNARY = ("is null", "is not null")
_SYNONYMS = {"==": "=", "<>": "!=", "is_null": "is null", "is_not_null": "is not null"}
HASH_COLUMN = "\0hash"
"""The hidden column of placement hashes (hash placement only)."""
MAX_IN = 1_000_000

Interval = tuple[Any, Any]
"""A closed interval of domain values; None is an open end."""


@dataclass(frozen=True, slots=True)
class Atom:
    """One validated predicate: the column, the operator and a typed constant."""

    column: str
    op: str
    value: Any = None


def parse_where(where: Any, columns: dict[str, Column]) -> tuple[Atom, ...]:
    """Validate a raw ``where`` list against a table's columns."""
    if where is None:
        return ()
    if not isinstance(where, (list, tuple)):
        raise BadOperation("where is a list of predicates such as ['price', '<', 300]")
    atoms = []
    for pred in where:
        if not isinstance(pred, (list, tuple)) or not 2 <= len(pred) <= 3:
            raise BadOperation(
                f"a predicate is [column, op, value] or [column, 'is null']: {pred!r:.80}"
            )
        name, op = pred[0], pred[1]
        if type(op) is str:
            op = _SYNONYMS.get(op.lower(), op.lower())
        col = columns.get(name) if type(name) is str else None
        if col is None:
            raise BadOperation(f"unknown column {name!r:.60} in a predicate")
        if op in UNARY:
            if len(pred) != 2:
                raise BadOperation(f"{op!r} takes no value: {pred!r:.80}")
            atoms.append(Atom(name, op))
            continue
        if op not in BINARY:
            raise BadOperation(
                f"unknown predicate operator {op!r:.30} (use {', '.join(BINARY + UNARY)})"
            )
        if len(pred) != 3:
            raise BadOperation(f"{op!r} needs a value: {pred!r:.80}")
        value = pred[2]
        if op == "in":
            if not isinstance(value, (list, tuple)):
                raise BadOperation(f"'in' takes a list of values, not {value!r:.60}")
            if len(value) > MAX_IN:
                raise BadOperation(f"'in' takes at most {MAX_IN} values")
            if any(v is None for v in value):
                raise BadOperation("NULL in an 'in' list never matches; use 'is null'")
            atoms.append(Atom(name, "in", tuple(constant(col, v) for v in value)))
            continue
        if value is None:
            raise BadOperation(f"{name} {op} NULL is never true; use 'is null'/'is not null'")
        if op == "prefix":
            if not col.type.is_string:
                raise BadOperation(f"'prefix' applies to strings; {name!r} is {col.type.name}")
            if type(value) is not str:
                raise BadOperation(f"a prefix is a string, not {value!r:.60}")
            check_utf8(col, value)
            atoms.append(Atom(name, "prefix", value))
            continue
        atoms.append(Atom(name, op, constant(col, value)))
    return tuple(atoms)


def constant(col: Column, value: Any) -> Any:
    """A predicate constant of ``col`` (no length check: too long just never matches)."""
    if col.type.is_string:
        if type(value) is not str:
            raise BadOperation(f"{col.name!r} is {col.type.name}; {value!r:.60} is not a string")
        check_utf8(col, value)
        return value
    return scalar(col, value)


# ---------------------------------------------------------------- constraints
@dataclass(slots=True)
class Constraint:
    """The atoms on one column, folded: ``intervals`` (None: any value), ``ne``, ``null``
    (0: no requirement, 1: must be NULL, 2: must not be NULL)."""

    intervals: list[Interval] | None = None
    ne: list[Any] = field(default_factory=list)
    null: int = 0

    @property
    def empty(self) -> bool:
        if self.intervals is not None and not self.intervals:
            return True
        return self.null == 1 and (self.intervals is not None or bool(self.ne))

    @property
    def valued(self) -> bool:
        """Whether a value condition applies (which implies NOT NULL)."""
        return self.intervals is not None or bool(self.ne) or self.null == 2

    def add_intervals(self, ivs: list[Interval]) -> None:
        self.intervals = ivs if self.intervals is None else intersect(self.intervals, ivs)


def _lt(a: Any, b: Any) -> bool:
    """``a < b`` for lower bounds (None is minus infinity)."""
    return b is not None and (a is None or a < b)


def intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Two sorted unions of disjoint closed intervals, intersected."""
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo = a[i][0] if _lt(b[j][0], a[i][0]) else b[j][0]
        ahi, bhi = a[i][1], b[j][1]
        hi = ahi if bhi is None or (ahi is not None and ahi < bhi) else bhi
        if lo is None or hi is None or lo <= hi:
            out.append((lo, hi))
        if bhi is None or (ahi is not None and ahi < bhi):
            i += 1
        else:
            j += 1
    return out


def points(values: Sequence[Any]) -> list[Interval]:
    return [(v, v) for v in sorted(set(values))]


class Domain:
    """How a column's constants become numbers the scan compares."""

    __slots__ = ("dictionary", "hi", "kind", "lo")

    def __init__(self, col: Column | None, dictionary: StringDictionary | None = None) -> None:
        if col is None:  # the hash column
            self.kind, self.lo, self.hi = "int", 0, 2**32 - 1
        elif col.type.is_string:
            self.kind, self.lo, self.hi = "rank", 0, None
        elif col.type.kind == "float":
            self.kind, self.lo, self.hi = "float", None, None
        elif col.type.kind == "bool":
            self.kind, self.lo, self.hi = "int", 0, 1
        else:
            self.kind, self.lo, self.hi = "int", col.type.lo, col.type.hi
        self.dictionary = dictionary

    # Each returns a list of closed intervals (empty: nothing matches).
    def compare(self, op: str, c: Any) -> list[Interval]:
        if self.kind == "rank":
            return self._rank_compare(op, c)
        if self.kind == "float":
            return _float_compare(op, float(c))
        if type(c) is bool:
            c = int(c)
        return self._clamp(_int_compare(op, c))

    def _clamp(self, ivs: list[Interval]) -> list[Interval]:
        out = []
        for lo, hi in ivs:
            if self.lo is not None and (lo is None or lo < self.lo):
                lo = self.lo if (hi is None or self.lo <= hi) else None
                if lo is None:
                    continue
            if self.hi is not None and (hi is None or hi > self.hi):
                if lo is not None and lo > self.hi:
                    continue
                hi = self.hi
            out.append((lo, hi))
        return out

    def _rank_compare(self, op: str, c: str) -> list[Interval]:
        d = self.dictionary
        assert d is not None
        if op == "=":
            code = d.code(c)
            return [] if code == 0 else [(int(d.ranks()[code]),) * 2]
        if op == "<":
            hi = d.rank_at_least(c) - 1
            return [(None, hi)] if hi >= 0 else []
        if op == "<=":
            hi = d.rank_at_least(c, strict=True) - 1
            return [(None, hi)] if hi >= 0 else []
        if op == ">":
            return [(d.rank_at_least(c, strict=True), None)]
        if op == ">=":
            return [(d.rank_at_least(c), None)]
        raise AssertionError(op)

    def rank_of(self, c: str) -> int | None:
        assert self.dictionary is not None
        code = self.dictionary.code(c)
        return None if code == 0 else int(self.dictionary.ranks()[code])

    def prefix(self, p: str) -> list[Interval]:
        assert self.dictionary is not None
        lo = self.dictionary.rank_at_least(p)
        succ = prefix_successor(p)
        if succ is None:
            return [(lo, None)]
        hi = self.dictionary.rank_at_least(succ) - 1
        return [(lo, hi)] if hi >= lo else []

    def point(self, c: Any) -> Any | None:
        """The domain value equal to ``c``, None if no stored value can equal it."""
        if self.kind == "rank":
            return self.rank_of(c)
        if self.kind == "float":
            return float(c)
        if type(c) is float:
            if not c.is_integer():
                return None
            c = int(c)
        if (self.lo is not None and c < self.lo) or (self.hi is not None and c > self.hi):
            return None
        return int(c)

    def fold(self, atoms: Sequence[Atom]) -> Constraint:
        """The constraint of a column's atoms."""
        con = Constraint()
        for a in atoms:
            op = a.op
            if op == "is null":
                con.null = _MUST_BE_NULL[con.null]
            elif op == "is not null":
                con.null = _MUST_NOT_BE_NULL[con.null]
            elif op == "!=":
                p = self.point(a.value)
                if p is not None:
                    con.ne.append(p)
                else:  # nothing stored equals it: only NULL fails the test
                    con.null = _MUST_NOT_BE_NULL[con.null]
            elif op == "=":
                p = self.point(a.value)
                con.add_intervals([] if p is None else [(p, p)])
            elif op == "in":
                ps = [self.point(v) for v in a.value]
                con.add_intervals(points([p for p in ps if p is not None]))
            elif op == "prefix":
                con.add_intervals(self.prefix(a.value))
            else:
                con.add_intervals(self.compare(op, a.value))
        if con.null == 3:
            con.intervals = []
        if con.ne and con.intervals is not None:
            # An excluded value inside a point set just removes the point.
            pts = {lo for lo, hi in con.intervals if lo is not None and lo == hi}
            keep = [x for x in con.ne if x not in pts]
            if len(keep) < len(con.ne):
                drop = set(con.ne) - set(keep)
                con.intervals = [iv for iv in con.intervals if not (iv[0] == iv[1] in drop)]
                con.ne = keep
        return con


# Null requirements as they combine (3: contradictory).
_MUST_BE_NULL = {0: 1, 1: 1, 2: 3, 3: 3}
_MUST_NOT_BE_NULL = {0: 2, 1: 3, 2: 2, 3: 3}


def _int_compare(op: str, c: int | float) -> list[Interval]:
    if type(c) is float and math.isinf(c):
        below = c < 0
        if op in ("=",):
            return []
        if op in ("<", "<="):
            return [] if below else [(None, None)]
        return [(None, None)] if below else []
    if op == "=":
        return [(c, c)] if type(c) is int or c.is_integer() else []
    if op == "<":
        return [(None, math.ceil(c) - 1)]
    if op == "<=":
        return [(None, math.floor(c))]
    if op == ">":
        return [(math.floor(c) + 1, None)]
    if op == ">=":
        return [(math.ceil(c), None)]
    raise AssertionError(op)


def _float_compare(op: str, c: float) -> list[Interval]:
    if op == "=":
        return [(c, c)]
    if op == "<":
        return [] if c == -math.inf else [(None, float(np.nextafter(c, -math.inf)))]
    if op == "<=":
        return [(None, c)]
    if op == ">":
        return [] if c == math.inf else [(float(np.nextafter(c, math.inf)), None)]
    if op == ">=":
        return [(c, None)]
    raise AssertionError(op)


def evaluate(con: Constraint, v: np.ndarray, nul: np.ndarray | None) -> np.ndarray:
    """Which rows satisfy ``con``: ``v`` the domain values, ``nul`` the NULL mask."""
    n = len(v)
    if con.empty:
        return np.zeros(n, dtype=bool)
    if con.null == 1:
        return np.zeros(n, dtype=bool) if nul is None else nul.copy()
    m: np.ndarray | None = None
    if con.intervals is not None:
        for lo, hi in con.intervals:
            if lo is None and hi is None:
                part = np.ones(n, dtype=bool)
            elif lo is None:
                part = v <= hi
            elif hi is None:
                part = v >= lo
            elif lo == hi:
                part = v == lo
            else:
                part = (v >= lo) & (v <= hi)
            m = part if m is None else (m | part)
        if m is None:
            return np.zeros(n, dtype=bool)
    for x in con.ne:
        m = (v != x) if m is None else (m & (v != x))
    if nul is not None and con.valued:
        m = ~nul if m is None else (m & ~nul)
    return np.ones(n, dtype=bool) if m is None else m


# ---------------------------------------------------------------- placement ranges
TypedRange = tuple[Any, bool, Any, bool]
"""``(lo, lo_inclusive, hi, hi_inclusive)`` of key values; None is an open end."""


def typed_ranges(ranges: RangeSet, rank: int) -> list[TypedRange] | None:
    """The part of a placement range set that holds keys of one Rubberband rank (2 for
    numbers, 3 for strings), as intervals of plain values; None if it holds them all."""
    out: list[TypedRange] = []
    for lo_b, hi_b in ranges:
        if lo_b[0] > rank or hi_b[0] < rank:
            continue
        if lo_b[0] < rank:
            lo, lo_inc = None, True
        else:
            lo, lo_inc = lo_b[1], len(lo_b) == 2
        if hi_b[0] > rank:
            hi, hi_inc = None, True
        elif len(hi_b) == 1:
            continue  # (rank,) below every key of the rank
        else:
            hi, hi_inc = hi_b[1], len(hi_b) == 3
        if (
            lo is not None
            and hi is not None
            and (lo > hi or (lo == hi and not (lo_inc and hi_inc)))
        ):
            continue
        out.append((lo, lo_inc, hi, hi_inc))
    if len(out) == 1 and out[0][0] is None and out[0][2] is None:
        return None
    return out


def ranges_constraint(typed: list[TypedRange], domain: Domain) -> list[Interval]:
    """Typed key ranges as closed intervals of the key column's domain."""
    out: list[Interval] = []
    for lo, lo_inc, hi, hi_inc in typed:
        ivs: list[Interval] = [(None, None)]
        if lo is not None:
            ivs = intersect(ivs, _bound(domain, ">=" if lo_inc else ">", lo))
        if hi is not None:
            ivs = intersect(ivs, _bound(domain, "<=" if hi_inc else "<", hi))
        out.extend(ivs)
    out.sort(key=lambda iv: (iv[0] is not None, iv[0]))
    merged: list[Interval] = []
    for iv in out:
        if merged and _touches(merged[-1], iv, domain):
            last = merged[-1]
            hi = None if last[1] is None or iv[1] is None else max(last[1], iv[1])
            merged[-1] = (last[0], hi)
        else:
            merged.append(iv)
    return merged


def _bound(domain: Domain, op: str, value: Any) -> list[Interval]:
    if domain.kind == "int" and type(value) is not int and type(value) is not float:
        raise AssertionError(value)
    return domain.compare(op, value)


def _touches(a: Interval, b: Interval, domain: Domain) -> bool:
    if a[1] is None:
        return True
    if b[0] is None:
        return True
    step = 0 if domain.kind == "float" else 1
    return b[0] <= a[1] + step


def as_object(value: Any) -> np.ndarray:
    """``value`` as a 0-d object array.  Compared with an object array of strings it is
    compared as a Python ``str``; a bare ``str`` would first become a NumPy string, which
    drops trailing NULs ("a\\x00" would equal "a")."""
    out = np.empty((), dtype=object)
    out[()] = value
    return out


def typed_range_mask(typed: list[TypedRange], values: np.ndarray) -> np.ndarray:
    """Value-mode check of typed ranges on plain values (numbers or an object array of
    strings)."""
    m = np.zeros(len(values), dtype=bool)
    wrap = as_object if values.dtype == object else (lambda x: x)
    for lo, lo_inc, hi, hi_inc in typed:
        part = np.ones(len(values), dtype=bool)
        if lo is not None:
            part &= (values >= wrap(lo)) if lo_inc else (values > wrap(lo))
        if hi is not None:
            part &= (values <= wrap(hi)) if hi_inc else (values < wrap(hi))
        m |= part
    return m


# ---------------------------------------------------------------- value mode
def string_atom_mask(atom: Atom, strings: np.ndarray, nul: np.ndarray) -> np.ndarray:
    """Value-mode evaluation of one atom on decoded strings (an object array of ``str``,
    ``""`` for NULL, and the NULL mask).  Object arrays compare with Python's own string
    order, which the dictionary's ranks follow too."""
    op = atom.op
    if op == "is null":
        return nul.copy()
    if op == "is not null":
        return ~nul
    c = atom.value
    if op in COMPARISONS:
        c = as_object(c)
    if op == "=":
        m = strings == c
    elif op == "!=":
        m = strings != c
    elif op == "<":
        m = strings < c
    elif op == "<=":
        m = strings <= c
    elif op == ">":
        m = strings > c
    elif op == ">=":
        m = strings >= c
    elif op == "prefix":
        m = np.fromiter((s.startswith(c) for s in strings), dtype=bool, count=len(strings))
    elif op == "in":
        wanted = set(c)
        m = np.fromiter((s in wanted for s in strings), dtype=bool, count=len(strings))
    else:
        raise AssertionError(op)
    return m & ~nul
