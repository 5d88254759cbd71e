"""A maintainer started from a paged snapshot: each page of a source is exact as of its
own position, the feed follows from the first page's, and the view it starts with
(and keeps) equals the view of the whole base at every position."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rubberband.changelog import Event
from rubberband.keys import encode_key
from rubberband.proto import H
from rubberband.views.compute import recompute
from rubberband.views.define import meta_key, stable_key, view_def
from rubberband.views.maintain import Maintainer

VIEW = view_def("by_g", "index", (0, 100), on="g")

writes = st.lists(
    st.tuples(st.integers(0, 30), st.one_of(st.none(), st.integers(0, 3))), max_size=40
)


def _apply(base: dict[int, Any], key: int, g: int | None) -> None:
    if g is None:
        base.pop(key, None)
    else:
        base[key] = {"g": g}


@settings(max_examples=200, deadline=None)
@given(
    initial=st.dictionaries(st.integers(0, 30), st.integers(0, 3), max_size=25),
    history=writes,
    page_rows=st.integers(1, 8),
    pages_every=st.integers(1, 4),
)
def test_a_paged_snapshot_starts_the_view_exact_at_every_later_position(
    initial: dict[int, int], history: list[tuple[int, int | None]], page_rows: int,
    pages_every: int,
) -> None:  # fmt: skip
    """Writes go on while the pages are read (``pages_every`` writes between two
    pages): the view rows written up to each position equal the view of the base then."""
    base: dict[int, Any] = {k: {"g": g} for k, g in initial.items()}
    states = {0: dict(base)}
    events: list[Event] = []
    position = 0
    pages: list[tuple[list[Any], int]] = []
    after_key: int | None = None
    i = 0

    def write() -> None:
        nonlocal position, i
        position += 1
        key, g = history[i]
        i += 1
        _apply(base, key, g)
        how = "delete" if g is None else "put"
        events.append(Event(position, ((key, how, None if g is None else {"g": g}),)))
        states[position] = dict(base)

    while True:
        for _ in range(pages_every):
            if i < len(history):
                write()
        position += 1  # the page's read has a position of its own
        keys = sorted(k for k in base if after_key is None or k > after_key)
        rows = [(k, base[k]) for k in keys[:page_rows]]
        pages.append((rows, position))
        if len(keys) <= page_rows:
            break
        after_key = rows[-1][0]
    while i < len(history):
        write()
    m = Maintainer(VIEW)
    versions: dict[Any, list[Any]] = {}

    def take(writes_out: list[Any]) -> None:
        for _name, entries, *_ in writes_out:
            for key, entry in entries:
                if key not in (meta_key(VIEW.name), stable_key(VIEW.name)):  # not a row
                    versions.setdefault(encode_key(key[2]), []).append((key, entry))

    take(m.start([], [pages], 0.0))
    feed = [e for e in events if e.position > m.since[0]]  # the feed from where it asks
    take(m.page(0, position + 1, feed, 0.0))
    assert m.position == position + 1
    for t in range(pages[-1][1], position + 1):
        state = states[max(p for p in states if p <= t)]
        want = {ek: v for ek, (_k, v) in recompute(VIEW, [state]).items()}
        got = {}
        for ek, chain in versions.items():
            entries = [e for _k, e in chain if e[0] <= t]
            if entries and len(entries[-1]) == 2:
                got[ek] = entries[-1][1]
        assert got == want, (t, pages)


def test_split_points_are_checked_and_a_view_over_a_view_is_not_split() -> None:
    from rubberband.errors import BadOperation
    from rubberband.views import view_def

    for parts, says in [
        ([(5,), (2,)], "increasing"),
        ([(2,), (2,)], "increasing"),
        ([object()], "key value"),
        (list(range(70)), "at most 63"),
    ]:
        with pytest.raises(BadOperation, match=says):
            view_def("v", "index", (0, 10), on="g", parts=parts)
    with pytest.raises(BadOperation, match="one part"):
        view_def("w", "selection", (None, None), over="v", base=[(0, 10)], parts=[1])
    assert view_def("v", "index", (0, 10), on="g", parts=[[2, "x"]]).parts == ((2, "x"),)


def test_a_pages_rows_are_cut_into_messages_by_count_and_by_bytes() -> None:
    """Rows of large values travel in messages of about ``BATCH_BYTES``: 500 rows of a
    projection of 64 KB values would not fit E-Cast's frame in one."""
    from rubberband.views.maintain import BATCH_BYTES, BATCH_KEYS, _parts

    small = [((i,), [1, {"n": i}]) for i in range(BATCH_KEYS + 1)]
    assert [len(p) for p in _parts(small)] == [BATCH_KEYS, 1]
    big = [((i,), [1, "x" * (64 << 10)]) for i in range(200)]
    parts = _parts(big)
    assert [e for p in parts for e in p] == big  # every row once, in order
    assert all(sum(len(e[1][1]) for e in p) <= BATCH_BYTES for p in parts)
    assert len(parts) == 4  # 63 values of 64 KiB (and their headers) in 4 MiB
    absent = [((0,), [5])]  # a row's absence: no value
    assert _parts(absent) == [absent]


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(
        st.one_of(st.none(), st.integers(0, 40), st.sampled_from([200 << 10, (1 << 20) + 1])),
        max_size=1_200,
    )
)
def test_a_pages_messages_are_cut_as_each_rows_measure_cuts_them(sizes: list[Any]) -> None:
    """Measured a message at a time (most pages: small rows) or row by row (a large
    one among them), the rows are cut alike, and a row over the limit is refused."""
    from rubberband.views.maintain import RowTooLarge, _measured, _parts

    entries = [(("~view", "v", i), [1] if n is None else [1, "x" * n]) for i, n in enumerate(sizes)]
    try:
        want = _measured(entries)
    except RowTooLarge:
        with pytest.raises(RowTooLarge):
            _parts(entries)
        return
    assert _parts(entries) == want


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = (value,)
    return value


