"""Routers and endpoints driven by scripts: each test stages one required behaviour."""

from __future__ import annotations

from ecast import history
from ecast.core.config import KeyRingConfig
from ecast.core.effects import UnexpectedMessage
from ecast.core.endpoint import (
    Acked,
    Endpoint,
    EndpointClosed,
    EndpointParams,
    LeaderChanged,
    Shed,
)
from ecast.core.message import Submission
from ecast.core.proto import (
    CloseForbidden,
    CloseSessions,
    Confirm,
    Congestion,
    Deliver,
    DeliverUnsafe,
    Forbidden,
    Hello,
    Leader,
    RejectedClosed,
    Route,
    Stable,
    StableCmd,
    Suspected,
    UnsafeShed,
)
from ecast.core.router import Router
from ecast.core.ufabcast.messages import Accept
from tests import ecast_scenarios as sc


def sent(n, kind, src=None, dst=None):  # type: ignore[no-untyped-def]
    return [
        (s, d, m)
        for s, d, m in n.sent
        if type(m) is kind and (src is None or s == src) and (dst is None or d == dst)
    ]


def acks_of(n, pid):  # type: ignore[no-untyped-def]
    return n.history.of_kind(pid, history.Ack)


def unsafe_of(n, pid):  # type: ignore[no-untyped-def]
    return n.history.of_kind(pid, history.DeliverUnsafe)


def test_broadcast_delivers_one_order_and_acknowledges_with_timestamps() -> None:
    n = sc.net()
    for p in "abc":
        n.add_app(p)
    n.settle(0.3)
    for i in range(6):
        n.submit("abc"[i % 3], f"m{i}")
    n.settle(0.5)
    orders = {p: [x for x in n.delivered(p) if x] for p in "abc"}
    assert orders["a"] == orders["b"] == orders["c"]
    assert sorted(orders["a"]) == [f"m{i}" for i in range(6)]
    for p in "abc":
        acks = [e for e in acks_of(n, p) if e.t is not None]
        assert len(acks) == 3 and all(e.delivered for e in acks)  # join + two messages, delivered
    assert n.violations() == []


def test_forwarding_keeps_strict_t_order_per_destination() -> None:
    n = sc.leader_change_after_last_message()
    for _s, _d, m in sent(n, Deliver):
        ts = [t for t, _m in m.items]
        assert ts == sorted(set(ts))
    # The new leader sent x again; a confirmed the duplicate; x became stable.
    assert n.notes["a delivered before the crash"] == [None, None, "x"]
    assert [e.id for e in acks_of(n, "a")][-1] == (("a", 0, ""), 1)  # x, the data session's first
    assert n.violations() == []


def test_route_of_a_learned_unstable_message_is_not_proposed_again() -> None:
    n = sc.net()
    n.add_app("a")
    n.add_app("b")
    n.credentials["b"] = ("a",)  # b's credential covers a's session, as Spark tasks share one
    n.settle(0.3)
    n.submit("a", "x")
    n.deliver("a", "r1")  # the route itself
    held = {("a", "r1"), ("b", "r1")}  # then confirmations wait: x stays unstable
    n.deliver_all(hold=held)
    r1 = n.router("r1")
    assert r1.unstable() == 1
    routed = r1.stats["routed"]
    sub = n.endpoint("a").window[1]
    n.inject("a", "r1", Route((sub,)))  # a resends x (as after a leader change)
    n.inject("b", "r1", Route((sub,)))  # b routes the same submission too
    n.settle(0.5)
    assert r1.stats["routed"] == routed  # neither was proposed again
    assert any(e.id == sub.id for e in acks_of(n, "a"))
    # Every process that routed the message gets the stable acknowledgement.
    to_b = [a for _s, _d, m in sent(n, Stable, dst="b") for a in m.acks if a[0] == sub.id]
    assert to_b and to_b[0][1] is not None
    assert n.violations() == []


def test_message_nobody_receives_is_acknowledged_at_once_as_not_delivered() -> None:
    n = sc.net()
    n.add_app("stranger", join=False)  # never joined: the config ignores its messages
    n.settle(0.2)
    n.submit("stranger", "lost")
    n.settle(0.3)
    (ack,) = acks_of(n, "stranger")
    _id, t, delivered, _at = ack
    assert t is not None and delivered is False
    assert n.violations() == []


def test_suspected_process_is_told_and_stops_and_gets_nothing_more() -> None:
    n = sc.net()
    for p in ("a", "b", "mon"):
        n.add_app(p)
    n.settle(0.3)
    n.suspect("mon", ["b"])  # b is alive: a false suspicion
    n.settle(0.3)
    told = [m for _s, d, m in sent(n, Suspected) if d == "b"]
    assert told and n.endpoint("b").terminated == "suspected"
    # It is told where: the position of mon's suspect (which mon's ack names too).
    (at,) = [t for mid, t, _d, _a in acks_of(n, "mon") if mid == (("@mon", mid[0][1], ""), 2)]
    assert {m.t for m in told} == {at} and n.endpoint("b").suspected_at == at
    got = len(n.delivered("b"))
    n.submit("a", "after")
    n.settle(0.3)
    assert len(n.delivered("b")) == got
    assert "after" in n.delivered("a")
    assert n.violations() == []


