"""Materialized views in the simulator: the shipped maintainer and view-read steps
(:mod:`rubberband.views.steps`), driven through the shipped client core, through every
fault of a run, and their check.

Two maintainer processes keep every view at once (one is crashed mid-run and a third
started later: a restart from a snapshot beside a maintainer that never stopped), and
a reader reads the views at every level.  The run's change-feed follower records every
base write from before the first one, so the base is known at every position: each
read must equal the view recomputed there (:func:`rubberband.checkers.views.check_view_reads`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ecast import NodeId
from rubberband import versions
from rubberband.checkers.views import ViewRead, check_view_reads
from rubberband.client import ReadDone, WriteDone
from rubberband.errors import BadOperation, RubberbandError
from rubberband.views import LEVELS, view_def
from rubberband.views.define import CATALOG, ViewDef, catalog_key, from_dict, rows_bounds
from rubberband.views.reads import read_steps
from rubberband.views.snapshots import KeyPage, page_read
from rubberband.views.steps import (
    Ahead,
    Both,
    Group,
    Pipe,
    Read,
    Settle,
    Sleep,
    Steps,
    Write,
    groups,
    maintain_group_steps,
)

if TYPE_CHECKING:
    from rubberband.sim.process import RbNode
    from rubberband.sim.run import RubberbandRun

MAINTAINERS: tuple[NodeId, ...] = ("maintainer:vm1", "maintainer:vm2")
LATE_MAINTAINER: NodeId = "maintainer:vm3"
READER: NodeId = "client:vr"
POLL = 0.2
"""Seconds between a maintainer's idle pages (fewer simulated messages than the SDK's)."""
SOURCE = (3_000, 7_000)
"""The views' base: parts of two segments of the ring, 7 list-append keys."""
PAGE_ROWS = 3
"""Rows per page of a maintainer's snapshot: every start reads several pages, each at a
position of its own, while the writes go on (the daemon's pages are 10,000 rows)."""
READ_EVERY = 0.1
"""Virtual seconds between the reader's reads."""
HOSTILE_EVERY = 7
"""Reads between the reader's hostile writes: it is a plain client, and views' rows and
definitions are their maintainers' (``rubberband.applying.refusal``)."""
RETENTION = 0.5
"""Virtual seconds of versions kept (the chains stay short, as under real load)."""
VIEWS = (
    view_def("rows", "selection", SOURCE, retention=RETENTION),
    view_def("by_g", "index", SOURCE, on="g", columns=["g"], retention=RETENTION, parts=[(2,)]),
    view_def(
        "totals",
        "aggregate",
        SOURCE,
        retention=RETENTION,
        aggregates={
            "n": ["count", None],
            "s": ["sum", "g"],
            "lo": ["min", "g"],
            "hi": ["max", "g"],
        },
    ),
    view_def(
        "pairs",
        "join",
        (3_000, 3_800),
        on="g",
        right=(6_200, 7_000),
        right_on="g",
        columns=["g"],
        retention=RETENTION,
    ),
    view_def(
        "per_g",
        "aggregate",
        (None, None),
        over="rows",
        base=(SOURCE,),
        group_by="g",
        aggregates={"n": ["count", None], "s": ["sum", "g"]},
        retention=RETENTION,
    ),
    view_def(
        "busy_g",
        "selection",
        (None, None),
        over="per_g",
        base=(SOURCE,),
        where=[("n", ">=", 18)],
        retention=RETENTION,
    ),
)
"""Over the list-append keys (lists: rows of the selection, counted, no index entry, no
join value) and the bulky puts (``{"g": 0..4, ...}``: index entries, sums, extremes and
join pairs); and a chain of views over views (rows, then its rows grouped by ``g``, then
the groups of two rows or more)."""
BY_NAME = {v.name: v for v in VIEWS}


CHURN_WINDOW = 1_000
"""The window (:data:`rubberband.versions.WINDOW`) under ``churn``: a run orders a few
thousand messages, a maintainer's writes are known applied within a few hundred."""


