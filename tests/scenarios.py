"""Scripted ufabcast scenarios, each staging one trap from the issue's list.

Every scenario returns the :class:`ManualNet` it ran, so a unit test can assert on the
exact outcome and a mutation test can run the same script with a planted bug and show
that the generic checkers flag it (inside ``mutations.planted(...)``).
"""

from __future__ import annotations

from ecast.core.ufabcast import UfabParams
from ecast.sim.manual import ManualNet

IMMEDIATE = {"clump_trigger": 1, "clump_delay": 0.0}
"""Propose every command in its own instance, at once: scripts stay easy to follow."""


def params(**kw: object) -> UfabParams:
    return UfabParams(**{**IMMEDIATE, **kw})  # type: ignore[arg-type]


def void_after_stop_sign() -> ManualNet:
    """A stop sign (join of j) is chosen together with the instance after it.

    In a 4-router group (majority 3, learning by Commit), leader a puts join(j) in
    instance 0 and b's command x in instance 1; b and c accept both before either is
    committed, so instance 1 is chosen in view 0 as well.  It must be void: view 1 starts
    at instance 1, where a (the leader of view 1) puts its own z first and b's
    re-proposed x second.  Every router, the joiner included, executes z before x.
    """
    net = ManualNet(["a", "b", "c", "d"], params())
    net.join("j", ["a"])
    net.deliver("j", "a")  # JoinRequest: a proposes join(j) in instance 0
    net.propose("b", "x")
    net.deliver("b", "a")  # Forward(x): instance 1 of view 0
    assert [m.instance for m in net.pending("a", "b")] == [0, 1]
    for acceptor in ("b", "c"):
        net.deliver("a", acceptor)  # accepts 0 and 1 in one batch
        net.deliver(acceptor, "a")  # Accepted(upto=1)
    # a now knows 0 and 1 chosen in view 0, executes 0 and leads view 1 (round 0).
    net.propose("a", "z")  # z goes into instance 1 of view 1
    net.settle(1.0)  # b re-sends x in view 1; j installs its snapshot
    return net


def reproposal_after_leader_crash() -> ManualNet:
    """Leader a crashes after c and d accepted b's x; nobody has learned it yet.

    b takes over (next in succession order).  Its phase 1 finds x in the promises and
    proposes it again in instance 0; b also re-sends its own pending x, which lands in
    instance 1.  One command, chosen twice under its one identity (b, 1): the FIFO layer
    releases it once.
    """
    net = ManualNet(["a", "b", "c", "d"], params())
    net.propose("b", "x")
    net.deliver("b", "a")  # a proposes x in instance 0
    net.deliver("a", "c")
    net.deliver("a", "d")
    net.crash("a")  # no Accepted reached a, no Commit left it
    net.settle(1.5)  # b, c, d suspect a; b leads, re-proposes, parts a
    return net


def parted_router_late_command() -> ManualNet:
    """c leaves; a command c sent before its part reaches the leader only afterwards."""
    net = ManualNet(["a", "b", "c"], params())
    net.propose("c", "y1")
    net.settle(0.1)
    net.leave("c")
    net.deliver("c", "a")  # Forward(part c): a proposes it
    net.propose("c", "y2")  # still queued on c -> a when c's part executes
    net.settle(0.5, hold={("c", "a")})
    net.settle(1.0)  # the late Forward(y2) arrives after c's part
    return net


def parted_router_held_back() -> ManualNet:
    """c's #3 is executed but held back (its #2 never arrives); then c leaves."""
    net = ManualNet(["a", "b", "c"], params())
    net.propose("c", "y1")
    net.settle(0.1)
    net.propose("c", "y2")
    net.propose("c", "y3")
    net.lose("c", "a", 0)  # Forward(y2) vanishes with a connection
    net.deliver_all()
    net.notes["held before part"] = {r: sorted(net.core(r).held.get("c", {})) for r in "abc"}
    net.leave("c")
    net.settle(1.0)
    return net


def chosen_then_leader_crash() -> ManualNet:
    """Leader a gets x chosen (a, b, c accepted), executes it, and crashes.

    Its Commit never left, so b, c and d know nothing yet.  b takes over; phase 1 finds
    x among the promises and proposes it again, so every router executes what the
    crashed leader executed (uniform agreement).
    """
    net = ManualNet(["a", "b", "c", "d"], params())
    net.propose("a", "x")
    for acceptor in ("b", "c"):
        net.deliver("a", acceptor)
        net.deliver(acceptor, "a")
    net.notes["a executed before crashing"] = net.executed("a")
    net.crash("a")
    net.settle(1.5)
    return net


def mutual_parts() -> ManualNet:
    """The link between a and b breaks; both propose to part the other; c sees both."""
    net = ManualNet(["a", "b", "c"], params())
    net.propose("a", "p")
    net.propose("b", "q")
    net.settle(0.2)
    cut = {("a", "b"), ("b", "a")}
    net.settle(2.5, hold=cut)
    for x in ("a", "b"):
        net.drop(x, "b" if x == "a" else "a")
    net.settle(1.5)
    return net