def test_routers_let_the_link_buffers_of_departed_processes_go() -> None:
    # A parted or suspected process is owed nothing once its departure is stable and
    # collected; keeping its resend buffers would leak one channel per departed client.
    n = sc.net()
    for p in ("a", "b", "c", "mon"):
        n.add_app(p)
    n.settle(0.3)
    n.suspect("mon", ["b"])
    n.close("c")
    n.settle(0.3)
    for _ in range(3):  # traffic moves the collection floor past both departures
        n.submit("a", "more")
        n.settle(0.3)
    for r in ("r1", "r2", "r3"):
        assert {p for node, p in n.dropped if node == r} == {"b", "c"}, r
    assert "more" in n.delivered("a") and n.violations() == []


def test_close_ends_at_the_own_part_but_confirms_until_it_is_stable() -> None:
    n = sc.net()
    n.add_app("a")
    n.add_app("b")
    n.settle(0.3)
    n.close("b")
    try:
        n.submit("b", "too late")
    except EndpointClosed:
        pass
    else:
        raise AssertionError("submitting after close must fail")
    n.settle(0.3)
    ep = n.endpoint("b")
    assert ep.terminated == "closed" and not ep.lingering  # part stable: done
    assert n.router("r1").state.mseq.latest.members() == {"a"}
    assert n.violations() == []


def test_unsafe_message_is_accepted_only_where_the_tag_matches() -> None:
    n = sc.unsafe_then_safe()
    uns = unsafe_of(n, "b")
    assert uns and uns[0].accepted is True  # tag == t_max at b
    # Never confirmed, acknowledged or kept: no Confirm followed only the unsafe delivery.
    assert not any(e.id == uns[0].id for e in acks_of(n, "a"))
    assert n.endpoint("a").window == {}
    # Sent to a router that never forwarded anything to b: tag None, not accepted.
    n.submit_unsafe("a", "via r2")
    n.endpoint("a").target = "r2"
    n.submit_unsafe("a", "via r2 again")
    n.settle(0.2)
    assert n.router("r2").stats["unsafe_dropped"] >= 1
    # r2 does not lead: it says so at once, naming what it did not forward.
    assert n.endpoint("a").stats["unsafe_shed"] >= 1
    assert n.violations() == []


def test_unsafe_messages_are_accepted_after_a_takeover_with_no_safe_traffic() -> None:
    n = sc.unsafe_after_takeover()
    assert n.notes["leader"] == "r2"
    uns = unsafe_of(n, "b")
    # r2 had sent b nothing, so no tag (-1).
    assert [(e.tag, e.payload, e.accepted) for e in uns] == [(-1, "u", True)]
    assert not n.violations()


def test_a_process_that_only_sends_unsafe_messages_keeps_its_router() -> None:
    """Unsafe messages get no answer: a light client that sends nothing else (and is no
    destination) must probe its router with keep-alives rather than take it for gone (it
    moved to a follower, which shed every snapshot read it was sent)."""
    n = sc.unsafe_then_safe()
    c = n.add_app("c", join=False)
    n.settle(0.3)
    assert c.target == "r1"
    for i in range(40):  # 8 s, past the progress timeout and a keep-alive period
        n.submit_unsafe("c", f"u{i}")
        n.settle(0.2)
    assert c.target == "r1" and c.stats["unsafe_shed"] == 0
    assert "c" not in n.router("r2").apps, "c left its router for a follower"
    assert unsafe_of(n, "b")[-1].accepted
    assert n.violations() == []


def test_a_process_that_drifted_to_a_follower_is_sent_back_to_the_leader() -> None:
    """A follower sheds an unsafe message (it cannot forward one) and says who leads, in
    the view the process already knows: the process goes back to that leader, and its
    next unsafe message is accepted."""
    n = sc.unsafe_then_safe()
    a = n.endpoint("a")
    before = len(unsafe_of(n, "b"))
    a.target = "r2"
    n.submit_unsafe("a", "via a follower")
    n.settle(0.2)
    assert a.stats["unsafe_shed"] == 1 and a.target == "r1"
    n.submit_unsafe("a", "via the leader")
    n.settle(0.2)
    got = unsafe_of(n, "b")[before:]
    assert [(e.payload, e.accepted) for e in got] == [("via the leader", True)]
    assert n.violations() == []


