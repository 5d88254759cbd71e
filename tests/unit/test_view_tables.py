"""Views over a table's rows: the maintainer takes the rows' changes as the engine
reports them (``(ROWS, table, key)`` with the row's images) beside key-value data in one
feed, starts from one select of the table, and every view equals the view recomputed
from the base at every position; key-value views never take a table's rows."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rubberband.changelog import Event
from rubberband.engine import Placement, row_key
from rubberband.errors import BadOperation
from rubberband.keys import encode_key
from rubberband.views.compute import recompute
from rubberband.views.define import ViewDef, catalog_key, from_dict, meta_key, stable_key, view_def
from rubberband.views.maintain import Maintainer
from rubberband.views.steps import Group, group_of

T = ("t", "id")
VIEWS = (
    view_def("by_g", "index", (None, None), on="g", table=T),
    view_def(
        "sums",
        "aggregate",
        (0, 20),
        group_by="g",
        table=T,
        aggregates={"n": ["count", None], "v": ["sum", "v"], "top": ["max", "v"]},
    ),
    view_def("kv", "selection", (None, None)),
    view_def("pairs", "join", (None, None), on="g", table=T, right=(100, 200), right_on="g"),
)

# (True: a table row, False: a key-value key; key; None to delete, else (g, v))
writes = st.lists(
    st.tuples(
        st.booleans(),
        st.integers(0, 30),
        st.one_of(st.none(), st.tuples(st.integers(0, 3), st.integers(-5, 5))),
    ),
    max_size=40,
)


def _change(base: dict[Any, Any], table: bool, key: int, new: Any) -> tuple[Any, str, Any]:
    """Apply one write to ``base`` (keyed as the feed names keys); the change the
    engine reports for it."""
    if table:
        name = row_key(T[0], key)
        before = (base.get(name) or {}).get("row")
        if new is None:
            base.pop(name, None)
            return (name, "delete", {"before": before})
        row = {"id": key, "g": new[0], "v": new[1]}
        base[name] = {"row": row}
        return (name, "put", {"row": row, "before": before})
    kv = 100 + key if key % 2 else key  # some key-value keys in the join's right range
    if new is None:
        base.pop(kv, None)
        return (kv, "delete", None)
    base[kv] = {"g": new[0], "v": new[1]}
    return (kv, "put", base[kv])


@settings(max_examples=150, deadline=None)
@given(initial=writes, history=writes, view=st.sampled_from(VIEWS))
def test_a_table_view_is_exact_at_every_position_from_one_select_and_the_rows_feed(
    initial: list[Any], history: list[Any], view: ViewDef
) -> None:
    base: dict[Any, Any] = {}
    for table, key, new in initial:
        _change(base, table, key, new)
    start = 1  # the select's position: the table's rows as they are then
    snapshot = []
    for side, (lo, hi) in enumerate(view.sources):
        if view.table_of(side) is None:
            rows = [(k, v) for k, v in base.items() if type(k) is int
                    and (lo is None or k >= lo) and (hi is None or k < hi)]  # fmt: skip
        else:
            rows = [(k, v) for k, v in base.items() if type(k) is tuple]
        snapshot.append([(rows, start)])
    states = {start: dict(base)}
    events = []
    for i, (table, key, new) in enumerate(history):
        events.append(Event(start + 1 + i, (_change(base, table, key, new),)))
        states[start + 1 + i] = dict(base)
    m = Maintainer(view)
    versions: dict[Any, list[Any]] = {}

    def take(out: list[Any]) -> None:
        for _name, entries, *_ in out:
            for k, entry in entries:
                if k not in (meta_key(view.name), stable_key(view.name)):
                    versions.setdefault(encode_key(k[2]), []).append(entry)

    take(m.start([], snapshot, 0.0))
    end = start + len(history) + 1
    for side in range(len(view.sources)):
        take(m.page(side, end, events, 0.0))
    assert m.position == end
    for t, state in states.items():
        want = {ek: v for ek, (_k, v) in recompute(view, [state] * len(view.sources)).items()}
        got = {}
        for ek, chain in versions.items():
            entries = [e for e in chain if e[0] <= t]
            if entries and len(entries[-1]) == 2:
                got[ek] = entries[-1][1]
        assert got == want, t
    if view.name == "kv":  # a key-value view over everything takes no table row
        assert all(type(k) is int for k, _v in m.rows.rows.values())


def test_a_table_view_names_its_table_and_keeps_it_through_the_catalog() -> None:
    view = VIEWS[3]
    assert view.tables == (T, None) and view.table_of(0) == T and view.table_of(1) is None
    assert from_dict(view.to_dict()) == view
    over = view_def("over", "selection", (None, None), over="by_g", base=VIEWS[0].sources,
                    tables=VIEWS[0].tables)  # fmt: skip
    assert over.tables == (T,) and over.table_of(0) is None  # its base: by_g's rows
    assert from_dict(over.to_dict()) == over
    # Views over the same range of a table and of key-value data are two groups.
    assert group_of(VIEWS[0]) != group_of(VIEWS[2]) and group_of(over) == group_of(VIEWS[0])
    with pytest.raises(ValueError, match="other sources"):
        Group([VIEWS[0], VIEWS[2]])
    for bad in ("t", ("t",), ("t", ""), ("t", 1)):
        with pytest.raises(BadOperation, match="table name, its key column"):
            view_def("x", "selection", (None, None), table=bad)
    with pytest.raises(BadOperation, match="right_table= belongs to joins"):
        view_def("x", "selection", (None, None), right_table=T)


def test_a_view_over_a_table_on_an_engine_without_tables_says_why_it_cannot_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The driver asks the client's engine operations for the table's select; without
    them the step is refused, every time, and the maintainer says so as a warning."""
    import asyncio
    import logging
    from types import SimpleNamespace

    from rubberband.views.client import drive
    from rubberband.views.steps import maintain_group_steps

    class NoTables:
        core = SimpleNamespace(ops=object())  # a key-value engine's operations
        placement = Placement()

        def segments(self) -> list[Any]:
            return []

        async def read(self, op: Any, isolation: str, within: Any = None,
                       with_position: bool = False) -> Any:  # fmt: skip
            return ([], 5) if with_position else []

    async def go() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.2, stop.set)
        await drive(NoTables(), maintain_group_steps(Group([VIEWS[0]])), stop)

    with caplog.at_level(logging.WARNING, logger="rubberband.views"):
        asyncio.run(go())
    assert "needs a client whose engine has tables" in caplog.text


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(0, 25),
    page=st.integers(1, 6),
    seed=st.integers(0, 1000),
    limit=st.one_of(st.none(), st.integers(1, 4)),
)
def test_a_table_backfills_in_pages_each_at_its_own_position(
    rows: int, page: int, seed: int, limit: int | None
) -> None:
    """A table's rows are read as its keys first, then the key ranges between every
    ``page``-th key, each at a position of its own, the table written between any two
    reads: the view the maintainer starts from equals the view recomputed at its start
    (so a table too big for one answer backfills), and a page holds ``page`` rows and
    what was written since the keys were read.  With ``limit``, an answer of more rows
    is refused as too large to send (rows bigger than most): the page is halved until
    it fits."""
    import random

    from rubberband.changelog import Changes, Page
    from rubberband.errors import Rejected
    from rubberband.views.snapshots import KeyPage, TableRows
    from rubberband.views.steps import Both, Pipe, Read, Write, maintain_group_steps

    rng = random.Random(seed)
    view = VIEWS[1]  # the aggregate over table rows with keys in [0, 20)
    base: dict[Any, Any] = {}
    for k in range(rows):
        _change(base, True, k, (k % 3, k))
    t, log, states = 1, [], {1: dict(base)}
    written: dict[Any, list[Any]] = {}
    sizes: list[int] = []  # rows in each page
    bounds: list[int] = []  # what each page may hold: a page's keys, and the writes since
    listed: list[int] = []  # keys in each listing
    listed_at = [0]  # the last listing's position

    def in_range(k: Any, lo: Any, hi: Any) -> bool:
        return (lo is None or k >= lo) and (hi is None or k < hi)

    def answer(request: Any) -> Any:
        if type(request) in (Both, Pipe):
            answer(request.write)
            return answer(request.read)
        if type(request) is Write:
            for _op, entries, *_ in request.ops:
                for key, entry in entries:
                    written.setdefault(key, []).append(entry)
            return None
        if type(request) is not Read:
            return None
        op = request.op
        if type(op) is TableRows:
            got = [(name[2], v["row"]) for name, v in base.items()
                   if type(name) is tuple and in_range(name[2], op.lo, op.hi)]  # fmt: skip
            if op.keys_only:
                listed.append(len(got))
                listed_at[0] = t
                return [(k, {"id": k}) for k, _row in got], t
            if limit is not None and len(got) > limit:
                raise Rejected("the answer is too large to send: read less at once")
            sizes.append(len(got))
            bounds.append(page + sum(1 for e in log if e.position > listed_at[0]))
            return got, t
        if type(op) is Changes:
            return Page(t, [e for e in log if e.position > op.since])
        if type(op) is KeyPage:
            return ([], None), t  # the view's old rows: none
        if request.aside:  # the maintainer's look at the catalog: the view is defined
            return {catalog_key(view.name): view.to_dict()}
        return ([], t) if request.with_position else []

    steps = maintain_group_steps(Group([view]), poll=0.01, page_rows=page)
    request = next(steps)
    for _ in range(3000):
        if meta_key(view.name) in written:
            break
        t += 1  # every request at a position of its own, as in the total order
        try:
            reply, error = answer(request), None
        except Rejected as e:
            reply, error = None, e
        t += 1
        # With a limit, the rows listed are rewritten (or deleted) but no key is new, so
        # a range of one listed key never holds more than one row.
        key = rng.randrange(0, 30) if limit is None else rng.randrange(0, max(1, rows))
        new = None if rng.random() < 0.3 else (rng.randrange(3), rng.randrange(10))
        log.append(Event(t, (_change(base, True, key, new),)))
        states[t] = dict(base)
        request = steps.throw(error) if error else steps.send((reply, float(t)))
    assert meta_key(view.name) in written, "the view never started"
    reached = written[meta_key(view.name)][0][0]  # the first progress: the start and after
    at = max(p for p in states if p <= reached)  # the table as of it
    want = {ek: v for ek, (_k, v) in recompute(view, [states[at]]).items()}
    got = {}
    for k, chain in written.items():
        if len(k) == 3 and k[1] == view.name:
            entry = [e for e in chain if e[0] <= reached][-1]
            if len(entry) == 2:
                got[encode_key(k[2])] = entry[1]
    assert got == want
    # One page a ``page`` keys listed; each holds those and the rows written since the
    # listing (one write after each request: the start's feed reads between the pages
    # are requests too, so counted as written, not as one a page).
    if limit is None:
        assert listed and len(sizes) == 1 + len(range(page, listed[0], page))
        assert all(n <= most for n, most in zip(sizes, bounds, strict=True))
    else:
        # Halved until each fits (a range of one listed key that rows written since
        # the listing overfilled starts the backfill over, listing the keys anew).
        # (Without the halving the view never starts: the refusals repeat for ever.)
        assert all(n <= limit for n in sizes)
        assert len(sizes) >= -(-listed[-1] // page)  # the last listing's pages at least


def test_a_catalog_entry_that_is_no_definition_is_left_out_and_named() -> None:
    """Any client can write under the catalog's keys: ``list_views`` (what a maintainer
    asks each second) took every entry for a definition, and the first that was not
    raised a TypeError or KeyError that stopped the maintainer with every view it kept."""
    import asyncio

    from rubberband.views.client import list_views
    from rubberband.views.define import catalog_key

    good = VIEWS[0]
    entries = [
        (catalog_key(good.name), good.to_dict()),
        (catalog_key("junk"), "not a definition"),
        (catalog_key("empty"), {}),
        (catalog_key("mimic"), good.to_dict()),  # another view's definition, copied
        (catalog_key("kind"), {**good.to_dict(), "name": "kind", "kind": ["index"]}),
        (list(catalog_key(good.name)), good.to_dict()),  # a key as the wire gives it back
    ]

    class Catalog:
        async def read(self, op: Any, level: str) -> Any:
            return entries

    malformed: list[Any] = []
    views = asyncio.run(list_views(Catalog(), malformed))
    assert views == [good, good]
    assert [k[1] for k, _ in malformed] == ["junk", "empty", "mimic", "kind"]
    assert all(type(why) is str and why for _, why in malformed)
    for _, value in entries[1:5]:
        with pytest.raises(BadOperation):
            from_dict(value, catalog_key("x"))
