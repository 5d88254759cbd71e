"""Change feeds (rubberband.changelog): every write's changes at its position, read as a
chain of sequential reads, identical at every replica, compacted with a clear error."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ecast.core import mutations
from rubberband.changelog import (
    HISTORY_TWICE,
    PEEK_CHANGES,
    Changed,
    ChangeLog,
    Changes,
    Event,
    Page,
    merge,
)
from rubberband.errors import BadOperation, Compacted, Rejected
from rubberband.keys import EVERYTHING, encode_key
from rubberband.proto import Answer, Peek, Stale
from storage_adapters.memory import MemoryEngine
from tests.rubberband_client_rig import Rig
from tests.rubberband_model import Model


def page(rig: Rig, since: int | None, lo: Any = None, hi: Any = None) -> Page:
    done = rig.until_done(rig.read(Changes(since, lo, hi), "sequential"))
    if done.error is not None:
        raise done.error
    return done.result  # type: ignore[no-any-return]


def peek(rig: Rig, since: int, lo: Any = None, hi: Any = None) -> bool:
    done = rig.until_done(rig.read(Changed(since, lo, hi), "basic"))
    if done.error is not None:
        raise done.error
    return done.result  # type: ignore[no-any-return]


def logged(segments: int, **log: Any) -> tuple[Model, Rig, int]:
    """A ring of ``segments`` whose storage processes keep ``ChangeLog(**log)``, its
    client rig, and the position a feed from now starts at."""
    m = Model(f=3).ring_of(segments)
    rig = Rig(m)
    start = page(rig, None).position
    for core in m.storage.values():
        core.changes = ChangeLog(**log)
    return m, rig, start


def test_a_feed_is_every_write_once_in_order_one_event_per_write() -> None:
    """A multi-key write over several segments is one event at its one position; pages
    chain without gap or duplicate; a delete of a key that holds nothing changes
    nothing; an append's event carries the new list."""
    m = Model(f=3).ring_of(4)
    rig = Rig(m)
    start = page(rig, None)
    assert start.events == [] and start.position > 0
    m.write(("put", ((5, "five"), (150, "x"), (350, "y"))))  # three segments
    m.write(("delete", (5, 6)))  # 6 holds nothing
    m.settle()
    first = page(rig, start.position)
    m.write(("append", ((7, "a"),)))
    m.write(("append", ((7, "b"),)))
    m.write(("delete", (999,)))  # changes nothing: no event
    m.settle()
    second = page(rig, first.position)
    events = first.events + second.events
    assert [e.changes for e in events] == [
        ((5, "put", "five"), (150, "put", "x"), (350, "put", "y")),
        ((5, "delete", None),),
        ((7, "put", ["a"]),),
        ((7, "put", ["a", "b"]),),
    ]
    positions = [e.position for e in events]
    assert positions == sorted(set(positions))
    assert start.position < positions[0] and positions[-1] < second.position
    assert all(first.position < e.position for e in second.events)
    # A key range: only its keys, the same positions.
    assert page(rig, start.position, 100, 200).events == [Event(positions[0], ((150, "put", "x"),))]


def test_every_replica_of_a_segment_keeps_the_same_changes_at_the_same_positions() -> None:
    """So a feed continues at any replica: a holder's answer is the same as another's."""
    m = Model(f=3).ring_of(5)
    base = m.t  # each process gained its ranges before this, at a position of its own
    for i in range(40):
        m.write(("put", tuple((k, f"v{i}") for k in range(i * 7 % 500, 500, 97))))
        if i % 5 == 0:
            m.write(("delete", (i * 7 % 500,)))
    m.settle()
    ks = m.config.keyspace
    for s, seg in enumerate(ks.segments()):
        answers = {
            h: m.storage[h].changes.read(base, seg, m.t + 1) for h in ks.holders_of_segment(s)
        }
        assert len(answers) == 3
        first = next(iter(answers.values()))
        assert first, "every segment changed"
        assert all(a == first for a in answers.values()), answers


