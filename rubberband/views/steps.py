"""The views' protocols as steps, without I/O: what to read, write or wait for next.

A maintainer's loop and a view read at a level are conversations with the cluster (a
read, then writes, then pages of a feed...).  Each is a generator here: it *yields* a
request (:class:`Read`, :class:`Write`, :class:`Both`, :class:`Sleep`) and is resumed with
``(result, now)``, or with the error thrown into it.  It touches no socket, clock or
event loop, so the asyncio client (:mod:`rubberband.views.client`) and the simulator
(:mod:`rubberband.sim.views`) run the same steps: the simulator checks the code that
ships, as it does for every other core.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from typing import Any, NamedTuple

from rubberband.changelog import Changed, Changes, Event
from rubberband.errors import (
    Compacted,
    Indeterminate,
    RubberbandError,
    Unavailable,
)
from rubberband.keys import encode_key
from rubberband.views.define import (
    ViewDef,
    part_bounds,
    rows_bounds,
    unit_name,
    units,
)
from rubberband.views.looks import Looks, confirm, leave
from rubberband.views.maintain import Figures, Maintainer
from rubberband.views.requests import Ahead, Both, Pipe, Read, Settle, Sleep, Steps, Write
from rubberband.views.snapshots import PAGE_ROWS, key_pages, table_pages

LEVELS = ("sequential", "read-your-writes", "snapshot", "any")
RETRY = 1.0
"""Seconds a maintainer waits after a failed step before it asks again, or starts over."""
RETRIES = 10
"""Times a maintainer asks again for a read or write that got no answer (a router or a
storage process failing over) before it starts every view over from snapshots.  Its
state is intact and its writes idempotent (version merges), so asking again repeats
nothing harmful; starting over a view of a million rows took 47 s of backfill."""


# ------------------------------------------------------------------ maintaining
class Group:
    """Views over the same sources, kept by one loop that reads each source's feed once
    for all of them (a page's decoding is most of a maintainer's cost).  The driver may
    change ``views`` at any time: the loop starts a new view from its own snapshot at its
    next page, and drops a removed one; ``figures`` has each view's."""

    # The loop's steps may run on a worker thread while the driver adds and removes
    # views on the event loop: both dicts are replaced, never changed, so a step
    # iterates the one it took whole, and a view it finds in one may be gone from the
    # other (looked up with ``get``).
    def __init__(self, views: Iterable[ViewDef] = ()) -> None:
        self.views: dict[str, ViewDef] = {}
        self.figures: dict[str, Figures] = {}
        for view in views:
            self.add(view)

    @property
    def sources(self) -> tuple[tuple[Any, Any], ...] | None:
        for view in self.views.values():
            return view.sources
        return None

    def add(self, view: ViewDef, figures: Figures | None = None) -> None:
        """Keep ``view``: each of its parts as a unit of its own (named ``view#i``), or
        the one part given (``view.part``), or the whole of an unsplit view."""
        if self.views and group_of(view) != group_of(next(iter(self.views.values()))):
            raise ValueError(f"view {view.name!r} has other sources than its group's")
        kept = units(view)
        one = figures if figures is not None and len(kept) == 1 else None
        named = {unit_name(unit): unit for unit in kept}
        self.figures = {**self.figures, **{n: Figures() if one is None else one for n in named}}
        self.views = {**self.views, **named}

    def remove(self, name: str) -> None:
        self.views = {n: v for n, v in self.views.items() if n != name}
        self.figures = {n: f for n, f in self.figures.items() if n != name}


def group_of(view: ViewDef) -> str:
    """The key of the :class:`Group` a view belongs to: its sources (ranges, and the
    tables whose rows they are)."""
    return repr((view.sources, view.tables))


def groups(views: Iterable[ViewDef]) -> list[list[ViewDef]]:
    """``views`` by their sources: each list a :class:`Group`'s views."""
    by: dict[str, list[ViewDef]] = {}
    for view in views:
        by.setdefault(group_of(view), []).append(view)
    return list(by.values())