group_values = st.one_of(
    st.integers(-3, 3),
    st.text(max_size=3),
    st.floats(allow_nan=False, width=32),
    st.booleans(),
    st.none(),
    st.binary(max_size=2),
    st.tuples(st.integers(0, 3), st.text(max_size=2)),
    st.integers(5, 8).map(_nested),  # too deep for a row's key from 7 (index) or 8
)
MAINTAINED = [
    view_def("sel", "selection", (0, 30), where=[("n", ">=", 2)]),
    view_def("idx", "index", (0, 30), on="g", columns=["n"]),
    view_def("agg", "aggregate", (0, 30), group_by="g", aggregates={"n": ["count", None]}),
    view_def("join", "join", (0, 20), on="g", right=(10, 30), right_on="g", columns=["n"]),
    view_def("part", "index", (0, 30), on="g", parts=[[1, 0]]),
]


@settings(max_examples=300, deadline=None)
@given(
    view=st.sampled_from(MAINTAINED),
    old=st.lists(st.integers(0, 5), max_size=3),
    changes=st.lists(
        st.tuples(
            st.integers(0, 1), st.integers(0, 29), st.none() | group_values, st.integers(0, 4)
        ),
        max_size=80,
    ),
    per_page=st.sampled_from([1, 2, 6, 80]),
)
def test_a_maintainers_rows_carry_the_ranges_its_engine_would_find(
    view: Any, old: list[int], changes: list[tuple[int, int, Any, int]], per_page: int
) -> None:
    """A maintainer's row writes carry their ranges (``Placed``): the ones ``part_fun``
    finds from their keys, or past :data:`~rubberband.messages.EXACT_RANGES` keys the
    one range from the lowest to the highest of those, on the writes as
    :meth:`Maintainer.in_order` sends them too.  A value nested too deep to sit in a
    row's key makes no row (before, an index on it raised in the maintainer, and other
    kinds made a write refused at every try)."""
    from rubberband.engine import Placed, Placement
    from rubberband.keys import covers
    from rubberband.messages import EXACT_RANGES
    from rubberband.views.define import row_key
    from storage_adapters.memory import KVOps

    ops, ranged = KVOps(), Placement()
    sides = len(view.sources)
    m = Maintainer(view)
    writes = [m.start([(row_key(view.name, ("old", k)), [0, 1]) for k in old],
                      [[([], 1)]] * sides, 0.0)]  # fmt: skip
    position = 1
    for i in range(0, len(changes), per_page):
        position += 1
        events: list[list[Event]] = [[] for _ in range(sides)]
        for side, key, g, n in changes[i : i + per_page]:
            change = (key, "delete", None) if g is None else (key, "put", {"g": g, "n": n})
            events[side % sides].append(Event(position, (change,)))
        for side in range(sides):
            writes.append(m.page(side, position + 1, events[side], 0.0))
    for made in writes:
        if not made:
            continue
        for op in [*made, *Maintainer.in_order(made)[0]]:
            if type(op) is Placed:
                want = ops.part_fun(tuple(op), ranged).ranges
                if len(want) <= EXACT_RANGES:
                    assert op.ranges == want
                else:  # every key's point, and nothing below the lowest or above the highest
                    assert covers(op.ranges, want) and len(op.ranges) <= 2, op.ranges
                    assert (op.ranges[0][0], op.ranges[-1][1]) == (want[0][0], want[-1][1])
                assert op.places == tuple(encode_key(key) for key, _entry in op[1])
            else:
                assert not any(key[:2] == ("~view", view.name) and len(key) == 3
                               for key, _entry in op[1]), op  # fmt: skip