def test_a_feed_read_from_before_what_is_kept_raises_compacted_naming_where_to_go_on() -> None:
    m, rig, start = logged(3, max_changes=3)
    for i in range(6):
        m.write(("put", ((i, i),)))
    m.settle()
    with pytest.raises(Compacted) as e:
        page(rig, start)
    go_on = e.value.position
    assert go_on > start
    got = page(rig, go_on)
    assert [c for ev in got.events for c in ev.changes] == [
        (3, "put", 3),
        (4, "put", 4),
        (5, "put", 5),
    ]


def test_a_long_feed_comes_in_pages_each_ending_where_a_holder_cut_its_answer() -> None:
    """Each holder answers at most ``page`` key changes, ending its answer where it cut:
    pages end at the earliest cut, whole positions only (a multi-key write is never
    split), and chained they are the feed one unlimited read gives."""
    m, rig, start = logged(4, page=3)
    for i in range(40):
        m.write(("put", ((i * 7 % 400, i), ((i * 7 + 200) % 400, -i))))
    m.settle()
    pages, at = [], start
    while True:
        got = page(rig, at)
        if not got.events:
            break
        pages.append(got)
        assert got.events[-1].position <= got.position
        at = got.position
    assert len(pages) > 5, "no answer was cut: the test tests nothing"
    for core in m.storage.values():
        core.changes.page = 1 << 30
    whole = page(rig, start)
    assert [e for p in pages for e in p.events] == whole.events
    assert all(len(e.changes) == 2 for e in whole.events) and len(whole.events) == 40


def test_a_cut_answer_ends_the_page_at_its_cut_and_drops_what_others_gave_after() -> None:
    log = ChangeLog(page=2)
    for t in range(10, 20):
        log.record(t, 0.0, [(t, "put", t)])
    cut = log.read(9, EVERYTHING, 30)
    assert cut == [[10, [[10, "put", 10]]], [11, [[11, "put", 11]]], [11, None]]
    other = [[12, [[1000, "put", 0]]]]
    got = merge([(EVERYTHING, cut), (EVERYTHING, other)], 30, encode_key)
    assert got == Page(11, [Event(10, ((10, "put", 10),)), Event(11, ((11, "put", 11),))])


def expand_to_new_holder(m: Model, rig: Rig) -> None:
    """storage:9 joins and takes ``[100, ...)`` from a ring of one; the rig learns it."""
    m.join_storage("storage:9")
    m.reconfigure(("expand", "storage:9", 100))  # [100, ...) moves to storage:9
    m.settle()
    assert m.config.keyspace.holders_of_segment(1) == ("storage:9",)
    rig.run(rig.core.refresh(rig.now))
    rig.pump()


def test_a_feed_goes_on_across_a_migration_of_its_range() -> None:
    """A copy carries the source's change log of the ranges (before its first chunk):
    the new holder answers a page from before the expand, without a gap."""
    m = Model(f=1).ring_of(1)
    rig = Rig(m)
    start = page(rig, None).position
    m.write(("put", ((150, "x"),)))
    m.write(("put", ((50, "a"),)))
    m.settle()
    expand_to_new_holder(m, rig)
    m.write(("put", ((150, "y"),)))
    m.settle()
    got = page(rig, start, 100, 200)
    assert [ev.changes for ev in got.events] == [((150, "put", "x"),), ((150, "put", "y"),)]
    assert [ev.changes for ev in page(rig, start).events] == [
        ((150, "put", "x"),),
        ((50, "put", "a"),),
        ((150, "put", "y"),),
    ]


def test_a_feed_from_before_a_range_was_first_placed_is_compacted() -> None:
    """The first holder of a range holds its changes from its placement on: asked from
    before, it says where to go on, never a page with a silent gap."""
    m = Model(f=1).ring_of(1)
    with pytest.raises(Compacted) as e:
        page(Rig(m), 0)
    assert 0 < e.value.position <= m.t