IDLE_FIRST = 0.002
"""Seconds a maintainer pauses after the first page without a change; each further one
doubles it, up to the loop's ``poll``.  A fixed pause of ``poll`` (50 ms) after any
empty page was most of a view's staleness at a light load: at 1,000 writes/s a page
read in 3 ms was often empty, and a base write then waited out the pause."""
IDLE_READ_EVERY = 1.0
"""Seconds an idle maintainer goes at most without reading its feeds in order.  In
between it peeks at its sources' change logs after each pause (a basic read of one
replica a segment, no place in the total order) and reads in order once one says a
source changed.  Each ordered page and progress write woke every router and holder:
one idle view kept 0.16 cores busy.  A sequential view read does not wait for the
maintainer's next page: it shows itself that nothing changed since the view's
progress (:mod:`rubberband.views.reads`)."""


def maintain_group_steps(group: Group, poll: float = 0.05, page_rows: int = 0) -> Steps:
    """A group's maintainer for ever: each view starts from a snapshot, then the group
    follows the sources' feeds, pausing between empty pages from :data:`IDLE_FIRST` up
    to ``poll`` seconds; a step without an answer is asked again
    (:data:`RETRIES`), and after a failure (a feed compacted under it, the cluster
    unreachable longer) it starts over, every view from a new snapshot."""
    while True:
        try:
            yield from _maintain(group, poll, page_rows or PAGE_ROWS)
        except Compacted:  # the base's changes went under it: from new snapshots
            for figures in group.figures.values():
                figures.failures += 1
                figures.compacted += 1
        except RubberbandError:
            for figures in group.figures.values():
                figures.failures += 1
            yield Sleep(RETRY)


def _start(view: ViewDef, figures: Figures, page_rows: int) -> Steps:
    """A view's start: its old rows and a snapshot of its sources, written whole, each
    source's feed followed from its snapshot's first page meanwhile (:class:`Fed`);
    returns its maintainer and the time."""
    m = Maintainer(view)
    figures.starts += 1
    pages = yield from key_pages(*part_bounds(view), page_rows)
    old = [row for rows, _position, _now in pages for row in rows]
    asked = pages[0][2]
    snapshots = []
    fed = Fed(view.sources)
    for side, (lo, hi) in enumerate(view.sources):
        table = view.table_of(side)
        if table is None:
            snapshot = key_pages(lo, hi, page_rows)
        else:
            snapshot = table_pages(table, lo, hi, page_rows)
        pages = yield from _between(snapshot, fed.read, lambda got, s=side: fed.begin(s, got))
        snapshots.append([(rows, position) for rows, position, _now in pages])
        now = pages[-1][2]
    now = yield from fed.reach(now)
    doubted, now = yield from confirm([view], long=True)  # (then computed whole)
    if doubted:
        return None, now
    writes = m.start(old, snapshots, now, fed.pages())
    fed.handed()
    now = yield from _between(_write(writes, now), fed.read)
    for side, got in enumerate(fed.pages()):  # the changes read as its rows went out
        if got is not None and got[1]:  # (the loop reads on from where they end)
            now = yield from _write(m.page(side, got[0], got[1], now), now)
    _started(m, figures, asked, now)
    return m, now