@contextlib.contextmanager
def dropping(on: bool) -> Iterator[None]:
    """Within, if ``on``, maintainers drop the rows that left their views at the
    simulator's scale: version writes are refused, and dead rows dropped, at
    :data:`CHURN_WINDOW` positions (the daemons': millions)."""
    kept = versions.WINDOW
    try:
        if on:
            versions.WINDOW = CHURN_WINDOW
        yield
    finally:
        versions.WINDOW = kept


def beneath(view: ViewDef) -> list[ViewDef]:
    """The views ``view`` is defined over, the one over the base first."""
    chain: list[ViewDef] = []
    while view.over is not None:
        view = BY_NAME[view.over]
        chain.insert(0, view)
    return chain


@dataclass
class Waiting:
    """What a driven generator waits for: a read's answer (its request id) and the
    stability of writes (theirs), the reply so far and the first failure."""

    read: int | None
    with_position: bool
    writes: set[int] = field(default_factory=set)
    reply: Any = None
    error: BaseException | None = None
    pipe: bool = False
    """A :class:`~rubberband.views.steps.Pipe`'s: failed, it leaves nothing in flight."""


class Driven:
    """One generator of steps, carried out through a simulated node's client core."""

    def __init__(self, node: RbNode, steps: Steps, done: Callable[[Any, Any], None]) -> None:
        self.node = node
        self.steps = steps
        self.done = done
        self.waiting: Waiting | None = None
        self.wake_at: float | None = None
        self.halted = False
        self._fresh = True
        self.flight: set[int] = set()  # the last Pipe's write, not yet stable
        self.flight_error: BaseException | None = None
        self.page_ends: dict[int, Any] = {}  # a KeyPage read's: where the next one starts
        self.ahead: tuple[Read, int] | None = None  # a read sent ahead (see Ahead), its id
        self.early: dict[int, tuple[ReadDone, bool, Any]] = {}  # its answer, not yet taken

    def resume(self, reply: Any, now: float, error: BaseException | None = None) -> None:
        self.waiting, self.wake_at = None, None
        if self.halted:
            self.steps.close()
            self.done(None, None)
            return
        while True:
            try:
                if self._fresh:
                    self._fresh = False
                    request = self.steps.send(None)
                elif error is not None:
                    request = self.steps.throw(error)
                else:
                    request = self.steps.send((reply, now))
            except StopIteration as e:
                self.done(e.value, None)
                return
            except RubberbandError as e:
                self.done(None, e)
                return
            try:
                if type(request) is Ahead:
                    self.early.clear()  # (one sent ahead before and not taken: unread)
                    self.ahead = (request.read, self._read(request.read, now))
                    error, reply = None, None
                    continue
                if self._perform(request, now):
                    w = self.waiting
                    if w is None or w.read is not None or w.writes:
                        return
                    # Nothing left to wait for (a read answered while it was ahead).
                    self.waiting = None
                    if w.pipe and w.error is not None:
                        self.flight, self.flight_error = set(), None  # the steps make it again
                    error, reply = w.error, w.reply
                    continue
                error, reply = self.flight_error, None  # a Settle with nothing to wait for
                self.flight_error = None
            except RubberbandError as e:  # refused at the call
                error, reply = e, None

    def _perform(self, request: Any, now: float) -> bool:
        """Carry out ``request``; False: it is done already (a :class:`Settle` with
        no write in flight)."""
        if type(request) is Sleep:
            self.wake_at = now + request.seconds
        elif type(request) is Read:
            self.waiting = Waiting(self._ask(request, now), request.with_position)
        elif type(request) is Write:
            self.waiting = Waiting(None, False, self._write(request, now))
        elif type(request) is Both:
            rids = self._write(request.write, now)
            self.waiting = Waiting(self._ask(request.read, now), request.read.with_position, rids)
        elif type(request) is Pipe:
            last, error = self.flight, self.flight_error
            self.flight = self._write(request.write, now) if request.write.ops else set()
            self.flight_error = None
            read = self._ask(request.read, now)
            self.waiting = Waiting(read, request.read.with_position, last, error=error, pipe=True)
        else:
            assert type(request) is Settle
            if not self.flight:
                return False
            self.waiting = Waiting(None, False, self.flight, error=self.flight_error)
            self.flight, self.flight_error = set(), None
        w = self.waiting
        if w is not None and w.read is not None and w.read in self.early:
            _answered(w, *self.early.pop(w.read))
        return True

    def _ask(self, request: Read, now: float) -> int:
        """The id of ``request``'s read: the one sent ahead if it is this read (an
        ``aside`` read leaves the one sent ahead for its request)."""
        if request.aside:
            return self._read(request, now)
        sent, self.ahead = self.ahead, None
        if sent is not None and sent[0] is request:
            return sent[1]
        self.early.clear()
        return self._read(request, now)

    def _read(self, request: Read, now: float) -> int:
        core = self.node.client
        assert core is not None
        op, within, end = request.op, request.within, None
        if type(op) is KeyPage:  # as the asyncio driver builds it, from this client's keyspace
            ks = core.keyspace
            op, within, end = page_read(op, core.placement.ordered, ks.segments() if ks else ())
        rid, fx = core.read(op, request.isolation, now, within=within)
        if type(request.op) is KeyPage:
            self.page_ends[rid] = end
        self.node.feed(fx)
        return rid

    def _write(self, request: Write, now: float) -> set[int]:
        core = self.node.client
        assert core is not None
        if len(request.ops) == 1:
            rid, fx = core.write(request.ops[0], now)
            rids = {rid}
        else:
            messages, fx = core.write_batch(list(request.ops), now)
            rids = {rid for _indices, rid in messages}
        self.node.feed(fx)
        return rids

    def upcall(self, item: Any, now: float) -> None:
        if type(item) is WriteDone and item.request in self.flight:
            self.flight.discard(item.request)
            self.flight_error = self.flight_error or item.error
            return
        paged = type(item) is ReadDone and item.request in self.page_ends
        end = self.page_ends.pop(item.request) if paged else None  # (a stale read's too)
        w = self.waiting
        if type(item) is ReadDone and self.ahead is not None and item.request == self.ahead[1]:
            self.early[item.request] = (item, paged, end)  # taken by the step asking for it
            return
        if w is None:
            return
        if type(item) is ReadDone and item.request == w.read:
            _answered(w, item, paged, end)
        elif type(item) is WriteDone and item.request in w.writes:
            w.writes.discard(item.request)
            if item.error is not None:
                w.error = w.error or item.error
        else:
            return
        # Every call runs to its end (a failed one leaves the others' messages in
        # flight, and their answers must still find their waiter); the first failure
        # is what the steps get.
        if w.read is None and not w.writes:
            if w.pipe and w.error is not None:
                self.flight, self.flight_error = set(), None  # the steps make it again
            self.resume(w.reply, now, w.error)

    def tick(self, now: float) -> None:
        if self.wake_at is not None and now >= self.wake_at:
            self.resume(None, now)