def test_unsafe_copies_to_a_destination_whose_link_lags_are_dropped() -> None:
    n = sc.unsafe_then_safe()
    before = len(unsafe_of(n, "b"))
    r1 = n.router("r1")
    r1.link_lag = lambda d: r1.p.unsafe_lag_limit + 1 if d == "b" else 0
    a = n.endpoint("a")
    n.submit_unsafe("a", "shed")
    shed_id = (a.unsafe_session, a.next_unsafe - 1)
    n.settle(0.2)
    assert len(unsafe_of(n, "b")) == before
    assert r1.stats["unsafe_dropped"] >= 1
    # The sender is told which message was shed (it need not wait for an answer).
    assert a.stats["unsafe_shed"] == 1
    r1.link_lag = lambda d: 0  # caught up: unsafe copies flow again
    n.submit_unsafe("a", "flows")
    n.settle(0.2)
    assert len(unsafe_of(n, "b")) == before + 1
    assert a.stats["unsafe_shed"] == 1
    assert n.violations() == []
    # The endpoint hands the notice up for its own unsafe messages only.
    fx = a.on_message("r1", UnsafeShed((shed_id, (("x", 0, "~u"), 1))), n.now)
    assert [up for up in fx.deliver if isinstance(up, Shed)] == [Shed((shed_id,))]


def test_an_endpoint_whose_router_is_unreachable_moves_on_at_once() -> None:
    """The runtime lost the connection to our router (it was killed): the endpoint resends
    its window to the next router now, not after its progress timeout; that follower
    still names the old leader, which it must not go back to while it is unreachable."""
    ep = Endpoint("e", ["r1", "r2", "r3"], EndpointParams())
    ep.on_message("r1", Leader(1, ("r1", "r2", "r3")), 0.0)
    ep.submit("x", None, 0.1)
    fx = ep.routers_unreachable({"r1"}, 0.2)
    assert ep.target == "r2"
    sent = [(d, type(m).__name__) for d, m in fx.send]
    assert ("r2", "Hello") in sent and ("r2", "Route") in sent, sent
    ep.on_message("r2", Leader(1, ("r1", "r2", "r3")), 0.3)  # r2 has not taken over yet
    assert ep.target == "r2"
    ep.on_message("r2", Leader(2, ("r2", "r3")), 1.2)  # now it has
    assert ep.target == "r2" and ep.succession == ("r2", "r3")
    # r2 is lost too: r3 next, never back to r2 while it cannot be reached.
    ep.routers_unreachable({"r2"}, 1.5)
    assert ep.target == "r3"
    ep.on_message("r3", Leader(2, ("r2", "r3")), 1.6)
    assert ep.target == "r3"
    ep.routers_unreachable(set(), 2.0)  # r2 is back, and r3 says it leads: go to it
    ep.on_message("r3", Leader(2, ("r2", "r3")), 2.1)
    assert ep.target == "r2"


def test_an_endpoint_told_an_old_view_by_a_removed_router_still_reaches_the_group() -> None:
    """r2 was removed from the group while it was slow and never learnt it: it lives on
    in view 0, whose other members have stopped, and names r1 as the leader.  The
    process, which knows r4 (a member of the current view) from its list, goes back to
    r1 once when r2 says so (a leader's hiccup looks the same), but not after r1 made no
    progress twice; once every router of the old succession made none it tries r4,
    which says who leads now."""
    ep = Endpoint("e", ["r2", "r4"], EndpointParams())
    ep.submit("x", None, 0.0)
    ep.on_message("r2", Leader(0, ("r1", "r2", "r3")), 0.0)
    assert ep.target == "r1"
    now, path = 0.0, []
    for _ in range(8):
        now += ep.p.progress_timeout + 0.1
        fx = ep.on_tick(now)
        path.append(ep.target)
        if ep.target == "r2":  # the removed router answers with its old view again
            ep.on_message("r2", Leader(0, ("r1", "r2", "r3")), now + 0.01)
            path.append(ep.target)
        if ep.target == "r4":
            assert ("r4", "Route") in [(d, type(m).__name__) for d, m in fx.send]
            break
    assert path == ["r2", "r1", "r2", "r2", "r3", "r4"], path
    ep.on_message("r4", Leader(8, ("r4", "r5", "r7")), now + 0.02)
    assert ep.target == "r4" and ep.succession == ("r4", "r5", "r7")
    # A leader that answers again is gone back to when a follower names it.
    ep.on_tick(now + ep.p.progress_timeout + 0.1)  # no progress at r4 either (a hiccup)
    assert ep.target == "r5"
    ep.on_message("r5", Leader(8, ("r4", "r5", "r7")), now + ep.p.progress_timeout + 0.2)
    assert ep.target == "r4"


def test_endpoint_window_starts_at_one_doubles_and_halves_on_congestion() -> None:
    ep = Endpoint("e", ["r1"], EndpointParams())
    for i in range(40):
        ep.submit(i, None, 0.0)
    assert len(ep.window) == 1
    now = 0.0
    sizes = []
    for _ in range(12):
        now += 0.5
        ep.on_tick(now)
        sizes.append(ep.cwnd)
    assert sizes[:4] == [2, 4, 8, 16] and sizes[-1] == 1024
    assert len(ep.window) == 40
    ep.on_message("r1", Congestion(), now)
    assert ep.cwnd == 512
    for _ in range(20):
        ep.on_message("r1", Congestion(), now)
    assert ep.cwnd == 1


