"""Scripted E-Cast scenarios: each stages one trap, for unit tests and planted bugs.

Every function returns the :class:`EcastNet` it ran; ``net.violations()`` runs the
simulator's checkers.  A mutation test runs one inside ``mutations.planted(...)``.
"""

from __future__ import annotations

from collections import deque

from ecast.core.config import Config
from ecast.core.endpoint import EndpointParams
from ecast.core.proto import Stable
from ecast.core.router import RouterParams
from ecast.core.ufabcast import UfabParams
from ecast.sim.manual import EcastNet


def net(
    routers: int = 3,
    config: Config | None = None,
    endpoint: dict[str, object] | None = None,
    **router_kw: object,
) -> EcastNet:
    rp = RouterParams(
        ufab=UfabParams(clump_trigger=1, clump_delay=0.0),
        **router_kw,  # type: ignore[arg-type]
    )
    ep = EndpointParams(**(endpoint or {}))  # type: ignore[arg-type]
    return EcastNet([f"r{i + 1}" for i in range(routers)], config, rp, ep)


def resent_before_learned() -> EcastNet:
    """a's message reaches r1, which proposes it; before it is learned a times out and
    sends its window to r2, which proposes it too.  Learned twice, appended once."""
    n = net()
    n.add_app("a")
    n.settle(0.3)
    n.submit("a", "x")
    n.deliver("a", "r1")  # r1 proposes x
    n.now += n.endpoint_params.progress_timeout + 0.1
    n.call("a", lambda h, now: h.on_tick(now))  # no progress: a switches to r2, resends
    n.notes["second router"] = n.endpoint("a").target
    n.settle(0.5)
    return n


def join_and_message_learned_together() -> EcastNet:
    """a's message m and b's join are learned in one instance, m first: m's prefix does
    not contain b, so b must not deliver m."""
    n = net()
    n.add_app("a")
    n.settle(0.3)
    n.add_app("b", join=False)
    n.submit("a", "m")
    n.deliver("a", "r1")
    n.call("b", lambda h, now: h.record_submission(*h.ep.join(now), now))
    n.deliver("b", "r1")
    n.settle(0.5)
    return n


def suspected_destination() -> EcastNet:
    """d crashes; a's message cannot be confirmed by d until the monitor suspects d."""
    n = net()
    for p in ("a", "d", "mon"):
        n.add_app(p)
    n.settle(0.3)
    n.crash("d")
    n.submit("a", "x")
    n.settle(0.3)
    n.suspect("mon", ["d"])
    n.settle(1.0)
    return n


def router_joins_then_traffic() -> EcastNet:
    """Router r4 joins after a's session has history; then a sends more.  r4 must know
    a's session position from its snapshot, or it decides differently from the others."""
    n = net()
    n.add_app("a")
    n.submit("a", "x1")
    n.settle(0.3)
    n.add_router("r4", seeds=["r1"])
    n.settle(0.5)
    n.submit("a", "x2")
    n.add_app("b")  # later traffic lands at different timestamps if r4 decided otherwise
    n.settle(0.5)
    return n


def leader_crash_before_proposing() -> EcastNet:
    """a's route dies with the leader r1; r2 takes over and announces itself; a must send
    its whole window to r2."""
    n = net()
    n.add_app("a")
    n.settle(0.3)
    n.submit("a", "x")
    n.crash("r1")  # the Route never arrives
    n.settle(3.0)
    return n


def leader_change_after_last_message() -> EcastNet:
    """x is delivered and confirmed to r1, which crashes before proposing it stable.  The
    new leader sends x again; nothing new follows, so only confirming a duplicate lets x
    become stable.  Adaptive acknowledgements are off: with them an idle r1 proposes the
    stable notice at once, and the window this scenario needs never opens."""
    n = net(adaptive_acks=False)
    n.add_app("a")
    n.add_app("b")
    n.settle(0.3)
    n.submit("a", "x")
    # No time passes: x is learned, delivered and confirmed to r1, whose stable notice
    # waits out its 10 ms delay (delayed acknowledgements) and so never leaves.
    n.deliver_all()
    n.notes["a delivered before the crash"] = n.delivered("a")
    n.notes["r1 unstable before the crash"] = n.router("r1").unstable()
    n.crash("r1")
    n.settle(3.0)
    return n