def _answered(w: Waiting, item: ReadDone, paged: bool, end: Any) -> None:
    """``w``'s read answered by ``item`` (``paged``: a KeyPage read's, which ended at
    ``end``)."""
    w.read = None
    result = (item.result, end) if paged else item.result
    if item.error is not None:
        w.error = w.error or item.error
    else:
        w.reply = (result, item.position) if w.with_position else result


def _definitions(catalog: dict[Any, Any]) -> dict[Any, Any]:
    """The catalog's entries as definitions (the entry itself where it is none)."""
    out = {}
    for key, value in catalog.items():
        try:
            out[key] = from_dict(value, key)
        except BadOperation:
            out[key] = value
    return out


NOWHERE = (-2, -1)
"""A base range no write of the simulator's reaches (its keys are from 0 up)."""


def _hostile(view: ViewDef, at: int, n: int) -> Steps:
    """What a plain client may try on a view: a junk version of a row, from a little
    after ``at`` on, a delete of every row, and (the ``n``-th time, every other) a
    definition of the view over a range nothing changes, or a delete of its definition.
    The storage processes refuse the junk and the definitions and spare the rows in the
    delete, so every read stays exact; the planted ``any_rows_writer`` takes them all.
    Readers trust a definition: one whose sources never change makes a read past a
    quiet progress take the view as unchanged while its base changed."""
    start, end = rows_bounds(view.name)
    junk = ("version", (((*start, ("junk",)), [at + 3, {"junk": True}]),), 0)
    if n % 2:
        bogus = replace(view, source=NOWHERE, base=(NOWHERE,) if view.over else ())
        catalog: Any = ("put", ((catalog_key(view.name), bogus.to_dict()),))
    else:
        catalog = ("delete", (catalog_key(view.name),))
    for op in (junk, ("delete_range", start, end), catalog):
        with contextlib.suppress(RubberbandError):  # refused, as it must be
            yield Write((op,))