def test_the_change_log_drops_by_count_and_by_age() -> None:
    log = ChangeLog(max_changes=4, max_age=10.0)
    for t in range(1, 4):
        log.record(t, float(t), [(t, "put", t), (-t, "put", t)])
    assert log.floor == 1  # six changes, four kept: position 1's two went
    assert log.read(1, EVERYTHING, 10) == [
        [2, [[2, "put", 2], [-2, "put", 2]]],
        [3, [[3, "put", 3], [-3, "put", 3]]],
    ]
    assert log.read(0, EVERYTHING, 10).startswith("compacted")
    assert log.read(2, EVERYTHING, 3) == []  # the read's own position bounds it
    log.trim(now=12.5)  # position 2 is 10.5 s old
    assert log.floor == 2 and log.figures()["changes"] == 2


def test_a_feed_is_read_in_order_only_and_over_some_key() -> None:
    rig = Rig(Model(f=1).ring_of(1))
    with pytest.raises(BadOperation, match="sequential"):
        rig.read(Changes(0), "snapshot")
    with pytest.raises(BadOperation, match="follows no key"):
        rig.read(Changes(0, 5, 5), "sequential")
    for since in ("0", -1, 1.5):
        with pytest.raises(BadOperation, match="since is a position"):
            rig.read(Changes(since), "sequential")  # type: ignore[arg-type]


def test_an_engine_that_reports_no_changes_says_so() -> None:
    class Plain(MemoryEngine):
        apply_logged = None  # type: ignore[assignment]

    m = Model(f=1).ring_of(1)
    for core in m.storage.values():
        core.engine.__class__ = Plain
        core._logged = False
    with pytest.raises(Rejected, match="keeps no change log"):
        page(Rig(m), 0)


def test_a_malformed_history_is_not_taken_and_the_range_says_compacted() -> None:
    """A copy's history is checked whole: a change of an unknown kind, a position that is
    no number or an entry of the wrong shape leaves the ranges as they were (complete
    only after the copy's keyspace message), never a log with made-up changes."""
    ranges = ((encode_key(100), encode_key(200)),)
    for bad in (
        [[5, [[150, "poke", 1]]]],
        [["five", [[150, "put", 1]]]],
        [[5, [150, "put", 1]]],
        "nonsense",
    ):
        log = ChangeLog()
        log.gained(ranges, 40)
        log.adopt(ranges, 2, bad, 40, now=0.0)  # type: ignore[arg-type]
        assert log.read(3, ranges, 50) == "compacted: continue from position 40", bad
    log = ChangeLog()
    log.gained(ranges, 40)
    log.adopt(ranges, 2, [[5, [[150, "put", 1]]], [30, [[160, "delete", None]]]], 40, now=0.0)
    assert log.read(3, ranges, 50) == [[5, [[150, "put", 1]]], [30, [[160, "delete", None]]]]
    assert log.read(1, ranges, 50).startswith("compacted")  # the source's own start


def test_a_copys_history_is_kept_for_the_log_age_from_when_it_came() -> None:
    """A new holder's log, empty, adopts a copy's history as of the time it came: kept
    as of time 0, every entry of it was older than the age bound at the holder's next
    write in a daemon (whose clock is the machine's), and a feed over the range was
    compacted under."""
    ranges = ((encode_key(100), encode_key(200)),)
    log = ChangeLog(max_age=600.0)
    log.gained(ranges, 40)
    log.adopt(ranges, 2, [[5, [[150, "put", 1]]], [30, [[160, "put", 2]]]], 40, now=50_000.0)
    log.record(41, 50_001.0, ((170, "put", 3),))
    assert log.read(2, ranges, 50) == [
        [5, [[150, "put", 1]]],
        [30, [[160, "put", 2]]],
        [41, [[170, "put", 3]]],
    ]
    log.record(42, 50_700.0, ((171, "put", 4),))  # 700 s on: the copy's are too old now
    assert log.read(2, ranges, 50).startswith("compacted")


