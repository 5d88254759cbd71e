"""ufabcast driven by scripts: each test stages one behaviour the issue requires."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ecast.core.ufabcast import NOOP, AppCmd, Executed, JoinCmd, PartCmd, Ufabcast, UfabParams
from ecast.core.ufabcast.messages import (
    Accept,
    Accepted,
    CatchUpReply,
    Commit,
    Forward,
    Heartbeat,
    JoinRequest,
    Parted,
    Prepare,
    Promise,
    Snapshot,
)
from ecast.sim.manual import ManualNet
from tests import scenarios
from tests.scenarios import params


def accepts(net: ManualNet, src: str, dst: str) -> list[Accept]:
    return [m for s, d, m in net.sent if s == src and d == dst and type(m) is Accept]


def test_founders_execute_one_total_order() -> None:
    net = ManualNet(["a", "b", "c"], params())
    for i in range(10):
        net.propose("abc"[i % 3], f"m{i}")
    net.settle(0.5)
    logs = {r: net.executed(r) for r in "abc"}
    assert logs["a"] == logs["b"] == logs["c"]
    assert sorted(logs["a"]) == sorted(f"m{i}" for i in range(10))
    assert net.violations() == []


def test_leader_pipelines_instances_without_waiting() -> None:
    net = ManualNet(["a", "b", "c"], params())
    for i in range(8):
        net.propose("a", f"m{i}")
    # Eight Accepts are on the wire to b before b has acknowledged anything.
    assert [m.instance for m in net.pending("a", "b")] == list(range(8))


def test_clumping_waits_for_the_timer_or_the_trigger_and_the_trigger_is_no_cap() -> None:
    net = ManualNet(["a", "b", "c"], UfabParams(pipeline_depth=0))  # fixed: 10 ms, 3 commands
    net.propose("a", "m0")
    net.propose("a", "m1")
    assert net.pending("a", "b") == []  # two are waiting for a third or the timer
    net.tick(0.011)
    (first,) = [m for m in net.pending("a", "b") if type(m) is Accept]
    assert [c.payload for c in first.value] == ["m0", "m1"]
    # Ten commands arriving in one Forward leave as one instance: 3 triggers, not caps.
    batch = tuple(AppCmd("b", i, f"b{i}") for i in range(1, 11))
    net.inject("b", "a", Forward(batch))
    net.deliver("b", "a")
    last = [m for m in net.pending("a", "b") if type(m) is Accept][-1]
    assert [c.payload for c in last.value] == [f"b{i}" for i in range(1, 11)]
    # With a cap of 4 per instance the same Forward needs three instances.
    capped = ManualNet(["a", "b", "c"], UfabParams(max_batch=4, pipeline_depth=0))
    capped.inject("b", "a", Forward(batch))
    capped.deliver("b", "a")
    sizes = [len(m.value) for m in capped.pending("a", "b") if type(m) is Accept]
    assert sizes == [4, 4, 2]


def test_instance_after_a_stop_sign_is_void_even_though_it_was_chosen() -> None:
    net = scenarios.void_after_stop_sign()
    # Instance 1 of view 0 carried x and was accepted by a, b and c (a majority of 4)...
    old = [m for m in accepts(net, "a", "b") if m.view == 0 and m.instance == 1]
    assert [c.payload for c in old[0].value] == ["x"]
    # ...yet view 1 starts at instance 1, where z stands, and x comes again later.
    new = [m for m in accepts(net, "a", "b") if m.view == 1]
    assert [(m.instance, [c.payload for c in m.value]) for m in new[:2]] == [
        (1, ["z"]),
        (2, ["x"]),
    ]
    for r in "abcdj":
        assert net.executed(r) == ["z", "x"], r
    assert all(net.core(r).stats["void_discarded"] >= 1 for r in "abcd")
    assert net.violations() == []


def test_reproposed_command_keeps_its_identity_and_executes_once() -> None:
    net = scenarios.reproposal_after_leader_crash()
    carrying_x = {
        (m.view, m.instance)
        for _s, _d, m in net.sent
        if type(m) is Accept and any(getattr(c, "payload", None) == "x" for c in m.value)
    }
    assert len({i for _v, i in carrying_x}) >= 2  # chosen in two instances
    ids = {
        (c.proposer, c.seq)
        for _s, _d, m in net.sent
        if type(m) is Accept
        for c in m.value
        if getattr(c, "payload", None) == "x"
    }
    assert ids == {("b", 1)}
    for r in "bcd":
        assert net.executed(r) == ["x"]
        assert net.core(r).stats["duplicates_dropped"] >= 1
    assert net.violations() == []


def test_leader_crash_after_execution_keeps_uniform_agreement() -> None:
    net = scenarios.chosen_then_leader_crash()
    assert net.notes["a executed before crashing"] == ["x"]
    for r in "bcd":
        assert net.executed(r) == ["x"]
    assert net.violations() == []


def _fifo_model(instances: list[list[AppCmd]]) -> list[tuple[str, int]]:
    """Reference: release per proposer in sequence order, each identity once."""
    nxt: dict[str, int] = {}
    held: dict[str, set[int]] = {}
    out = []
    for value in instances:
        for c in value:
            n = nxt.get(c.proposer, 1)
            if c.seq < n:
                continue
            held.setdefault(c.proposer, set()).add(c.seq)
            while n in held[c.proposer]:
                held[c.proposer].discard(n)
                out.append((c.proposer, n))
                n += 1
            nxt[c.proposer] = n
    return out


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.sampled_from(["p", "q"]), st.integers(1, 8)), max_size=4),
        min_size=1,
        max_size=12,
    ),
    st.integers(0, 11),
    st.lists(st.integers(1, 5), min_size=1, max_size=6),
)
def test_fifo_release_is_a_function_of_the_executed_sequence(
    raw: list[list[tuple[str, int]]], join_at: int, chunking: list[int]
) -> None:
    instances = [[AppCmd(p, s, f"{p}{s}") for p, s in value] for value in raw]
    values: list[tuple] = [tuple(v) for v in instances]
    if join_at < len(values):  # a view change in the middle: held commands must survive it
        values[join_at] = (JoinCmd("p", "j"), *values[join_at])
    expected = _fifo_model(instances)

    def run(chunks: list[int]) -> list[tuple[str, int]]:
        core = Ufabcast("r", params(), members=["r", "p", "q"])
        entries = []
        view = 0
        for i, v in enumerate(values):
            entries.append((i, view, v))
            if any(type(c) is JoinCmd for c in v):
                view += 1
        out: list[tuple[str, int]] = []
        pos, k = 0, 0
        while pos < len(entries):
            size = chunks[k % len(chunks)]
            k += 1
            fx = core.on_messages("p", (CatchUpReply(tuple(entries[pos : pos + size])),), 0.0)
            out.extend((e.proposer, e.seq) for e in fx.deliver if type(e) is Executed)
            pos += size
        return out

    assert run([len(values)]) == expected
    assert run(chunking) == expected


def test_phase1_fills_holes_with_the_highest_accepted_value_or_a_noop() -> None:
    b = Ufabcast("b", params(), members=["a", "b", "c"])
    stop = (PartCmd("a", "c"),)
    low, high = (AppCmd("a", 1, "low"),), (AppCmd("c", 1, "high"),)
    # b accepted instance 2 from a (ballot (0, a)) before a went quiet.
    b.on_messages("a", (Accept(0, (0, "a"), 2, low),), 0.0)
    sent = []
    for k in range(7):  # b ticks every 250 ms; a and c stay silent: b suspects, prepares
        sent += b.on_tick(k * 0.25).send
    (prepare,) = {m for _d, m in sent if type(m) is Prepare}
    assert prepare.start == 0
    # c promises: a stop sign at 1 (nothing anywhere at 0), and 2 at a higher ballot.
    promise = Promise(0, prepare.ballot, 0, ((1, (0, "a"), stop), (2, (1, "c"), high)))
    fx = b.on_messages("c", (promise,), 1.5)
    proposed = [(m.instance, m.value) for d, m in fx.send if d == "c" and type(m) is Accept]
    assert proposed[:3] == [(0, NOOP), (1, stop), (2, high)]
    # Once chosen, the hole executes as a no-op and the stop sign ends the view.
    top = max(i for i, _v in proposed)
    fx = b.on_messages("c", (Accepted(0, prepare.ballot, top, -1),), 1.6)
    assert b.view is not None and b.view.number == 1 and "c" not in b.view.members


def test_redundant_parts_and_joins_are_proposed_once() -> None:
    net = ManualNet(["a", "b", "c", "d"], params())
    net.crash("d")
    net.settle(1.6)  # a, b and c all suspect d and propose part(d)
    parts = {
        m.instance
        for m in accepts(net, "a", "b")
        if any(type(c) is PartCmd and c.router == "d" for c in m.value)
    }
    assert len(parts) == 1
    assert all(not net.core(r).proposer.reconfigs for r in "abc")
    # A joiner asking two routers is joined once.
    net.join("j", ["b", "c"])
    net.inject("j", "c", JoinRequest())
    net.settle(0.5)
    joins = {
        m.instance
        for _s, _d, m in net.sent
        if type(m) is Accept and any(type(c) is JoinCmd and c.router == "j" for c in m.value)
    }
    assert len(joins) == 1
    assert net.core("j").installed
    assert net.violations() == []


def test_commands_of_a_parted_router_are_ignored() -> None:
    net = scenarios.parted_router_late_command()
    for r in "ab":
        assert net.executed(r) == ["y1"]
    assert net.core("c").stopped
    # The late Forward(y2) reached a after c's part and was not proposed.
    late = [m for s, d, m in net.sent if s == "c" and d == "a" and type(m) is Forward]
    assert any(c.payload == "y2" for m in late for c in m.cmds if type(c) is AppCmd)
    assert not any(
        getattr(c, "payload", None) == "y2" for m in accepts(net, "a", "b") for c in m.value
    )
    assert net.violations() == []


def test_held_back_commands_of_a_parted_router_are_discarded() -> None:
    net = scenarios.parted_router_held_back()
    assert net.notes["held before part"] == {"a": [3], "b": [3], "c": [3]}
    for r in "ab":
        assert "c" not in net.core(r).held
        assert net.executed(r) == ["y1"]  # y3 never executes without y2
    assert net.violations() == []


def test_parted_router_stops_and_may_rejoin_only_under_a_fresh_id() -> None:
    net = scenarios.parted_router_late_command()
    assert net.core("c").stopped
    net.replace("c", Ufabcast("c", params(), seeds=["a"]))  # same id, new process
    net.settle(0.5)
    assert net.core("c").stopped and not net.core("c").installed
    assert any(s == "a" and d == "c" and type(m) is Parted for s, d, m in net.sent)
    assert not any(
        type(m) is Accept and any(type(c) is JoinCmd and c.router == "c" for c in m.value)
        for _s, _d, m in net.sent
    )
    net.join("c2", ["a"])
    net.settle(0.5)
    assert net.core("c2").installed
    assert net.core("a").view is not None and "c2" in net.core("a").view.members


def test_a_retiring_router_finishes_when_the_view_it_left_for_has_moved_on() -> None:
    """c parts from {a, b, c}; before its confirmations arrive, b parts from {a, b} and its
    process exits.  A majority of {a, b}, the view c left for, can never confirm c's part
    now; a's later view is proof enough that {a, b} executed c's stop sign (it was decided
    by a majority of {a, b}), so c may go.  Found by a jepsen_like run where a lingering
    retiree kept the group from settling for good."""
    net = ManualNet(["a", "b", "c"], params())
    net.leave("c")
    net.deliver("c", "a")  # c's part reaches the leader; what c says later is held
    held = {("c", "a"), ("c", "b")}
    net.settle(0.5, hold=held)
    c = net.core("c")
    assert c.retiring and c.view is not None and c.view.members == ("a", "b")
    net.leave("b")
    net.settle(0.5, hold=held)
    assert net.core("b").finished
    net.crash("b")
    assert net.core("a").view is not None and net.core("a").view.members == ("a",)
    net.settle(0.5)
    assert c.finished and not c.retiring
    assert net.violations() == []


def test_a_retiring_router_stopped_by_a_batch_ignores_the_rest_of_it() -> None:
    """Two confirmations in one frame: the first stops the retiree, and the second found
    no retirement left to confirm and failed an assertion (a seeded custom-config
    schedule, seed 243)."""
    net = ManualNet(["a", "b", "c"], params())
    net.leave("c")
    net.deliver("c", "a")
    held = {("c", "a"), ("c", "b")}
    net.settle(0.5, hold=held)
    c = net.core("c")
    assert c.retiring and c.view is not None
    later = c.view.number + 1
    c.on_messages("a", (Parted(later, ("a",)),) * 3, net.now)
    assert c.finished and not c.retiring


def test_routers_that_part_each_other_lose_exactly_one() -> None:
    net = scenarios.mutual_parts()
    members = net.core("c").view.members  # type: ignore[union-attr]
    assert ("a" in members) != ("b" in members)
    loser = "b" if "a" in members else "a"
    assert net.core(loser).stopped
    winner = "a" if loser == "b" else "b"
    assert net.core(winner).view == net.core("c").view
    assert net.violations() == []


def test_joiner_buffers_until_its_snapshot_and_ignores_later_ones() -> None:
    net = ManualNet(["a", "b", "c"], params())
    net.propose("a", "before")
    net.settle(0.1)
    net.join("j", ["a"])
    net.deliver("j", "a")
    hold = {("b", "j"), ("c", "j")}
    net.deliver_all(hold=hold | {("a", "j")})
    # a's snapshot is lost; what a sends next (Accepts of the new view) reaches j first.
    snap_index = next(i for i, m in enumerate(net.pending("a", "j")) if type(m) is Snapshot)
    net.lose("a", "j", snap_index)
    net.propose("a", "after")
    net.deliver_all(hold=hold)
    assert not net.core("j").installed and net.executed("j") == []
    net.deliver("b", "j")  # b's snapshot: install, then apply what was buffered
    assert net.core("j").installed
    net.deliver("c", "j")  # a third snapshot changes nothing
    net.settle(0.5)
    assert net.executed("j") == net.executed("a") == ["before", "after"]
    assert net.violations() == []


def test_active_instance_limit_holds_back_proposals_but_never_a_part() -> None:
    net = ManualNet(["a", "b", "c"], params(max_active=4))
    for i in range(10):
        net.propose("a", f"m{i}")
    assert [m.instance for m in net.pending("a", "b")] == [0, 1, 2, 3]
    assert net.core("a").stats["limit_blocked"] > 0
    net.leave("c")  # part(c) goes out at once, beyond the limit
    net.deliver("c", "a")
    assert any(type(c) is PartCmd for m in net.pending("a", "b")[4:] for c in m.value)
    net.settle(2.0)  # heartbeats advance the watermark; the rest follows
    assert sorted(net.executed("a")) == sorted(f"m{i}" for i in range(10))
    assert net.violations() == []


def test_adaptive_clumping_sends_at_once_when_idle_and_batches_when_busy() -> None:
    net = ManualNet(["a", "b", "c"], UfabParams(pipeline_depth=2))
    net.propose("a", "m0")  # idle leader: out at once, no timer
    net.propose("a", "m1")  # one uncommitted instance: still below the depth
    accepts = [m for m in net.pending("a", "b") if type(m) is Accept]
    assert [[c.payload for c in m.value] for m in accepts] == [["m0"], ["m1"]]
    net.propose("a", "m2")  # two uncommitted: the clumping rule takes over
    net.propose("a", "m3")
    assert len([m for m in net.pending("a", "b") if type(m) is Accept]) == 2
    net.deliver_all()  # m0 and m1 commit: what waited leaves as one batch
    values = [
        [c.payload for c in m.value]
        for src, dst, m in net.sent
        if src == "a" and dst == "b" and type(m) is Accept
    ]
    assert values == [["m0"], ["m1"], ["m2", "m3"]]


def test_a_stalled_router_does_not_blame_others_for_its_own_pause() -> None:
    b = Ufabcast("b", params(), members=["a", "b", "c"])
    b.on_messages("a", (Heartbeat(0, 0),), 0.0)
    b.on_messages("c", (Heartbeat(0, 0),), 0.0)
    b.on_tick(0.0)
    # b's process was starved for 1.5 s: heartbeats from a and c may sit unread.
    fx = b.on_tick(1.5)
    assert not b.detector.suspected and not any(type(m) is Prepare for _d, m in fx.send)
    assert b.stats["stalls_excused"] == 1
    # Real silence after the stall is still detected, one failure timeout later.
    for k in range(1, 7):
        b.on_tick(1.5 + k * 0.25)
    assert b.detector.suspected == {"a", "c"}


def test_a_commit_rides_with_the_next_accept_or_leaves_alone_after_the_delay() -> None:
    net = ManualNet(["a", "b", "c"], UfabParams(commit_delay=0.005))
    net.propose("a", "m0")
    net.deliver("a", "b")
    net.deliver("b", "a")  # m0 is chosen: its Commit waits for company
    assert not [m for m in net.pending("a", "b") if type(m) is Commit]
    assert net.executed("b") == ["m0"]  # b decided on accepting (two of three votes)
    net.propose("a", "m1")  # the next Accept takes the Commit along, in the same step
    assert [type(m) for m in net.pending("a", "b")] == [Accept, Commit]
    net.deliver_all()
    net.tick(0.004)
    assert not [m for m in net.pending("a", "c") if type(m) is Commit and m.hi == 1]
    net.tick(0.002)  # nothing else to carry it: out alone once the delay is over
    (commit,) = [m for m in net.pending("a", "c") if type(m) is Commit]
    assert commit.hi == 1
    net.settle(0.5)
    assert net.executed("c") == ["m0", "m1"] and net.violations() == []


def test_a_commit_goes_at_once_without_a_delay() -> None:
    net = ManualNet(["a", "b", "c"], UfabParams(commit_delay=0.0))
    net.propose("a", "m0")
    net.deliver("a", "b")
    net.deliver("b", "a")
    assert [m.hi for m in net.pending("a", "b") if type(m) is Commit] == [0]


def test_the_first_follower_votes_at_once_and_the_other_after_the_vote_delay() -> None:
    net = ManualNet(["a", "b", "c"], UfabParams(vote_delay=0.005))
    net.propose("a", "m0")
    net.deliver("a", "b")
    net.deliver("a", "c")
    assert [type(m) for m in net.pending("b", "a")] == [Accepted]  # the vote a waits for
    assert net.pending("c", "a") == []  # a redundant vote, held
    net.tick(0.006)
    assert [type(m) for m in net.pending("c", "a") if type(m) is not Heartbeat] == [Accepted]
    net.settle(0.5)
    assert net.executed("a") == ["m0"] and net.violations() == []


def test_a_held_vote_still_chooses_when_the_prompt_voter_is_gone() -> None:
    net = ManualNet(["a", "b", "c"], UfabParams(vote_delay=0.005))
    net.crash("b")
    net.propose("a", "m0")
    net.deliver_all()
    assert net.executed("a") == []
    net.tick(0.006)
    net.deliver_all()
    assert net.executed("a") == ["m0"]


def test_the_log_is_collected_a_round_trip_after_everyone_executed_it_not_a_heartbeat() -> None:
    # Heartbeats every 30 s: any collection below comes from Accepted and Commit alone.
    net = ManualNet(["a", "b", "c"], params(heartbeat_interval=30.0, failure_timeout=60.0))
    for i in range(4):
        net.propose("a", f"m{i}")
        net.deliver_all()
        net.tick(0.01)
        net.deliver_all()
    assert all(net.executed(r) == [f"m{i}" for i in range(4)] for r in "abc")
    # The only heartbeats went out with the first tick, when instance 0 was all anyone had.
    assert {m.executed for _s, _d, m in net.sent if type(m) is Heartbeat} == {0}
    a, b, c = (net.core(r) for r in "abc")
    # The leader heard every follower's position in its votes and collected what all
    # executed; each Commit carried that watermark to the followers, one instance behind.
    assert a.watermark == 3 and not a.log.entries
    assert b.watermark == c.watermark == 2 and sorted(b.log.entries) == sorted(c.log.entries) == [3]
    commits = [m.collected for s, d, m in net.sent if s == "a" and type(m) is Commit]
    assert commits == sorted(commits) and commits[-1] == 2
    assert net.violations() == []


def test_a_router_cut_off_from_the_rest_holds_its_parts_until_it_hears_a_majority() -> None:
    """c crashes right after a and b are cut apart.  Parting b (a's first suspect) would
    wait in the log for b's own vote and, decided once the cut heals, leave the view a
    and c with c dead: no router could change it again.  a holds its parts while it hears
    no majority of the view without them, and parts c alone once the cut heals."""
    net = ManualNet(["a", "b", "c"], params())
    net.propose("a", "m0")
    net.settle(0.5)
    cut = {("a", "b"), ("b", "a")}
    net.settle(0.1, hold=cut)
    net.crash("c")
    net.settle(1.5, hold=cut)
    assert net.core("a").detector.suspected == {"b", "c"}
    assert not net.core("a").proposer.reconfigs and not net.core("b").proposer.reconfigs
    net.settle(3.0)  # the cut heals: what waited on its links crosses
    for r in ("a", "b"):
        assert net.core(r).view.members == ("a", "b"), r  # type: ignore[union-attr]
    net.propose("b", "m1")
    net.settle(0.5)
    assert net.executed("a")[-1] == net.executed("b")[-1] == "m1"
    assert not net.violations(liveness=False)


def test_two_routers_that_each_believe_the_other_leads_settle_on_one() -> None:
    """a heard b's ballot last and believes b leads; b stepped down for c's higher
    ballot, suspects c, and so believes a (the first member).  Neither ran phase 1, and
    a's commands went to b, which sent them back nowhere (simulator: ``--layer ufabcast
    --seed 26731 --routers 3 --commands 50 --max-active 4 --no-clumping`` never executed
    again).  A router that gets commands from the one it believes leads takes over."""
    net = ManualNet(["a", "b", "c"], params())
    net.propose("a", "m0")
    net.settle(0.1)
    net.crash("c")
    a, b = net.core("a"), net.core("b")
    a.leader.lead = None
    a.leader.max_round = 1
    a.leader.hint_ballot = (1, "b")
    b.leader.max_round = 1
    b.leader.hint_ballot = (1, "c")
    b.detector.suspected.add("c")
    assert a.leader.believed() == "b" and b.leader.believed() == "a"
    net.propose("a", "m1")
    net.settle(0.5)
    assert net.executed("a")[-1] == net.executed("b")[-1] == "m1"
    assert b.stats["leadership_claimed"] >= 1
