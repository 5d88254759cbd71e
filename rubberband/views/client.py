"""Views from a client: define them, read them at a level, and maintain them.

Read levels (``docs/views.md``), strongest first:

- ``sequential``: the view exactly as of the read's own position ``t`` in the total
  order (a sequential read of the view's progress gives ``t``); it waits until the
  maintainer has reached ``t``, then answers from each row's version at ``t``.  Seed
  000's *complete* consistency, at a position.
- ``read-your-writes``: every write this client made before the read is reflected
  (seed 001's session guarantee); after a write it costs what a sequential read costs,
  and answers with the newest state once the view reached the write.  Reads never go
  back in time (monotonic).
- ``snapshot``: a consistent view at the newest position its maintainer reached, read
  at snapshot isolation; ``any``: the same at basic isolation (fastest, possibly
  stale).  Each reports the position it is exact at.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Iterable, Sequence
from typing import Any, NamedTuple

from rubberband.changelog import Changed, Changes
from rubberband.config import MAINTAINER
from rubberband.driver import LoopGate
from rubberband.errors import BadOperation, RubberbandError
from rubberband.keys import encode_key, normalize, point
from rubberband.views.define import (
    CATALOG,
    ViewDef,
    catalog_key,
    from_dict,
    keys_end,
    meta_key,
    prefix_bounds,
    progress_keys,
    row_key,
    rows_bounds,
    units,
    view_def,
)
from rubberband.views.reads import Layout, Session, read_steps
from rubberband.views.snapshots import KeyPage, TableRows, page_read
from rubberband.views.steps import (
    Ahead,
    Both,
    Figures,
    Group,
    Pipe,
    Read,
    Settle,
    Sleep,
    Steps,
    Write,
    maintain_group_steps,
)

log = logging.getLogger("rubberband.views")


async def create_view(
    rb: Any, name: str, from_: Sequence[Any] | str, kind: str, **spec: Any
) -> ViewDef:
    """Define a view (checked first: :class:`BadOperation` says what is wrong).  A
    maintainer (``rubberband views maintain``) backfills it from a snapshot of its base
    at one position and then follows the base's changes while writes go on.  ``from_``
    is the base range ``(lo, hi)``, or the name of a view to define this one over (the
    maintainer of that view's group keeps it).  ``table=(name, key column)``: the
    range is of that table's rows (and ``right_table=`` a join's right side's).  Only a
    maintainer writes views' definitions (``docs/views.md``, "Who writes a view"):
    anyone else is refused here, before anything is sent."""
    _as_maintainer(rb, f"defining view {name!r} writes the catalog of views")
    if isinstance(from_, str):
        got = await rb.read(("get", (catalog_key(from_),)), "sequential")
        if not got:
            raise BadOperation(f"there is no view {from_!r} to define {name!r} over")
        parent = from_dict(got[catalog_key(from_)], catalog_key(from_))
        if parent.parts:
            raise BadOperation(f"view {from_!r} is split in parts: a view over it is not kept")
        view = view_def(name, kind, (None, None), over=from_, base=parent.sources,
                        tables=parent.tables, **spec)  # fmt: skip
    else:
        view = view_def(name, kind, from_, **spec)
    got, free = await rb.read(("get", (catalog_key(name),)), "sequential", with_position=True)
    if got:
        raise BadOperation(f"a view named {name!r} exists (drop it first)")
    # Each progress chain starts absent at the position the name was found free: a
    # maintainer of a dropped view of this name, stopped and woken since, writes only
    # progress from before the drop, which the chains' floor then ignores (readers
    # would have taken it, with its rows, for this view's until its maintainer wrote).
    keys = [k for unit in units(view) for k in progress_keys(name, unit.part)]
    await rb.write(("version", tuple((k, [free]) for k in keys), free))
    await rb.put(catalog_key(name), view.to_dict())
    return view


def _ordered(rb: Any) -> bool:
    """Is the cluster range-partitioned (a view's key range then is a few segments)?
    Under hash partitioning any range is every bucket."""
    placement = rb.placement  # the cluster's partitioning, learned at connect
    return placement is None or bool(placement.ordered)


DROP_KEYS = 1000
"""Keys a hash-partitioned view's drop writes absent (and reclaims) a message."""
DROP_SETTLE = 1.5
"""Seconds a drop waits after deleting a view's rows before it looks again: longer than
a maintainer takes to see the definition gone (``rubberband views maintain`` reads the
catalog once a second), so rows one wrote meanwhile are found and deleted.  A drop
returns no sooner after the definition went, and a maintainer's look at the catalog
holds for less (``rubberband.views.looks.CONFIRMED_FOR``): whatever it writes of a
view it found defined comes from pages ordered before any new view of that name."""
DROP_ROUNDS = 10
"""Deletes a drop makes before it gives up on a view whose rows keep coming back (a
maintainer that does not see the drop)."""


async def drop_view(rb: Any, name: str) -> None:
    """Forget a view's definition and delete its rows, again until a look after
    ``DROP_SETTLE`` finds none (a maintainer still keeping the view stops once it sees
    the definition gone, and its last rows are deleted too).  A view that others are
    defined over is refused (drop those first).  Only a maintainer deletes views' rows
    (``docs/views.md``, "Who writes a view"): anyone else is refused here, before
    anything changes."""
    over = sorted(v.name for v in await list_views(rb) if v.over == name)
    if over:
        raise BadOperation(f"views {', '.join(over)} are defined over {name!r}: drop them first")
    _as_maintainer(rb, f"dropping view {name!r} deletes its definition and rows")
    await rb.delete(catalog_key(name))
    gone = time.monotonic()
    for _ in range(DROP_ROUNDS):
        if not await _delete_rows(rb, rows_bounds(name)[0], keys_end(name)):
            # A view defined anew under this name comes DROP_SETTLE after the old one's
            # definition went: a maintainer's look at the catalog lasts less
            # (``rubberband.views.looks.CONFIRMED_FOR``).
            await asyncio.sleep(max(0.0, gone + DROP_SETTLE - time.monotonic()))
            return
        await asyncio.sleep(DROP_SETTLE)
    raise RubberbandError(f"view {name!r}: its rows keep being written: is a maintainer stuck?")


def _as_maintainer(rb: Any, what: str) -> None:
    """:class:`BadOperation` unless ``rb`` is a maintainer: the storage processes would
    refuse its writes of views' definitions and rows (``rubberband.applying.refusal``),
    and a plain write's refusal reaches no caller."""
    if not rb.ecast.name.startswith(MAINTAINER):
        raise BadOperation(
            f"{what}, which only a maintainer may: connect as {MAINTAINER}... (`rubberband "
            f"views` does, with the cluster's maintainer credential), not as {rb.ecast.name}"
        )


async def _delete_rows(rb: Any, lo: Any, hi: Any) -> bool:
    """Delete every key of a view's in ``[lo, hi)`` (its rows, every progress); whether
    there was any."""
    if rb.placement.ordered:
        if not await rb.read(("scan", lo, hi, 1), "sequential"):
            return False
        await rb.delete_range(lo, hi)
        return True
    # Hash partitioning has no range delete: each key is written absent above every
    # version it holds, then reclaimed (dropped because its chain ends in that absence).
    # (One scan of the whole view: a view too large for one answer fails here, whole.)
    rows, at = await rb.read(("scan", lo, hi), "sequential", with_position=True)
    keys = [k for k, _ in rows]
    for i in range(0, len(keys), DROP_KEYS):
        chunk = tuple(keys[i : i + DROP_KEYS])
        await rb.write(("version", tuple((k, [at]) for k in chunk), 0))
        await rb.write(("reclaim", chunk, at))
    return bool(keys)


async def list_views(rb: Any, malformed: list[tuple[Any, str]] | None = None) -> list[ViewDef]:
    """Every view's definition.  The catalog is data: maintainers alone write it, but
    a buggy one (or a release from before the rule) may have written anything under its
    keys, and a maintainer that took every entry for a definition stopped at the first
    that was not, with every view it kept.  Such entries are left out (and, with
    ``malformed``, listed there with what is wrong with each)."""
    rows = await rb.read(("scan", (CATALOG,), (CATALOG + "\x00",)), "sequential")
    views = []
    for key, value in rows:
        try:
            views.append(from_dict(value, key))
        except BadOperation as e:
            if malformed is not None:
                malformed.append((key, str(e)))
    return views


class View:
    """One view, read through a client (``rb.view(name)``)."""

    def __init__(self, rb: Any, name: str) -> None:
        self.rb = rb
        self.name = name
        self._session = Session()
        self._layout = Layout()

    async def get(
        self, keys: Iterable[Any], level: str = "sequential", *, with_position: bool = False
    ) -> Any:
        """``{row key: value}`` of the rows among ``keys`` that are there."""
        keys = list(keys)
        op = ("get", (meta_key(self.name), *(row_key(self.name, k) for k in keys)))
        rows, position = await self._read(op, None, level)
        out = dict(rows)
        return (out, position) if with_position else out

    async def scan(
        self,
        lo: Any = None,
        hi: Any = None,
        level: str = "sequential",
        *,
        with_position: bool = False,
    ) -> Any:
        """``[(row key, value), ...]`` of the rows in ``[lo, hi)`` (None: unbounded), in
        key order."""
        start, end = rows_bounds(self.name)
        rlo = encode_key(start if lo is None else row_key(self.name, lo))
        rhi = encode_key(end if hi is None else row_key(self.name, hi))
        rows, position = await self._rows(rlo, rhi, level)
        return (rows, position) if with_position else rows

    async def lookup(
        self, value: Any, level: str = "sequential", *, with_position: bool = False
    ) -> Any:
        """An index view's rows for secondary key ``value``: ``[(base key, row), ...]``."""
        lo, hi = prefix_bounds(self.name, value)
        rows, position = await self._rows(encode_key(lo), encode_key(hi), level)
        out = [(k[1], v) for k, v in rows]
        return (out, position) if with_position else out

    async def _rows(self, lo: Any, hi: Any, level: str) -> tuple[list[tuple[Any, Any]], int]:
        """The rows of the encoded range ``[lo, hi)``, read with the view's progress.
        Under range partitioning the read goes to the segments of that range (and of
        the progress) alone; under hash partitioning every bucket holds part of any
        range, so the whole view is read and cut here."""
        op = ("scan", *rows_bounds(self.name))
        if _ordered(self.rb):
            return await self._read(op, normalize([point(meta_key(self.name)), (lo, hi)]), level)
        rows, position = await self._read(op, None, level)
        name = self.name
        return [r for r in rows if lo <= encode_key(row_key(name, r[0])) < hi], position

    # ------------------------------------------------------------------ the levels
    async def _read(self, op: Any, within: Any, level: str) -> tuple[list[tuple[Any, Any]], int]:
        rb = self.rb
        steps = read_steps(self.name, op, within, level, time.monotonic(), rb.answer_timeout,
                           self._session, rb.writes_sent, self._layout)  # fmt: skip
        return await drive(rb, steps)  # type: ignore[no-any-return]


class _Done(NamedTuple):
    value: Any


def _advance(steps: Steps, reply: Any, error: BaseException | None) -> Any:
    """The next request of ``steps``, or :class:`_Done` with what they returned."""
    try:
        return steps.throw(error) if error is not None else steps.send(reply)
    except StopIteration as done:
        return _Done(done.value)


SHORT_PAGE = 256
"""Changes a feed page may hold for the step after it to run on the event loop."""


async def drive(
    rb: Any, steps: Steps, stop: asyncio.Event | None = None, threaded: bool = False
) -> Any:
    """Carry out ``steps`` (:mod:`rubberband.views.steps`) with ``rb``'s calls until
    they return (or ``stop`` is set); what they return.  ``threaded``: a long step
    runs on a worker thread, so a long computation (a maintainer's start over a
    million rows: 20 s) never holds the event loop, whose client heartbeats would stop
    and the routers take the client for dead.  Long: the step after a snapshot's or a
    table's page, a feed page while a view of the group has not started (a start
    computes the view from those pages: ``Read.long``) or a feed page of more than
    :data:`SHORT_PAGE` changes, and every step for a while after two on the loop used
    too much CPU (:class:`~rubberband.driver.LoopGate`).  The rest, a page of a few
    dozen changes, run on the loop: each hop to the thread and back cost a maintainer
    about a tenth of its CPU and a wake-up of each side per page."""
    loop = asyncio.get_running_loop()
    reply: Any = None
    error: BaseException | None = None
    flight: asyncio.Task[None] | None = None  # the last Pipe's write (see Pipe)
    ahead: tuple[Read, asyncio.Future[Any]] | None = None  # a read sent ahead (see Ahead)
    request: Any = None
    gate = LoopGate(loop.time)

    def answer(read: Read) -> Awaitable[Any]:
        """``read``'s answer: the one sent ahead if it is this read, else asked now."""
        nonlocal ahead
        sent, ahead = (None, ahead) if read.aside else (ahead, None)  # (see Read.aside)
        if sent is not None and sent[0] is read:
            return sent[1]
        return _read(rb, read)  # (one sent ahead and not taken: its answer goes unread)

    while stop is None or not stop.is_set():
        if threaded and (not gate.open() or _long(request, reply)):
            request = await asyncio.to_thread(_advance, steps, reply, error)
        elif threaded:
            request = gate.run(_advance, steps, reply, error)
        else:
            request = _advance(steps, reply, error)
        if type(request) is _Done:
            return request.value
        error = None
        try:
            if type(request) is Read:
                got = await answer(request)
            elif type(request) is Write:
                got = await _write(rb, request)
            elif type(request) is Both:
                got = await _read_after(_write(rb, request.write), answer(request.read))
            elif type(request) is Ahead:
                task = asyncio.ensure_future(_read(rb, request.read))
                task.add_done_callback(_seen)  # (not taken, it fails unread)
                ahead, got = (request.read, task), None
            elif type(request) is Pipe:
                last, flight = flight, None
                try:
                    flight = _sent(rb, request.write)
                    got = await _read_after(last, answer(request.read))
                except BaseException:
                    flight = None  # the steps make its write again
                    raise
            elif type(request) is Settle:
                last, flight = flight, None
                got = await _read_after(last, None)
            elif stop is None:
                got = await asyncio.sleep(request.seconds)
            else:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), request.seconds)
                got = None
        except RubberbandError as e:
            # A refused step (a view over a table on an engine without tables, a
            # malformed definition) fails the same way every time: say so where an
            # operator looks; a step without an answer is routine during failover.
            level = logging.WARNING if isinstance(e, BadOperation) else logging.DEBUG
            if type(request) is not Sleep:
                log.log(level, "view step %s failed: %s", type(request).__name__, e)
            error = e
            continue
        reply = (got, time.monotonic())
    steps.close()
    return None


