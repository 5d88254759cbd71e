"""The parts of a ufabcast core, each on its own: the log, progress and quorum, leader
duties, configuration changes (``tests/unit/test_ufabcast.py`` drives the whole core)."""

from __future__ import annotations

from ecast.core.ufabcast import AppCmd, JoinCmd, PartCmd, Ufabcast, UfabParams, View
from ecast.core.ufabcast.leader import NOOP
from ecast.core.ufabcast.log import Log
from ecast.core.ufabcast.messages import (
    Accept,
    Commit,
    Prepare,
    Promise,
    SnapshotNeeded,
    ViewChanged,
)
from ecast.core.ufabcast.paxos import Acceptor
from ecast.core.ufabcast.progress import Progress, chosen_upto, first_voters

IMMEDIATE = UfabParams(clump_trigger=1, clump_delay=0.0, commit_delay=0.0, vote_delay=0.0)


# ---------------------------------------------------------------------- the log
def test_the_log_keeps_the_first_value_decided_and_executes_in_order() -> None:
    log = Log()
    log.decide(0, 1, ("b",), current=0)
    log.decide(0, 0, ("a",), current=0)
    log.decide(0, 0, ("other",), current=0)  # chosen values are unique: the first stays
    assert log.next_chosen(0) == ("a",)
    log.executed_at(0, 0, ("a",))
    assert log.next_chosen(0) == ("b",)
    log.executed_at(1, 0, ("b",))
    assert log.next_chosen(0) is None and log.executed == 1
    log.decide(0, 1, ("late",), current=0)  # executed already: ignored
    assert log.decided[0] == {}


def test_a_closed_views_undecided_values_are_void() -> None:
    log = Log()
    log.decide(0, 5, ("void",), current=0)
    log.decide(1, 6, ("next view",), current=0)
    assert log.close_views_before(1, start=5, carry=False) == 1
    assert 0 not in log.decided and log.decided[1] == {6: ("next view",)}
    log.decide(1, 7, ("x",), current=1)
    log.decide(2, 3, ("y",), current=1)
    assert log.close_views_before(2, start=3, carry=True) == 2  # the planted bug
    assert log.decided[2] == {3: ("y",), 6: ("next view",), 7: ("x",)}


def test_a_commit_takes_values_from_the_acceptor_and_reports_what_is_missing() -> None:
    log = Log()
    acc = Acceptor()
    acc.accepted[0] = ((1, "a"), ("v0",))
    acc.accepted[1] = ((0, "a"), ("older ballot",))  # below the commit's ballot: not it
    acc.seen[2] = ((2, "b"), ("seen",))
    missing = log.learn_commit(Commit(0, (1, "a"), 0, 2, -1), acc, floor=0)
    assert missing and log.decided[0] == {0: ("v0",), 2: ("seen",)}
    # The same commit again walks nothing; a higher one goes on from where it stopped.
    assert not log.learn_commit(Commit(0, (1, "a"), 0, 2, -1), acc, floor=0)
    acc.accepted[3] = ((1, "a"), ("v3",))
    assert not log.learn_commit(Commit(0, (1, "a"), 0, 3, -1), acc, floor=0)
    assert log.decided[0][3] == ("v3",)


def test_the_log_serves_contiguous_entries_and_collects_and_jumps() -> None:
    log = Log()
    for i in range(6):
        log.executed_at(i, 0, (f"v{i}",))
    assert log.serve(2, 3) == [(2, 0, ("v2",)), (3, 0, ("v3",)), (4, 0, ("v4",))]
    log.collect(2, -1)
    assert sorted(log.entries) == [3, 4, 5]
    assert not log.reaches(2, watermark=2) and log.reaches(3, watermark=2)
    log.decide(0, 9, ("ahead",), current=0)
    log.decide(0, 12, ("further",), current=0)
    log.jump_to(10)  # a snapshot at 10
    assert log.next_exec == 11 and not log.entries and log.decided[0] == {12: ("further",)}
    assert not log.reaches(10, watermark=-1)


# ---------------------------------------------------------------------- progress, quorum
def test_an_instance_is_chosen_once_a_majority_accepted_it() -> None:
    members = ("a", "b", "c", "d", "e")
    assert chosen_upto({"a": 9, "b": 7, "c": 3}, members, 3, floor=-1) == 3
    assert chosen_upto({"a": 9, "b": 7}, members, 3, floor=-1) == -1
    assert chosen_upto({"a": 9, "b": 7, "c": 8, "d": 9}, members, 3, floor=-1) == 8
    p = Progress()
    assert p.ack("b", 4) and not p.ack("b", 3) and not p.ack("b", 4)
    assert p.ack("a", 6) and p.chosen(("a", "b", "c"), 2, floor=-1) == 4


def test_the_first_voters_with_the_leader_make_a_majority() -> None:
    assert first_voters(("a", "b", "c", "d", "e"), "a", 3) == ["b", "c"]
    assert first_voters(("a", "b", "c"), "c", 2) == ["a"]
    assert first_voters(("a", "b", "c"), "x", 2) == ["a", "b"]  # a leader outside the view


# ---------------------------------------------------------------------- leader duties
def _sent(fx: object, kind: type) -> list[tuple[str, object]]:
    return [(d, m) for d, m in fx.send if type(m) is kind]  # type: ignore[attr-defined]