def _maintain(group: Group, poll: float, page_rows: int) -> Steps:
    members: dict[str, Maintainer] = {}
    writes: dict[str, list[Any]] = {}  # each view's of the last page, not yet made
    held: list[tuple[Any, Progress]] = []  # progress writes whose rows are stable
    flight = Flight()
    now = writes_asked = 0.0
    pause = IDLE_FIRST
    halted: dict[str, Maintainer] = {}  # stopped, until their last progress writes went
    level = True  # no feed page of the last round was cut: the members reached the head
    ahead: tuple[Read | None, float] = (None, 0.0)  # the next page's read sent, and when
    waited = 0  # rounds since the last start
    looks = Looks(RETRY)  # at the catalog, before writes
    while True:
        halted, held, flight = _tidy(group, members, writes, halted, held, flight)
        waited += 1
        due = (_due(group, members, looks, now)
               if level or waited > START_WAIT or not members else None)  # fmt: skip
        if due is not None:
            waited = 0
            # One start a round, after every write the others made is known applied,
            # and once they have reached the head again (no page cut): none falls
            # behind by more than one backfill (a version write too far behind is
            # refused: rubberband.versions.WINDOW).
            if members:
                now = yield from _catch_up(group, members, flight, held, writes, writes_asked, now)
                held, flight, writes = [], Flight(), {}
            name, view, parent, figures = due
            began = now  # (its look at the catalog is sent after this)
            start = _begin(view, parent, figures, page_rows)
            if parent is None:  # the others follow their feeds meanwhile (_follow)
                start = _between(start, lambda now: _follow(group, members, looks, now))
            started, now = yield from start
            looks.begun(members, name, view, started, began, now)
        _stops(group, members, writes, halted)
        if not members:  # the last progress of views that stopped still goes out
            now = yield from _catch_up(group, members, flight, held, {}, writes_asked, now)
            held, flight = [], Flight()
            _, now = yield Sleep(poll)
            continue
        idle, level = True, True
        asked = now  # the pages of this round are asked for from now on
        sources = group.sources or ()
        for side, (lo, hi) in enumerate(sources):
            read = _feed_read(members, side, lo, hi, len(sources) == 1)
            if read == ahead[0]:
                read, asked = ahead[0], min(asked, ahead[1])  # its page: as of when sent
            ahead = (None, now)
            made = [name for name, w in writes.items() if w]
            rows = sum(max(1, len(writes[n]) - 1 - members[n].housekeeping) for n in made)
            if rows <= PIPE_MESSAGES:
                # A page's rows go out with the next page's read, the last of them with
                # the progress ordered reads wait for, and are known stable a round
                # later; their stable progress goes out the round after that (a basic
                # read that sees it then sees the rows, whichever replicas it asks).
                split = {n: Maintainer.in_order(writes[n]) for n in made}
                ops = (*(op for op, _ in held), *(op for rows, _ in split.values() for op in rows))
                mine = [(split[n][1], _progress(members[n], writes_asked)) for n in made]
                page, now, held, flight = yield from _pipe(group, flight, held, ops, mine, read)
            else:
                now = yield from _catch_up(group, members, flight, held, writes, writes_asked, now)
                held, flight = [], Flight()
                page, now = yield from _retry(read)
            _paged(group, page, now)
            if read.ahead and page.events:
                ahead = yield from _ask_ahead(members, side, read, page)
            writes, writes_asked = _computed(members, side, page, now), asked
            idle = idle and not page.events
            level = level and not (page.events and page.position == page.events[-1].position)
        now = yield from looks.look(members, writes, now)
        head = max((m.position for m in members.values()), default=-1)
        if idle or any(m.draining(head) for m in members.values()):
            now = yield from _catch_up(group, members, flight, held, writes, writes_asked, now)
            held, flight, writes = [], Flight(), {}
        if idle:
            now, pause = yield from _idle(group, members, now, poll, pause, looks)
        else:
            pause = IDLE_FIRST


def _computed(members: dict[str, Maintainer], side: int, page: Any, now: float) -> dict[str, Any]:
    """The writes each member makes of source ``side``'s ``page``, views over views last."""
    writes = {}
    for name, m in members.items():
        if m.view.over is None:
            events = [e for e in page.events if e.position > m.since[side]]
            writes[name] = m.page(side, page.position, events, now)
    _over(members, writes, now)
    return writes


FOLLOW_EVERY = 0.05
"""Seconds at least between the reads of feeds while a view starts: of its own sources'
(:class:`Fed`), and a round of the other views of its group (:func:`_follow`)."""


