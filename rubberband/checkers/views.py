"""Views against their base: every view read equals the view recomputed from the base
tables as of the position the read reports.

The base history is a change feed of every source range (:mod:`rubberband.changelog`:
each write's changes at its position, gap-free), started from a base state known at a
position (empty at 0, or a snapshot read's rows at its position).  A read's rows must
be exactly :func:`rubberband.views.compute.recompute` of the base at that position:
nothing missing, nothing extra, no aggregate off by one change, never a state that no
position had.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import Any, NamedTuple

from rubberband.changelog import Event
from rubberband.keys import encode_key
from rubberband.views.compute import recompute_over, same
from rubberband.views.define import ViewDef


class ViewRead(NamedTuple):
    """A read of a view: the position it reports and the rows it returned
    (``[(row key, value), ...]`` as :meth:`rubberband.views.View.scan` returns them,
    or only some rows: ``keys`` names which were asked for, or says of a row key
    whether it was, as for an index lookup)."""

    position: int
    rows: Sequence[tuple[Any, Any]]
    keys: Sequence[Any] | Callable[[Any], bool] | None = None
    level: str = ""


def check_view_reads(
    view: ViewDef,
    start: tuple[dict[Any, Any], int],
    events: Sequence[Event],
    reads: Sequence[ViewRead],
    under: Sequence[ViewDef] = (),
) -> list[str]:
    """What is wrong with ``reads`` of ``view`` (empty: nothing).  ``start``: the base
    (all sources' keys) and the position it is as of; ``events``: every base write
    after it, in order; reads at positions before the start are not judged.  A view
    over a view: ``under`` are the views beneath it, the one over the base first."""
    problems: list[str] = []
    base, at = dict(start[0]), start[1]
    ordered = sorted(events, key=lambda e: e.position)
    if any(a.position == b.position for a, b in pairwise(ordered)):
        problems.append("the base history has two events at one position")
    i = 0
    for read in sorted(reads, key=lambda r: r.position):
        if read.position < at:
            continue
        while i < len(ordered) and ordered[i].position <= read.position:
            for key, how, value in ordered[i].changes:
                if how == "delete":
                    base.pop(key, None)
                else:
                    base[key] = value
            i += 1
        # {encoded key: (key, value)}
        want = recompute_over([*under, view], [base] * len((under or [view])[0].sources))
        asked = read.keys
        if asked is not None:
            inside = asked if callable(asked) else {encode_key(k) for k in asked}.__contains__
            want = {e: kv for e, kv in want.items() if inside(kv[0] if callable(asked) else e)}
        got = {encode_key(k): (k, v) for k, v in read.rows}
        if len(got) != len(read.rows):
            problems.append(f"a read at {read.position} returned a row twice")
        missing = [kv[0] for e, kv in want.items() if e not in got]
        extra = [kv[0] for e, kv in got.items() if e not in want]
        wrong = [(kv[0], got[e][1], kv[1]) for e, kv in want.items()
                 if e in got and not same(got[e][1], kv[1])]  # fmt: skip
        if missing or extra or wrong:
            problems.append(
                f"{read.level or 'a'} read of {view.name} at position {read.position}: "
                f"missing {missing[:3]}, extra {extra[:3]}, wrong {wrong[:3]}"
            )
    return problems
