"""Each check of ecast.history catches a hand-made violation, and names it.

Every test starts from a correct history (``tests.history_gen.run``: an m-seq replayed
through the config, every destination delivering, every submitter acknowledged), which
passes every check, and plants one anomaly; the check must report it with the process,
message and timestamp that make it one.  Where a check works both with the routers' logs
and without them (a real run), both are tried.
"""

from __future__ import annotations

from typing import Any

import pytest

from ecast.core.config import BroadcastConfig, KeyRingConfig
from ecast.core.message import Message
from ecast.history import (
    LIVENESS,
    SAFETY,
    Ack,
    Crash,
    Deliver,
    DeliverUnsafe,
    History,
    Submit,
    SubmitUnsafe,
    Terminate,
    check_history,
)
from tests import history_gen as g

BROADCAST = BroadcastConfig.initial()
RING = KeyRingConfig.initial(replication=1)

A1 = (("a", 0, ""), 1)
B1 = (("b", 0, ""), 1)


def mseq() -> list[Message]:
    """t=0..2 joins of a, b, c; t=3 a#1, t=4 b#1, t=5 c#1, t=6 a#2, t=7 b#2."""
    return [
        g.join("a"),
        g.join("b"),
        g.join("c"),
        g.data("a", 1),
        g.data("b", 1),
        g.data("c", 1),
        g.data("a", 2),
        g.data("b", 2),
    ]


def broadcast(learned: bool = False) -> History:
    return g.run(mseq(), BROADCAST, learned=learned)


def found(h: History, config: Any = BROADCAST, **kw: Any) -> dict[str, list[str]]:
    return check_history(h, config, **kw).violations


def index_of(events: list[Any], kind: type, **fields: Any) -> int:
    for i, e in enumerate(events):
        if type(e) is kind and all(getattr(e, k) == v for k, v in fields.items()):
            return i
    raise AssertionError(f"no {kind.__name__} {fields}")


@pytest.mark.parametrize("learned", [False, True])
def test_the_correct_histories_pass_every_check(learned: bool) -> None:
    v = check_history(broadcast(learned), BROADCAST)
    assert v.ok, v.messages()
    assert v.ran == [*SAFETY, *LIVENESS] and not v.skipped
    ring = g.run(
        [
            g.join("a", role="receiver"),
            g.join("b", role="receiver"),
            g.join("s", role="client"),
            *(g.data("s", i, {"key": i}) for i in range(1, 9)),
        ],
        RING,
        learned=learned,
    )
    assert check_history(ring, RING).ok


# ====================================================================== safety
def test_prefix_agreement_two_processes_disagree_on_a_timestamp() -> None:
    h = broadcast()
    b = h.processes["b"]
    i = index_of(b, Deliver, t=4)
    b[i] = b[i]._replace(id=(("x", 0, ""), 1))
    assert found(h, liveness=False)["prefix-agreement"] == [
        "t=4 is (('b', 0, ''), 1) elsewhere but (('x', 0, ''), 1) at b"
    ]


def test_prefix_agreement_routers_disagree_or_a_delivery_is_not_the_mseq() -> None:
    h = broadcast(learned=True)
    h.router("r2").learned[6] = g.data("z", 1)
    assert found(h, liveness=False)["prefix-agreement"] == [
        "t=6 is (('a', 0, ''), 2) at r1 but (('z', 0, ''), 1) at r2"
    ]
    h = broadcast(learned=True)
    c = h.processes["c"]
    i = index_of(c, Deliver, t=3)
    c[i] = c[i]._replace(t=4)  # c delivered a#1 as t=4 (and b#1 as t=4 too)
    assert (
        "c delivered (('a', 0, ''), 1) as t=4, the m-seq has (('b', 0, ''), 1) there"
        in (found(h, liveness=False)["prefix-agreement"])
    )


def test_prefix_agreement_a_hole_in_the_routers_mseq() -> None:
    h = broadcast(learned=True)
    for r in ("r1", "r2"):
        del h.routers[r].learned[5]
    assert found(h, liveness=False)["prefix-agreement"][0] == "no router learned t=5 (of 1)"


