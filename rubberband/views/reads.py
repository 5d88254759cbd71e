"""A view read at a level, as steps without I/O (:mod:`rubberband.views.steps`).

A read asks for the view's progress (each part's, for a view split in parts) and its
rows, and answers with the rows exact as of one position: a sequential read's own, once
the maintainers have reached it; otherwise the position every part has reached.  Which
of a row's versions it takes, and which rows count, is decided here (:func:`_as_of`).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from ecast.core import mutations
from rubberband.changelog import Changed, Changes, Revisions
from rubberband.errors import BadOperation, Compacted, Indeterminate, RubberbandError
from rubberband.keys import encode_key, normalize, overlaps, point
from rubberband.versions import as_of
from rubberband.views.define import (
    catalog_key,
    from_dict,
    keys_end,
    meta_key,
    part_of,
    progress_keys,
    reclaim_key,
    rows_bounds,
    stored_key,
)
from rubberband.views.define import row_key as view_row_key
from rubberband.views.maintain import QUIET
from rubberband.views.steps import LEVELS, Read, Sleep, Steps, peek


@dataclass
class Session:
    """What read-your-writes remembers of a client: its writes when it last read, and
    the position its reads must reach (its reads never go back)."""

    writes_seen: int = -1
    floor: int = -1


POLL_CAP = 0.01
"""Seconds at most between a waiting view read's polls of the progress: a sequential
read waits a few of the maintainer's round trips, and a coarser poll added up to its
own length to the wait (it was 50 ms: a view read at half the peak write rate took p50
110 ms)."""


@dataclass
class Layout:
    """What a reader knows of a view's split points (each part has a progress of its
    own): learnt from part 0's progress, which every read reads, and checked against
    it by every read (a view dropped and defined anew with other parts)."""

    parts: tuple[Any, ...] = ()
    sources: tuple[tuple[Any, Any], ...] | None = None
    """The view's sources when a reader last read its definition: what it peeks at
    before it reads in order (:func:`unchanged_since`); a hint, checked each time."""


def read_steps(
    name: str, op: Any, within: Any, level: str, now: float, timeout: float,
    session: Session | None = None, writes: int = 0, layout: Layout | None = None,
) -> Steps:  # fmt: skip
    """A view read at ``level``: ``(rows, position)``, the rows ``[(row key, value)]``
    in key order, exact as of ``position``.  ``op`` is a get of the progress key and
    row keys, or a scan of the view's rows (``within``: of those ranges);
    ``writes``: the client's write calls so far (read-your-writes reads past them)."""
    if level not in LEVELS:
        raise BadOperation(f"a view read's level is one of {', '.join(LEVELS)}, not {level!r}")
    deadline = now + timeout
    layout = layout if layout is not None else Layout()
    for _ in range(3):
        try:
            return (yield from _read(name, op, within, level, deadline, session, writes, layout))
        except Compacted:
            if level not in ("sequential", "any"):
                raise
            # The maintainer started over past the read's position (or, at `any`, a
            # row's replica past the progress read first): read at a new one.
    raise Indeterminate(f"view {name!r} kept starting over past the reads' positions")


