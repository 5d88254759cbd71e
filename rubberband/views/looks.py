"""A maintainer's looks at the catalog of views before it writes a view's rows: that
the definition it computes the view by is still the catalog's, at a position past the
pages the rows come from (``docs/views.md``, "A view dropped and defined anew under
the same name")."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from rubberband.errors import BadOperation
from rubberband.views.define import ViewDef, catalog_key, from_dict, unit_name, units
from rubberband.views.maintain import Maintainer
from rubberband.views.requests import Read

CONFIRMED_FOR = 0.75
"""Seconds after a catalog read that held a view's definition was sent during which
a page answered may have the view's rows written without another look (:func:`confirm`).
A view dropped and defined anew under the same name has ``rubberband.views.client.
DROP_SETTLE`` (1.5 s, more than this) between the two: the drop's order came after
that read was sent, the new definition's at least that long after, and a page
answered within this time was ordered before it."""
Doubts = dict[str, tuple[ViewDef, float]]
"""Views whose definition the catalog contradicted, each with the time until which its
definition as the loop has it is not started again."""


def confirm(
    views: list[ViewDef], long: bool = False
) -> Generator[Read, tuple[Any, float], tuple[set[str], float]]:
    """The units among ``views`` whose definition the catalog does not hold (dropped,
    defined anew, or not written), read in order after the pages whose rows are about
    to be written: ``(their names, now)``.  The driver learns of a drop or a new
    definition about a second late (``rubberband views maintain`` reads the catalog
    once a second), and a maintainer paused in between (a stopped process, a slow
    machine) woke up to compute and write the view of a definition gone, at positions
    past a new one's start under the same name, where readers took its rows for the
    new view's.  A catalog read ordered after the pages settles it: a view written
    from a page is the view its catalog held at a position past that page.  A look
    a round would lengthen every round by a round trip; one a while
    (:data:`CONFIRMED_FOR`) holds as long, since a new definition comes that long
    after a drop.  ``long``: the step after it computes much (a view's start)."""
    keys = tuple(dict.fromkeys(catalog_key(v.name) for v in views))
    got, now = yield Read(("get", keys), "sequential", long=long, aside=True)
    doubted = set()
    for view in views:
        key = catalog_key(view.name)
        try:
            held = units(from_dict(got[key], key)) if key in got else []
        except BadOperation:
            held = []
        if view not in held:
            doubted.add(unit_name(view))
    return doubted, now


def doubt(
    members: dict[str, Maintainer], writes: dict[str, Any], doubted: set[str], doubts: Doubts,
    until: float,
) -> None:  # fmt: skip
    """The ``doubted`` members left out with their writes, and the views over them: the
    driver drops or defines them anew within a second, and a definition the catalog
    held after all (a read that raced a redefinition back) starts again then."""
    for name, m in leave(members, writes, [n for n in members if n in doubted]).items():
        doubts[name] = (m.view, until)


def leave(
    members: dict[str, Maintainer], writes: dict[str, Any], gone: list[str]
) -> dict[str, Maintainer]:
    """The members named in ``gone`` taken out of ``members`` with their writes, and
    then each view over one taken out, deepest last: those taken out."""
    out = {}
    while gone:
        for name in gone:
            out[name] = members.pop(name)
            writes.pop(name, None)
        gone = [n for n, m in members.items() if m.view.over is not None
                and m.view.over not in members]  # fmt: skip
    return out


class Looks:
    """A maintainer loop's looks: when a catalog read that held each view was sent, and
    the views the catalog contradicted (not started again for ``retry`` seconds)."""

    def __init__(self, retry: float) -> None:
        self.retry = retry
        self.doubts: Doubts = {}
        self.confirmed: dict[str, float] = {}

    def doubted(self, name: str, view: ViewDef, now: float) -> bool:
        got = self.doubts.get(name)
        return got is not None and got[0] == view and now < got[1]

    def begun(
        self, members: dict[str, Maintainer], name: str, view: ViewDef,
        started: Maintainer | None, began: float, now: float,
    ) -> None:  # fmt: skip
        """A start made (``started``, its look sent after ``began``), or refused."""
        if started is None:
            self.doubts[name] = (view, now + self.retry)
        else:
            members[name], self.confirmed[name] = started, began

    def look(
        self, members: dict[str, Maintainer], writes: dict[str, Any], now: float
    ) -> Generator[Read, tuple[Any, float], float]:
        """Before a round's ``writes`` go out (``now``: its last page's answer), a look
        at the definitions of the views to write that no look holds for
        (:data:`CONFIRMED_FOR`); the views it contradicts left out.  Returns the time."""
        made = [m.view for n, m in members.items() if writes.get(n)
                and now - self.confirmed.get(n, float("-inf")) > CONFIRMED_FOR]  # fmt: skip
        if made:
            sent = now
            doubted, now = yield from confirm(made)
            self.confirmed.update((unit_name(v), sent) for v in made)
            doubt(members, writes, doubted, self.doubts, now + self.retry)
        return now