def test_endpoint_window_doubles_per_acknowledged_window_until_the_first_notice() -> None:
    ep = Endpoint("e", ["r1"], EndpointParams())
    for i in range(5000):
        ep.submit(i, None, 0.0)
    t = 0

    def ack_window() -> None:
        nonlocal t
        acks = []
        for seq in sorted(ep.window):
            acks.append(((ep.session, seq), t, True))
            t += 1
        ep.on_message("r1", Stable(tuple(acks)), 0.01)

    sizes = []
    for _ in range(11):
        ack_window()
        sizes.append(len(ep.window))
    # No timer fired (window_growth is 0.5 s): one round trip per doubling.
    assert sizes == [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 1024]
    ep.on_message("r1", Congestion(), 0.02)
    assert ep.cwnd == 512
    ack_window()  # a congested endpoint grows only with the periodic timer again
    assert ep.cwnd == 512
    ep.on_tick(0.6)
    assert ep.cwnd == 1024


def test_a_large_admission_leaves_as_routes_of_at_most_max_route_over_steps() -> None:
    ep = Endpoint("e", ["r1"], EndpointParams(initial_window=1024, max_route=256))
    _ids, fx = ep.submit_many([(i, None) for i in range(600)], 0.0)
    sizes = [len(m.subs) for _d, m in fx.send if type(m) is Route]
    assert sizes == [256] and fx.wake_at == 0.0  # the rest in the next step, at once
    fx = ep.on_tick(0.0)
    assert [len(m.subs) for _d, m in fx.send if type(m) is Route] == [256]
    fx = ep.on_tick(0.0)
    routes = [m for _d, m in fx.send if type(m) is Route]
    assert [len(m.subs) for m in routes] == [88] and routes[0].subs[-1].payload == 599
    assert fx.wake_at is not None and fx.wake_at > 0.0  # nothing left to send now


def test_router_notifies_submitters_above_their_fair_quota() -> None:
    n = sc.net(congestion_threshold=4)
    n.add_app("a")
    n.add_app("b")
    n.settle(0.3)
    held = {("r1", "a"), ("r1", "b")}  # deliveries wait, so nothing is confirmed
    n.settle(2.0)  # a's congestion window grows to 16
    for i in range(6):
        n.submit("a", f"a{i}")
    n.submit("b", "b0")
    n.deliver_all(hold=held)
    assert n.router("r1").state.unstable_per_sender() == {"a": 6, "b": 1}
    n.settle(0.3, hold=held)  # periodic check: 7 unstable > 4; quota 4/2 = 2 each
    told = {d for _s, d, _m in sent(n, Congestion)}
    assert told == {"a"}
    assert n.router("r1").ufab.view.number == 0  # nobody was suspected meanwhile


def test_sessions_drop_gaps_acknowledge_duplicates_and_close() -> None:
    n = sc.net()
    n.add_app("a")
    n.settle(0.3)
    session = n.endpoint("a").session
    n.submit("a", "first")  # the data session's 1 (the join went in the control session)
    n.settle(0.3)
    first_t = n.router("r1").state.acks[session][1][0]
    n.inject("a", "r1", Route((Submission((session, 5), None, "gap"),)))
    n.settle(0.3)
    assert all(n.router(r).state.sessions[session] == 2 for r in ("r1", "r2", "r3"))
    assert sum(n.router(r).stats["gaps"] for r in ("r1", "r2", "r3")) == 3  # everywhere alike
    n.inject("a", "r1", Route((Submission((session, 1), None, "dup"),)))
    n.settle(0.2)
    dup_acks = [a for _s, _d, m in sent(n, Stable, dst="a") for a in m.acks if a[0][1] == 1]
    assert len(dup_acks) >= 2 and dup_acks[-1][1] == first_t  # from the ack cache
    n.inject("a", "r1", CloseSessions("a", 0))
    n.settle(0.2)
    assert all(session not in n.router(r).state.sessions for r in ("r1", "r2", "r3"))
    n.submit("a", "closed?")
    n.settle(0.2)
    assert any(d == "a" for _s, d, _m in sent(n, RejectedClosed))
    assert "closed?" not in n.delivered("a")


