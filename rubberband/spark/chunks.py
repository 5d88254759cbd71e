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

from rubberband.engine import BadKey, Placement, after
from rubberband.proto import write_header

Operation = Literal["insert", "upsert", "delete", "update", "append"]
OPERATIONS: tuple[str, ...] = ("insert", "upsert", "delete", "update", "append")
MAX_BUCKETS = 1024


class BadRows(ValueError):
    """Rows (or options) that cannot become Rubberband operations; the task fails with it."""


def option_map(options: Any) -> dict[str, str]:
    """A data source's options as Spark gives them, names in lower case (Spark's option
    names are case-insensitive)."""
    return {str(k).lower(): str(v) for k, v in dict(options).items()}


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
        """Take rows (column-wise, input order) and return the messages they complete,
        in the order the rows completing them came in (whatever the batch boundaries)."""
        if not self.columns:
            self._start(tuple(batch))
        try:
            keys = batch[self.target.key]
            cols = {c: batch[c] for c in self.columns}
        except KeyError as e:
            raise BadRows(f"the input has no column {e.args[0]!r}") from None
        n = len(keys)
        if n == 0:
            return []
        if None in keys:
            i = list(keys).index(None)
            raise BadRows(f"row {self.rows_in + i}: the key {self.target.key!r} is null")
        hashed = self.placement.partitioning == "hash"
        places = self._places(keys) if hashed else None
        nb = self.buckets
        rpm = self.rows_per_message
        fills: list[tuple[int, Columns, list[Any] | None]] = []
        if nb == 1:
            per_bucket = [range(n)]
        else:
            assert places is not None
            per_bucket = [[] for _ in range(nb)]
            for i, p in enumerate(places):
                per_bucket[(p[1] * nb) >> 32].append(i)
        for b, rows in enumerate(per_bucket):
            if not rows:
                continue
            whole = type(rows) is range
            start = 0
            while len(self._held_places[b]) + len(rows) - start >= rpm:
                take = rpm - len(self._held_places[b])
                self._take(b, cols, places, rows, start, start + take, whole)
                fills.append((rows[start + take - 1], self._held[b], self._held_places[b]))
                self._held[b] = {c: [] for c in self.columns}
                self._held_places[b] = []
                start += take
            self._take(b, cols, places, rows, start, len(rows), whole)
        fills.sort(key=lambda f: f[0])  # the row that completed each: one order
        out: list[tuple[Any, dict[str, Any]]] = []
        for _, chunk, chunk_places in fills:
            out.extend(build_messages(self.target, self.columns, chunk, self.placement,
                                      chunk_places if hashed else None))  # fmt: skip
        self.rows_in += n
        self.messages_out += len(out)
        return out

    def _places(self, keys: Sequence[Any]) -> list[Any]:
        ekey = self.placement.ekey
        try:
            return [ekey(k) for k in keys]
        except BadKey as e:
            raise BadRows(
                f"a key of rows {self.rows_in}..{self.rows_in + len(keys)}: {e}"
            ) from None

    def _take(
        self,
        b: int,
        cols: Mapping[str, Sequence[Any]],
        places: list[Any] | None,
        rows: Sequence[int],
        lo: int,
        hi: int,
        whole: bool,
    ) -> None:
        """Hold rows ``rows[lo:hi]`` of the batch in bucket ``b``."""
        if hi <= lo:
            return
        held = self._held[b]
        if whole:  # one bucket: the rows are a contiguous slice
            for c, values in cols.items():
                held[c].extend(values[lo:hi])
            self._held_places[b].extend(places[lo:hi] if places is not None else range(hi - lo))
            return
        idx = rows[lo:hi]
        for c, values in cols.items():
            held[c].extend([values[i] for i in idx])
        assert places is not None
        self._held_places[b].extend([places[i] for i in idx])

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


def build_messages(
    target: Target,
    columns: Sequence[str],
    rows: Columns,
    placement: Placement,
    places: list[Any] | None = None,
) -> list[tuple[Any, dict[str, Any]]]:
    """The messages of one chunk of rows: one, except ``update`` on a table, which
    sends one message per distinct assignment (the engine's update sets one value set
    per operation), in order of first appearance.  ``places``: the keys' places, if
    known (hash partitioning)."""
    keys = rows[target.key]
    header = write_header((hull(keys, placement, places),))
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
    groups: dict[tuple[Any, ...], list[Any]] = {}
    others = [c for c in columns if c != key]
    for i, k in enumerate(keys):
        groups.setdefault(tuple(rows[c][i] for c in others), []).append(k)
    out = []
    for assignment, ks in groups.items():
        assign = dict(zip(others, assignment, strict=True))
        op = _where_in(table, key, ks, {"op": "update", "set": assign})
        out.append((op, write_header((hull(ks, placement),))))
    return out


ORDERED_ALIKE = (int, str, bytes)
"""Key types whose order is their encoded order (one type throughout): a chunk's hull
under range partitioning is then the encoding of its least and greatest key."""


def hull(keys: Sequence[Any], placement: Placement, places: list[Any] | None = None) -> Any:
    """The one range from the least to just past the greatest place of ``keys``."""
    if places is None:
        kinds = set(map(type, keys))
        if placement.partitioning == "range" and len(kinds) == 1 and kinds <= set(ORDERED_ALIKE):
            try:
                return (placement.ekey(min(keys)), after(placement.ekey(max(keys))))
            except BadKey as e:
                raise BadRows(str(e)) from None
        try:
            places = [placement.ekey(k) for k in keys]
        except BadKey as e:
            raise BadRows(str(e)) from None
    return (min(places), after(max(places)))


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
                out.extend(build_messages(target, columns, chunk, placement))
    return out


def plain(value: Any) -> Any:
    """A value as it travels in a message: dates and times as ISO strings, decimals as
    strings (exact), everything else as it is (what msgpack carries)."""
    if isinstance(value, (dt.date, dt.datetime, dt.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    return value