def _read(
    name: str, op: Any, within: Any, level: str, deadline: float, session: Session | None,
    writes: int, layout: Layout,
) -> Steps:  # fmt: skip
    target = -1
    probe = Read(("get", (meta_key(name),)), "sequential", None, True)
    if level == "sequential":
        (_, target), now = yield probe
    elif level == "read-your-writes":
        session = session if session is not None else Session()
        if writes != session.writes_seen:
            (_, at), now = yield probe
            session.floor = max(session.floor, at)
            session.writes_seen = writes
        target = session.floor
    pause = 0.002
    tried = -2  # the progress an attempt to show nothing changed since failed from
    while True:
        parts = layout.parts
        needed = _needed(name, op, within, parts)
        if level == "any":
            # Basic reads ask each segment's replica apart, each as it is when asked:
            # the progress first, then the rows, asked only once it is known.  Rows are
            # stable before their progress is written, and a replica answers a basic
            # read after every write it had received, so the rows' answers hold every
            # version up to the progress (one read of both could take the progress from
            # a replica asked later than a row's, a retry's answer, and be older).
            keys = [progress_keys(name, i)[1] for i in needed]
            progress, now = yield Read(("get", tuple(keys)), "basic")
            got, now = yield Read(op, "basic", within)
            chains = _rows_only(name, dict(got))  # a get's {key: chain}, a scan's pairs
            # The reclaim floor last: a row dropped before the rows' replica answered was
            # dropped only once that floor was at every replica of it, so this read sees
            # it (read with the progress, it could come from before the drop's floor).
            dropped, now = yield Read(("get", (reclaim_key(name),)), "basic")
            metas = {**dict(progress), **dict(dropped)}
        else:
            keys = [progress_keys(name, i)[0] for i in needed]
            wide, where = _with(name, op, within, [*keys, reclaim_key(name)])
            got, now = yield Read(wide, "snapshot", where)  # every ordered level
            metas = dict(got)
            chains = _rows_only(name, metas)
        first = metas.get(keys[0])  # part 0's: it says how the view is split
        told = _layout(first[-1]) if _said(first) else parts
        if told != parts and now <= deadline:
            layout.parts = told  # split otherwise than this reader knew: read again
            continue
        said = combined_progress(needed, [metas.get(k) for k in keys])
        if said is not None:
            reached, floor, starts, _parts = said
            dropped = metas.get(reclaim_key(name))  # dead rows dropped below its floor
            floor = max(floor, dropped[0]) if dropped else floor
            at = target if level == "sequential" else reached
            # A part that started over past another part's progress: its floor is
            # above the position they have all reached; wait for the others (at a
            # sequential read's own position, the view is compacted for good).
            if reached >= target and (at >= floor or level == "sequential"):
                if at < floor:
                    raise Compacted(floor)
                if session is not None and level == "read-your-writes":
                    session.floor = max(session.floor, reached)
                return _as_of(chains, at, starts, parts), at
            if target > reached >= floor and reached != tried and quiet(metas, keys):
                tried = reached  # an idle maintainer's: the view at the target if unchanged
                same, now = yield from unchanged_since(name, reached, now, layout)
                if same:
                    if session is not None and level == "read-your-writes":
                        session.floor = max(session.floor, target)
                    return _as_of(chains, target, starts, parts), target
        if now + pause > deadline:
            raise Indeterminate(
                f"view {name!r} has not reached position {target} in time"
                if _said(metas.get(keys[0]))
                else f"view {name!r} has no maintainer's progress yet (is it defined, and is "
                "`rubberband views maintain` running?)"
            )
        _, now = yield Sleep(pause)
        pause = min(pause * 2, POLL_CAP)


UNCHANGED_UNCHECKED = mutations.declare(
    "unchanged_unchecked", "views",
    "a reader takes a view at its target without reading its sources' feeds",
)  # fmt: skip
DEFINITIONS_DEEP = 8
"""Views over views a reader follows at most to their base when it shows that nothing
changed (:func:`unchanged_since`); deeper, it waits for the maintainer."""


def unchanged_since(
    name: str, since: int, now: float, layout: Layout | None = None
) -> Generator[Read, tuple[Any, float], tuple[bool, float]]:
    """Did nothing view ``name`` depends on change after position ``since``: neither
    its definition (nor those of the views it is over) nor any key of its sources?
    Then the view at any position from ``since`` to now is the view at ``since``.
    ``(answer, now)`` (``now``: the time when asked); False also when it cannot tell
    (a definition with no known revision, a feed compacted past ``since``, a failed
    read).

    Cheapest first: a peek at the sources' change logs (no place in the order; the
    sources ``layout`` remembers, a hint) fails fast under writes.  Then what decides:
    each definition's revision, and each source's feed page from ``since``, read in
    order after the reader's own position, so nothing changed up to a position past
    it."""
    peeked = layout.sources if layout is not None else None
    try:
        if peeked is not None:
            changed, now = yield from peek([Changed(since, lo, hi) for lo, hi in peeked], now)
            if changed:
                return False, now
        definition = None
        wanted: str | None = name
        for _ in range(DEFINITIONS_DEEP):
            key = catalog_key(wanted)
            (got, revisions), now = yield Read(Revisions(("get", (key,)), (key,)), "sequential")
            value, revised = dict(got).get(key), revisions.get(key)
            if value is None or revised is None or revised > since:
                return False, now
            try:
                view = from_dict(value, key)
            except BadOperation:  # not a definition: nothing to show the view unchanged
                return False, now
            definition = definition or view
            wanted = view.over
            if wanted is None:
                break
        if definition is None or wanted is not None:
            return False, now
        sources = definition.sources
        if layout is not None:
            layout.sources = sources
        if mutations.on(UNCHANGED_UNCHECKED):
            return True, now
        if sources != peeked:
            changed, now = yield from peek([Changed(since, lo, hi) for lo, hi in sources], now)
            if changed:
                return False, now
        for lo, hi in sources:
            page, now = yield Read(Changes(since, lo, hi), "sequential")
            if page.events:
                return False, now
    except RubberbandError:
        return False, now
    return True, now