def test_sessions_are_used_and_closed_only_under_a_credential_covering_their_namespace() -> None:
    """Probe: sessions were keyed by namespace, epoch and stream alone; mallory's messages
    took carol's next numbers (acknowledged to carol, carol's payloads delivered to
    nobody), and mallory closed alice's sessions, the routers' own and a super's."""
    n = sc.net()
    for p in ("alice", "carol", "mallory"):
        n.add_app(p)
    n.settle(0.3)
    carol = n.endpoint("carol").session
    n.submit("carol", "c1")
    n.settle(0.3)
    n.inject("mallory", "r1", Route(tuple(Submission((carol, s), None, "evil") for s in (2, 3))))
    n.settle(0.3)
    refused = [sid for _s, _d, m in sent(n, Forbidden, dst="mallory") for sid in m.ids]
    assert refused == [(carol, 2), (carol, 3)]
    for c in ("c2", "c3"):
        n.submit("carol", c)
    reserved = ("@routers", "@carol", "@mallory", "@super:s1")
    for ns in ("alice", "carol", "super:s1", *reserved):
        n.inject("mallory", "r1", CloseSessions(ns, 2**62))
    n.settle(0.5)
    told = sorted(m.namespace for _s, _d, m in sent(n, CloseForbidden, dst="mallory"))
    assert told == sorted(("alice", "carol", "super:s1", *reserved))
    assert all(not n.router(r).state.closed for r in ("r1", "r2", "r3"))
    assert [x for x in n.delivered("alice") if x] == ["c1", "c2", "c3"]
    assert {a.id[1] for a in acks_of(n, "carol") if a.id[0] == carol} == {1, 2, 3}
    assert sum(n.router(r).stats["forbidden_sessions"] for r in ("r1", "r2", "r3")) == 9
    assert n.violations() == []
    # Under a credential that covers the namespace, a session is taken over as before,
    # and closed (injected by hand: the checkers would call it never submitted).
    n.credentials["mallory"] = ("carol",)
    n.inject("mallory", "r1", Route((Submission((carol, 4), None, "handed over"),)))
    n.inject("mallory", "r1", CloseSessions("carol", carol[1]))
    n.settle(0.5)
    assert "handed over" in n.delivered("alice")
    assert all(n.router(r).state.closed == {"carol": carol[1]} for r in ("r1", "r2", "r3"))


def test_messages_queued_behind_a_refused_window_are_refused_too_not_stalled() -> None:
    """A replay into a closed session (Spark re-running a committed batch) submits more
    than one window's worth: each refusal frees a slot as an ack would."""
    n = sc.net()
    n.add_app("a")
    n.settle(0.3)
    n.inject("a", "r1", CloseSessions("a", 0))
    n.settle(0.2)
    ep = n.endpoint("a")
    for i in range(40):
        n.submit("a", f"late{i}")
    assert ep.queued  # more than the window admits at once
    n.settle(0.3)  # less than one window growth period: refusals alone must admit
    assert not ep.queued and not ep.window
    refused = {sid for _s, d, m in sent(n, RejectedClosed) if d == "a" for sid in m.ids}
    assert len(refused) == 40
    assert not any(str(x).startswith("late") for x in n.delivered("a"))


def test_announcements_reach_processes_before_they_join_and_old_ones_are_ignored() -> None:
    n = sc.net()
    n.add_app("watcher", join=False)
    n.settle(0.2)
    assert any(d == "watcher" for _s, d, _m in sent(n, Leader))
    ep = Endpoint("e", ["r1"], EndpointParams())
    fx = ep.on_message("r1", Leader(3, ("r2", "r1")), 0.0)  # a known router names r2
    assert ep.target == "r2" and any(type(u) is LeaderChanged for u in fx.deliver)
    ep.on_message("r1", Leader(2, ("r1", "r2")), 0.0)  # older: ignored
    assert ep.target == "r2" and ep.view == 3


def test_joining_router_gets_mseq_sessions_and_configs_and_leads_only_once_installed() -> None:
    n = sc.router_joins_then_traffic()
    r4, r1 = n.router("r4"), n.router("r1")
    assert r4.ufab.installed
    assert r4.state.sessions == r1.state.sessions
    assert r4.state.mseq.next_t == r1.state.mseq.next_t
    assert r4.state.mseq.latest == r1.state.mseq.latest
    assert n.violations() == []
    joiner = Router("r9", KeyRingConfig.initial(), seeds=["r1"])
    assert not joiner.leading()
    joiner.on_tick(0.0)
    assert not joiner.leading() and not joiner.ufab.installed


def test_endpoint_moves_on_when_the_leader_is_isolated() -> None:
    n = sc.net()
    n.add_app("a")
    n.settle(0.3)
    cut = {("r1", x) for x in ("r2", "r3", "a")} | {(x, "r1") for x in ("r2", "r3", "a")}
    for pair in cut:
        n.drop(*pair)
    n.submit("a", "x")
    n.settle(4.0, hold=cut)  # r1 never learns its part; a times out and tries r2
    assert n.endpoint("a").target != "r1"
    assert "x" in n.delivered("a")
    assert n.violations() == []