def test_a_write_of_many_rows_names_the_range_around_them_and_travels_as_before() -> None:
    """Past ``EXACT_RANGES`` rows a write names the one range from its lowest key to
    its highest, where the maintainer flattened and sorted every key for their points;
    the message a client makes of it names what it named then (a range around the keys
    of each piece of the ring), and travels packed."""
    from rubberband.engine import Placed, Placement
    from rubberband.messages import EXACT_RANGES, Messages
    from storage_adapters.memory import KVOps

    view = MAINTAINED[1]  # an index of the keys 0-29 on g
    m = Maintainer(view)
    m.start([], [[([(k, {"g": 0, "n": 1}) for k in range(30)], 1)]], 0.0)
    moved = [Event(3, tuple((k, "put", {"g": 1 + k % 4, "n": 1}) for k in range(30)))]
    rows = [op for op in m.page(0, 4, moved, 0.0) if type(op) is Placed]
    assert [len(op[1]) for op in rows] == [60]  # each row written absent, and anew
    (op,) = rows
    want = KVOps().part_fun(tuple(op), Placement()).ranges
    assert len(want) == 60 > EXACT_RANGES
    assert op.ranges == ((want[0][0], want[-1][1]),)
    payload, header = Messages(KVOps()).write_message(op)
    assert header == Messages(KVOps())._alone(tuple(op), want)[1]
    assert type(payload) is bytes and header[H.PACKED] == 1


def test_a_placed_write_goes_where_it_says_under_range_partitioning_alone() -> None:
    """A maintainer's rows are placed; under hash partitioning a client asks
    ``part_fun`` whatever a write says."""
    from rubberband.engine import Placed, Placement
    from rubberband.keys import point
    from rubberband.messages import Messages
    from storage_adapters.memory import KVOps

    m = Maintainer(VIEW)
    m.start([], [[([], 1)]], 0.0)
    made = m.page(0, 3, [Event(2, ((4, "put", {"g": 1}),))], 0.0)
    rows, _stable = Maintainer.in_order(made)
    assert [type(op) for op in made] == [Placed, tuple] and type(rows[-1]) is Placed
    assert rows[-1].ranges == KVOps().part_fun(tuple(rows[-1]), Placement()).ranges

    op = Placed(("version", (((0,), [3, 1]),), 0), (point("elsewhere"),))
    assert op == ("version", (((0,), [3, 1]),), 0)
    assert Messages(KVOps())._write_ranges(op) == (point("elsewhere"),)
    payloads = [Messages(KVOps()).write_message(op)[0],
                *(m[1] for m in Messages(KVOps()).writes_of([op, op], 16, 1 << 20))]  # fmt: skip
    assert [type(p) for p in payloads] == [tuple] * 3  # on the wire: a plain write
    hashed = Placement("hash")
    want = KVOps().part_fun(tuple(op), hashed).ranges
    assert Messages(KVOps(), hashed)._write_ranges(op) == want != (point("elsewhere"),)


