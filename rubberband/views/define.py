"""What a view is: its definition, validated, and where its rows live in the keyspace.

A view is a Rubberband table of its own: its rows live under the key prefix
``("~view", name)``, so the ring partitions, replicates and moves them like any other
keys (a secondary-key view is partitioned by the secondary key: its rows are ordered by
it).  Each row is a version chain (:mod:`rubberband.versions`) so the view can be read
as of a position; the key ``("~view", name)`` itself (the first of the prefix) holds the
maintainer's progress, a chain whose newest entry is ``[W, floor]``: every base change
up to position ``W`` is in the rows, and positions below ``floor`` are no longer
readable.  Definitions live under ``("~views", name)``.  Keys that start with ``"~view"``
or ``"~views"`` are the views' own: do not write them.

Kinds (seed 000's and PNUTS's view types, section III and 6):

==============  ==================================  =====================================
kind            row key                             row value
==============  ==================================  =====================================
``selection``   the base key                        the base value (``columns``: those)
``projection``  the base key                        ``{column: value}`` of ``columns``
``index``       ``(value[on], base key)``           the base value (``columns``: those)
``aggregate``   ``value[group_by]`` (or None)       ``{name: aggregate}``
``join``        ``(join value, left key, right)``   ``{"left": value, "right": value}``
==============  ==================================  =====================================

A view may be defined over another view (``over``): its base is the other view's rows
(row key, row value) at each position, and it is kept by the same maintainer loop, from
the rows the other view changes at each base position (seed 000's view expressions
composed as a DAG), so it is exact as of every position the other one is.  Its
``sources`` are the root view's base ranges (which feeds the loop reads).

A view's base may be a table's rows (``table=(name, key column)``, and for a join
``right_table=``) on an engine with tables (the scan engine): its source range is then
of the rows' keys, the base value of a row is the row (a dict of its columns), and the
maintainer backfills from one sequential select of the table and follows the rows'
changes, which the engine reports with their images (:mod:`rubberband.engine`).

Every kind takes ``where``: ``[(field, op, constant), ...]``, all of which a base value
must meet (ops ``= != < <= > >=``, compared in Rubberband's key order, so values of
different types compare without error).  A field is a key of a dict value; the field
``None`` is the value itself.  Aggregates are ``{name: [fn, field]}`` with ``fn`` one
of ``count sum min max avg``; ``count`` with field None counts rows.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise
from typing import Any

from rubberband.errors import BadKey, BadOperation
from rubberband.keys import MAX, encode_key
from rubberband.versions import CATALOG, VIEW

KINDS = ("selection", "projection", "index", "aggregate", "join")
OPS = ("=", "!=", "<", "<=", ">", ">=")
FUNCTIONS = ("count", "sum", "min", "max", "avg")
NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")
Table = tuple[str, str]
"""A table source: its name and its key column."""


@dataclass(frozen=True)
class ViewDef:
    """A view's definition: ``source`` is the base range ``(lo, hi)`` (None: unbounded),
    or for a join the left one, with ``right`` the other; or ``over`` names the view it
    is defined over, and ``base`` holds that view's sources."""

    name: str
    kind: str
    source: tuple[Any, Any]
    where: tuple[tuple[Any, str, Any], ...] = ()
    columns: tuple[str, ...] | None = None
    on: Any = None
    group_by: Any = None
    aggregates: tuple[tuple[str, str, Any], ...] = ()
    right: tuple[Any, Any] | None = None
    right_on: Any = None
    retention: float = 60.0
    over: str | None = None
    base: tuple[tuple[Any, Any], ...] = ()
    tables: tuple[Table | None, ...] = ()
    """Per source, the table whose rows it is (``(name, key column)``), or None for
    key-value data; empty: every source is key-value data.  A view over a view holds
    that view's."""
    parts: tuple[Any, ...] = ()
    """Split points in the view's key order: the view's rows in parts ``[-inf, p1),
    [p1, p2), ... [pn, +inf)``, each kept by a maintainer unit of its own with a
    progress of its own (empty: one part)."""
    part: int | None = None
    """On a maintainer's unit of a split view (:func:`units`): the part it keeps."""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def sources(self) -> tuple[tuple[Any, Any], ...]:
        if self.over is not None:
            return self.base
        return (self.source,) if self.right is None else (self.source, self.right)

    def table_of(self, side: int) -> Table | None:
        """The table source ``side`` is the rows of (None: key-value data, or a view
        over a view, whose base is that view's rows)."""
        if self.over is not None or side >= len(self.tables):
            return None
        return self.tables[side]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "source": list(self.source),
            "where": [list(w) for w in self.where],
            "columns": None if self.columns is None else list(self.columns),
            "on": self.on,
            "group_by": self.group_by,
            "aggregates": {n: [f, c] for n, f, c in self.aggregates},
            "right": None if self.right is None else list(self.right),
            "right_on": self.right_on,
            "retention": self.retention,
            "over": self.over,
            "base": [list(r) for r in self.base],
            "tables": [None if t is None else list(t) for t in self.tables],
            "parts": list(self.parts),
        }