@pytest.mark.parametrize("planted", [False, True])
def test_a_copy_into_a_range_already_logged_replaces_its_history_up_to_the_copy(
    planted: bool,
) -> None:
    """A repair copies a range its receiver held incomplete: up to the copy's position
    the source's history of the range is the history (what the receiver logged of it
    would repeat a change, or contradict it: an append computed on missing data), and
    after it the receiver's own log.  Other ranges' changes at those positions stay."""
    if planted:  # the planted bug (the receiver's own entries kept beside) is caught
        with mutations.planted({HISTORY_TWICE}), pytest.raises(AssertionError):
            test_a_copy_into_a_range_already_logged_replaces_its_history_up_to_the_copy(False)
        return
    ranges = ((encode_key(100), encode_key(200)),)
    log = ChangeLog()
    log.record(10, 0.0, [(150, "put", [1]), (300, "put", "x")])  # 150: logged incomplete
    log.record(20, 0.0, [(150, "put", [1, 2])])
    log.record(50, 0.0, [(150, "put", [0, 1, 2, 3])])  # after the copy: ours
    log.adopt(
        ranges, 2, [[10, [[150, "put", [0, 1]]]], [20, [[150, "put", [0, 1, 2]]]]], 40, now=0.0
    )
    assert log.read(3, ranges, 60) == [
        [10, [[150, "put", [0, 1]]]],
        [20, [[150, "put", [0, 1, 2]]]],
        [50, [[150, "put", [0, 1, 2, 3]]]],
    ]
    assert log.read(3, EVERYTHING, 60)[:2] == [
        [10, [[300, "put", "x"]]],
        [10, [[150, "put", [0, 1]]]],
    ]


def test_a_long_log_pages_from_any_position_as_a_scan_of_it_would() -> None:
    """Pages start by bisection and dropped entries are cut in bulk: every page still
    equals what filtering all kept entries gives."""
    log = ChangeLog(max_changes=2_000)
    kept: list[tuple[int, int]] = []
    for t in range(1, 10_001, 2):
        log.record(t, 0.0, [(t % 97, "put", t)])
        kept.append((t, t % 97))
    kept = kept[-2_000:]
    assert log.floor == kept[0][0] - 2
    lo = (encode_key(10), encode_key(20))
    for since in (log.floor, 6_001, 6_002, 9_000, 9_999):
        for upto in (since + 1, 7_000, 10_001):
            want = [[t, [[k, "put", t]]] for t, k in kept if since < t < upto and 10 <= k < 20]
            assert log.read(since, (lo,), upto) == want, (since, upto)
    assert log.read(log.floor - 1, (lo,), 10_001).startswith("compacted")


def test_a_write_held_back_behind_a_copy_takes_its_place_in_position_order() -> None:
    """A storage process that receives a range holds back writes to it until the copy is
    complete, and applies writes to its other ranges meanwhile: the held-back write is
    recorded after later positions, and a page across it must still hold it (a view's
    simulation found a feed that skipped such a write)."""
    log = ChangeLog()
    for t in (10, 12, 20, 25):
        log.record(t, 0.0, [(t, "put", t)])
    log.record(14, 0.0, [(14, "put", "held back")])  # the copy completed: it runs now
    log.record(30, 0.0, [(30, "put", 30)])
    got = log.read(11, EVERYTHING, 31)
    assert [t for t, _ in got] == [12, 14, 20, 25, 30]
    assert log.read(13, EVERYTHING, 15) == [[14, [[14, "put", "held back"]]]]


def test_rubberband_cost_times_a_write_with_and_without_the_change_log() -> None:
    from rubberband.tools.cost import storage_cost

    got = storage_cost(repeat=1, writes=300, held=500)  # asserts every write was applied
    assert set(got) == {"put, change log kept", "put, no change log", "put of a new key, 500 held"}
    assert all(us > 0 for us in got.values())


def test_a_views_rows_are_no_change_of_the_feed_nor_a_revision() -> None:
    """``version`` and ``reclaim`` writes (a view's rows, read as the view) are not
    logged: a feed over every key shows the base writes only, and the rows have no
    revision; the rows are written (and a dead one reclaimed) all the same."""
    from rubberband.changelog import Revisions

    m = Model(f=3).ring_of(4)
    rig = Rig(m)
    start = page(rig, None).position
    row, dead = ("~view", "v", 5), ("~view", "v", 6)
    m.write(("put", ((5, "five"),)))
    m.write(("version", ((row, [9, "five"]), (dead, [9, "six"]), (dead, [10])), 0), "maintainer:m")
    m.write(("reclaim", (dead,), 10), "maintainer:m")
    m.settle()
    events = page(rig, start).events
    assert [e.changes for e in events] == [((5, "put", "five"),)]
    done = rig.until_done(
        rig.read(Revisions(("get", (5, row, dead)), (5, row, dead)), "sequential")
    )
    values, revised = done.result
    assert values[row][-1] == [9, "five"] and dead not in values and set(revised) == {5}