def test_a_pages_rows_travel_a_message_a_piece_of_the_ring_the_progress_last() -> None:
    """Every holder of any of a message's keys decodes all of it: a page's rows go out
    one message per piece of the ring, each to that piece's holders alone, and the
    piece with the progress (the last pair, which readers take as the sign that every
    row before it is there) last.  Each part is the page's write restricted to its
    piece, and the storage processes end up with what one message would have left."""
    import msgpack

    from rubberband.client import ClientCore
    from rubberband.engine import Placed
    from rubberband.views.define import row_key
    from storage_adapters.memory import KVOps
    from tests.rubberband_model import Model

    def ring(ids: list[Any]) -> Model:
        m = Model(f=2)
        for i, at in enumerate(ids):
            m.join_storage(f"storage:{i}")
            m.reconfigure(("expand", f"storage:{i}", at))
            m.settle()
        return m

    maintainer = Maintainer(VIEW)
    maintainer.start([], [[([], 1)]], 0.0)
    events = [Event(2 + k, ((k, "put", {"g": k % 10}),)) for k in range(60)]
    made = maintainer.page(0, 70, events, 0.0)
    rows, _stable = Maintainer.in_order(made)
    (op,) = rows
    assert type(op) is Placed and op.places == tuple(encode_key(k) for k, _ in op[1])
    cuts = [0, row_key("by_g", (3, 0)), row_key("by_g", (7, 0)), meta_key("by_g")]
    whole, split = ring(cuts), ring(cuts)
    for m, pieces in ((whole, False), (split, True)):
        client = ClientCore(KVOps())
        client.learn(m.config.version, m.config.keyspace.to_state())
        if not pieces:
            client.keyspace = None  # (no ring known: one message, as before)
        sent = client.writes_of([op], 32, 1 << 20)
        assert all(indices == (0,) for indices, _, _ in sent)
        parts = [msgpack.unpackb(p, use_list=False) if type(p) is bytes else p
                 for _, p, _ in sent]  # fmt: skip
        if pieces:
            assert len(sent) == 3  # g 0-2, 3-6 and 7-9 with the progress
            assert sorted(pair for part in parts for pair in part[1]) == sorted(op[1])
            assert parts[-1][1][-1] == op[1][-1] and parts[-1][1][-1][0] == meta_key("by_g")
            for part, (_, _, header) in zip(parts, sent, strict=True):
                assert part[::2] == op[::2] and part[3:] == op[3:]
                assert header[H.WRITES] == client.routable(
                    KVOps().part_fun(part, m.placement).ranges
                )
        else:
            assert len(sent) == 1
        for _, payload, header in sent:
            dests = m.submit("maintainer:m", header, payload)
            assert len(dests) == (2 if pieces else 4), dests
        m.settle()
    # (as the wire would carry them: the model hands a part's lists over as they are)
    held = [msgpack.packb(sorted(s.engine.items())) for s in whole.storage.values()]
    assert held == [msgpack.packb(sorted(s.engine.items())) for s in split.storage.values()]
    assert sum(len(s.engine.items()) for s in split.storage.values()) == 2 * len(op[1])