@pytest.mark.parametrize("learned", [False, True])
def test_validity_a_message_nobody_submitted(learned: bool) -> None:
    h = broadcast(learned)
    del h.processes["c"][index_of(h.processes["c"], Submit, id=(("c", 0, ""), 1))]
    assert found(h, liveness=False)["validity"] == ["t=5 (('c', 0, ''), 1) was never submitted"]


def test_validity_an_unsafe_delivery_nobody_submitted_and_a_forged_router_message() -> None:
    h = broadcast()
    u = (("a", 0, "~u"), 1)
    h.add("b", DeliverUnsafe(7, 8, u, False, 7.5, "a", None, "u"))
    assert found(h, liveness=False)["validity"] == [f"b delivered unsafe {u}, never submitted"]
    h.add("a", SubmitUnsafe(u, 7.4))
    assert "validity" not in found(h, liveness=False)
    # The routers submit lease suspects only; anything else from them is forged.
    forged = Message("@routers", (("@routers", 0, "r1"), 1), {"kind": "part"}, None)
    ms = [*mseq(), forged]
    h = g.run(ms, BROADCAST, learned=True)
    assert found(h, liveness=False)["validity"] == [
        "t=8 (('@routers', 0, 'r1'), 1) from the routers is no lease suspect"
    ]
    assert check_history(
        g.run([*mseq(), g.lease_suspect("r1", ["c"])], BROADCAST, learned=True), BROADCAST
    ).ok


@pytest.mark.parametrize("learned", [False, True])
def test_no_duplicates_a_process_delivers_a_message_twice(learned: bool) -> None:
    h = broadcast(learned)
    c = h.processes["c"]
    c.append(c[index_of(c, Deliver, t=4)])
    got = found(h, liveness=False)
    assert got["no-duplicates"] == ["c delivered (('b', 0, ''), 1) twice"]


@pytest.mark.parametrize("learned", [False, True])
def test_no_duplicates_one_message_at_two_timestamps(learned: bool) -> None:
    ms = mseq()
    ms.append(ms[3])  # a#1 again at t=8
    h = g.run(ms, BROADCAST, learned=learned)
    got = found(h, liveness=False)
    assert got["no-duplicates"][0].startswith("(('a', 0, ''), 1) appears at t=3 and t=8")


def test_minimality_a_process_delivers_what_was_not_meant_for_it() -> None:
    ms = [
        g.join("a", role="receiver"),
        g.join("b", role="receiver"),
        g.join("s", role="client"),
        *(g.data("s", i, {"key": i}) for i in range(1, 5)),
    ]
    h = g.run(ms, RING)
    dests, config = {}, RING
    for t, m in enumerate(ms):
        dests[t] = config.destset(m)
        config = config.apply(m)
    t = next(t for t in range(3, 7) if dests[t] == {"a"})
    m = ms[t]
    b = h.processes["b"]
    later = next(i for i, e in enumerate(b) if type(e) is Deliver and e.t > t)
    b.insert(later, Deliver(t, m.id, t + 0.1, m.sender, m.header))
    assert found(h, RING, liveness=False)["minimality"] == [
        f"b delivered t={t} {m.id}, not in its destination set"
    ]


@pytest.mark.parametrize("learned", [False, True])
def test_total_order_two_deliveries_swapped(learned: bool) -> None:
    h = broadcast(learned)
    c = h.processes["c"]
    i, j = index_of(c, Deliver, t=4), index_of(c, Deliver, t=5)
    c[i], c[j] = c[j], c[i]
    assert found(h, liveness=False)["total-order"] == [
        "c delivered t=4 (('b', 0, ''), 1) after t=5"
    ]


@pytest.mark.parametrize("learned", [False, True])
def test_gap_free_a_session_skips_a_sequence_number(learned: bool) -> None:
    ms = mseq()
    ms[6] = g.data("a", 3)  # a#2 never ordered, a#3 is
    h = g.run(ms, BROADCAST, learned=learned)
    assert found(h, liveness=False)["gap-free"] == [
        "session ('a', 0, '') has #3 at t=6, expected #2"
    ]