def view_def(
    name: str,
    kind: str,
    source: Sequence[Any],
    *,
    where: Sequence[Sequence[Any]] = (),
    columns: Sequence[str] | None = None,
    on: Any = None,
    group_by: Any = None,
    aggregates: dict[str, Sequence[Any]] | None = None,
    right: Sequence[Any] | None = None,
    right_on: Any = None,
    retention: float = 60.0,
    over: str | None = None,
    base: Sequence[Sequence[Any]] = (),
    table: Sequence[str] | None = None,
    right_table: Sequence[str] | None = None,
    tables: Sequence[Sequence[str] | None] = (),
    parts: Sequence[Any] = (),
) -> ViewDef:
    """A checked definition; :class:`BadOperation` names what is wrong.  ``table``
    (``right_table``): the source (right) range is of that table's rows, ``(name, key
    column)``; ``tables``: a view over a view takes that view's; ``parts``: split
    points of the view's key, each part kept by a maintainer unit of its own."""
    _name(name)
    origins = _origins(over, tables, table, right, right_table)
    bases: tuple[tuple[Any, Any], ...] = ()
    if over is not None:
        _name(over)
        if over == name or kind == "join" or not 1 <= len(base) <= 2:
            raise BadOperation(
                "a view over a view names another view and is not a join (over=...), "
                "with that view's base ranges (base=...)"
            )
        bases = tuple(_range(r, "base") for r in base)
        source = bases[0]
    if kind not in KINDS:
        raise BadOperation(f"a view's kind is one of {', '.join(KINDS)}, not {kind!r:.40}")
    src = _range(source, "source")
    rng = None if right is None else _range(right, "right")
    conds = []
    for w in where:
        if type(w) not in (list, tuple) or len(w) != 3 or w[1] not in OPS:
            raise BadOperation(
                f"a where condition is (field, op, constant) with op one of {' '.join(OPS)}"
            )
        _key(w[2], "a where constant")
        conds.append((w[0], w[1], w[2]))
    cols = None if columns is None else tuple(columns)
    if cols is not None and not all(type(c) is str for c in cols):
        raise BadOperation("columns are field names (str)")
    aggs = []
    if kind == "projection" and not cols:
        raise BadOperation("a projection names its columns")
    if kind == "index" and on is None:
        raise BadOperation("an index names the field it is on (on=...)")
    if kind == "aggregate":
        if not aggregates:
            raise BadOperation("an aggregate view names its aggregates: {name: [fn, field]}")
        for out, spec in aggregates.items():
            if type(out) is not str or type(spec) not in (list, tuple) or len(spec) != 2:
                raise BadOperation("aggregates are {name: [fn, field]}")
            if spec[0] not in FUNCTIONS:
                raise BadOperation(
                    f"an aggregate is one of {', '.join(FUNCTIONS)}, not {spec[0]!r:.30}"
                )
            aggs.append((out, spec[0], spec[1]))
    if kind == "join":
        if rng is None or on is None or right_on is None:
            raise BadOperation("a join names right=(lo, hi), on= (the left field) and right_on=")
    elif rng is not None or right_on is not None:
        raise BadOperation("right= and right_on= belong to joins")
    if not 0.0 < float(retention) <= 86_400.0:
        raise BadOperation("a view's retention is seconds in (0, 86400]")
    splits = _parts(parts, over)
    return ViewDef(name, kind, src, tuple(conds), cols, on, group_by, tuple(aggs), rng, right_on,
                   float(retention), over, bases, origins, splits)  # fmt: skip