class Fed:
    """A starting view's sources' feeds, each read from its snapshot's first page on
    while the rest of the snapshot is read, for :meth:`Maintainer.start`, and on while
    its rows are written (a million of them take seconds).  Read only after the start,
    a feed was compacted under a start that took longer than the change log's span (a
    million rows took 47 s) and the view started over, for ever under a load that kept
    that up; and its holders held no one back for it, its reads not begun (the
    simulator's first starts with logs of 100 changes).

    What it read up to the snapshot's newest page so far is kept folded by key, the
    last change of each: the view starts at its snapshot's last page, so only the state
    there matters, and a change carries its key's whole new value.  Kept whole, the
    changes of a start under load grew the maintainer by every write while it lasted
    (47 s at 20,000 writes a second: about a million); folded, by at most the keys."""

    def __init__(self, sources: tuple[tuple[Any, Any], ...]) -> None:
        self.sources = sources
        self.since: list[int | None] = [None] * len(sources)
        self.events: list[list[Any]] = [[] for _ in sources]
        """Per source: the changes read after the newest snapshot page, whole."""
        self.folded: list[dict[Any, Event]] = [{} for _ in sources]
        """Per source: the last change to each key at or before that page."""
        self.paged = -1
        """The newest snapshot page's position so far: the view starts there or later."""

    def begin(self, side: int, got: Any) -> None:
        """A read of source ``side``'s snapshot answered ``got`` (its position second):
        its feed is followed from its first (the first page's, or before it)."""
        if self.since[side] is None:
            self.since[side] = int(got[1])
        if got[1] > self.paged:
            self.paged = int(got[1])
            self._fold()

    def read(self, now: float) -> Steps:
        """A page of each begun source's feed; returns the time."""
        for side, (lo, hi) in enumerate(self.sources):
            since = self.since[side]
            if since is not None:
                page, now = yield from _retry(Read(Changes(since, lo, hi), "sequential"))
                self.events[side] += page.events
                self.since[side] = page.position
        self._fold()
        return now

    def _fold(self) -> None:
        for events, folded in zip(self.events, self.folded, strict=True):
            n = 0
            while n < len(events) and events[n].position <= self.paged:
                e = events[n]
                for change in e.changes:
                    folded[encode_key(change[0])] = Event(e.position, (change,))
                n += 1
            del events[:n]

    def handed(self) -> None:
        """What was read so far went to :meth:`Maintainer.start`."""
        self.events = [[] for _ in self.sources]
        self.folded = [{} for _ in self.sources]

    def reach(self, now: float) -> Steps:
        """A page of each feed not read past the snapshot's last page yet (a read sent
        after it is ordered after it, so it gets there unless its page is cut); returns
        the time.  Its feeds short of it, the view started only
        when the loop's pages reached it, and its rows went out there, every write
        waited for and no feed read between them: as the last feed read came just
        before the last snapshot page or not, a start under a hold took 5 s and started
        once, or wrote its rows for 14 s while its holders heard nothing of it and
        started over every 15 s (real daemons, a 200,000-row index under 4,000 writes
        a second, logs of 10,000 changes).  One page only: read on until it got there
        under writes whose pages were cut, the group's other views fell behind by the
        reads (the unit tests' six views in a version window of 300 positions)."""
        if any(since is not None and since < self.paged for since in self.since):
            now = yield from self.read(now)
        return now

    def pages(self) -> list[tuple[int, list[Any]] | None]:
        """Per source: where its feed was read to and its events (the folded ones first,
        out of position order), or None if not begun."""
        return [None if t is None else (t, [*f.values(), *e])
                for t, e, f in zip(self.since, self.events, self.folded, strict=True)]  # fmt: skip


def _between(
    steps: Steps, follow: Callable[[float], Steps], seen: Callable[[Any], None] | None = None
) -> Steps:
    """``steps``, with ``follow(now)``'s steps after theirs, one each
    :data:`FOLLOW_EVERY` at most; ``seen``, if given, is told each reply to a read of
    theirs first.  What ``steps`` return."""
    reply: Any = None
    error: Exception | None = None
    last: float | None = None
    while True:
        try:
            request = steps.send(reply) if error is None else steps.throw(error)
        except StopIteration as stop:
            return stop.value
        error = None
        try:
            reply = yield request
        except Exception as e:  # (their own failure: thrown into them)
            error = e
            continue
        if seen is not None and type(request) is Read:
            seen(reply[0])
        now = reply[1]
        last = now if last is None else last
        if now - last >= FOLLOW_EVERY:
            last = now = yield from follow(now)
            reply = (reply[0], now)