_VKEYS = st.recursive(
    st.integers(-(2**63), 2**63 - 1) | st.text(max_size=4) | st.binary(max_size=4)
    | st.floats(allow_nan=False) | st.booleans(),
    lambda inner: st.tuples(inner, inner),
    max_leaves=4,
)  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(vkeys=st.lists(_VKEYS, min_size=1, max_size=30), bulk=st.sampled_from([0, 2_500]))
def test_dead_rows_are_kept_packed_and_dropped_a_budget_at_a_time(
    vkeys: list[Any], bulk: int
) -> None:
    """A row written absent is kept, until the reclaim floor passes it, packed with the
    others of its write (a pair of objects each took 266 bytes); the drops give back
    every key as it was (a tuple as a tuple, bytes as bytes, a float as a float), in
    order, at most ``RECLAIMS`` a page, the rest the next.  ``dead_rows`` (the
    operator's gauge of what the replicas still hold for them) counts those not yet
    sent, down to none."""
    from rubberband.views.define import row_key
    from rubberband.views.maintain import BATCH_KEYS, RECLAIMS

    keys = [row_key("idx", v) for v in vkeys] + [row_key("idx", ("bulk", i)) for i in range(bulk)]
    old = list({encode_key(key): key for key in reversed(keys)}.values())[::-1]  # (a view's
    # rows, as a read gives them: each key once, told apart as Rubberband tells keys apart)
    m = Maintainer(MAINTAINED[1])
    m.start([(key, [0, 1]) for key in old], [[([], 1)]], 0.0)  # none is in the view now
    assert len(m.dead) == 1 and type(m.dead[0][1]) is bytes
    assert m.dead_rows == len(old)
    m._upto = m.position  # (its reclaim floor written and stable)
    dropped: list[Any] = []
    for _ in range(3):
        ops = [op for op in m._reclaims(m.position) if op[0] == "reclaim"]
        assert sum(len(op[1]) for op in ops) <= RECLAIMS
        assert all(len(op[1]) <= BATCH_KEYS for op in ops)
        dropped += [key for op in ops for key in op[1]]
        assert m.dead_rows == len(old) - len(dropped)
    assert [repr(k) for k in dropped] == [repr(k) for k in old]
    assert not m.dead and m.reclaimed == len(dropped)


def test_a_start_writes_no_row_absent_again_yet_drops_it_in_its_turn() -> None:
    """A start among an earlier maintainer's rows: one still present but no longer in
    the view is written absent at the start, one back in the view is written present,
    and one whose chain ends in an absence already is written nothing (no reader at the
    start or after sees it either way: under load a start rewrote hundreds of
    thousands of them) yet is dropped with the others once the reclaim floor passes
    the start."""
    from rubberband.versions import dead_by, merge
    from rubberband.views.define import row_key

    m = Maintainer(VIEW)
    row = lambda g, k: row_key("by_g", (g, k))  # noqa: E731
    old = {
        row(1, 5): [0, [2, {"g": 1}]],  # present, but key 5 is in group 2 now
        row(2, 5): [0, [3, {"g": 2}], [4]],  # left once, back at the start
        row(3, 6): [0, [2, {"g": 3}], [6]],  # left the view, and still out of it
        row(0, 7): [0, [1, {"g": 0}], [3]],  # the same
    }
    writes = m.start(list(old.items()), [[([(5, {"g": 2}), (8, {"g": 0})], 10)]], 0.0)
    written = {k: e for op in writes if op[0] == "version" for k, e in op[1] if k in old}
    assert written == {row(1, 5): [10], row(2, 5): [10, {"g": 2}]}
    assert m.dead_rows == 3  # the one written absent, and the two absent already
    # Each replica holds the chains; once the reclaim floor passes the start, the
    # drops name every row that is absent, and each such chain is dead by then.
    chains = {k: merge(c, [written[k]], 0, k) if k in written else c for k, c in old.items()}
    m._upto = 10  # (its reclaim floor written and stable)
    drops = [k for op in m._reclaims(10) if op[0] == "reclaim" for k in op[1]]
    assert sorted(map(repr, drops)) == sorted(map(repr, [row(1, 5), row(3, 6), row(0, 7)]))
    assert all(dead_by(chains[k], 10) for k in drops) and not dead_by(chains[row(2, 5)], 10)
    assert m.dead_rows == 0