def _needed(name: str, op: Any, within: Any, parts: tuple[Any, ...]) -> list[int]:
    """The parts whose progress a read of ``op`` (``within``) needs: those its rows may
    be in, and part 0 always (its progress says how the view is split)."""
    if not parts:
        return [0]
    if op[0] == "get":
        return sorted({0, *(part_of(parts, k[2]) for k in op[1] if len(k) > 2)})
    asked = within if within is not None else normalize([(encode_key(op[1]), encode_key(op[2]))])
    bounds = [encode_key(rows_bounds(name)[0])]
    bounds += [encode_key(view_row_key(name, p)) for p in parts]
    bounds.append(encode_key(rows_bounds(name)[1]))
    return [0] + [i for i in range(1, len(parts) + 1)
                  if overlaps(asked, ((bounds[i], bounds[i + 1]),))]  # fmt: skip


def _with(name: str, op: Any, within: Any, keys: list[Any]) -> Any:
    """``op`` (and ``within``) reading the progress ``keys`` too, as one read."""
    if op[0] == "get":
        rows = [k for k in op[1] if k != keys[0]]
        return ("get", (*keys, *rows)), within
    wider = ("scan", op[1], keys_end(name), *op[3:])
    if within is None:
        return wider, None
    return wider, normalize([*within, *(point(k) for k in keys)])


def _rows_only(name: str, chains: dict[Any, Any]) -> dict[Any, Any]:
    """The rows among a read's keys (not any part's progress)."""
    return {k: c for k, c in chains.items() if len(k) > 2 and k[1] == name}


def combined_progress(
    needed: list[int], chains: list[Any]
) -> tuple[int, int, dict[int, int], tuple[Any, ...]] | None:
    """The ``needed`` parts' progress ``chains`` (part 0's first) as one: the position
    every one of them reached, the highest floor, each part's start, and the split
    points they say; None while one has none, or they say other split points than
    part 0's (a maintainer of an older definition)."""
    if not all(_said(chain) for chain in chains):
        return None
    said = [progress_of(chain[-1]) for chain in chains]
    layouts = [_layout(chain[-1]) for chain in chains]
    if any(layout != layouts[0] for layout in layouts):
        return None
    reached = min(s[0] for s in said)
    floor = max(s[1] for s in said)
    return reached, floor, {i: s[2] for i, s in zip(needed, said, strict=True)}, layouts[0]


def _said(chain: Any) -> bool:
    """Does a progress chain end in a progress?  It ends in an absence from
    ``create_view``, which starts each of a view's progress chains absent at the
    position it found the name free: a maintainer of an earlier view of that name,
    stopped and woken after the drop, can then write no progress the new view's
    readers would take (a version below a chain's floor is ignored)."""
    return chain is not None and len(chain) > 1 and len(chain[-1]) > 1


def _layout(entry: Any) -> tuple[Any, ...]:
    value = entry[1]
    if type(value) in (list, tuple) and len(value) > 2:
        return tuple(stored_key(p) for p in value[2])
    return ()


def quiet(metas: dict[Any, Any], keys: list[Any]) -> bool:
    """Do the progress chains under ``keys`` each end in a progress its maintainer
    marked :data:`~rubberband.views.maintain.QUIET` (the pages it reflects had no
    change)?  Only then does a sequential read past it try to show that nothing
    changed since (:func:`unchanged_since`): under writes, the maintainer is about to
    move on, and the check would only delay the read's next look at the progress."""
    for key in keys:
        chain = metas.get(key)
        value = chain[-1][1] if _said(chain) else None
        if type(value) not in (list, tuple) or len(value) < 4 or value[3] != QUIET:
            return False
    return True


def progress_of(entry: Any) -> tuple[int, int, int]:
    """A progress version ``[W, floor]`` or ``[W, [floor, start]]``: ``(W, floor,
    start)`` (start 0: not said)."""
    reached, value = entry
    if type(value) in (list, tuple):
        return reached, value[0], value[1]
    return reached, value, 0


def _as_of(
    chains: dict[Any, Any], at: int, starts: dict[int, int], parts: tuple[Any, ...] = ()
) -> list[tuple[Any, Any]]:
    """The rows as of ``at``.  A row whose version at ``at`` is older than the start
    of its part's maintainer is not in its view: that maintainer wrote every row it
    held at its start, and such a version is another maintainer's, written after this
    one read the old rows (that maintainer may have died before writing the row's
    later absence)."""
    out = []
    for key in sorted(chains, key=encode_key):
        chain = chains[key]
        try:
            present, value = as_of(chain, at)
        except LookupError as e:
            raise Compacted(e.args[0]) from None
        start = starts.get(part_of(parts, key[2]), 0) if parts else starts.get(0, 0)
        if present and _since(chain, at) >= start:
            out.append((key[2], value))
    return out


def _since(chain: Any, at: int) -> int:
    """The position of a chain's version that holds at ``at``."""
    best = -1
    for entry in chain[1:]:
        if entry[0] > at:
            break
        best = entry[0]
    return best