def _follow(group: Group, members: dict[str, Maintainer], looks: Looks, now: float) -> Steps:
    """A page of each source for ``members``, their writes made through (nothing left
    in flight: a view's start goes on next); returns the time.  Run between a start's
    steps: the group's other views stood where they were while a start lasted (47 s for
    a million rows), their feeds compacted under them past the change log's span, and
    the whole group started over (the simulator's runs with logs of 100 changes, where
    starts took a second: 108 starts over in 18 seeds, 66 once they followed)."""
    for side, (lo, hi) in enumerate(group.sources or ()):
        if all(m.view.over is not None for m in members.values()):
            break  # (none: the group's first start, or all left)
        asked = now
        page, now = yield from _retry(_feed_read(members, side, lo, hi, False))
        _paged(group, page, now)
        writes = _computed(members, side, page, now)
        now = yield from looks.look(members, writes, now)
        now = yield from _write_through(group, members, [], writes, asked, now)
    return now


def _paged(group: Group, page: Any, now: float) -> None:
    """A feed page came at ``now``: the members' figures of how far the base is read,
    how long the round took and how many changes the page held."""
    changes = sum(len(e.changes) for e in page.events)
    for figures in group.figures.values():
        figures.seen = max(figures.seen, page.position)
        if figures.pages:  # (a time of 0.0 is a time: the pages say whether one came)
            figures.page_seconds = round(now - figures.page_at, 6)
        figures.page_at = now
        figures.page_changes = changes
        figures.pages += 1


def _idle(
    group: Group, members: dict[str, Maintainer], now: float, poll: float, pause: float,
    looks: Looks,
) -> Generator[Sleep | Read, tuple[Any, float], tuple[float, float]]:  # fmt: skip
    """Pause; once the pause has doubled up to ``poll`` (the sources quiet for as
    long), peek at each source's change log after each pause, until a source changed
    (or a peek failed: the ordered read then says why), :data:`IDLE_READ_EVERY`
    passed, or a view is to start, stop or change.  A peek asks a storage process
    that, under writes, answers only after its queued deliveries: a brief lull reads
    the next page in order instead, as before the peeks.
    A peek that finds nothing refreshes the members' :attr:`Figures.fresh_as_of`:
    their progress is published (the loop caught up) and nothing changed since."""
    until = now + IDLE_READ_EVERY
    sources = group.sources or ()
    while True:
        _, now = yield Sleep(min(pause, poll))
        if pause < poll:  # a lull, perhaps under writes: the next page is read in order
            return now, min(pause * 2, poll)
        bases = [m for m in members.values() if m.view.over is None]
        redefined = any(group.views.get(n) != m.view for n, m in members.items())
        if now >= until or not bases or redefined or _due(group, members, looks, now):
            return now, pause
        asked = now
        ops = [Changed(min(m.since[side] for m in bases), lo, hi)
               for side, (lo, hi) in enumerate(sources)]  # fmt: skip
        try:
            changed, now = yield from peek(ops, now)
        except RubberbandError:
            return now, pause
        if changed:
            return now, pause
        for name in members:
            figures = group.figures.get(name)
            if figures is not None:
                figures.fresh_as_of = max(figures.fresh_as_of, asked)


def peek(
    ops: Iterable[Changed], now: float
) -> Generator[Read, tuple[Any, float], tuple[bool, float]]:
    """Does a peek at the change logs (a basic read of each of ``ops``, no place in
    the total order) say a source changed?  ``(answer, now)``; the first yes ends it."""
    for op in ops:
        changed, now = yield Read(op, "basic")
        if changed:
            return True, now
    return False, now


def _tidy(
    group: Group, members: dict[str, Maintainer], writes: dict[str, list[Any]],
    halted: dict[str, Maintainer], held: Held, flight: Flight,
) -> tuple[dict[str, Maintainer], Held, Flight]:  # fmt: skip
    """A round's start: views stopped, dropped or defined anew taken out of
    ``members``, and the progress writes of views no longer kept by the maintainer that
    made them dropped; ``(halted, held, flight)``, ``halted`` keeping the stopped views
    whose last progress writes are still owed."""
    _stops(group, members, writes, halted)
    _forget(group, members, writes)
    halted = {n: m for n, m in halted.items() if group.views.get(n) == m.view}
    kept = {**halted, **members}
    held = _kept(held, kept)
    flight = flight._replace(made=_kept(flight.made, kept), publish=_kept(flight.publish, kept))
    owed = {p.name for _, p in (*held, *flight.made, *flight.publish)}
    return {n: m for n, m in halted.items() if n in owed and n not in members}, held, flight


