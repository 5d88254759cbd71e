"""``spark.readStream.format("rubberband")``: a key range's change feed as a stream.

The offset of a micro-batch is a position in the total order: ``{"position": P}`` says
that every change at a position up to ``P`` is in this batch or an earlier one.  A
batch ``(start, end]`` is fixed the moment ``end`` is chosen (no write can take a
position before a read's own once that read has one, E-Cast's total order), so Spark
may replay a batch, after a failed task or a restarted query, and it reads exactly the
same changes: exactly once into a checkpointed sink comes from Spark's replay with no
bookkeeping here.  The driver side keeps one client for the query's life (an offset is
one changes read with nothing to read, one small E-Cast message); each task reads its
batch with a client of its own and continues page after page (a holder answers in pages
of at most 20,000 changes) until it has passed ``end``.

A batch is one Spark partition: a feed's page is one read of the whole key range, and
its events are ordered by position, which a split by key range would give up.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any, NamedTuple

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import LongType, StringType, StructType

from rubberband.errors import Compacted
from rubberband.spark.chunks import BadRows

COLUMNS = {"position": LongType(), "key": StringType(), "kind": StringType(), "value": StringType()}
SCHEMA = "position long, key string, kind string, value string"
BATCH_ROWS = 10_000
"""Rows per Arrow batch a task yields."""


class Feed(NamedTuple):
    """A change stream's options: the key range, where a new query starts, and the most
    changes a micro-batch takes (None: all there are)."""

    lo: Any = None
    hi: Any = None
    since: str = "now"
    max_changes: int | None = None


def feed_options(options: dict[str, str]) -> Feed:
    """``lo``, ``hi`` (JSON: ``'"user:"'`` is a string key, ``10`` a number), ``since``
    (``now``, the default; ``earliest``; or a position) and ``max_changes_per_batch`` of
    a change stream."""
    bounds = []
    for name in ("lo", "hi"):
        text = options.get(name)
        if text is None or text == "":
            bounds.append(None)
            continue
        try:
            bounds.append(json.loads(text))
        except ValueError:
            raise BadRows(
                f"option {name!r} is a key written as JSON ('\"user:\"' for a string, 10 for "
                f"a number), not {text!r:.80}"
            ) from None
    since = options.get("since", "now")
    if since not in ("now", "earliest") and not (since.isdigit() and len(since) < 19):
        raise BadRows(f"option 'since' is now, earliest or a position, not {since!r:.80}")
    limit = options.get("max_changes_per_batch")
    if limit is not None and not (limit.isdigit() and 0 < int(limit) < 10**9):
        raise BadRows(f"option 'max_changes_per_batch' is a count (1 or more), not {limit!r:.40}")
    return Feed(bounds[0], bounds[1], since, None if limit is None else int(limit))


def check_schema(schema: StructType) -> None:
    """A change stream's columns are some of :data:`SCHEMA`'s, with their types."""
    bad = [f.name for f in schema.fields if COLUMNS.get(f.name) != f.dataType]
    if bad or not schema.fields:
        raise BadRows(
            f"a change stream's columns are some of {SCHEMA!r} (give them with "
            f".schema(...)); not {', '.join(bad) or 'none'}"
        )


def compacted_error(e: Compacted, since: int) -> BadRows:
    return BadRows(
        f"the changes after position {since} are compacted (the cluster keeps a window of "
        f"them, --change-log and --change-log-age); the oldest position a stream can go on "
        f"from is {e.position}: start a new query (a new checkpoint) with since={e.position} "
        f"or since=now, and take what was lost from a batch read"
    )


class Span(InputPartition):  # type: ignore[misc]
    """One micro-batch: the changes at positions in ``(start, end]``."""

    def __init__(self, start: int, end: int) -> None:
        super().__init__((start, end))
        self.start = start
        self.end = end


class ChangeStream(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    """The driver's side answers offsets; :meth:`read` runs in the tasks.

    ``availableNow`` needs :meth:`prepareForTriggerAvailableNow`: without it PySpark 4.3
    ran a restarted query's pending batch and stopped, short of the writes after it."""

    def __init__(self, opts: Any, schema: StructType, feed: Feed) -> None:
        check_schema(schema)
        self.opts = opts
        self.schema = schema
        self.lo, self.hi, self.since, self.max_changes = feed
        self._open: contextlib.ExitStack | None = None
        self._target: int | None = None
        """``availableNow``'s last position: the query stops there."""
        self._client: tuple[Any, Any] = (None, None)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled for the tasks without the driver's client (a thread, a loop)."""
        return {**self.__dict__, "_open": None, "_client": (None, None)}

    # ----------------------------------------------------------------- driver side
    def _rb(self) -> tuple[Any, Any]:
        from rubberband.spark.source import _client

        if self._open is None:
            stack = contextlib.ExitStack()
            self._client = stack.enter_context(_client(self.opts))
            self._open = stack
        return self._client

    def _position(self) -> int:
        loop, rb = self._rb()
        page = loop.run(rb.changes(None, self.lo, self.hi), self.opts.timeout * 2)
        return int(page.position)

    def initialOffset(self) -> dict[str, int]:
        if self.since == "now":
            return {"position": self._position()}
        since = 0 if self.since == "earliest" else int(self.since)
        loop, rb = self._rb()
        try:
            loop.run(rb.changes(since, self.lo, self.hi), self.opts.timeout * 2)
        except Compacted as e:
            if self.since != "earliest":
                raise compacted_error(e, since) from None
            since = e.position
        return {"position": since}

    def latestOffset(
        self, start: dict[str, int] | None = None, limit: Any = None
    ) -> dict[str, int]:
        position = self._position()
        if self._target is not None:
            position = min(position, self._target)
        if start is None:
            return {"position": position}
        at = int(start["position"])
        if isinstance(limit, ReadMaxRows) and at < position:
            loop, rb = self._rb()
            position = loop.run(self._limited(rb, at, position, limit.max_rows), None)
        return {"position": max(position, at)}

    def getDefaultReadLimit(self) -> Any:
        if self.max_changes is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.max_changes)

    async def _limited(self, rb: Any, at: int, latest: int, most: int) -> int:
        """Where a batch from ``at`` ends if it takes at most ``most`` changes: after the
        last whole write that fits (a write larger than ``most`` alone is taken whole:
        a position is never split).  The driver reads the changes to count them, and
        the task reads them again."""
        count, last = 0, at
        async for event in self._events(rb, at, latest):
            n = len(event.changes)
            if count and count + n > most:
                return last
            count, last = count + n, event.position
            if count >= most:
                return last
        return latest

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._position()

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[Span]:
        a, b = int(start["position"]), int(end["position"])
        return [Span(a, b)] if a < b else []

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to release: the cluster keeps changes by count and age, not per reader."""

    def stop(self) -> None:
        if self._open is not None:
            stack, self._open = self._open, None
            stack.close()

    # ----------------------------------------------------------------- in a task
    def read(self, partition: Span) -> Iterator[pa.RecordBatch]:
        from rubberband.spark.source import _client, _record_batch

        with _client(self.opts) as (loop, rb):
            rows = loop.run(self._between(rb, partition.start, partition.end), None)
        names = [f.name for f in self.schema.fields]
        for i in range(0, len(rows), BATCH_ROWS) or (0,):
            part = rows[i : i + BATCH_ROWS]
            columns = {n: [r[j] for r in part] for j, n in enumerate(COLUMNS)}
            yield _record_batch(self.schema, {n: columns[n] for n in names})

    async def _between(self, rb: Any, start: int, end: int) -> list[tuple[Any, ...]]:
        """Every change at a position in ``(start, end]``, in position order (a
        multi-key write's keys in key order): the same rows on every attempt."""
        return [
            (event.position, *change)
            async for event in self._events(rb, start, end)
            for change in event.changes
        ]

    async def _events(self, rb: Any, start: int, end: int) -> AsyncIterator[Any]:
        """The feed's events at positions in ``(start, end]``, page after page."""
        at = start
        while at < end:
            try:
                page = await rb.changes(at, self.lo, self.hi)
            except Compacted as e:
                raise compacted_error(e, at) from None
            for event in page.events:
                if event.position > end:
                    return
                yield event
            at = page.position