def notices_alone_in_instances(n):  # type: ignore[no-untyped-def]
    """Paxos instances the leader proposed that carry nothing but stable notices."""
    alone = 0
    for _s, _d, m in sent(n, Accept, src="r1", dst="r2"):
        kinds = [type(c) for ac in m.value for c in getattr(ac, "payload", ())]
        alone += kinds == [StableCmd]
    return alone


def test_delayed_acks_piggyback_and_can_be_switched_off() -> None:
    def stable_notices_alone(delayed: bool) -> int:
        """Instances that carry nothing but stable notices."""
        n = sc.net(delayed_acks=delayed, adaptive_acks=False, early_acks=False)
        n.add_app("a")
        n.add_app("b")  # b's confirmations arrive on their own, without a new route
        n.settle(0.3)
        n.settle(3.0)  # a's congestion window grows to 64
        for i in range(30):
            n.submit("a", f"m{i}")
            n.settle(0.002, step=0.001)
        n.settle(0.2)
        alone = notices_alone_in_instances(n)
        assert n.violations() == []
        return alone

    assert stable_notices_alone(False) > 2 * stable_notices_alone(True)


def test_a_batch_with_a_message_of_the_wrong_role_changes_nothing() -> None:
    r = Router("r1", KeyRingConfig.initial(), routers=["r1"])
    r.on_message("p", Hello(0.0), 0.0)
    sub = Submission((("p", 0, ""), 1), {"kind": "join", "role": "client"}, None)
    before = r.memory()
    try:
        r.on_batch([("p", [Route((sub,))]), ("q", [Confirm(1), object()])], 0.0)
    except UnexpectedMessage as e:
        assert e.peer == "q"
    else:
        raise AssertionError("the batch must be refused")
    assert r.memory() == before and r.stats["routed"] == 0
    fx = r.on_batch([("p", [Route((sub,))])], 0.0)  # the runtime re-feeds the others
    assert r.stats["routed"] == 1 and fx.send


def test_confirm_and_hello_are_routine_and_unknown_messages_are_refused() -> None:
    r = Router("r1", KeyRingConfig.initial(), routers=["r1"])
    r.on_message("p", Hello(0.0), 0.0)
    r.on_message("p", Confirm(5), 0.0)
    try:
        r.on_message("p", object(), 0.0)
    except TypeError as e:
        assert "unknown" in str(e)
    else:
        raise AssertionError("an unknown message must be refused")
    assert isinstance(
        DeliverUnsafe(
            (),
        ),
        DeliverUnsafe,
    ) and Acked((("s", 0, ""), 1), 1, True)


def test_an_idle_pipeline_neither_delays_stable_notices_nor_acknowledgements() -> None:
    def ack_delay(**kw: object) -> float:
        n = sc.net(**kw)
        n.add_app("a")
        n.settle(0.3)
        n.submit("a", "x")
        start = n.now
        while not [e for e in acks_of(n, "a") if e.id == (("a", 0, ""), 1)]:  # x
            n.settle(0.001, step=0.001)
        return n.now - start

    fixed = ack_delay(adaptive_acks=False, early_acks=False)
    adaptive = ack_delay()
    notice_first = ack_delay(early_acks=False)  # the ack waits for the notice: no delay
    assert fixed >= 0.010  # the dissertation's 10 ms delayed acknowledgement
    assert adaptive < 0.003 and adaptive < fixed
    assert notice_first < 0.005 and notice_first < fixed


def test_early_acks_spend_no_consensus_round_on_stable_notices_at_light_load() -> None:
    def rounds(**kw: object) -> tuple[int, int]:
        n = sc.net(**kw)
        n.add_app("a")
        n.add_app("b")
        n.settle(0.3)
        n.settle(1.0)
        before = len(acks_of(n, "a"))
        for i in range(20):  # one message every 5 ms: the pipeline idles in between
            n.submit("a", f"m{i}")
            n.settle(0.005, step=0.001)
        n.settle(0.2)
        alone = notices_alone_in_instances(n)
        assert n.violations() == []
        return alone, len(acks_of(n, "a")) - before

    early, early_acks = rounds()
    late, late_acks = rounds(early_acks=False)
    assert early_acks >= 20 and late_acks >= 20
    assert late >= 20  # every acknowledgement waited for its own round
    assert early <= 5, early  # notices wait up to 10 ms and ride with the next route


def test_a_leaver_keeps_confirming_until_the_group_agreed_its_part_is_stable() -> None:
    n = sc.leaver_confirmed_then_leader_crash()
    assert n.notes["b lingering when r1 crashed"] is True
    assert not n.endpoint("b").lingering  # released by the new leader, after agreement
    assert n.router("r2").state.departed or n.router("r2").state.mseq.floor > 0
    assert n.violations() == []