def _feed_read(members: dict[str, Maintainer], side: int, lo: Any, hi: Any, one: bool) -> Read:
    """The read of source ``side``'s next feed page, from where the members' feeds are
    (a view not started yet is computed at the page that reaches its snapshot: a long
    step); ``one``: the group has one source, so its next read can go ahead."""
    since = min(m.since[side] for m in members.values() if m.view.over is None)
    starting = any(m.position < 0 for m in members.values())
    return Read(Changes(since, lo, hi), "sequential", long=starting, ahead=one and not starting)


def _ask_ahead(
    members: dict[str, Maintainer], side: int, read: Read, page: Any
) -> Generator[Ahead, tuple[Any, float], tuple[Read, float]]:
    """The read of the page after ``page``, sent before ``page`` is computed
    (:class:`Ahead`), and when: each member's feed continues from ``page`` or from
    where it already was, as :meth:`Maintainer.page` leaves it.  Should the next
    round's read differ (a view started or stopped meanwhile), that one is sent: this
    answer is only ever the one the loop would have asked for."""
    since = min(
        (max(m.since[side], page.position) for m in members.values() if m.view.over is None),
        default=page.position,
    )
    nxt = read._replace(op=read.op._replace(since=since))
    _, sent = yield Ahead(nxt, len(page.events))
    return nxt, sent


def _due(group: Group, members: dict[str, Maintainer], looks: Looks, now: float) -> Any:
    """The next view to start, ``(name, view, the view it is over if kept, its
    figures)``, or None: each after the one it is over, once that one has a position,
    and none the catalog contradicted less than :data:`RETRY` ago
    (:func:`~rubberband.views.looks.doubt`)."""
    for name, view in _by_depth(group.views):
        figures = group.figures.get(name)
        if name in members or figures is None or figures.stopped:
            continue
        if looks.doubted(name, view, now):
            continue
        if view.over is None:
            return name, view, None, figures
        parent = members.get(view.over)
        if parent is not None and parent.position >= 0 and not parent.stopped:
            return name, view, parent, figures
    return None


def _begin(view: ViewDef, parent: Maintainer | None, figures: Figures, page_rows: int) -> Steps:
    """A view's start, from a snapshot of its base or from the view it is over:
    ``(maintainer, now)``, the maintainer None where the catalog no longer holds the
    view's definition once its snapshot is read (:func:`~rubberband.views.looks.confirm`):
    nothing written."""
    if parent is None:
        return (yield from _start(view, figures, page_rows))
    return (yield from _start_over(view, figures, parent, page_rows))


class Flight(NamedTuple):
    """A page's write sent by a :class:`Pipe` and not yet known stable."""

    ops: tuple[Any, ...] = ()
    publish: list[tuple[Any, Progress]] = []
    """Stable progress writes among ``ops``: published once ``ops`` are stable."""
    made: list[tuple[Any, Progress]] = []
    """The stable progress of the rows in ``ops``: written once they are stable."""


Held = list[tuple[Any, "Progress"]]


def _kept(made: Held, members: dict[str, Maintainer]) -> Held:
    """The progress writes of views still kept by the maintainer that made them (a
    view dropped or defined anew meanwhile has a new one, whose figures they are not)."""
    return [(op, p) for op, p in made if members.get(p.name) is p.maintainer]


def _pipe(
    group: Group, flight: Flight, held: Held, ops: tuple[Any, ...], mine: Held, read: Read
) -> Steps:
    """``ops`` sent and the next page read, the last write in flight waited for:
    ``(page, now, held, flight)``.  A failure makes both writes again, in order, and
    waits for them (writes are idempotent version merges)."""
    both = (*flight.ops, *ops)
    try:
        page, now = yield Pipe(Write(ops), read) if both else read
    except (Indeterminate, Unavailable):
        _, now = yield Sleep(RETRY)
        page, now = yield from _retry(Both(Write(both), read) if both else read)
        _publish(group, [*flight.publish, *held], now)
        return page, now, [*flight.made, *mine], Flight()
    _publish(group, flight.publish, now)
    return page, now, flight.made, Flight(ops, held, mine)