def test_the_change_log_drops_by_bytes_and_a_table_rows_images_weigh_more() -> None:
    """Row images make a change hundreds of times bigger than an int's: the log keeps
    about ``max_bytes`` of them, dropping from the oldest, and says how much it holds."""
    log = ChangeLog(max_changes=1000, max_bytes=20_000)
    image = {f"c{i}": i for i in range(22)}
    for t in range(1, 11):
        log.record(t, 0.0, [(("~rows", "t", t), "put", {"row": image, "before": image})])
    kept = log.figures()
    assert 0 < kept["bytes"] <= 20_000 and kept["changes"] < 10
    assert log.floor == 10 - kept["changes"]
    small = ChangeLog(max_changes=1000, max_bytes=20_000)
    for t in range(1, 11):
        small.record(t, 0.0, [(t, "put", t)])
    assert small.floor == -1 and small.figures()["changes"] == 10  # ints: all kept


def test_a_peek_says_whether_a_range_changed_after_a_position_outside_the_order() -> None:
    """A follower that waits for changes asks the replicas straight: each answers from
    its log, nothing is ordered, and the answer is the feed's (a page read there has
    events exactly when the peek said so)."""
    m, rig, start = logged(4)
    ordered = m.t
    assert peek(rig, start) is False
    assert m.t == ordered  # no message in the total order
    m.write(("put", ((150, "x"),)))
    m.settle()
    ordered = m.t
    assert peek(rig, start) is True
    assert peek(rig, start, 100, 200) is True
    assert peek(rig, start, 0, 100) is False
    assert peek(rig, start, 300, 400) is False
    assert peek(rig, ordered) is False  # the write is at or before it
    assert m.t == ordered
    nxt = page(rig, start)
    assert nxt.events and peek(rig, nxt.position) is False
    m.write(("delete", (350,)))  # holds nothing: changes nothing, as the feed says
    m.settle()
    assert peek(rig, nxt.position) is False and page(rig, nxt.position).events == []
    with pytest.raises(BadOperation):
        rig.read(Changed(start), "sequential")  # a hint, never a read in the order
    with pytest.raises(BadOperation):
        rig.read(Changed(None), "basic")  # type: ignore[arg-type]


def test_a_peek_that_a_log_cannot_answer_says_changed() -> None:
    """A hint may say True for nothing but never False for a change: a log that starts
    after ``since`` (compacted, or the range came later) cannot tell, nor can one that
    would test more than PEEK_CHANGES others' changes."""
    log = ChangeLog()
    place = encode_key
    assert log.changed_after(0, EVERYTHING) is False
    log.record(5, 0.0, [(1, "put", "a")])
    inside = ((place(0), place(10)),)
    outside = ((place(100), place(200)),)
    assert log.changed_after(4, inside) is True
    assert log.changed_after(5, inside) is False
    assert log.changed_after(4, outside) is False
    assert log.changed_after(4, EVERYTHING, (place(100), place(200))) is False  # key filter
    assert log.changed_after(4, EVERYTHING, (place(0), place(2))) is True
    log.gained(outside, 7)  # the range came here at 7: its earlier changes are elsewhere
    assert log.changed_after(6, outside) is True
    assert log.changed_after(7, outside) is False
    many = ChangeLog()
    many.record(1, 0.0, [(k, "put", k) for k in range(PEEK_CHANGES + 1)])
    assert many.changed_after(0, ((place(10**6), place(10**7)),)) is True
    few = ChangeLog()
    few.record(1, 0.0, [(k, "put", k) for k in range(PEEK_CHANGES - 1)])
    assert few.changed_after(0, ((place(10**6), place(10**7)),)) is False
    short = ChangeLog(max_changes=1)
    short.record(1, 0.0, [(1, "put", 1)])
    short.record(2, 0.0, [(2, "put", 2)])  # the first dropped: the floor is 1
    short.trim(0.0)
    assert short.changed_after(0, outside) is True
    assert short.changed_after(1, outside) is False