MAX_PARTS = 64


def _parts(parts: Sequence[Any], over: str | None) -> tuple[Any, ...]:
    if type(parts) not in (list, tuple) or len(parts) >= MAX_PARTS:
        raise BadOperation(f"a view's parts are at most {MAX_PARTS - 1} split points (a list)")
    if parts and over is not None:
        raise BadOperation("a view over a view is kept in one part (its rows come from the "
                           "other view's loop)")  # fmt: skip
    out = []
    for p in parts:
        out.append(stored_key(p))  # JSON and msgpack give lists for tuples
        _key(out[-1], "a split point")
    encoded = [encode_key(p) for p in out]
    if any(not a < b for a, b in pairwise(encoded)):
        raise BadOperation("a view's split points are in increasing key order, none twice")
    return tuple(out)


def _name(name: Any) -> None:
    if type(name) is not str or not NAME.fullmatch(name):
        raise BadOperation(
            f"a view name is a letter then up to 63 of [A-Za-z0-9_.-], not {name!r:.70}"
        )


def from_dict(d: Any, key: Any = None) -> ViewDef:
    """A stored definition (``to_dict``'s) read back, or :class:`BadOperation`.  The
    catalog is data any client can write: a value that is no definition, or one stored
    under another view's key (``key``), is refused here, never taken for a view or
    raised as some other error that would stop a maintainer."""
    if type(d) is not dict:
        raise BadOperation(f"a stored view definition is a dict, not {type(d).__name__}")
    if key is not None and stored_key(key) != catalog_key(d.get("name")):  # type: ignore[arg-type]
        raise BadOperation(f"the definition under {key!r:.60} names another view")
    try:
        return _from_dict(d)
    except BadOperation:
        raise
    except (TypeError, KeyError, ValueError, IndexError, AttributeError) as e:
        raise BadOperation(f"a malformed view definition: {type(e).__name__}: {e}") from None


def _from_dict(d: dict[str, Any]) -> ViewDef:
    return view_def(
        d["name"],
        d["kind"],
        d["source"],
        where=d.get("where") or (),
        columns=d.get("columns"),
        on=d.get("on"),
        group_by=d.get("group_by"),
        aggregates=d.get("aggregates") or None,
        right=d.get("right"),
        right_on=d.get("right_on"),
        retention=d.get("retention", 60.0),
        over=d.get("over"),
        base=d.get("base") or (),
        tables=d.get("tables") or () if d.get("over") is not None else (),
        table=_side(d, 0),
        right_table=_side(d, 1) if d.get("right") is not None else None,
        parts=d.get("parts") or (),
    )


def stored_key(value: Any) -> Any:
    """A key as it was defined: stored definitions come back with lists for tuples."""
    return tuple(stored_key(v) for v in value) if type(value) in (list, tuple) else value


def _origins(
    over: str | None, tables: Sequence[Any], table: Any, right: Any, right_table: Any
) -> tuple[Table | None, ...]:
    """The checked ``tables`` of a definition: a view over a view takes its parent's,
    others name theirs per source (empty when every source is key-value data)."""
    if over is not None:
        origins = tuple(_table(t) for t in tables)
    else:
        if right is None and right_table is not None:
            raise BadOperation("right_table= belongs to joins")
        origins = (_table(table),) if right is None else (_table(table), _table(right_table))
    return origins if any(origins) else ()


def _side(d: dict[str, Any], side: int) -> Any:
    """The table of a stored definition's ``side`` (None for a view over a view: its
    ``tables`` are its parent's, taken whole)."""
    tables = d.get("tables") or ()
    return tables[side] if d.get("over") is None and side < len(tables) else None


def _table(t: Any) -> Table | None:
    if t is None:
        return None
    if type(t) not in (list, tuple) or len(t) != 2 or not all(type(x) is str and x for x in t):
        raise BadOperation("a table source is (table name, its key column)")
    return (t[0], t[1])


def _key(value: Any, what: str) -> None:
    try:
        encode_key(value)
    except BadKey as e:
        raise BadOperation(f"{what} must be a key value: {e}") from None