def test_an_endpoint_refuses_a_bad_batch_before_confirming_any_of_it() -> None:
    from ecast.core.message import Message

    ep = Endpoint("a", ["r1"])
    ep.on_tick(0.0)
    m = Message("b", (("b", 0, ""), 1), None, b"x")
    try:
        ep.on_messages("r1", (Deliver(((0, m),)), Accept(0, (0, "r1"), 0, ())), 0.1)
    except UnexpectedMessage as e:
        assert e.peer == "r1"
    else:
        raise AssertionError("the batch was taken")
    # Nothing of the batch took effect: no delivery is owed, and none is confirmed.
    assert ep.t_max == -1
    fx = ep.on_tick(0.2)
    assert not [msg for _d, msg in fx.send if type(msg).__name__ == "Confirm"]
    fx = ep.on_messages("r1", (Deliver(((0, m),)),), 0.3)
    assert [d.message for d in fx.deliver] == [m]


def test_a_process_that_crashes_after_its_part_is_ordered_can_still_be_suspected() -> None:
    n = sc.leaver_crashes_before_confirming_its_part()
    assert "after" in n.delivered("a")
    assert n.endpoint("a").window == {}  # everything acknowledged
    assert all(n.router(r).unstable() == 0 for r in ("r1", "r2", "r3"))
    assert not n.violations()


def test_a_process_that_dies_silently_is_suspected_when_its_lease_runs_out() -> None:
    n = sc.silent_crash_caught_by_lease()
    assert n.notes["suspects issued"] == 1
    assert n.endpoint("a").window == {}  # x became stable without d
    r1 = n.router("r1")
    assert "d" in r1.state.expelled and r1.stats["leases_expired"] >= 1
    assert not n.violations()


def test_a_new_leader_gives_every_process_a_full_lease() -> None:
    n = sc.net()
    for p in ("a", "b"):
        n.add_app(p)
    n.settle(0.3)
    n.crash("b")
    n.settle(3.0)  # b silent for 3 s of its 5-s lease...
    n.crash("r1")  # ...when the leader dies: r2 takes over and starts b's lease afresh
    n.settle(3.0)
    r2 = n.router("r2")
    assert r2.leading() and r2.stats["suspects_issued"] == 0
    n.settle(3.0)
    assert r2.stats["suspects_issued"] == 1 and "b" in r2.state.expelled


def test_a_suspect_gets_through_a_full_data_window() -> None:
    n = sc.busy_survivor_suspects_a_dead_peer()
    assert n.notes["window before"] == 2 and n.notes["queued before"] == 18
    a = n.endpoint("a")
    assert a.window == {} and not a.queued and a.control == {}  # all of it stable
    assert [p for p in n.delivered("b") if p and p.startswith("m")] == [f"m{i}" for i in range(20)]
    assert not n.violations()


def test_a_second_submitter_of_an_in_flight_message_is_acked_without_a_timeout() -> None:
    from ecast.core.config import BroadcastConfig

    n = sc.net(config=BroadcastConfig.initial(senders="anyone"))
    n.add_app("a")
    n.add_app("watcher")
    n.settle(0.3)
    a = n.endpoint("a")
    n.add_app("b", join=False)
    b = n.endpoint("b")
    b.session = a.session  # b takes over a's session (a retried task)
    n.credentials["b"] = ("a",)  # under a credential that covers it
    n.submit("a", "x")
    n.deliver("a", "r1")  # r1 proposes x; it is not learned yet...
    n.call("b", lambda h, now: h.record_submission(*h.ep.submit("x", None, now), now))
    n.deliver("b", "r1")  # ...when b routes the same id to r1
    start = n.now
    n.settle(0.3)
    acks_b = acks_of(n, "b")
    assert [e.id for e in acks_b] == [(a.session, 1)]
    assert acks_b[0].time - start < 0.1  # not after a 2-s progress timeout
    assert [e.t for e in acks_b] == [e.t for e in acks_of(n, "a") if e.id == (a.session, 1)]
    assert n.delivered("watcher").count("x") == 1
    assert not n.violations()


def test_a_process_that_left_is_never_suspected_by_lease() -> None:
    n = sc.leaver_acknowledged_late_by_a_later_leader()
    assert n.notes["r1 dropped b"] is True
    assert n.notes["b terminated"] is not None
    assert n.notes["suspects issued"] == 0
    for r in ("r2", "r3"):
        router = n.router(r)
        assert "b" not in router.state.expelled and "b" not in router.heard
        assert router.unstable() == 0
    assert n.violations() == []


