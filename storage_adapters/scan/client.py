"""The client half of the scan engine: building operations, routing them, combining results.

:class:`ScanOps` is pure (no engine, no I/O): it builds the plain operations of
:mod:`.ops`, computes the ranges an operation reads or writes (``part_fun``, 5.3), and
merges the partial results that several storage processes return for one read.  The
Rubberband SDK wraps it, e.g. ``await t.select(where=..., columns=..., isolation=...)``
becomes ``ops.select(t.name, where=..., columns=..., isolation=...)`` submitted with
``part_fun``'s ranges and, for a read, the isolation level; the answers then go through
``ScanOps.combine``.

Routing follows Crescando/RB (5.3).  Under range placement a select, update or delete
goes only to the ranges its key predicates name (``=``, ``in``, ``<``, ``<=``, ``>``,
``>=``, ``prefix``, in any conjunction); under hash placement only ``=`` and ``in`` on the
key narrow it, to the hashes of their values.  Anything else goes to ``EVERYTHING``.
Inserts and upserts name the points of their rows' keys; table DDL writes everything.
An operation no key can satisfy (``k = 1`` and ``k = 2``) names no range at all: its
answer is known without asking anyone (empty, or zero rows changed).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any

from rubberband.engine import (
    EVERYTHING,
    MAX_EKEY,
    MIN_EKEY,
    NOTHING,
    ROWS,
    BadKey,
    BadOperation,
    Event,
    Part,
    Placement,
    RangeSet,
    after,
    encode_key,
    intersect,
    normalize,
)
from storage_adapters.scan.dictionary import prefix_successor
from storage_adapters.scan.ops import DDL, op_kind

Isolation = str
"""``sequential`` or ``snapshot`` (strict reads here) or ``basic`` (5.2)."""
_ISOLATION = {"sequential": "strict", "snapshot": "strict", "strict": "strict", "basic": "basic"}
_BYTES_START = encode_key(b"")
"""The first key above every string: where a prefix range without successor ends."""


def _plain(value: Any) -> Any:
    """Operation values as msgpack carries them: dates as ISO strings, tuples as lists."""
    if type(value) is dt.date:
        return value.isoformat()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class ScanOps:
    """Builds scan-engine operations and routes them; knows each defined table's key."""

    def __init__(self, keys: Mapping[str, str] | None = None) -> None:
        self.keys: dict[str, str] = dict(keys or {})
        """The key attribute of each table this client knows (for routing)."""

    # ---------------------------------------------------------------- builders
    def create_table(self, table: str, schema: Sequence[Sequence[str]], key: str) -> dict:
        """``schema``: ``[(name, type), ...]`` with types such as ``"int32"``,
        ``"varchar(6) not null"``, ``"date"`` (see :mod:`.schema`)."""
        self.keys[table] = key
        return {"op": "create_table", "table": table, "schema": _plain(schema), "key": key}

    def drop_table(self, table: str) -> dict:
        return {"op": "drop_table", "table": table}

    def insert(
        self,
        table: str,
        rows: Iterable[Mapping[str, Any]] | None = None,
        *,
        columns: Sequence[str] | None = None,
        data: Sequence[Sequence[Any]] | None = None,
    ) -> dict:
        """Rows as dicts, or column-wise (``columns`` names, ``data`` one list per column:
        the fast form for bulk loads).  An existing key refuses the whole insert."""
        return self._rows("insert", table, rows, columns, data)

    def upsert(
        self,
        table: str,
        rows: Iterable[Mapping[str, Any]] | None = None,
        *,
        columns: Sequence[str] | None = None,
        data: Sequence[Sequence[Any]] | None = None,
    ) -> dict:
        """Like :meth:`insert`, but a row whose key exists replaces it whole (columns it
        leaves out become NULL); a key repeated in one upsert: the last row wins."""
        return self._rows("upsert", table, rows, columns, data)

    def select(
        self,
        table: str,
        where: Any = (),
        columns: Sequence[str] | None = None,
        agg: Any = None,
        isolation: Isolation = "sequential",
    ) -> dict:
        """``where``: ``[(column, op, value), ...]`` or ``{column: value}`` for equalities;
        ``agg``: ``("count", "*")`` or a list of ``(function, column)``."""
        read = _ISOLATION.get(isolation)
        if read is None:
            raise BadOperation(f"isolation is sequential, snapshot or basic, not {isolation!r}")
        op: dict[str, Any] = {"op": "select", "table": table, "where": _where(where)}
        if columns is not None:
            op["columns"] = list(columns)
        if agg is not None:
            single = isinstance(agg, (tuple, list)) and agg and isinstance(agg[0], str)
            op["agg"] = [list(agg)] if single else [list(a) for a in agg]
        if read == "basic":
            op["read"] = "basic"
        return self._keyed(op)

    def update(self, table: str, where: Any = (), values: Mapping[str, Any] | None = None) -> dict:
        """Set ``values`` (``{column: value}``) in the rows that satisfy ``where``."""
        op = {
            "op": "update",
            "table": table,
            "where": _where(where),
            "set": {k: _plain(v) for k, v in (values or {}).items()},
        }
        return self._keyed(op)

    def delete(self, table: str, where: Any = ()) -> dict:
        return self._keyed({"op": "delete", "table": table, "where": _where(where)})

    def _rows(self, kind: str, table: str, rows: Any, columns: Any, data: Any) -> dict:
        op: dict[str, Any] = {"op": kind, "table": table}
        if rows is not None:
            op["rows"] = [{k: _plain(v) for k, v in r.items()} for r in rows]
        else:
            op["columns"] = list(columns or ())
            op["data"] = [_plain(col) for col in (data or ())]
        return self._keyed(op)

    def _keyed(self, op: dict[str, Any]) -> dict[str, Any]:
        key = self.keys.get(op["table"])
        if key is not None:
            op["key"] = key
        return op

    # ---------------------------------------------------------------- routing
    def part_fun(self, op: Any, placement: Placement) -> Part:
        """The ranges ``op`` reads or writes, in ``placement``'s space (5.3)."""
        kind = op_kind(op)
        if kind in DDL:
            return Part("write", EVERYTHING)
        key = op.get("key")
        if kind in ("insert", "upsert"):
            if type(key) is not str:
                raise BadOperation(f"{kind} needs the table's key attribute ('key') to route")
            return Part("write", _points(_insert_keys(op, key), placement))
        part_kind = "read" if kind == "select" else "write"
        if type(key) is not str:
            return Part(part_kind, EVERYTHING)  # type: ignore[arg-type]
        return Part(part_kind, _where_ranges(op.get("where"), key, placement))  # type: ignore[arg-type]

    # ---------------------------------------------------------------- results
    @staticmethod
    def combine(op: Mapping[str, Any], results: Sequence[Any]) -> Any:
        """One answer from the partial answers of the storage processes that each
        answered a disjoint part of ``op``'s ranges; raises a rejection."""
        for r in results:
            if isinstance(r, BaseException):
                raise r
        kind = op.get("op")
        if kind == "select":
            if op.get("agg") is not None:
                return _combine_aggregates(op, results)
            columns = list(op.get("columns") or (results[0]["columns"] if results else []))
            data: list[list[Any]] = [[] for _ in columns]
            for r in results:
                for mine, theirs in zip(data, r["data"], strict=True):
                    mine.extend(theirs)
            return {"columns": columns, "data": data}
        merged: dict[str, Any] = {}
        for r in results:
            for field, value in r.items():
                if type(value) is bool:
                    merged[field] = merged.get(field, False) or value
                else:
                    merged[field] = merged.get(field, 0) + value
        return merged

    @staticmethod
    def answered(op: Any) -> bool:
        """Every write waits for a holder's answer, so a rejection (an existing key, a
        value of the wrong type, a table defined otherwise) raises at the call."""
        return isinstance(op, Mapping) and op.get("op") != "select"

    def bind(self, client: Any) -> Tables:
        """The calls a Rubberband client offers with these operations (``rb.table``)."""
        return Tables(client, self)

    def rows_read(
        self, table: str, key: str, lo: Any, hi: Any, keys_only: bool = False
    ) -> tuple[dict[str, Any], Callable[[Any], list[tuple[Any, dict[str, Any]]]]]:
        """The select of ``table``'s rows with keys in ``[lo, hi)`` (None: unbounded),
        and how to read its answer as ``(key, row)`` pairs: the hook a view over a
        table backfills with (:mod:`rubberband.views`); ``keys_only``: the key column
        alone (how a backfill finds where to cut its pages)."""
        self.keys[table] = key
        where = [(key, op, bound) for op, bound in ((">=", lo), ("<", hi)) if bound is not None]

        def pairs(result: Any) -> list[tuple[Any, dict[str, Any]]]:
            return [(row[key], row) for row in self.rows(result)]

        return self.select(table, where, [key] if keys_only else None), pairs

    @staticmethod
    def rows(result: Mapping[str, Any]) -> list[dict[str, Any]]:
        """A select's column-wise result as one dict per row."""
        columns = result["columns"]
        return [
            dict(zip(columns, values, strict=True)) for values in zip(*result["data"], strict=True)
        ]