def test_a_storage_process_answers_a_peek_as_a_basic_read_and_refuses_a_malformed_one() -> None:
    m, _rig, start = logged(1)
    core = m.storage[next(iter(m.storage))]
    everything = EVERYTHING
    fx = core.on_direct("client:c", Peek(7, start, everything, None, core.version + 1))
    assert [type(d.payload) for _, d in fx.send] == [Stale]
    fx = core.on_direct("client:c", Peek(8, start, everything, None, core.version))
    (answer,) = [d.payload for _, d in fx.send]
    assert type(answer) is Answer and answer.result is False and answer.error is None
    assert answer.covered == core.owned
    m.write(("put", ((5, "x"),)))  # so that the key range is compared with a change
    m.settle()
    for bad in (Peek(9, start, everything, "keys", core.version),
                Peek(9, start, everything, (1, 2, 3), core.version),
                Peek(9, start, everything, (1, 2), core.version),  # not encoded keys
                Peek(9, -1, everything, None, core.version)):  # fmt: skip
        (answer,) = [d.payload for _, d in core.on_direct("client:c", bad).send]
        assert answer.error == "malformed peek" and answer.covered == ()
    assert not core.on_direct("client:c", Peek(9, start, "not ranges", None, core.version)).send
    assert core.stopped is None


def test_a_peek_after_a_migration_sees_the_changes_the_copy_carried() -> None:
    """The new holder of a range answers from the history the copy brought (or, where
    it holds the range's changes only from later, says it cannot tell): never False for
    a change the feed holds."""
    m = Model(f=1).ring_of(1)
    rig = Rig(m)
    start = page(rig, None).position
    m.write(("put", ((150, "x"),)))
    m.settle()
    expand_to_new_holder(m, rig)
    assert peek(rig, start, 100, 200) is True
    assert peek(rig, start, 0, 100) is False
    assert peek(rig, m.t, 100, 200) is False
    m.write(("put", ((150, "y"),)))
    m.settle()
    assert peek(rig, m.t - 1, 100, 200) is True


@settings(max_examples=200, deadline=None)
@given(
    since=st.one_of(st.integers(-3, 40), st.integers(-(2**70), 2**70)),
    ranges=st.one_of(
        st.just(EVERYTHING),
        st.just(((encode_key(0), encode_key(100)),)),
        st.lists(st.tuples(st.binary(max_size=4), st.binary(max_size=4)), max_size=3).map(tuple),
        st.text(max_size=3),
    ),
    keys=st.one_of(
        st.none(),
        st.just((encode_key(0), encode_key(10))),
        st.tuples(st.binary(max_size=4), st.binary(max_size=4)),
        st.lists(st.one_of(st.integers(), st.text(max_size=2), st.none()), max_size=3),
        st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    ),
    stale=st.booleans(),
)
@example(since=0, ranges=EVERYTHING, keys=[1, 2], stale=False)  # compared with a key: refused
def test_any_peek_is_answered_or_dropped_and_never_stops_a_storage_process(
    since: int, ranges: Any, keys: Any, stale: bool
) -> None:
    """Whatever a peer puts in a peek's fields (past the codec's types), the storage
    process answers True, False, stale or "malformed peek", or drops a peek whose
    ranges are no range set; it never stops."""
    m, _rig, _start = logged(2)
    m.write(("put", ((5, "x"), (150, "y"))))
    m.settle()
    for core in m.storage.values():
        version = core.version + (1 if stale else 0)
        for _, d in core.on_direct("client:c", Peek(3, since, ranges, keys, version)).send:
            a = d.payload
            assert type(a) is Stale or (
                type(a) is Answer and (a.result in (True, False) or a.error == "malformed peek")
            )
        assert core.stopped is None