def _long(request: Any, reply: Any) -> bool:
    """Is the step that takes ``request``'s ``reply`` long (see :func:`drive`)?"""
    kind = type(request)
    if kind is Ahead:
        return request.changes > SHORT_PAGE  # the step after computes that page
    if kind in (Pipe, Both):
        request = request.read
    elif kind is not Read:
        return False  # a write's outcome, a pause: the next request follows at once
    if type(request.op) is Changed or (request.aside and not request.long):
        return False  # a peek's yes or no, a look at definitions: the next follows at once
    if type(request.op) is not Changes or request.long:
        return True  # a snapshot's or a table's page, or a view's start after it
    if request.ahead:
        return False  # the step after sends the next read ahead, the one after computes
    page = reply[0] if type(reply) is tuple else None
    return len(getattr(page, "events", ())) > SHORT_PAGE


def _sent(rb: Any, write: Write) -> asyncio.Task[None] | None:
    """``write`` sent now, its outcome awaited later; None for no ops.  Its messages
    are in the client's session before this returns, so before anything the steps send
    after it, and a write refused at the call (a bad op: nothing of it is sent) raises
    here, before the steps send the next page's progress."""
    if not write.ops:
        return None
    outcomes = rb.write_batch_nowait(list(write.ops))
    task = asyncio.ensure_future(_failed(outcomes))
    task.add_done_callback(_seen)  # a write given up by the steps fails unread
    return task