def _where(where: Any) -> list[list[Any]]:
    if isinstance(where, Mapping):
        return [[k, "=", _plain(v)] for k, v in where.items()]
    return [[_plain(x) for x in pred] for pred in where]


def _insert_keys(op: Mapping[str, Any], key: str) -> list[Any]:
    if "rows" in op:
        rows = op["rows"]
        if not isinstance(rows, (list, tuple)):
            raise BadOperation("rows is a list of {column: value} dicts")
        try:
            return [r[key] for r in rows]
        except (KeyError, TypeError):
            raise BadOperation(f"every row needs its key {key!r}") from None
    columns, data = op.get("columns"), op.get("data")
    if not isinstance(columns, (list, tuple)) or key not in columns:
        raise BadOperation(f"every row needs its key {key!r}")
    if not isinstance(data, (list, tuple)) or len(data) != len(columns):
        raise BadOperation("an insert has one data list per column")
    return list(data[list(columns).index(key)])


def _ekey(value: Any, placement: Placement | None = None) -> Any:
    try:
        return encode_key(value) if placement is None else placement.ekey(value)
    except BadKey as exc:
        raise BadOperation(f"{value!r:.60} cannot be a key: {exc}") from None


def _points(keys: Iterable[Any], placement: Placement) -> RangeSet:
    out = []
    for k in keys:
        if k is None:
            raise BadOperation("a key is never NULL")
        e = _ekey(k, placement)
        out.append((e, after(e)))
    return normalize(out)


