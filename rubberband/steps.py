"""Which of a storage process's steps are short enough to run on its event loop.

An engine whose operations on single keys are short (``inline_points``,
:class:`rubberband.engine.Engine`: the memory engine) has a batch of nothing else run
on the loop rather than handed to its engine thread: the thread hop cost the storage
processes about a fifth of their CPU a write.  The judge reads only the deliveries'
headers (and a feed page's count in the change log), never the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rubberband.bundles import unpack_writes
from rubberband.changelog import FROM_NOW
from rubberband.proto import H
from rubberband.versions import is_version_op

if TYPE_CHECKING:
    from rubberband.storage import StorageCore

INLINE_KEYS = 2_048
"""Single keys a batch run on the loop may name in all, its headers' point ranges
summed: a view's rows come 500 to a message, each a few microseconds of work, so a
batch of them is as short as a few base writes were per delivery."""
INLINE_DELIVERIES = INLINE_KEYS
"""Deliveries a batch run on the loop holds at most, as many as the keys it may name: a
single-key write that is not short (an append copies its list) counts as long by
itself, and at a few microseconds a key the loop is back to its heartbeats within a
few tens of milliseconds (:class:`~rubberband.driver.LoopGate` sends the steps to the
thread for a while after two slower ones).  At 128, the memory engine's steps under a
full load went to the engine thread: each write alone into 3 storage processes
(``rubberband bench write-vs-storage --engine memory``) ran at 36,944 writes/s on the
mean of four runs against 39,184 now, the storage processes 1.0 µs a write busier
(2026-12-04)."""
INLINE_FEED = 256
"""Changes a feed's page may walk from its ``since`` and still run on the loop: a
maintainer that keeps up asks every few milliseconds for the few changes since its
last page; one that fell behind (or a bulk write) walks the log on the thread."""


def points_only(
    deliveries: list[Any],
    feed: Callable[[int], int] | None = None,
    weigh: Callable[[Any], int] | None = None,
) -> bool:
    """Is each delivery a read or a write of single keys, a few thousand in all?  A
    batch of such is short on an engine that says so (``inline_points``,
    :class:`rubberband.engine.Engine`); a range, a keyspace message or a membership
    change may not be, nor anything unexpected.  The keys are counted from the header's
    ranges when they are all points; a write of many keys names one hull instead
    (:meth:`rubberband.messages.Messages.routable`), and then ``weigh``, the engine's
    ``point_keys``, counts its operation's keys (None: such a write keeps the thread).
    ``feed``: how many changes the change log holds after a position, so a feed's page
    that walks only a few counts as short (None: every feed page keeps the thread)."""
    return _short_step([deliveries], feed, weigh)


def short_batches(core: StorageCore, batches: list[list[Any]]) -> bool:
    """Are these batches of deliveries short enough for ``core`` to run on the event
    loop, for an engine that says single keys are short (:func:`points_only`, summed
    over all of them)?"""
    log = core.changes

    def feed(since: int) -> int:
        return log.changes_after(since, INLINE_FEED)

    return _short_step(batches, feed, getattr(core.engine, "point_keys", None))


def _short_step(
    batches: list[list[Any]],
    feed: Callable[[int], int] | None,
    weigh: Callable[[Any], int] | None,
) -> bool:
    """Do a step's ``batches`` (packed writes unpacked in their place) name at most
    :data:`INLINE_KEYS` single keys, all short (:func:`points_only`)?  A feed's page
    also walks the changes of the step's writes before it (logged before pages are)."""
    room, written = INLINE_KEYS, 0
    try:
        for deliveries in batches:
            if len(deliveries) > INLINE_DELIVERIES:
                return False
            for d in unpack_writes(deliveries):
                n = _points(d.message, feed, weigh, written)
                room -= n
                if room < 0:
                    return False
                header = d.message.header
                if (H.WRITES in header or H.KEY in header) and not is_version_op(d.message.payload):
                    written += n  # (a view's rows are not logged)
        return True
    except Exception:  # a header of any shape: not judged, and the thread takes it
        return False


_LONG = INLINE_KEYS + 1
"""What a delivery that may walk more than its keys counts for: over any budget."""


def _points(
    m: Any, feed: Callable[[int], int] | None, weigh: Callable[[Any], int] | None, written: int
) -> int:
    """The single keys a delivered message names, or :data:`_LONG` (a feed's page:
    the changes it walks, ``written`` of them the step's own)."""
    header = m.header
    if type(header) is not dict or H.REVISIONS in header:
        return _LONG  # a revisions read walks more than its keys
    since = header.get(H.SINCE)
    if since is not None:  # a feed's page walks the log's changes after ``since``
        if since == FROM_NOW:
            return 1  # answered empty, at once
        if feed is None or type(since) is not int:
            return _LONG
        walked = feed(since) + written
        return walked if walked <= INLINE_FEED else _LONG
    ranges = header.get(H.WRITES) or header.get(H.READS)
    if ranges is None and H.KEY in header:
        return 1  # a write of one key (beside ranges, the ranges count, as they route)
    if type(ranges) not in (list, tuple) or not ranges:
        return _LONG
    for lo, hi in ranges:
        if len(hi) != len(lo) + 1 or hi[-1] != 0 or hi[: len(lo)] != lo:
            # A hull: a write of many single keys says so in its operation alone (a
            # bundle's operations are packed: not read here).
            if weigh is None or H.WRITES not in header or H.COUNT in header:
                return _LONG
            keys = weigh(m.payload)
            return keys if keys >= 0 else _LONG
    count = header.get(H.COUNT)  # a bundle: as many operations, on these keys
    if count is not None:
        return max(len(ranges), count) if type(count) is int and count > 0 else _LONG
    return len(ranges)