def test_gap_free_an_unknown_timestamp_may_hold_the_missing_message() -> None:
    ms = mseq()
    ms[6] = g.data("a", 3)
    h = g.run(ms, BROADCAST)
    h.processes["a"].insert(0, Submit((("a", 0, ""), 2)))  # submitted, never delivered
    # t=5 unknown (nobody recorded it): a#2 may be there, so no gap can be proved...
    for p in h.processes.values():
        p[:] = [e for e in p if getattr(e, "t", None) != 5]
    assert "gap-free" not in found(h, liveness=False, only=("gap-free",))
    # ...but a#2 after a#3 is a gap whatever the unknown holds.
    ms = mseq()
    ms[6], ms[7] = g.data("a", 3), g.data("a", 2)
    h = g.run(ms, BROADCAST)
    for p in h.processes.values():
        p[:] = [e for e in p if getattr(e, "t", None) != 5]
    assert found(h, liveness=False)["gap-free"] == [
        "session ('a', 0, '') has #2 at t=7, after #3 at t=6"
    ]


@pytest.mark.parametrize("learned", [False, True])
def test_causal_order_a_submission_ordered_before_what_its_sender_had_seen(learned: bool) -> None:
    h = broadcast(learned)
    a = h.processes["a"]
    sub = a.pop(index_of(a, Submit, id=(("a", 0, ""), 2)))  # a#2 is t=6
    a.insert(index_of(a, Deliver, t=7) + 1, sub)  # submitted after delivering t=7
    assert found(h, liveness=False)["causal-order"] == [
        "a submitted (('a', 0, ''), 2) (t=6) after seeing t=7"
    ]


def test_ack_safety_acknowledged_before_a_destination_delivered() -> None:
    h = broadcast(learned=True)
    b = h.processes["b"]
    i = index_of(b, Deliver, t=3)
    b[i] = b[i]._replace(time=3.5)  # a's ack of t=3 is at 3.2
    assert found(h, liveness=False)["ack-safety"] == [
        "(('a', 0, ''), 1) (t=3) acknowledged at 3.2000 before unsuspected b delivered it"
    ]
    # The same history with times not compared, or within a tolerance, is fine...
    assert "ack-safety" not in found(h, liveness=False, time_tolerance=None)
    assert "ack-safety" not in found(h, liveness=False, time_tolerance=0.5)
    # ...but a destination that never delivered it is caught either way.
    del b[i]
    assert "ack-safety" in found(h, liveness=False, time_tolerance=None)


@pytest.mark.parametrize("learned", [False, True])
def test_ack_safety_acknowledged_at_another_timestamp_or_as_delivered_to_nobody(
    learned: bool,
) -> None:
    h = broadcast(learned)
    a = h.processes["a"]
    i = index_of(a, Ack, id=A1)
    a[i] = a[i]._replace(t=4)
    assert "ack-safety" in found(h, liveness=False) or "prefix-agreement" in found(
        h, liveness=False
    )
    # Without a config: an ack that says delivered, for a message nobody delivered.
    h = g.run([g.join("a"), g.data("a", 1)], BROADCAST, learned=learned)
    for p in h.processes.values():
        p[:] = [e for e in p if not (type(e) is Deliver and e.t == 1)]
    got = found(h, None, liveness=False)
    assert got["ack-safety"] == [
        "(('a', 0, ''), 1) (t=1) acknowledged as delivered, nobody delivered it"
    ]


def test_unsafe_cut_accepted_at_a_tag_the_receiver_had_not_reached() -> None:
    h = broadcast(learned=True)
    u = (("a", 0, "~u"), 1)
    a, b = h.processes["a"], h.processes["b"]
    a.insert(index_of(a, Deliver, t=5) + 1, SubmitUnsafe(u, 5.3))
    # b (joined at t=1) has delivered t=1..5; the copy claims it was sent up to t=6.
    b.insert(index_of(b, Deliver, t=5) + 1, DeliverUnsafe(6, 7, u, True, 5.4, "a", None, "u"))
    assert found(h, liveness=False)["unsafe-cut"] == [
        f"b accepted {u} at tag 6 having delivered 5 of the 6 messages up to it"
    ]
    # At the right tag it is fine; rejected copies are never judged.
    i = index_of(b, DeliverUnsafe)
    b[i] = b[i]._replace(tag=5, frontier=6)
    assert "unsafe-cut" not in found(h, liveness=False)
    b[i] = b[i]._replace(tag=6, accepted=False)
    assert "unsafe-cut" not in found(h, liveness=False)