def _land(group: Group, flight: Flight, held: Held, now: float) -> Steps:
    """The write in flight waited for (made again if it failed): ``(now, held,
    flight)`` with its rows' stable progress now held and nothing in flight."""
    if flight.ops:
        try:
            _, now = yield Settle()
        except (Indeterminate, Unavailable):
            _, now = yield from _retry(Write(flight.ops))
        _publish(group, flight.publish, now)
    return now, [*held, *flight.made], Flight()


def _catch_up(
    group: Group, members: dict[str, Maintainer], flight: Flight, held: Held,
    writes: dict[str, list[Any]], asked: float, now: float,
) -> Steps:  # fmt: skip
    """The write in flight waited for, then everything held back and each view's rows
    written through (:func:`_write_through`): nothing is left in flight or held.
    Returns the time."""
    now, held, _ = yield from _land(group, flight, held, now)
    return (yield from _write_through(group, members, held, writes, asked, now))


def _write_through(
    group: Group, members: dict[str, Maintainer], held: list[tuple[Any, Progress]],
    writes: dict[str, list[Any]], asked: float, now: float,
) -> Steps:  # fmt: skip
    """The progress held back (its rows are stable), then each view's rows and its
    progress, view after view, each published once made: when a page's writes do not
    fit the next read's round trip, and before the loop idles."""
    now = yield from _write([op for op, _ in held], now)
    _publish(group, held, now)
    for name, w in writes.items():
        if w:
            now = yield from _write(w, now)
            _publish(group, [(None, _progress(members[name], asked))], now)
    return now


class Progress(NamedTuple):
    """What a view's figures say once its progress write is stable."""

    name: str
    position: int
    floor: int
    rows: int
    events: int
    versions: int
    asked: float
    maintainer: Maintainer
    reclaimed: int = 0
    dead_rows: int = 0


def _started(m: Maintainer, figures: Figures, asked: float, now: float) -> None:
    """A start's writes are made (each waited for): its progress is published."""
    p = _progress(m, asked)
    m.published(p.position, p.floor)
    _set(figures, p, now)


def _progress(m: Maintainer, asked: float) -> Progress:
    return Progress(unit_name(m.view), m.position, m.written_floor, len(m.rows.rows), m.events,
                    m.versions, asked, m, m.reclaimed, m.dead_rows)  # fmt: skip


def _publish(group: Group, made: list[tuple[Any, Progress]], now: float) -> None:
    for _op, p in made:
        p.maintainer.published(p.position, p.floor)
        figures = group.figures.get(p.name)
        if figures is not None:  # else the view left its group meanwhile
            _set(figures, p, now)


def _set(figures: Figures, p: Progress, now: float) -> None:
    figures.position, figures.floor, figures.rows = p.position, p.floor, p.rows
    figures.events, figures.versions, figures.reclaimed = p.events, p.versions, p.reclaimed
    figures.dead_rows = p.dead_rows
    figures.published_at, figures.fresh_as_of = now, p.asked


def _by_depth(views: dict[str, ViewDef]) -> list[tuple[str, ViewDef]]:
    """``views`` with every view after the one it is defined over (if in the group),
    and right after it: a view over another starts from its rows at its position, and
    writes them as versions there, so it starts before another view's backfill takes
    the order far past that position (a version write too far behind is refused:
    :data:`rubberband.versions.WINDOW`)."""

    def path(view: ViewDef) -> list[str]:
        names = [view.name]
        while view.over is not None and view.over in views and view.over not in names:
            view = views[view.over]
            names.insert(0, view.name)
        return names

    return sorted(list(views.items()), key=lambda nv: path(nv[1]))


def _forget(group: Group, members: dict[str, Maintainer], writes: dict[str, Any]) -> None:
    """Drop the members whose view was dropped or defined anew, and those over them."""
    leave(members, writes, [n for n, m in members.items() if group.views.get(n) != m.view])
    for m in members.values():
        m.emitted = [] if any(c.view.over == m.view.name for c in members.values()) else None