def test_the_first_member_leads_round_zero_without_phase_one() -> None:
    a = Ufabcast("a", IMMEDIATE, members=["a", "b", "c"])
    assert a.leader.active() is not None and a.leader.lead.ballot == (0, "a")  # type: ignore[union-attr]
    fx = a.propose("x", 0.0)
    accepts = _sent(fx, Accept)
    assert sorted(d for d, _ in accepts) == ["b", "c"] and not _sent(fx, Prepare)
    b = Ufabcast("b", IMMEDIATE, members=["a", "b", "c"])
    assert b.leader.active() is None and b.leader.believed() == "a"


def test_phase_one_reproposes_the_highest_accepted_value_and_fills_holes() -> None:
    b = Ufabcast("b", IMMEDIATE, members=["a", "b", "c"])
    b.detector.suspected.add("a")  # the round-0 leader looks dead: b tries to lead
    fx = b.on_tick(0.0)
    ((_, prepare),) = [x for x in _sent(fx, Prepare) if x[0] == "c"]
    assert prepare.ballot[0] >= 1 and b.leader.lead.preparing  # type: ignore[attr-defined,union-attr]
    accepted = ((0, (0, "a"), ("x",)), (2, (0, "a"), ("z",)))
    fx = b.on_message("c", Promise(0, prepare.ballot, 0, accepted), 0.0)  # type: ignore[attr-defined]
    values = {m.instance: m.value for _, m in _sent(fx, Accept)}  # type: ignore[attr-defined]
    # b suspects a and hears c (its clock starts at b's first tick): its part of a goes
    # after the instances phase 1 must re-propose.
    assert values == {0: ("x",), 1: NOOP, 2: ("z",), 3: (PartCmd("b", "a"),)}


def test_a_higher_ballot_makes_a_leader_step_down_and_back_off() -> None:
    a = Ufabcast("a", IMMEDIATE, members=["a", "b", "c"])
    before = a.leader.backoff
    a.on_message("b", Prepare(0, (5, "b"), 0), 1.0)
    assert a.leader.lead is None and a.leader.believed() == "b"
    assert a.leader.backoff == 2 * before and a.leader.backoff_until > 1.0
    assert a.stats["stepdowns"] == 1


def test_a_leader_stops_at_max_active_but_a_part_always_goes() -> None:
    p = UfabParams(clump_trigger=1, clump_delay=0.0, max_active=2, commit_delay=0.0)
    a = Ufabcast("a", p, members=["a", "b", "c"])
    for i in range(4):
        a.propose(f"m{i}", 0.0)
    # Instances 0 and 1: at most max_active beyond the watermark (-1).
    assert a.leader.lead.next_inst == 2  # type: ignore[union-attr]
    assert a.stats["limit_blocked"] >= 1 and a.leader.queue
    fx = a.leave(0.0)
    parts = [m for _, m in _sent(fx, Accept) if any(type(c) is PartCmd for c in m.value)]  # type: ignore[attr-defined]
    assert parts, "a part must be proposed at once, beyond max_active"


# ---------------------------------------------------------------------- configuration changes
def test_joins_and_parts_that_change_nothing_are_redundant() -> None:
    a = Ufabcast("a", IMMEDIATE, members=["a", "b"])
    v = a.views
    assert v.redundant(JoinCmd("a", "b")) and not v.redundant(JoinCmd("a", "x"))
    assert v.redundant(PartCmd("a", "x")) and not v.redundant(PartCmd("a", "b"))
    v.retired.add("old")
    assert v.redundant(JoinCmd("a", "old"))
    alone = Ufabcast("z", IMMEDIATE, members=["z"])
    assert alone.views.redundant(PartCmd("z", "z"))  # the last member stays


def test_a_stop_sign_starts_the_next_view_and_owes_the_joiner_a_snapshot() -> None:
    a = Ufabcast("a", IMMEDIATE, members=["a", "b"])
    a._begin(0.0)
    a.views.apply(4, (AppCmd("a", 1, "x"), JoinCmd("b", "j"), AppCmd("b", 1, "after")))
    fx = a._end()
    assert a.view == View(1, ("a", "b", "j"), 5)
    kinds = [type(u) for u in fx.deliver]
    assert SnapshotNeeded in kinds and ViewChanged in kinds
    assert ("j", 4) in a.views.snap_parts


def test_commands_of_a_router_after_its_own_part_are_ignored() -> None:
    a = Ufabcast("a", IMMEDIATE, members=["a", "b", "c"])
    a._begin(0.0)
    a.views.apply(0, (PartCmd("a", "c"), AppCmd("c", 1, "late")))
    fx = a._end()
    assert "c" in a.views.retired and a.stats["ignored_parted"] == 1
    assert not [u for u in fx.deliver if getattr(u, "payload", None) == "late"]


def test_commands_a_queue_hands_on_are_taken_again_if_they_come_back() -> None:
    """A router about to lead queued a part, handed it on when leadership seemed to go
    elsewhere, and led after all in the same tenure: the part came back and was refused
    as already queued, every resend too, and the dead router stayed a member for good
    (the ufabcast simulator, ``--seed 145 --routers 4 --commands 145 --no-clumping``)."""
    from ecast.core.ufabcast.proposer import ClumpQueue

    q = ClumpQueue()
    part = PartCmd("b", "a")
    app = AppCmd("b", 3, "x")
    assert q.add(part, ("PartCmd", "a"), 0.0) and q.add(app, ("b", 3), 0.0)
    assert q.take() == [part, app]
    assert q.add(part, ("PartCmd", "a"), 1.0) and q.add(app, ("b", 3), 1.0)
    assert not q.add(part, ("PartCmd", "a"), 1.0)  # a resend crossing it: one instance