def _where_ranges(where: Any, key: str, placement: Placement) -> RangeSet:
    ranges: RangeSet = EVERYTHING
    if not isinstance(where, (list, tuple)):
        return ranges
    for pred in where:
        if not isinstance(pred, (list, tuple)) or len(pred) < 2 or pred[0] != key:
            continue
        op = pred[1].lower() if isinstance(pred[1], str) else pred[1]
        op = {"==": "=", "is_null": "is null"}.get(op, op)
        if op == "is null":
            return NOTHING
        if len(pred) != 3:
            continue
        value = pred[2]
        narrowed: RangeSet | None = None
        if op == "=":
            narrowed = _points([value], placement) if value is not None else NOTHING
        elif op == "in" and isinstance(value, (list, tuple)):
            narrowed = _points([v for v in value if v is not None], placement)
        elif placement.ordered and value is not None:
            if op in ("<", "<=", ">", ">="):
                e = _ekey(value)
                narrowed = {
                    "<": ((MIN_EKEY, e),),
                    "<=": ((MIN_EKEY, after(e)),),
                    ">": ((after(e), MAX_EKEY),),
                    ">=": ((e, MAX_EKEY),),
                }[op]
            elif op == "prefix" and isinstance(value, str):
                succ = prefix_successor(value)
                hi = _BYTES_START if succ is None else encode_key(succ)
                narrowed = ((encode_key(value), hi),)
        if narrowed is not None:
            ranges = intersect(ranges, narrowed)
    return ranges


def _combine_aggregates(op: Mapping[str, Any], results: Sequence[Any]) -> dict[str, Any]:
    aggs = op["agg"]
    names = [f"{fn.lower()}({col})" for fn, col in aggs]
    values: list[Any] = []
    for i, (fn, _) in enumerate(aggs):
        parts = [r["partials"][i] for r in results]
        fn = fn.lower()
        if fn == "count":
            values.append(sum(parts))
        elif fn == "sum":
            present = [p for p in parts if p is not None]
            values.append(sum(present) if present else None)
        elif fn in ("min", "max"):
            present = [p for p in parts if p is not None]
            values.append((min if fn == "min" else max)(present) if present else None)
        else:  # avg: [sum, count] pairs
            total = sum(p[0] for p in parts if p[1])
            count = sum(p[1] for p in parts)
            values.append(total / count if count else None)
    return {"columns": names, "values": values}