def _stops(
    group: Group, members: dict[str, Maintainer], writes: dict[str, Any],
    halted: dict[str, Maintainer],
) -> None:  # fmt: skip
    """The members whose view stopped (a row over the limit) leave the loop for
    ``halted`` (their last progress writes still go out), and so do the views over
    them, which stop with them and start again once that view is kept again: the
    group's other views go on (before, one such row failed every round of the whole
    group, which then started over from snapshots, again and again)."""
    for name, view in _by_depth(group.views):
        figures, m = group.figures.get(name), members.get(name)
        if figures is None:
            continue  # removed meanwhile: forgotten at the next round
        if m is not None and m.view != view:
            m = None  # defined anew meanwhile: the old one is forgotten, not halted
        if m is not None and m.stopped:
            figures.stopped, figures.stopped_by = m.stopped, name
        elif figures.stopped_by != name and view.over is not None:
            above = group.figures.get(view.over)
            if above is not None and above.stopped:
                figures.stopped = f"view {name!r} is over view {view.over!r}, which stopped"
                figures.stopped_by = above.stopped_by
            else:
                figures.stopped = figures.stopped_by = ""
        if figures.stopped and m is not None:
            halted[name] = members.pop(name)
            writes.pop(name, None)


def _over(members: dict[str, Maintainer], writes: dict[str, list[Any]], now: float) -> None:
    """The views over views take the rows their view changed, deepest last."""
    ordered = _by_depth({n: m.view for n, m in members.items()})
    for name, view in ordered:
        if view.over is not None:
            parent = members[view.over]
            writes[name] = members[name].page(0, parent.position, parent.emitted or (), now)
    for m in members.values():
        if m.emitted:
            m.emitted.clear()


def _start_over(view: ViewDef, figures: Figures, parent: Maintainer, page_rows: int) -> Steps:
    """A view over a view starts from the other view's rows as the loop holds them, at
    its position; its old rows are read as any view's are."""
    m = Maintainer(view)
    figures.starts += 1
    pages = yield from key_pages(*rows_bounds(view.name), page_rows)
    old = [row for rows, _position, _now in pages for row in rows]
    asked = pages[0][2]
    doubted, now = yield from confirm([view], long=True)  # (then computed whole)
    if doubted:
        return None, now
    snapshot = [(list(parent.rows.rows.values()), parent.position)]
    parent.emitted = []
    now = yield from _write(m.start(old, [snapshot], now), now)
    _started(m, figures, asked, now)
    return m, now


START_WAIT = 64
"""Rounds a maintainer waits at most, after a view's start, for its other views to
reach the head (no feed page cut) before it starts the next: under a load of bulk
writes every page is cut, and the next view would otherwise never start."""
PIPE_MESSAGES = 16
"""Messages of rows a page's writes may have to go out with the next page's read (a
maintainer that fell behind reads pages of thousands of changes; up to this many
messages they are pipelined all the same, so it catches up at the pace it fell behind,
where writing them a few at a time, each waited for, let it fall further behind)."""
IN_FLIGHT = 4
"""Row writes a maintainer has in flight at once.  A backfill of 200,000 rows sent as one
batch of 100 messages kept the client re-encoding its send window for minutes; a few
at a time stream at the cluster's pace."""


def _write(writes: list[Any], now: float) -> Steps:
    """The rows first, a few messages at a time, then the last write (the progress)
    once they are stable: a reader that sees the progress sees every row version under
    it, at any replica (a basic read asks each segment's replica apart)."""
    rows = writes[:-1]
    for i in range(0, len(rows), IN_FLIGHT):
        _, now = yield from _retry(Write(tuple(rows[i : i + IN_FLIGHT])))
    if writes:
        _, now = yield from _retry(Write((writes[-1],)))
    return now


def _retry(request: Read | Write | Both) -> Steps:
    """``request``'s reply, asked again after a failure without an answer (none came,
    or no responder was reachable) up to :data:`RETRIES` times."""
    for attempt in range(RETRIES + 1):
        try:
            return (yield request)
        except (Indeterminate, Unavailable):
            if attempt == RETRIES:
                raise
        yield Sleep(RETRY)
    raise AssertionError("unreachable")
