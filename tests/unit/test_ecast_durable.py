"""Confirmation when durable (``EndpointParams.confirm_when_durable``): a message becomes
stable, and its sender acknowledged, only once every destination said it has it on
disk, so an application that writes its deliveries down can promise that an
acknowledgement survives every process crashing at once."""

from __future__ import annotations

from ecast import history
from ecast.core.proto import Confirm
from ecast.sim.manual import EcastNet
from tests import ecast_scenarios as sc


def durable(n: EcastNet, *pids: str) -> None:
    """``pids`` have written down everything delivered to them so far."""
    for pid in pids:
        n.call(pid, lambda h, now: h._absorb(h.ep.durable(h.ep.t_max, now), now))


def data_acks(n: EcastNet, pid: str) -> list[history.Ack]:
    data = n.endpoint(pid).session
    return [a for a in n.history.of_kind(pid, history.Ack) if a.id[0] == data]


def test_stability_waits_until_every_destination_has_the_message_on_disk() -> None:
    n = sc.net(endpoint={"confirm_when_durable": True})
    n.add_app("a")
    n.settle(0.3)  # a's own join is confirmed at once: it joins with nobody's help
    control = n.endpoint("a").control_session
    assert [x for x in n.history.of_kind("a", history.Ack) if x.id[0] == control]
    n.add_app("b")
    n.settle(0.3)
    durable(n, "a")  # a has b's join written down: b's join becomes stable
    n.settle(0.3)
    n.submit("a", "x")
    n.settle(1.0)
    assert n.delivered("a")[-1] == n.delivered("b")[-1] == "x"
    assert data_acks(n, "a") == []  # delivered everywhere, on disk nowhere
    durable(n, "b")
    n.settle(1.0)
    assert data_acks(n, "a") == []  # b has it; a does not yet
    durable(n, "a")
    n.settle(1.0)
    assert [a.t for a in data_acks(n, "a")] != [] and n.violations() == []


def test_a_confirmation_covers_only_what_is_durable_and_repeats_are_confirmed_at_once() -> None:
    n = sc.net(endpoint={"confirm_when_durable": True})
    n.add_app("a")
    n.add_app("b")
    n.settle(0.3)
    durable(n, "a", "b")
    n.settle(0.3)
    for i in range(4):
        n.submit("a", f"m{i}")
    n.settle(0.5)
    ep = n.endpoint("b")
    top = ep.t_max
    half = top - 2
    n.sent.clear()
    n.call("b", lambda h, now: h._absorb(h.ep.durable(half, now), now))
    confirms = [m.upto for s, _d, m in n.sent if s == "b" and type(m) is Confirm]
    assert confirms == [half]  # not the deliveries after it
    n.sent.clear()
    n.call("b", lambda h, now: h._absorb(h.ep.durable(half, now), now))
    assert not [m for s, _d, m in n.sent if s == "b" and type(m) is Confirm]
    durable(n, "a", "b")
    n.settle(1.0)
    assert len(data_acks(n, "a")) == 4 and n.violations() == []


def test_without_the_flag_deliveries_are_confirmed_as_they_arrive() -> None:
    n = sc.net()
    n.add_app("a")
    n.add_app("b")
    n.settle(0.3)
    n.submit("a", "x")
    n.settle(1.0)
    assert len(data_acks(n, "a")) == 1 and n.violations() == []