def _range(rng: Any, what: str) -> tuple[Any, Any]:
    if type(rng) not in (list, tuple) or len(rng) != 2:
        raise BadOperation(f"a view's {what} is a key range (lo, hi); None is unbounded")
    lo, hi = rng
    for b in (lo, hi):
        if b is not None:
            _key(b, f"the {what}'s bounds")
    if lo is not None and hi is not None and not encode_key(lo) < encode_key(hi):
        raise BadOperation(f"the {what} range [{lo!r}, {hi!r}) is empty")
    for b in (lo, hi):
        if type(b) is tuple and b[:1] in ((VIEW,), (CATALOG,)):
            raise BadOperation(
                "a view's source is a base range; a view over a view names it (from_='name')"
            )
    return (lo, hi)


# ------------------------------------------------------------------ the keyspace
def meta_key(name: str) -> tuple[str, str]:
    """The view's progress that ordered reads wait for (sequential, read-your-writes,
    snapshot): written in the same write as the rows under it."""
    return (VIEW, name)


def stable_key(name: str) -> tuple[str, str]:
    """The view's progress that basic (``any``) reads trust: written only once the rows
    under it are stable.  Just past the view's rows (no view name holds a NUL)."""
    return (VIEW, name + "\x00")


def progress_keys(name: str, part: int | None = None) -> tuple[Any, Any]:
    """A part's two progress keys, ordered and stable (:func:`meta_key`,
    :func:`stable_key`): part 0 (and an unsplit view) has those, the others theirs
    just past the stable one, where a scan from :func:`rows_bounds`' start to
    :func:`keys_end` finds them all."""
    if not part:
        return meta_key(name), stable_key(name)
    return (VIEW, name + "\x00", part, 0), (VIEW, name + "\x00", part, 1)


def reclaim_key(name: str) -> tuple[str, str, int]:
    """The view's reclaim floor: the floor of its chain is the highest position below
    which a maintainer may have dropped dead rows (:mod:`rubberband.versions`,
    "Reclaiming"); every reader takes it as a floor of the view.  A chain's floor only
    rises, so no stale maintainer can lower it.  Just past the stable progress, before
    the other parts' progress."""
    return (VIEW, name + "\x00", -1)


def keys_end(name: str) -> tuple[str, str]:
    """Past every key of the view: its rows and every part's progress."""
    return (VIEW, name + "\x01")


def units(view: ViewDef) -> list[ViewDef]:
    """What maintainers keep: each part of a split view as a unit of its own (its
    ``part`` set), an unsplit view whole."""
    if not view.parts or view.part is not None:
        return [view]
    return [replace(view, part=i) for i in range(len(view.parts) + 1)]


def unit_name(view: ViewDef) -> str:
    return view.name if view.part is None else f"{view.name}#{view.part}"


def part_of(parts: tuple[Any, ...], vkey: Any) -> int:
    """The part a row of view key ``vkey`` is in."""
    if not parts:
        return 0
    return bisect_right([encode_key(p) for p in parts], encode_key(vkey))


def part_bounds(view: ViewDef) -> tuple[Any, Any]:
    """The keys of a unit's rows, ``(lo, hi)`` (the whole view's, its progress key
    first, for part 0's lower end and an unsplit view)."""
    lo, hi = rows_bounds(view.name)
    if view.part is None:
        return lo, hi
    if view.part > 0:
        lo = row_key(view.name, view.parts[view.part - 1])
    if view.part < len(view.parts):
        hi = row_key(view.name, view.parts[view.part])
    return lo, hi


def row_key(name: str, vkey: Any) -> tuple[str, str, Any]:
    return (VIEW, name, vkey)


def catalog_key(name: str) -> tuple[str, str]:
    return (CATALOG, name)


def rows_bounds(name: str) -> tuple[Any, Any]:
    """The view's key range, its progress key first: ``(lo, hi)``."""
    return (VIEW, name), (VIEW, name + "\x00")


def prefix_bounds(name: str, prefix: Any) -> tuple[Any, Any]:
    """The range of the rows whose key is a tuple starting with ``prefix`` (an index's
    rows for one secondary key): the upper bound holds ``MAX``, an encoded-only key."""
    return (VIEW, name, (prefix,)), (VIEW, name, (prefix, MAX))