async def _failed(outcomes: Awaitable[list[Exception | None]]) -> None:
    for outcome in await outcomes:
        if outcome is not None:
            raise outcome


def _seen(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()


async def _read_after(write: Awaitable[None] | None, read: Awaitable[Any] | None) -> Any:
    """``read``'s answer once ``write`` is stable too; either may be None.  Both run
    to their end (a failed one does not cancel the other: a cancelled call would leave
    its message in flight, unanswered), and the first failure is raised."""
    calls = [c for c in (write, read) if c is not None]
    done = await asyncio.gather(*calls, return_exceptions=True)
    for outcome in done:
        if isinstance(outcome, BaseException):
            raise outcome
    return done[-1] if read is not None else None


async def _read(rb: Any, request: Read) -> Any:
    op = request.op
    if type(op) is TableRows:
        # A table's rows: the engine's client-side operations build the select and
        # read its answer (Rubberband knows no engine's operations).
        hook = getattr(rb.core.ops, "rows_read", None)
        if hook is None:
            raise BadOperation(
                f"a view over table {op.table!r} needs a client whose engine has tables "
                "(the scan engine's operations)"
            )
        select, pairs = hook(op.table, op.key, op.lo, op.hi, keys_only=op.keys_only)
        result, position = await rb.read(select, request.isolation, with_position=True)
        return pairs(result), position
    if type(op) is KeyPage:
        scan, within, end = page_read(op, rb.placement.ordered, rb.segments())
        rows, position = await rb.read(scan, request.isolation, within=within, with_position=True)
        return (rows, end), position
    return await rb.read(op, request.isolation, within=request.within,
                         with_position=request.with_position)  # fmt: skip


async def _write(rb: Any, request: Write) -> None:
    if len(request.ops) == 1:
        await rb.write(request.ops[0])
        return
    await _failed(rb.write_batch(list(request.ops)))


# ------------------------------------------------------------------ maintaining
async def maintain(
    rb: Any,
    view: ViewDef,
    poll: float = 0.05,
    stop: asyncio.Event | None = None,
    figures: Figures | None = None,
) -> None:
    """Keep ``view`` up to date until ``stop`` is set (or the task is cancelled): start
    from a snapshot of its sources, then follow their feeds (a group of one, see
    :func:`maintain_group`); ``figures`` follow its progress."""
    group = Group()
    group.add(view, figures)
    await maintain_group(rb, group, poll, stop)


async def maintain_group(
    rb: Any, group: Group, poll: float = 0.05, stop: asyncio.Event | None = None
) -> None:
    """Keep a :class:`~rubberband.views.steps.Group` of views over the same sources up
    to date until ``stop`` is set, their feeds read once for all; ``group.views`` may
    change meanwhile (``rubberband views maintain`` adds the views defined later)."""
    await drive(rb, maintain_group_steps(group, poll), stop or asyncio.Event(), threaded=True)
