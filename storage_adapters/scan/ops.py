"""Operations of the scan engine: their plain format and their validation (2.2).

Operations are plain values (dicts of lists, strings and numbers) so they travel through
msgpack unchanged; :class:`~storage_adapters.scan.client.ScanOps` builds them.

=================  ===========================================================  ==========
``op``             fields                                                       result
=================  ===========================================================  ==========
``create_table``   ``table``, ``schema`` (``[[name, type], ...]``), ``key``     created
``drop_table``     ``table``                                                    dropped
``insert``         ``table``, ``rows`` (list of dicts) or ``columns`` + ``data``  inserted
                   (one list per column)
``upsert``         as ``insert``; a row whose key exists replaces it whole      inserted,
                                                                                updated
``select``         ``table``, ``where``, ``columns`` (projection) or ``agg``    rows or
                   (``[[fn, column], ...]``), ``read`` (``strict``/``basic``)   partials
``update``         ``table``, ``where``, ``set`` (``{column: value}``)          updated
``delete``         ``table``, ``where``                                         deleted
=================  ===========================================================  ==========

Any operation may carry ``key`` (the table's key attribute) so that ``part_fun`` can route
it without a catalog; the engine refuses an operation whose ``key`` is not the table's.

Validation happens before any state changes (validate first, then change: a refused
operation leaves nothing half done):
:func:`compile_op` turns a raw operation into a typed one or raises
:class:`BadOperation` with a message for the client.  An ``insert`` whose key already
exists (or repeats within the insert) is refused whole, deterministically, when it runs;
``upsert`` is the operation that overwrites.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from rubberband.engine import BadOperation
from storage_adapters.memory import is_read as is_kv_read
from storage_adapters.scan.predicates import Atom, parse_where
from storage_adapters.scan.schema import Schema, column_values, stored_scalar

AGGREGATES = ("count", "min", "max", "sum", "avg")
DDL = ("create_table", "drop_table")
WRITES = ("insert", "upsert", "update", "delete")


@dataclass(frozen=True, slots=True)
class CreateTable:
    table: str
    schema: Schema


@dataclass(frozen=True, slots=True)
class DropTable:
    table: str


@dataclass(slots=True)
class Rows:
    """Rows of an insert or upsert, column-wise and validated (strings not yet coded)."""

    n: int
    values: dict[str, Any]
    """Per column: a NumPy array of the storage dtype, or a list of ``str``."""
    nulls: dict[str, np.ndarray | None]
    keys: list[Any]


@dataclass(slots=True)
class Select:
    table: str
    atoms: tuple[Atom, ...]
    columns: tuple[str, ...]
    """The projection (empty for an aggregate)."""
    aggs: tuple[tuple[str, str | None], ...] | None
    basic: bool


@dataclass(slots=True)
class Write:
    kind: Literal["insert", "upsert", "update", "delete"]
    table: str
    atoms: tuple[Atom, ...] = ()
    assignments: dict[str, Any] = field(default_factory=dict)
    rows: Rows | None = None


Compiled = CreateTable | DropTable | Select | Write


def is_select(op: Any) -> bool:
    """Whether ``op`` is a table read (``select``): :meth:`Engine.is_read` of the
    engines with tables."""
    return isinstance(op, Mapping) and op.get("op") == "select"


def is_table_or_kv_read(op: Any) -> bool:
    """A select of a table, or a key-value ``get`` or ``scan``: :meth:`Engine.is_read`
    of the engines that hold both."""
    return is_select(op) if isinstance(op, dict) else is_kv_read(op)


def op_kind(op: Any) -> str:
    if not isinstance(op, Mapping):
        raise BadOperation(f"an operation is a dict with an 'op' field, not {type(op).__name__}")
    kind = op.get("op")
    if kind not in (*DDL, *WRITES, "select"):
        raise BadOperation(f"unknown operation {kind!r:.40}")
    return kind  # type: ignore[no-any-return]


def table_name(op: Mapping[str, Any]) -> str:
    name = op.get("table")
    if type(name) is not str or not name or len(name) > 128:
        raise BadOperation(f"'table' is a table name, not {name!r:.60}")
    return name


def _known(op: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    extra = set(op) - {"op", "table", "key", *allowed}
    if extra:
        raise BadOperation(f"unknown field(s) {sorted(map(str, extra))} in {op.get('op')}")


def compile_op(op: Any, schemas: Mapping[str, Schema]) -> Compiled:
    """Validate ``op`` against the tables' schemas; raises :class:`BadOperation`."""
    kind = op_kind(op)
    name = table_name(op)
    if kind == "create_table":
        _known(op, ("schema",))
        return CreateTable(name, Schema.parse(op.get("schema"), op.get("key")))
    if kind == "drop_table":
        _known(op, ())
        return DropTable(name)
    schema = schemas.get(name)
    if schema is None:
        raise BadOperation(f"unknown table {name!r}")
    if "key" in op and op["key"] != schema.key:
        raise BadOperation(f"table {name!r} has key {schema.key!r}, not {op['key']!r:.40}")
    if kind == "select":
        _known(op, ("where", "columns", "agg", "read"))
        return _select(op, name, schema)
    if kind in ("insert", "upsert"):
        _known(op, ("rows", "columns", "data"))
        return Write(kind, name, rows=_rows(op, schema))
    if kind == "update":
        _known(op, ("where", "set"))
        return Write(
            "update",
            name,
            parse_where(op.get("where"), schema.by_name),
            assignments=_assignments(op.get("set"), schema),
        )
    _known(op, ("where",))
    return Write("delete", name, parse_where(op.get("where"), schema.by_name))


