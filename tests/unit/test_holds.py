"""A view's maintainer far behind a storage process's change log holds that process's
intake back (rubberband.holds), so the writers slow down to what the view keeps up with
instead of the maintainer being compacted under and starting over; no other reader
holds anyone back, and a hold ends, or lapses, on its own."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from rubberband.changelog import ChangeLog
from rubberband.holds import FIRST_TTL, MAX_PAUSE, PACE, READER_TTL, Holds
from tests.rubberband_client_rig import Rig
from tests.unit.test_changes import logged, page

M = "maintainer:m"


def taken_in(holds: Holds, seconds: float, step: int = 100) -> int:
    """Positions an intake that takes ``step`` positions at a time, as fast as
    ``holds`` lets it, takes in ``seconds`` of virtual time."""
    now, upto = 0.0, 0
    holds.pause(upto, now)
    for _ in range(100_000):  # an intake never held takes a step in no time
        if now >= seconds:
            break
        upto += step
        now += holds.pause(upto, now)
    return upto


def at(share: float) -> Callable[[int], float]:
    """A log in which ``share`` of its span lies after any position."""
    return lambda _since: share


def test_a_maintainer_in_the_older_half_of_the_log_paces_the_intake_to_its_own_rate() -> None:
    holds = Holds()
    holds.read(M, 0, -2.0)
    holds.read(M, 2_000, -1.0)  # 2,000 positions a second
    holds.read(M, 4_000, 0.0)
    holds.update(at(0.4), 0.0)
    assert holds.limit is None  # not in the older half yet
    holds.update(at(0.6), 0.0)
    assert holds.limit is not None and holds.limit[0] == PACE * 2_000
    taken = taken_in(holds, 10.0)
    assert abs(taken - 10.0 * PACE * 2_000) <= 200, taken  # within a step or two
    assert holds.held_seconds > 9.0


def test_a_hold_starts_between_reads_as_the_log_fills_behind_a_slow_maintainer() -> None:
    """A maintainer's round can take seconds: the hold starts when the intake since its
    last read fills half the log, not at its next read."""
    log = ChangeLog(max_changes=100)
    holds = Holds()
    holds.read(M, 0, -1.0)
    log.record(1, 0.0, ((1, "put", 1),))
    holds.read(M, 1, 0.0)  # its next read starts after position 1
    for t in range(2, 50):
        log.record(t, 0.0, ((t, "put", t),))
        holds.update(lambda since: log.share_after(since, 0.0), 0.1)
        assert holds.limit is None, t
    log.record(50, 0.0, ((50, "put", 50),))
    log.record(51, 0.0, ((51, "put", 51),))
    holds.update(lambda since: log.share_after(since, 0.0), 0.1)
    assert holds.limit is not None  # half of 100 changes after it, before any read


def test_a_hold_ends_in_the_newer_quarter_and_not_before() -> None:
    holds = Holds()
    holds.read(M, 0, 0.0)
    holds.update(at(0.6), 0.0)  # its pace not known yet: not held before it is
    assert holds.limit is None
    holds.read(M, 1_000, 1.0)
    holds.update(at(0.6), 1.0)
    assert holds.limit is not None and holds.limit[0] == PACE * 1_000
    holds.update(at(0.4), 1.0)  # between the marks: still held
    assert holds.limit is not None and holds.limit[0] == PACE * 1_000
    holds.update(at(0.3), 2.0)
    assert holds.limit is not None
    holds.update(at(0.2), 3.0)
    assert holds.limit is None
    assert taken_in(holds, 1.0) == 100_000 * 100  # the intake never waits
    holds.update(at(0.4), 4.0)  # back up, below the mark: not held again yet
    assert holds.limit is None
    holds.update(at(0.5), 5.0)
    assert holds.limit is not None


def test_only_a_maintainer_holds_the_intake_back() -> None:
    holds = Holds()
    for reader in ("client:spark", "storage:2", "super:1"):
        holds.read(reader, 0, 0.0)
        holds.read(reader, 10, 1.0)
    holds.update(at(0.9), 1.0)
    assert holds.limit is None and holds.readers == {}


def test_a_hold_lapses_when_its_maintainer_stops_reading_or_starts_over() -> None:
    holds = Holds()
    holds.read(M, 0, 0.0)
    holds.read(M, 100, 1.0)  # 80 positions a second allowed
    holds.update(at(0.9), 1.0)
    assert 0 < holds.pause(0, 1.0) + holds.pause(1_000, 1.0) <= MAX_PAUSE
    # No read for longer than the lapse: the intake takes what it is given.
    assert holds.pause(100_000, 1.0 + READER_TTL + 0.1) == 0.0
    holds.update(at(0.9), 1.0 + READER_TTL + 0.1)
    assert holds.limit is None and (M, None) not in holds.readers
    holds.read(M, 200, 50.0)
    holds.read(M, 300, 51.0)
    holds.update(at(0.9), 51.0)
    assert holds.limit is not None
    holds.update(at(math.inf), 52.0)  # compacted under: it starts over, holds nothing
    assert holds.limit is None and (M, None) not in holds.readers


def test_a_maintainer_that_makes_no_progress_slows_the_intake_without_stopping_it() -> None:
    holds = Holds()
    holds.read(M, 500, 0.0)
    holds.read(M, 500, 1.0)
    holds.update(at(0.9), 1.0)
    assert holds.limit is not None and holds.limit[0] == 0.0
    taken = taken_in(holds, 10.0)
    assert 10.0 / MAX_PAUSE * 100 <= taken <= (10.0 / MAX_PAUSE + 2) * 100


def test_the_share_of_the_log_behind_a_position_by_count_and_by_age() -> None:
    log = ChangeLog(max_changes=100, max_age=1_000.0)
    for t in range(1, 51):
        log.record(t, float(t), ((t, "put", t),))
    # Half full, by count: a reader at 25 has half of what is held, a quarter of the span.
    assert abs(log.share_after(25, 50.0) - 0.25) < 0.02
    assert log.share_after(50, 50.0) == 0.0
    for t in range(51, 151):
        log.record(t, float(t), ((t, "put", t),))
    assert log.floor == 50
    assert abs(log.share_after(100, 150.0) - 0.5) < 0.02
    assert log.share_after(49, 150.0) == math.inf  # compacted under
    # By age, when that is nearer: a change 600 s old of 1,000 kept.
    assert abs(log.share_after(140, 750.0) - (750.0 - 141.0) / 1_000.0) < 1e-9


def test_a_storage_process_takes_its_maintainers_feed_reads_as_holds_and_no_one_elses() -> None:
    m, rig, start = logged(3, max_changes=20)
    for i in range(16):
        m.write(("put", ((i, i),)))
    m.settle()
    page(rig, start)  # a client's read: no hold
    for core in m.storage.values():
        assert core.holds.readers == {}
    maintainer = Rig(m)
    maintainer.name = M
    first = page(maintainer, start)
    second = page(maintainer, first.position)
    # One replica answered each read; the others heard of it from that one (FeedRead)
    # and keep it alike: the next read of these ranges may go to any of them.  Each is
    # held by where the last read started: a part of it lost is asked again from there.
    places = {
        tuple((r.since, r.read_at) for r in _of(core.holds, M)) for core in m.storage.values()
    }
    assert len(m.storage) == 3 and len(places) == 1, places
    ((since, read_at),) = places.pop()
    assert since == first.position and read_at == second.position
    for core in m.storage.values():
        assert core.holds.limit is None
        (r,) = _of(core.holds, M)  # one feed
        r.rate = 1_000.0  # its pace, as its reads would say (the model's steps take no time)
    for i in range(11):  # 11 of 20 after where its last read started: held
        m.write(("put", ((i, -i),)))
    m.settle()
    assert all(core.holds.limit is not None for core in m.storage.values())


def test_a_replica_never_asked_learns_a_maintainers_pace_from_the_replica_that_answered() -> None:
    """A maintainer's reads go to one replica of each segment; a replica it never read
    from kept no hold for it and turned its log over under it (the simulator's feed
    follower, compacted at its first read of a replica).  Each read's news reaches
    every holder of what it read, and counts once there however many tell it."""
    holds = Holds()
    assert holds.read(M, 100, 0.0, "f", read_at=150, since=50)  # a neighbour's answer
    assert holds.read(M, 90, 0.1, "f", read_at=150, since=50)  # another's page, cut sooner
    assert holds.read(M, 120, 0.2, "f", read_at=140, since=40)  # an older read, come late
    (r,) = _of(holds, M)
    assert (r.since, r.resume, r.at, r.gap, r.rate) == (50, 90, 0.0, None, None)
    assert not holds.read("client:c", 0, 0.0, "f", read_at=150)  # held for no client
    holds.read(M, 1_090, 1.0, "f", read_at=1_200, since=90)  # 1,000 positions in a second
    assert (r.since, r.resume, r.read_at, r.rate) == (90, 1_090, 1_200, 1_000.0)
    holds.update(at(0.6), 1.0)
    assert holds.limit is not None and abs(holds.limit[0] - PACE * 1_000) < 1e-9


def test_a_hold_starts_where_the_last_read_started_and_ends_where_the_next_starts() -> None:
    """A part of a read answered elsewhere may be lost and asked again from where the
    read started, so the hold starts by that place (the simulator's feed follower,
    held for by its pages' end, was compacted under before its read came again); it
    ends by where the next read starts, or a maintainer whose reads come in through the
    held intake never moved its start on fast enough to end it (the simulator's final
    reads stood still behind such a hold)."""
    holds = Holds()
    holds.read(M, 1_000, 0.0, since=0, read_at=1_000)
    holds.read(M, 2_000, 1.0, since=1_000, read_at=2_000)

    def shares(started: float, next_starts: float) -> Callable[[int], float]:
        return lambda since: started if since == 1_000 else next_starts

    holds.update(shares(0.55, 0.1), 1.0)  # the page's end far from the log's floor
    assert holds.limit is not None and abs(holds.limit[0] - PACE * 1_000) < 1e-9
    holds.update(shares(0.45, 0.3), 1.0)
    assert holds.limit is not None  # held until where the next read starts is released
    holds.update(shares(0.45, 0.25), 1.0)
    assert holds.limit is None


def test_the_mark_is_set_per_process_and_zero_never_holds() -> None:
    """``--view-hold-at``: a storage process may hold later (the release at half the
    mark), or never, leaving a maintainer that falls behind to be compacted under."""
    later = Holds(0.8)
    later.read(M, 0, 0.0)
    later.read(M, 1_000, 1.0)
    later.update(at(0.7), 1.0)
    assert later.limit is None
    later.update(at(0.8), 1.0)
    assert later.limit is not None
    later.update(at(0.45), 2.0)
    assert later.limit is not None  # above half the mark: still held
    later.update(at(0.4), 2.0)
    assert later.limit is None
    never = Holds(0.0)
    never.read(M, 0, 0.0)
    never.read(M, 1_000, 1.0)
    never.update(at(1.0), 1.0)
    assert never.limit is None and never.readers == {}


def test_each_feed_of_a_maintainer_holds_by_its_own_place() -> None:
    """A maintainer follows one feed per group of views (over other sources), each at
    its own place: the one far behind holds, though a read of another is further on
    and came last (one place per maintainer took that one's, and the first was
    compacted under in the simulator)."""
    holds = Holds()
    holds.read(M, 0, 0.0, feed="a")
    holds.read(M, 1_000, 1.0, feed="a")
    holds.read(M, 0, 0.0, feed="b")
    holds.read(M, 9_000, 1.0, feed="b")  # the last read, far ahead of feed a's
    holds.update(lambda since: 0.6 if since < 5_000 else 0.0, 1.0)
    assert holds.limit is not None and abs(holds.limit[0] - PACE * 1_000) < 1e-9


def test_a_feed_that_stops_being_read_lapses_after_a_few_of_its_gaps() -> None:
    """A feed read here every 2 s holds for four of its gaps after its last read, but
    FIRST_TTL at the soonest; every 5 s, four gaps; every 20 s, READER_TTL at most.  One
    read here once holds nothing (its pace unknown) and is forgotten after FIRST_TTL."""
    behind = at(0.9)
    once = Holds()
    once.read(M, 0, 0.0)
    once.update(behind, 1.0)
    assert once.limit is None and once.readers
    once.update(behind, FIRST_TTL + 0.01)
    assert not once.readers
    for gaps, lapses in ((2.0, FIRST_TTL), (5.0, 20.0), (20.0, READER_TTL)):
        holds = Holds()
        last = 3 * gaps
        for i in range(4):
            holds.read(M, 1_000 * i, i * gaps)
        holds.update(behind, last + lapses - 0.01)
        assert holds.limit is not None, gaps
        holds.update(behind, last + lapses + 0.01)
        assert holds.limit is None and not holds.readers, gaps


def test_a_maintainer_late_at_a_holder_is_taken_as_slowed_by_as_much() -> None:
    """Its pace as this holder last measured it may be long gone (it slowed since, or
    reads other replicas): not back for twice its usual gap, half its pace; for ten
    times, a tenth; its next read here says its pace again."""
    holds = Holds()
    for i in range(3):
        holds.read(M, 1_000 * i, float(i))  # every second, 1,000 positions a second
    holds.update(at(0.6), 2.0 + 1.0)
    assert holds.limit is not None and holds.limit[0] == PACE * 1_000
    holds.update(at(0.6), 2.0 + 2.0)
    assert holds.limit is not None and abs(holds.limit[0] - PACE * 500) < 1e-6
    holds.update(at(0.6), 2.0 + 10.0)
    assert holds.limit is not None and abs(holds.limit[0] - PACE * 100) < 1e-6
    holds.read(M, 2_300, 12.0)  # back, slower: its pace measured again
    holds.update(at(0.6), 12.0)
    assert holds.limit is not None and 0 < holds.limit[0] < PACE * 1_000


def _of(holds: Holds, reader: str) -> list[Any]:
    """``reader``'s records at ``holds``, one for each feed it reads."""
    return [r for (who, _feed), r in holds.readers.items() if who == reader]


def test_news_of_reads_is_taken_from_storage_processes_only_and_bounded() -> None:
    """Any peer may send a :class:`FeedRead`: only a storage process's news is taken (a
    client cannot make the writers wait), its feed a key's length, and a process keeps
    at most ``MAX_READERS`` feeds however many it hears of."""
    from rubberband.holds import FEED_KEY, MAX_READERS, feed_key
    from rubberband.proto import FeedRead
    from tests.rubberband_model import Model

    core = next(iter(Model(f=3).ring_of(1).storage.values()))
    feed = feed_key(((b"a", b"b"),))
    assert len(feed) == FEED_KEY
    core.on_direct("client:c", FeedRead(M, feed, 5, 5, 5))
    core.on_direct("storage:9", FeedRead(M, feed + "x", 5, 5, 5))
    assert core.holds.readers == {}
    core.on_direct("storage:9", FeedRead(M, feed, 5, 4, 5))
    assert list(core.holds.readers) == [(M, feed)]
    holds = Holds()
    for i in range(MAX_READERS + 10):
        holds.read(f"{M}{i}", 0, 0.0, feed, read_at=1)
    assert len(holds.readers) == MAX_READERS


def test_a_maintainer_declared_faulty_holds_no_one_back_from_then_on() -> None:
    """Its lease ran out and the routers suspected it: it reads no more, and its holds
    end at once rather than a few of its gaps later; another maintainer's stay."""
    holds = Holds()
    other = "maintainer:n"
    for who in (M, other):
        holds.read(who, 0, 0.0, feed="a")
        holds.read(who, 1_000, 1.0, feed="a")
    holds.read(M, 0, 0.0, feed="b")
    holds.forget(M)
    assert list(holds.readers) == [(other, "a")]


def test_a_storage_process_drops_the_holds_of_a_maintainer_whose_lease_ran_out() -> None:
    """The routers' suspicion of a client (its lease ran out) is delivered to every
    member: a storage process drops that maintainer's holds at once; a super's vote
    about a storage process, or a suspicion sent by a client, drops none."""
    from ecast import KIND, ROUTERS, SUSPECT, Delivery, Message

    m, _rig, _start = logged(1, max_changes=20)
    core = next(iter(m.storage.values()))
    other = "maintainer:n"
    for who in (M, other):
        core.holds.read(who, 0, 0.0, feed="a")

    def suspicion(sender: str, who: list[str], t: int) -> Delivery:
        return Delivery(t, Message(sender, (sender, t), {KIND: SUSPECT, "who": who}, None))

    t = core.delivered
    core.on_deliveries([suspicion("client:c", [M], t + 1)])
    core.on_deliveries([suspicion("super:s1", [M], t + 2)])
    assert {who for who, _feed in core.holds.readers} == {M, other}
    core.on_deliveries([suspicion(ROUTERS, [M], t + 3)])
    assert {who for who, _feed in core.holds.readers} == {other}