def unsafe_then_safe() -> EcastNet:
    """b accepts an unsafe message from a, then a sends a safe one."""
    n = net()
    n.add_app("a")
    n.add_app("b")
    n.settle(0.3)
    n.submit_unsafe("a", "u")
    n.settle(0.1)
    n.submit("a", "m")
    n.settle(0.5)
    return n


def unsafe_after_takeover() -> EcastNet:
    """b has delivered everything and it is all stable when the leader r1 crashes; r2
    takes over and nothing safe follows.  An unsafe message from a must still be accepted
    by b: r2 has no tag of its own for b."""
    n = net()
    n.add_app("a")
    n.add_app("b")
    n.settle(0.3)
    n.submit("a", "m")
    n.settle(0.5)
    n.crash("r1")
    n.settle(3.0)
    n.notes["leader"] = n.endpoint("a").target
    n.submit_unsafe("a", "u")
    n.settle(0.5)
    return n


def leaver_crashes_before_confirming_its_part() -> EcastNet:
    """b's part is ordered, then b crashes before it confirms it: b is no member any more,
    yet everyone waits for its confirmation until the monitor suspects it."""
    n = net()
    for p in ("a", "b", "mon"):
        n.add_app(p)
    n.settle(0.3)
    n.close("b")
    n.deliver("b", "r1")  # the part is routed...
    n.crash("b")  # ...and b is gone before anything comes back
    n.submit("a", "after")
    n.settle(0.5)
    n.suspect("mon", ["b"])
    n.settle(1.0)
    return n


def silent_crash_caught_by_lease() -> EcastNet:
    """d crashes and nobody suspects it: a's message waits for d's confirmation until d's
    lease runs out and the leader suspects d itself."""
    n = net()
    for p in ("a", "d"):
        n.add_app(p)
    n.settle(0.3)
    n.crash("d")
    n.submit("a", "x")
    n.settle(n.router_params.client_lease + 1.0)
    n.notes["suspects issued"] = sum(n.router(r).stats["suspects_issued"] for r in n.founders)
    return n


def busy_survivor_suspects_a_dead_peer() -> EcastNet:
    """d dies; a keeps submitting until its window is full of messages that can only
    become stable once d is suspected, then a suspects d.  The suspect must not wait
    behind that window (leases are long here, so they do not rescue anyone)."""
    n = net(
        endpoint={"initial_window": 2, "max_window": 2, "slow_start": False},
        client_lease=60.0,
    )
    for p in ("a", "b", "c", "d"):
        n.add_app(p)
    n.settle(0.3)
    n.crash("d")
    for i in range(20):
        n.submit("a", f"m{i}")
    n.settle(0.5)
    n.notes["window before"] = len(n.endpoint("a").window)
    n.notes["queued before"] = len(n.endpoint("a").queued)
    n.suspect("a", ["d"])
    n.settle(3.0)
    return n


def leaver_confirmed_then_leader_crash() -> EcastNet:
    """b closes; its part is delivered and confirmed to r1, which crashes before the stable
    notice is agreed.  b must keep confirming until the new leader's re-sent part is
    stable, or the new leader waits for b forever."""
    n = net()
    n.add_app("a")
    n.add_app("b")
    n.settle(0.3)
    n.close("b")
    n.deliver("b", "r1")  # the part's route: r1 proposes it
    for follower in ("r2", "r3"):
        n.deliver("r1", follower)  # Accept
        n.deliver(follower, "r1")  # Accepted: chosen, learned, forwarded
    for app in ("a", "b"):
        n.deliver("r1", app)  # the part is delivered: b is closed and lingers
        n.deliver(app, "r1")  # confirmations: r1 now knows the part is stable
    n.deliver("r1", "b")  # whatever r1 tells b before it crashes
    n.notes["b lingering when r1 crashed"] = n.endpoint("b").lingering
    n.crash("r1")
    n.settle(3.0)
    return n