def test_unsafe_copies_are_routed_and_tagged_at_least_at_the_stable_floor() -> None:
    """Where every router leads, another leader may make messages stable before this one
    forwarded them: once collected, their configs are gone, and this leader's frontier
    lies below the floor.  Its unsafe copies must name a frontier whose config routed
    them (the floor's), not the stale one whose collected config wrapped to the latest."""
    from ecast.core.message import Message
    from ecast.core.router import RouterParams
    from ecast.core.router.forwarding import Forwarding, StableNotices
    from ecast.core.router.outbox import AppOutbox
    from ecast.core.router.state import RouterState

    st = RouterState(KeyRingConfig(1))
    joins = tuple(
        Message(p, ((f"@{p}", 0, ""), 1), {"kind": "join", "role": role}, None)
        for p, role in (("d1", "receiver"), ("d2", "receiver"), ("s", "submitter"))
    )
    st.learn_routes(joins, None)
    outbox = AppOutbox()
    stats = {"delivered": 0, "unsafe_sent": 0, "unsafe_dropped": 0}
    lead = Forwarding(st, RouterParams(), outbox, StableNotices(), stats)
    lead.forward()
    stale = lead.frontier
    # d2 leaves; its part becomes stable and is collected before this leader forwards it.
    st.learn_routes((Message("d2", (("@d2", 0, ""), 2), {"kind": "part"}, None),), None)
    st.learn_stable(tuple((t, True) for t in range(st.mseq.next_t)), 16, None)
    st.collect()
    assert st.mseq.floor > stale and st.mseq.starts[0] > stale
    lead.forward_unsafe("s", (Submission((("s", 0, "~u"), 1), {"key": "k"}, "u"),), None)
    copies = [(p, item) for p, run in outbox.unsafe_runs.items() for item in run.items]
    assert copies
    for p, (_tag, frontier, m) in copies:
        assert frontier >= st.mseq.floor
        assert p in st.mseq.destset(frontier, m)


def test_routers_count_commit_and_stable_latency_once_per_batch() -> None:
    n = sc.net()
    for p in "abc":
        n.add_app(p)
    n.settle(0.3)
    routers = [n.router(r) for r in ("r1", "r2", "r3")]
    before = [r.stable_seconds.count for r in routers]
    n.submit("a", "x")
    n.deliver("a", "r1")  # the route itself; confirmations held: x stays unstable
    n.deliver_all(hold={(p, "r1") for p in "abc"})
    r1 = routers[0]
    assert r1.unstable() >= 1
    assert r1.stable_seconds.count == before[0]  # nothing counted while unstable
    for i in range(6):
        n.submit("abc"[i % 3], f"m{i}")
    n.settle(1.0)
    # Every router learned the same route commands and saw each of them become stable.
    counts = [r.stable_seconds.count for r in routers]
    assert counts[0] > before[0] and len(set(counts)) == 1, counts
    assert all(not r._learned_at for r in routers)
    # Virtual time: no batch waited longer than the whole run (1.3 s).
    assert 0 < r1.stable_seconds.sum <= 1.3 * counts[0]
    commits = [r.ufab.proposer.commit_seconds for r in routers]
    assert sum(h.count for h in commits) > 0
    assert all(h.sum <= 1.3 * h.count for h in commits)
    assert n.violations() == []


def test_a_follower_names_a_new_views_leader_to_the_processes_that_talk_to_it() -> None:
    """A process that moved to a follower while that follower could see no view (cut off
    with it) was never told who leads; the leader, which keeps the lease book, would not
    hear from it and would suspect it.  So a follower that installs a new view names its
    leader to every process that talks to it."""
    n = sc.net()
    n.add_app("a")
    n.settle(0.3)
    n.router("r3").apps["a"] = None  # as if a had moved to r3
    mark = len(n.sent)
    n.crash("r1")
    n.settle(3.0)
    told = [m for s, d, m in n.sent[mark:] if s == "r3" and d == "a" and type(m) is Leader]
    assert told and "r1" not in told[-1].succession, told


def test_a_router_parted_while_away_learns_it_from_a_newcomer_and_points_its_processes_there() -> (
    None
):
    """r1 hears no majority of its view (r2 and r3 left), so it asks r4, which greeted it:
    r4 answers Parted with its view, and r1 sends its process there."""
    n = sc.zombie_router()
    assert n.notes["r1 parted"] and n.notes["r4 greeted r1"]
    assert n.notes["group"] == ("r4",)
    assert n.notes["r1 stopped"]  # r4 answered r1's heartbeat with Parted
    assert n.router("r1").successor is not None
    assert n.router("r1").successor.succession == ("r4",)
    s = n.endpoint("s")
    assert s.target == "r4" and "r4" in s.known_routers
    assert n.delivered("s")[-1] == "x"
    assert s.window == {}  # x is stable
    assert n.violations() == []


def test_processes_of_a_router_no_one_can_tell_it_was_parted_reach_the_group_they_know() -> None:
    """The way out when no newcomer greeted the zombie: its processes try, after the
    old succession made no progress, every router they know."""
    n = sc.zombie_router(newcomer_greeted_it=False)
    assert n.notes["r1 parted"] and not n.notes["r4 greeted r1"]
    assert not n.router("r1").stopped  # nobody can tell it
    s = n.endpoint("s")
    assert s.stats["beyond_succession"] >= 1 and s.target == "r4"
    assert n.delivered("s")[-1] == "x"
    assert s.window == {}
    assert n.violations() == []