def test_unsafe_cut_a_message_meant_for_the_receiver_lies_between_tag_and_frontier() -> None:
    h = broadcast(learned=True)
    u = (("a", 0, "~u"), 1)
    a, b = h.processes["a"], h.processes["b"]
    a.insert(index_of(a, Deliver, t=5) + 1, SubmitUnsafe(u, 5.3))
    b.insert(index_of(b, Deliver, t=5) + 1, DeliverUnsafe(5, 7, u, True, 5.4, "a", None, "u"))
    assert found(h, liveness=False)["unsafe-cut"] == [
        f"b accepted {u} at tag 5, but a message before frontier 7 was meant for it"
    ]


# ====================================================================== liveness
def test_uniform_agreement_delivered_somewhere_but_not_at_a_correct_destination() -> None:
    h = broadcast(learned=True)
    c = h.processes["c"]
    del c[index_of(c, Deliver, t=4)]
    got = found(h)
    assert got["uniform-agreement"] == ["t=4 was delivered, correct c never got it"]
    assert got["termination"] == ["correct c never delivered t=4 (('b', 0, ''), 1)"]
    # A crashed process is owed nothing.
    c.append(Crash(8.0))
    assert found(h, only=("uniform-agreement", "termination")) == {}


def test_termination_a_correct_process_never_acknowledged() -> None:
    h = broadcast(learned=True)
    b = h.processes["b"]
    del b[index_of(b, Ack, id=B1)]
    assert found(h) == {"termination": [f"correct b never got an ack for {B1}"]}
    assert found(h, liveness=False) == {}


def test_liveness_checks_need_asking_for_and_a_config() -> None:
    v = check_history(broadcast(), None)
    assert set(v.skipped) == {"minimality", "uniform-agreement"}
    assert "termination" in v.limits and v.ok
    v = check_history(broadcast(), BROADCAST, liveness=False)
    assert not set(LIVENESS) & set(v.ran)
    with pytest.raises(ValueError, match="unknown checks"):
        check_history(broadcast(), BROADCAST, only=("no-such-check",))


def test_explanations_are_capped_per_check() -> None:
    h = broadcast()
    for p in "abc":
        events = h.processes[p]
        events.reverse()  # every process delivers in reverse: one finding each
    got = found(h, liveness=False, only=("total-order",))["total-order"]
    assert len(got) == 3 and all("after t=" in x for x in got)


def _all_receivers_suspected_at_once() -> tuple[list[Message], History]:
    """Every receiver silent past its lease, suspected by one routers' suspect at t=6
    that nobody delivers (the key-ring config sends it to its suspects only), then two
    new receivers join and take the data."""
    ms = [
        g.join("a", role="receiver"),
        g.join("b", role="receiver"),
        g.join("s", role="client"),
        *(g.data("s", i, {"key": i}) for i in range(1, 4)),
        g.lease_suspect("r1", ["a", "b"]),
        g.join("a2", role="receiver"),
        g.join("b2", role="receiver"),
        *(g.data("s", i, {"key": i}) for i in range(4, 12)),
    ]
    return ms, g.run(ms, RING, crashed={"a": 6, "b": 6})


def test_a_suspect_nobody_delivered_is_rebuilt_from_where_its_suspects_were_told() -> None:
    _ms, h = _all_receivers_suspected_at_once()
    # Without knowing what t=6 was, the replay keeps a and b on the ring: the new
    # receivers' deliveries look misrouted (with the caveat that says why).
    blind = found(h, RING, liveness=False)
    findings = [v for vs in blind.values() for v in vs]
    assert findings and all("assuming the unknown message at t=6" in v for v in findings)
    # Told by a router where they were suspected, a and b record it: t=6 is replayed
    # as their suspect, and the same run passes every check.
    for p in ("a", "b"):
        h.add(p, Terminate("suspected", 6.5, 6))
    assert found(h, RING, liveness=False) == {}
    assert found(h, RING, liveness=True) == {}


def test_told_suspected_where_a_known_message_suspects_nobody_is_a_disagreement() -> None:
    ms, h = _all_receivers_suspected_at_once()
    for p in ("a", "b"):
        h.add(p, Terminate("suspected", 6.5, 5))  # t=5 is s's data message
    assert found(h, RING, liveness=False)["prefix-agreement"][0] == (
        f"a, b told suspected at t=5, but t=5 is {ms[5].id}, which does not suspect them"
    )