def leaver_acknowledged_late_by_a_later_leader() -> EcastNet:
    """b closes; its part becomes stable and is collected, but r1's acknowledgement never
    reaches b.  b resends its part to r2, which answers from the acknowledgement cache; then
    r1 crashes and r2 leads.  b left for good: no router may keep a lease for it, or the
    new leader suspects a process that is long gone, after the group went quiet."""
    n = net()
    n.add_app("a")
    n.add_app("b")
    n.settle(0.3)
    n.close("b")
    lost = 0
    for _ in range(40):  # every acknowledgement r1 sends b is lost with b's channel
        n.deliver_all(hold={("r1", "b")})
        q = n.queues.get(("r1", "b"), deque())
        for i in reversed(range(len(q))):
            if type(q[i]) is Stable:
                n.lose("r1", "b", i)
                lost += 1
        n.deliver("r1", "b")
        n.tick(0.05)
        if ("r1", "b") in n.dropped:
            break
    n.notes["r1 dropped b"] = ("r1", "b") in n.dropped
    n.notes["acks lost"] = lost
    n.settle(n.endpoint_params.progress_timeout + 0.5)  # b turns to r2, resends its part
    n.notes["b terminated"] = n.endpoint("b").terminated
    n.crash("r1")
    n.settle(n.router_params.client_lease + 2.0)
    n.notes["suspects issued"] = sum(n.router(r).stats["suspects_issued"] for r in ("r2", "r3"))
    return n


def zombie_router(newcomer_greeted_it: bool = True) -> EcastNet:
    """r1 is parted while cut off; r4 joins, and r2 and r3 leave for good.  No member of
    r1's old view is left to tell r1 it is out, and a new process ``s`` greets r1.

    ``newcomer_greeted_it``: r4 greeted r1 first, then r2, and s was given the
    founders' names only (the simulator's seed 2196 with half the messages unsafe and 3
    faults a second: s cycled among r1, r2 and r3 with its join unacknowledged, and
    never quiesced).  Otherwise r4 greeted r2 alone, so nothing will tell r1, and s was
    given r4's name too, after the founders' (seed 5341 at 2.5 faults a second: the
    zombie announced its old view, and its processes cycled among the old members)."""
    n = net()
    cut = {("r1", "r2"), ("r2", "r1"), ("r1", "r3"), ("r3", "r1")}
    n.settle(0.1)
    n.settle(2.0, hold=cut)
    n.notes["r1 parted"] = "r1" not in n.router("r2").ufab.view.members  # type: ignore[union-attr]
    n.add_router("r4", seeds=["r1", "r2"] if newcomer_greeted_it else ["r2"])
    cut.add(("r1", "r4"))  # r4's greeting reaches r1; nothing r1 says reaches r4 yet
    n.settle(2.0, hold=cut)
    n.notes["r4 greeted r1"] = any(
        s == "r4" and d == "r1" and type(m).__name__ == "JoinRequest" for s, d, m in n.sent
    )
    for r in ("r2", "r3"):
        n.call(r, lambda h, now: h.router.leave(now))
        n.settle(1.0, hold=cut)
        n.crash(r)
    n.notes["group"] = n.router("r4").ufab.view.members  # type: ignore[union-attr]
    n.add_app("s", routers=None if newcomer_greeted_it else ["r1", "r2", "r3", "r4"])
    n.submit("s", "x")
    n.settle(1.0)
    n.notes["r1 stopped"] = n.router("r1").stopped
    # Without r1's pointer s leaves each of r1, r2 and r3 after its progress timeout.
    n.settle(2.0 if newcomer_greeted_it else 4 * n.endpoint_params.progress_timeout)
    return n
