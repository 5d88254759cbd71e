"""Rows into Rubberband messages, the same messages on every attempt.

Exactly-once ingestion rests on E-Cast's sessions: a task submits in the session
``(namespace, epoch, stream)`` with sequence numbers 1, 2, ...; routers append a
session's next number only and drop every number already routed.  A retried task (or a
replayed batch) resubmits from 1, so *every message it sends under a number the failed
attempt may have used must be byte-identical to that attempt's*.  A Spark writer cannot
tell an input cut short by a failing upstream from the end of its partition (PySpark
ends the iterator normally), so nothing here may depend on rows not yet seen, on time,
or on the cluster's current keyspace.

The rule that gives that:

* rows go to a **bucket** fixed by the key alone (under hash partitioning, an arc of
  the 32-bit hash ring: messages reach only the holders of one arc; under range
  partitioning there is one bucket, since key order says nothing about where keys live
  without the keyspace);
* a bucket that fills to ``rows_per_message`` rows emits one message at once, so the
  k-th message is fixed by the input up to the row that completed it: a cut-off input
  produces a *prefix* of the full input's messages;
* the rows left in the buckets at the end (fewer than ``rows_per_message`` each) are
  never sent by the task: they travel in its commit message to the driver, which writes
  them under a session of its own (:func:`remainder_messages`), deterministically too,
  since only a successful attempt's commit message reaches the driver.

A message's header covers the *hull* of its rows' places (one range): a superset of what
it writes, computed from the message's own rows, so routing stays deterministic and the
engines still change only the keys inside each replica's ranges.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from rubberband.config import write_header
from storage_adapters.base import BadKey, Placement, after

Operation = Literal["insert", "upsert", "delete", "update", "append"]
OPERATIONS: tuple[str, ...] = ("insert", "upsert", "delete", "update", "append")
MAX_BUCKETS = 1024


class BadRows(ValueError):
    """Rows (or options) that cannot become Rubberband operations; the task fails with it."""


@dataclass(frozen=True, slots=True)
class Target:
    """Where rows go: a scan-engine ``table`` (rows are its columns, ``key`` the table's
    key column) or, with ``table`` None, the key-value engines (``key`` and ``value`` name
    the input's columns)."""

    key: str
    operation: Operation = "upsert"
    table: str | None = None
    value: str | None = None

    def __post_init__(self) -> None:
        if self.operation not in OPERATIONS:
            raise BadRows(f"operation is one of {', '.join(OPERATIONS)}, not {self.operation!r}")
        if self.table is None and self.value is None and self.operation != "delete":
            raise BadRows("the key-value engines need a 'value' column (or give 'table')")
        if self.table is not None and self.operation == "append":
            raise BadRows("append is a key-value operation (a list per key); tables upsert")

    def columns_needed(self) -> tuple[str, ...]:
        if self.table is not None:
            return (self.key,)
        return (self.key,) if self.operation == "delete" else (self.key, str(self.value))


Columns = dict[str, list[Any]]
"""Rows column-wise: column name to its values, every list the same length."""


@dataclass(slots=True)
class Chunker:
    """Rows in, deterministic messages out (see the module docstring)."""

    target: Target
    placement: Placement
    rows_per_message: int = 1000
    buckets: int = 8
    columns: tuple[str, ...] = ()
    _held: list[Columns] = field(default_factory=list)
    _held_places: list[list[Any]] = field(default_factory=list)
    rows_in: int = 0
    messages_out: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.rows_per_message <= 1_000_000:
            raise BadRows("rows_per_message is between 1 and 1,000,000")
        if not 1 <= self.buckets <= MAX_BUCKETS:
            raise BadRows(f"buckets is between 1 and {MAX_BUCKETS}")
        if self.placement.partitioning != "hash":
            self.buckets = 1  # key order places nothing without the keyspace
        self._held = [{c: [] for c in self.columns} for _ in range(self.buckets)]
        self._held_places = [[] for _ in range(self.buckets)]

    def feed(self, batch: Mapping[str, Sequence[Any]]) -> list[tuple[Any, dict[str, Any]]]:
        """Take rows (column-wise, input order) and return the messages they complete."""
        if not self.columns:
            self._start(tuple(batch))
        try:
            keys = batch[self.target.key]
        except KeyError:
            raise BadRows(f"the input has no key column {self.target.key!r}") from None
        cols = [(c, batch[c]) for c in self.columns]
        ekey = self.placement.ekey
        nb = self.buckets
        out: list[tuple[Any, dict[str, Any]]] = []
        rpm = self.rows_per_message
        for i, k in enumerate(keys):
            if k is None:
                raise BadRows(f"row {self.rows_in + i}: the key {self.target.key!r} is null")
            try:
                place = ekey(k)
            except BadKey as e:
                raise BadRows(f"row {self.rows_in + i}: {e}") from None
            b = (place[1] * nb) >> 32 if nb > 1 else 0
            held = self._held[b]
            for c, values in cols:
                held[c].append(values[i])
            places = self._held_places[b]
            places.append(place)
            if len(places) >= rpm:
                out.extend(self._build(held, places))
                self._held[b] = {c: [] for c in self.columns}
                self._held_places[b] = []
        self.rows_in += len(keys)
        self.messages_out += len(out)
        return out

    def _start(self, names: tuple[str, ...]) -> None:
        for c in self.target.columns_needed():
            if c not in names:
                raise BadRows(f"the input has no column {c!r} (it has {', '.join(names)})")
        self.columns = names if self.target.table is not None else self.target.columns_needed()
        self._held = [{c: [] for c in self.columns} for _ in range(self.buckets)]

    def remainder(self) -> list[Columns]:
        """The rows no message carried yet, per bucket in bucket order (the commit
        message's part); empty buckets are left out."""
        return [held for held, p in zip(self._held, self._held_places, strict=True) if p]

    def _build(self, rows: Columns, places: list[Any]) -> list[tuple[Any, dict[str, Any]]]:
        return build_messages(self.target, self.columns, rows, places)


def build_messages(
    target: Target, columns: Sequence[str], rows: Columns, places: list[Any]
) -> list[tuple[Any, dict[str, Any]]]:
    """The messages of one chunk of rows: one, except ``update`` on a table, which
    sends one message per distinct assignment (the engine's update sets one value set
    per operation), in order of first appearance."""
    hull = ((min(places), after(max(places))),)
    header = write_header(hull)
    keys = rows[target.key]
    if target.table is None:
        if target.operation == "delete":
            return [(("delete", tuple(keys)), header)]
        values = rows[str(target.value)]
        kind = "append" if target.operation == "append" else "put"
        return [((kind, tuple(zip(keys, values, strict=True))), header)]
    table, key = target.table, target.key
    if target.operation in ("insert", "upsert"):
        op = {
            "op": target.operation,
            "table": table,
            "key": key,
            "columns": list(columns),
            "data": [rows[c] for c in columns],
        }
        return [(op, header)]
    if target.operation == "delete":
        return [(_where_in(table, key, keys, {"op": "delete"}), header)]
    groups: dict[tuple[Any, ...], tuple[list[Any], list[Any]]] = {}
    others = [c for c in columns if c != key]
    for i, k in enumerate(keys):
        assignment = tuple(rows[c][i] for c in others)
        ks, ps = groups.setdefault(assignment, ([], []))
        ks.append(k)
        ps.append(places[i])
    out = []
    for assignment, (ks, ps) in groups.items():
        assign = dict(zip(others, assignment, strict=True))
        op = _where_in(table, key, ks, {"op": "update", "set": assign})
        out.append((op, write_header(((min(ps), after(max(ps))),))))
    return out


def _where_in(table: str, key: str, keys: list[Any], op: dict[str, Any]) -> dict[str, Any]:
    return {**op, "table": table, "key": key, "where": [[key, "in", list(keys)]]}


def remainder_messages(
    target: Target,
    placement: Placement,
    rows_per_message: int,
    parts: Iterable[tuple[Sequence[str], Iterable[Columns]]],
) -> list[tuple[Any, dict[str, Any]]]:
    """The driver's messages for the tasks' leftover rows: ``parts`` in partition order,
    each ``(columns, buckets)`` as its commit message carried them; every bucket's rows
    go out in chunks of ``rows_per_message``, in order."""
    out: list[tuple[Any, dict[str, Any]]] = []
    for columns, buckets in parts:
        for rows in buckets:
            keys = rows[target.key]
            for lo in range(0, len(keys), rows_per_message):
                chunk = {c: rows[c][lo : lo + rows_per_message] for c in columns}
                places = [placement.ekey(k) for k in chunk[target.key]]
                out.extend(build_messages(target, columns, chunk, places))
    return out


def plain(value: Any) -> Any:
    """A value as it travels in a message: dates and times as ISO strings, decimals as
    strings (exact), everything else as it is (what msgpack carries)."""
    if isinstance(value, (dt.date, dt.datetime, dt.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    return value