def _select(op: Mapping[str, Any], name: str, schema: Schema) -> Select:
    atoms = parse_where(op.get("where"), schema.by_name)
    read = op.get("read", "strict")
    if read not in ("strict", "basic"):
        raise BadOperation(f"read is 'strict' or 'basic', not {read!r:.30}")
    agg = op.get("agg")
    columns = op.get("columns")
    if agg is not None:
        if columns is not None:
            raise BadOperation(
                "a select has a projection or aggregates, not both (there is no GROUP BY)"
            )
        return Select(name, atoms, (), _aggs(agg, schema), read == "basic")
    if columns is None:
        cols = schema.names
    else:
        if not isinstance(columns, (list, tuple)) or not columns:
            raise BadOperation("columns is a non-empty list of column names")
        for c in columns:
            schema.column(c)
        if len(set(columns)) != len(columns):
            raise BadOperation("a column appears twice in the projection")
        cols = tuple(columns)
    return Select(name, atoms, cols, None, read == "basic")


def _aggs(agg: Any, schema: Schema) -> tuple[tuple[str, str | None], ...]:
    if not isinstance(agg, (list, tuple)) or not agg:
        raise BadOperation("agg is a non-empty list of [function, column] pairs")
    out = []
    for item in agg:
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise BadOperation(f"an aggregate is [function, column], not {item!r:.60}")
        fn, col = item
        fn = fn.lower() if type(fn) is str else fn
        if fn not in AGGREGATES:
            raise BadOperation(f"unknown aggregate {fn!r:.30} (use {', '.join(AGGREGATES)})")
        if col == "*":
            if fn != "count":
                raise BadOperation(f"{fn}(*) is not an aggregate; only count(*)")
            out.append((fn, None))
            continue
        c = schema.column(col)
        if fn in ("sum", "avg") and c.type.kind not in ("int", "float"):
            raise BadOperation(f"{fn} needs a number; {col!r} is {c.type.name}")
        out.append((fn, col))
    return tuple(out)


def _assignments(values: Any, schema: Schema) -> dict[str, Any]:
    if not isinstance(values, Mapping) or not values:
        raise BadOperation("set is a non-empty {column: value} mapping")
    out = {}
    for name, value in values.items():
        col = schema.column(name)
        if name == schema.key:
            raise BadOperation(
                f"the key {name!r} cannot be updated (delete the row and insert it again)"
            )
        out[name] = stored_scalar(col, value)
    return out


def _rows(op: Mapping[str, Any], schema: Schema) -> Rows:
    if "rows" in op:
        if "columns" in op or "data" in op:
            raise BadOperation("an insert has rows or columns + data, not both")
        rows = op["rows"]
        if not isinstance(rows, (list, tuple)):
            raise BadOperation("rows is a list of {column: value} dicts")
        names = set(schema.names)
        for r in rows:
            if not isinstance(r, Mapping):
                raise BadOperation(f"a row is a {{column: value}} dict, not {r!r:.60}")
            if not r.keys() <= names:
                extra = sorted(map(str, r.keys() - names))
                raise BadOperation(f"unknown column(s) {extra} in a row of {schema.key!r}'s table")
        columns = {name: [r.get(name) for r in rows] for name in schema.names}
        n = len(rows)
    else:
        cols, data = op.get("columns"), op.get("data")
        if not isinstance(cols, (list, tuple)) or not isinstance(data, (list, tuple)):
            raise BadOperation(
                "an insert has rows, or columns (names) and data (one list per column)"
            )
        if len(cols) != len(data):
            raise BadOperation(f"{len(cols)} columns but {len(data)} data lists")
        for c in cols:
            schema.column(c)
        if len(set(cols)) != len(cols):
            raise BadOperation("a column appears twice in an insert")
        lengths = {len(d) if isinstance(d, (list, tuple)) else -1 for d in data}
        if len(lengths) > 1 or -1 in lengths:
            raise BadOperation("every data list of an insert has one value per row")
        n = lengths.pop() if lengths else 0
        given = dict(zip(cols, data, strict=True))
        columns = {name: given.get(name, [None] * n) for name in schema.names}
    if schema.key not in columns or any(k is None for k in columns[schema.key]):
        raise BadOperation(f"every row needs its key {schema.key!r}")
    values: dict[str, Any] = {}
    nulls: dict[str, np.ndarray | None] = {}
    for col in schema.columns:
        values[col.name], nulls[col.name] = column_values(col, columns[col.name])
    key_col = schema.key_column
    raw_keys = values[schema.key]
    keys = raw_keys if key_col.type.is_string else raw_keys.tolist()
    return Rows(n, values, nulls, list(keys))
