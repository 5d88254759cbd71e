"""A snapshot of a key range or a table read in pages, as steps without I/O
(:mod:`rubberband.views.steps`): what a view's start reads, each page a sequential read
at its own position."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any, NamedTuple

from rubberband.engine import row_key
from rubberband.errors import Rejected
from rubberband.keys import MAX_EKEY, MIN_EKEY, encode_key
from rubberband.views.requests import Read, Steps

PAGE_ROWS = 10_000
"""Rows a snapshot's scan reads at once: an answer must fit a frame (16 MiB), and a
table of a million rows did not."""


class KeyPage(NamedTuple):
    """A page of the keys in ``[lo, hi)`` (``hi`` None: unbounded): a sequential scan of
    at most ``rows`` of them from ``lo``, kept to the one primary segment (as the
    driver's client knows the keyspace) that holds ``place`` (placement space; None:
    ``lo``'s place), built by :func:`page_read`.  The reply is ``((rows, end),
    position)``, ``end`` the place the next segment starts at, or None where the page
    reached ``hi``.

    Why one segment: every holder a read reaches answers a scan with a limit with that
    many rows of each segment it holds, so a page of 10,000 rows over four segments,
    each held by three processes, came back as up to 120,000 rows, and a view's backfill
    read its source a dozen times over."""

    lo: Any
    hi: Any
    rows: int
    place: Any = None


def page_read(page: KeyPage, ordered: bool, segments: Iterable[Any]) -> tuple[Any, Any, Any]:
    """``(op, within, end)``: the scan that reads ``page``, the placement ranges it is
    kept to (None: all of it), and the place the next segment starts (None: none before
    ``hi``).  Under hash partitioning every bucket holds part of any key range: the
    scan is not kept to one."""
    op = ("scan", page.lo, page.hi, page.rows)
    if not ordered:
        return op, None, None
    start = page.place
    if start is None:
        start = MIN_EKEY if page.lo is None else encode_key(page.lo)
    stop = MAX_EKEY if page.hi is None else encode_key(page.hi)
    for segment in segments:
        for a, b in segment:
            if a <= start < b:
                return (op, ((start, stop),), None) if stop <= b else (op, ((start, b),), b)
    # A keyspace the client does not know (yet, or any more): the rest at once.
    return op, (None if page.place is None else ((start, stop),)), None


def key_pages(lo: Any, hi: Any, page_rows: int) -> Steps:
    """``[lo, hi)`` read in pages of ``page_rows``, each a sequential scan at its own
    position from just after the last page's last key, within one segment
    (:class:`KeyPage`): ``[(rows, position, now)]``."""
    pages: list[tuple[list[Any], int, float]] = []
    start, place = lo, None
    while True:
        ((rows, end), position), now = yield Read(KeyPage(start, hi, page_rows + 1, place),
                                                  "sequential", None, True)  # fmt: skip
        rows = list(rows)
        if place is None and pages and rows and same_key(rows[0][0], start):
            rows = rows[1:]  # the last page's last key, where this page began (a page
            # from a segment's start begins past it: its first row may be key None)
        pages.append((rows[:page_rows], position, now))
        if len(rows) >= page_rows:
            start, place = rows[page_rows - 1][0], None
        elif end is None:
            return pages
        else:
            place = end  # the rest of this segment was in the page: on to the next


class TableRows(NamedTuple):
    """A read of a table's rows with keys in ``[lo, hi)`` (None: unbounded): the driver
    asks the engine's client-side operations to build it (Rubberband builds no engine's
    operations); the reply is ``[(row key, row), ...]`` in any order (``keys_only``:
    the rows hold their key column alone)."""

    table: str
    key: str
    lo: Any
    hi: Any
    keys_only: bool = False


def table_pages(table: tuple[str, str], lo: Any, hi: Any, page_rows: int) -> Steps:
    """A table's rows in ``[lo, hi)`` in pages of about ``page_rows``, each at its own
    position, named as the feed names them: ``[(rows, position, now)]``.  A select has
    no key order to page by, so the keys come first (a select of the key column alone,
    a tenth or less of the rows' bytes), and the pages are the key ranges between every
    ``page_rows``-th of them: a table whose rows do not fit one answer (16 MiB a holder)
    backfills all the same, and a page refused as too large to send (rows bigger than
    most) is halved until it fits.  Pages at different positions are what the
    key-value backfill reads too (:meth:`~rubberband.views.maintain.Maintainer.start`)."""
    (keyed, _), now = yield Read(TableRows(table[0], table[1], lo, hi, True), "sequential",
                                 None, True)  # fmt: skip
    keys = sorted_keys([k for k, _row in keyed])
    n = len(keys)

    def bound(i: int, end: Any) -> Any:
        return end if i in (0, n) else keys[i]

    todo = deque((i, min(i + page_rows, n)) for i in range(0, n, max(1, page_rows)))
    todo = todo or deque([(0, 0)])
    pages = []
    while todo:
        i, j = todo.popleft()
        read = TableRows(table[0], table[1], bound(i, lo), bound(j, hi))
        try:
            (rows, position), now = yield Read(read, "sequential", None, True)
        except Rejected:
            if j - i < 2:  # one row too large to send: nothing to split
                raise
            # Refused (too large to send: rows bigger than most): halve it.
            m = (i + j) // 2
            todo.extendleft([(m, j), (i, m)])
            continue
        pages.append(([(row_key(table[0], k), {"row": row}) for k, row in rows], position, now))
    return pages


def sorted_keys(keys: list[Any]) -> list[Any]:
    """A key column's values in the order its comparisons use (one type a column)."""
    try:
        return sorted(keys)
    except TypeError:
        return sorted(keys, key=encode_key)


def same_key(a: Any, b: Any) -> bool:
    return bool(encode_key(a) == encode_key(b))