class Tables:
    """The scan engine's calls on a Rubberband client (``rb.create_table``, ``rb.table``).

    Built only on the client's generic ``write(op)`` and ``read(op, isolation)``: a
    write returns when it is stable and raises if a holder rejected it; a select
    returns its rows as dicts (or one dict of aggregates)."""

    def __init__(self, client: Any, ops: ScanOps) -> None:
        self._client = client
        self.ops = ops

    async def create_table(
        self, name: str, schema: Mapping[str, str] | Sequence[Sequence[str]], key: str
    ) -> Table:
        """``schema``: ``{column: type}`` in column order, or ``[(column, type), ...]``;
        types as in :mod:`.schema` (``int``, ``str``, ``varchar(6) not null``, ...).
        Creating a table that exists with the same definition is not an error."""
        pairs = list(schema.items()) if isinstance(schema, Mapping) else list(schema)
        await self._client.write(self.ops.create_table(name, pairs, key))
        return self.table(name, key)

    async def drop_table(self, name: str) -> None:
        await self._client.write(self.ops.drop_table(name))

    def table(self, name: str, key: str | None = None) -> Table:
        """A table by name; ``key`` names its key attribute when this client did not
        create it (rows route by it)."""
        if key is not None:
            self.ops.keys[name] = key
        return Table(self._client, self.ops, name)


class Table:
    """Operations on one table through a Rubberband client."""

    def __init__(self, client: Any, ops: ScanOps, name: str) -> None:
        self._client = client
        self._ops = ops
        self.name = name

    def _keyed(self) -> None:
        if self.name not in self._ops.keys:
            raise BadOperation(
                f"table {self.name!r}: its key attribute is unknown to this client "
                f"(rb.table({self.name!r}, key=...))"
            )

    async def insert(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Insert rows; a key that exists rejects the whole insert (raises)."""
        self._keyed()
        await self._client.write(self._ops.insert(self.name, rows))

    async def upsert(self, rows: Iterable[Mapping[str, Any]]) -> None:
        self._keyed()
        await self._client.write(self._ops.upsert(self.name, rows))

    async def update(self, where: Any = (), set: Mapping[str, Any] | None = None) -> None:
        await self._client.write(self._ops.update(self.name, where, set or {}))

    async def delete(self, where: Any = ()) -> None:
        await self._client.write(self._ops.delete(self.name, where))

    async def watch(
        self, lo: Any = None, hi: Any = None, since: int | None = None, poll: float = 0.05
    ) -> AsyncIterator[Event]:
        """Every write to this table's rows with keys in ``[lo, hi)`` after position
        ``since`` (None: from now), one :class:`~rubberband.changelog.Event` per write
        in the total order (the client's ``watch``, with its guarantees): each change
        ``(key, "put", {"row": after, "before": before})`` (``before`` None for a new
        row) or ``(key, "delete", {"before": before})``, an update by predicate one
        change per row it matched.  Writes that change no row of the table give no
        event.  Needs storage processes whose engine reports its changes (the
        ``scan-memory`` engine)."""
        name = self.name
        async for event in self._client.watch(lo, hi, since=since, poll=poll):
            mine = tuple(
                (key[2], kind, value)
                for key, kind, value in event.changes
                if type(key) is tuple and len(key) == 3 and key[0] == ROWS and key[1] == name
            )
            if mine:
                yield Event(event.position, mine)

    async def select(
        self,
        where: Any = (),
        columns: Sequence[str] | None = None,
        agg: Any = None,
        isolation: str = "sequential",
    ) -> Any:
        """Rows as dicts; with ``agg`` (``("count", "*")`` or a list of ``(function,
        column)``) the aggregates as one dict, such as ``{"count(*)": 12}``."""
        op = self._ops.select(self.name, where, columns, agg, isolation)
        result = await self._client.read(op, isolation)
        if agg is not None:
            return dict(zip(result["columns"], result["values"], strict=True))
        return ScanOps.rows(result)