class ViewProcess:
    """A simulated process that runs steps: every view's maintainer, or the reader."""

    def __init__(self, run: RubberbandRun, node: RbNode, reader: bool) -> None:
        self.run = run
        self.node = node
        self.reader = reader
        self.driven: list[Driven] = []
        self.started = False
        self.reads: dict[str, list[ViewRead]] = {v.name: [] for v in VIEWS}
        self.halted = False
        self.final: list[Any] | None = None
        """After healing: the views the reader still has to read (None: not yet)."""
        self.final_reads: dict[str, int] = {}
        self.defined = False
        """Whether this maintainer wrote the views' definitions (at its first start)."""
        self.catalog: dict[Any, Any] | None = None
        """The catalog as the reader's last read found it, after healing."""
        self._n = 0
        self.groups: list[Group] = []
        """The maintainer's loops, each with its views' figures."""
        node.on_upcall = lambda _node, item, now: [d.upcall(item, now) for d in list(self.driven)]
        node.next_wake = self._next_wake
        node.on_step = self.tick

    def halt(self) -> None:
        """Start nothing more: each step in flight ends, and its generator is dropped."""
        self.halted = True
        for d in list(self.driven):
            d.halted = True
            if d.waiting is None:
                self._drop(d)

    def _drop(self, d: Driven) -> None:
        if d in self.driven:
            self.driven.remove(d)

    def _start(self, steps: Any, done: Callable[[Any, Any], None], now: float) -> Driven:
        def finished(got: Any, error: Any) -> None:
            self._drop(d)
            if not self.halted and not d.halted:  # (halted: nothing to hand on; the
                done(got, error)  # process may have started again since, afresh)

        d = Driven(self.node, steps, finished)
        d.wake_at = now
        self.driven.append(d)
        return d

    def resume_final(self) -> None:
        """Start again after healing; the reader reads each view once, sequentially,
        then the catalog (which must hold what the maintainers defined)."""
        self.halted = False
        self.started = False
        self.final = [*VIEWS, CATALOG]

    @property
    def final_done(self) -> bool:
        return self.final is not None and not self.final and not self.driven

    @property
    def idle(self) -> bool:
        return not self.driven

    def _next_wake(self) -> float | None:
        wakes = [d.wake_at for d in self.driven if d.wake_at is not None]
        return min(wakes) if wakes else (None if self.driven else self.run.sim.now + 0.2)

    def tick(self, now: float) -> None:
        core = self.node.client
        assert core is not None
        if self.halted:
            return
        if not self.started:
            follower = self.run.follower
            if core.keyspace is None or not len(core.keyspace):
                self.node.feed(core.refresh(now))
                return
            if follower is None or not follower.started:
                return
            self.started = True
            if self.reader:
                self._next_read(now)  # (refused until a maintainer defined the views)
            else:
                if not self.defined:  # (once: the catalog is checked after healing)
                    self.defined = True
                    self._define(now)
                for views in groups(VIEWS):  # as `rubberband views maintain` groups them
                    group = Group(views)
                    self.groups.append(group)
                    self._start(maintain_group_steps(group, POLL, PAGE_ROWS), lambda *_: None, now)
            return
        for d in list(self.driven):
            d.tick(now)

    def _define(self, now: float) -> None:
        """Write the views' definitions where ``create_view`` does (each maintainer
        alike: only maintainers may, and any one may be down): a sequential read shows
        from them that nothing changed since a view's progress rather than wait for an
        idle maintainer (the maintainers keep ``VIEWS``)."""

        def define() -> Steps:
            ops = tuple(("put", ((catalog_key(v.name), v.to_dict()),)) for v in VIEWS)
            yield Write(ops)

        def done(_got: Any, error: Any) -> None:
            if error is not None:  # through the faults: again, later
                self._start(define(), done, self.node._now + READ_EVERY)

        self._start(define(), done, now)

    def _next_read(self, now: float) -> None:
        self._n += 1
        view = VIEWS[self._n % len(VIEWS)]
        level = LEVELS[(self._n // len(VIEWS)) % len(LEVELS)]
        if self.final is not None:
            if not self.final:
                return
            view, level = self.final[0], "sequential"
            if view is CATALOG:
                self._read_catalog(now)
                return
        start, end = rows_bounds(view.name)
        steps = read_steps(view.name, ("scan", start, end), None, level, now,
                           self.run.cfg.answer_timeout * 3)  # fmt: skip

        def done(got: Any, error: Any) -> None:
            if error is None:  # a failed read through the faults is read again, later
                rows, at = got
                self.reads[view.name].append(ViewRead(at, rows, level=level))
                if self.final and self.final[0] is view:
                    self.final.pop(0)
                    self.final_reads[view.name] = at
                elif self.final is None and self._n % HOSTILE_EVERY == 0:
                    hostile = _hostile(view, at, self._n // HOSTILE_EVERY)
                    self._start(hostile, lambda *_: None, self.node._now)
            self._next_read(self.node._now + READ_EVERY)

        self._start(steps, done, now)

    def _read_catalog(self, now: float) -> None:
        """The reader's last read: the views' definitions, which every hostile write of
        its own left as the maintainers wrote them."""

        def read() -> Steps:
            rows, _now = yield Read(("scan", (CATALOG,), (CATALOG + "\x00",)), "sequential")
            return rows

        def done(got: Any, error: Any) -> None:
            if error is not None:
                self._next_read(self.node._now + READ_EVERY)
                return
            self.catalog = dict(got)
            assert self.final is not None
            self.final.pop(0)

        self._start(read(), done, now)

    def violations(self) -> list[str]:
        out: list[str] = []
        follower = self.run.follower
        if follower is None or follower.first is None:
            return ["views: the base's change feed never started"]
        if self.catalog is None:
            out.append("liveness: the catalog was not read after healing")
        elif _definitions(self.catalog) != {catalog_key(v.name): v for v in VIEWS}:
            out.append(f"views: the catalog is not the maintainers': {self.catalog!r:.300}")
        for view in VIEWS:
            reads = self.reads[view.name]
            if view.name not in self.final_reads:
                out.append(f"liveness: view {view.name} was not read after healing")
            out += check_view_reads(
                view, ({}, follower.first), follower.events, reads, beneath(view)
            )[:3]
        return out


def views_after_healing(run: RubberbandRun) -> None:
    """After healing: the maintainers start over (from a snapshot), each view is read
    once more at sequential level, and they halt again, so that their last writes reach
    every replica before the replicas are compared."""
    procs = run.view_processes
    for vp in procs.values():
        vp.resume_final()
    reader = procs[READER]
    run.sim.run(run.sim.now + 10.0, stop=lambda: reader.final_done)
    for vp in procs.values():
        vp.halt()

    def halted() -> bool:
        live = [p for p in procs if run.sim.nodes[p].alive]
        return all(procs[p].idle for p in live) and run.quiet()

    run.sim.run(run.sim.now + 5.0, stop=halted)
