"""A reconfiguration planned while copies of an earlier one are in flight waits when one
failure would lose data under it only because those copies are not done
(``rubberband.exposure``; the simulator's seeds 698 and 4320 with automatic repair)."""

from __future__ import annotations

import msgpack
import pytest

from rubberband.config import RubberbandConfig
from rubberband.errors import MustWait
from rubberband.exposure import exposure, judge
from rubberband.keys import encode_key
from rubberband.optimizer import Copy, Delete, optimize
from rubberband.outputs import Submit
from rubberband.placement import Keyspace
from rubberband.proto import incomplete_header, ready_header, vote_header
from rubberband.super import SuperCore
from rubberband.supervision import Reconfigured
from tests.unit.test_rubberband_config import cluster, step


def _super(c: RubberbandConfig) -> SuperCore:
    s = SuperCore("super:a")
    s.config = c
    return s


def _contracted_0() -> RubberbandConfig:
    """Five processes at 0, 100, .., 400 (f = 3), storage:0 contracted and its copies
    in flight: storage:3 sends [300, 400) to storage:1, and storage:0 sends to storage:2
    and storage:4."""
    c = cluster(5, f=3)
    c, _ = step(c, "super:a", _super(c).plan("contract", "storage:0").header)
    assert ("storage:3", "storage:1", ((encode_key(300), encode_key(400)),)) in (
        c.copies_in_flight()
    )
    return c


def _ready(c: RubberbandConfig, *names: str) -> RubberbandConfig:
    for p in names:
        c, _ = step(c, p, ready_header(c.version))
    return c


def test_a_contraction_waits_while_its_one_complete_holder_besides_a_receiver_is_deleted() -> None:
    """[300, 400) is held by storage:3 and storage:4 whole, and storage:1 receives it
    from storage:3.  Contracting storage:4 now deletes its copy at once and sends the
    range to storage:2 from storage:3 (storage:4 is busy receiving): storage:3 failing
    would break both receivers and leave nobody with the range; without the plan,
    storage:4 keeps it, and once storage:1's copy is done the plan is safe."""
    c = _contracted_0()
    with pytest.raises(MustWait, match=r"failure of storage:3 .* \[300, 400\)"):
        _super(c).plan("contract", "storage:4")
    # Forced, it goes (an operator's call), and other receivers finishing does not help.
    assert _super(c).plan("contract", "storage:4", force=True).header
    with pytest.raises(MustWait):
        _super(_ready(c, "storage:2", "storage:4")).plan("contract", "storage:4")
    # Once storage:1 has its copy, the same contraction is planned.
    done = _ready(c, "storage:1")
    assert "storage:1" not in {dst for _, dst, _ in done.copies_in_flight()}
    assert _super(done).plan("contract", "storage:4").plan.instructions


def test_a_source_already_suspected_is_a_loss_with_no_further_failure() -> None:
    """storage:3, the source of storage:1's copy of [300, 400), is voted out before it
    finished; storage:1 has not said what it lacks yet.  A contraction of storage:4 that
    fed storage:2 from storage:1 would delete the last complete copy with nothing else
    failing (the optimizer feeds it from storage:4, which is safe)."""
    c = _contracted_0()
    c, _ = step(c, "super:a", vote_header("storage:3"))
    ks, suspected = c.keyspace, c.excluded() | c.incomplete
    r = {x: ((encode_key(x), encode_key(x + 100)),) for x in (200, 300)}
    bad = (Copy("storage:2", "storage:1", r[200]), Copy("storage:1", "storage:2", r[300]))
    after = ks.contract("storage:4")
    assert exposure(ks, after, bad, suspected, {}, c.copies_in_flight()) == (None, r[300])
    assert exposure(ks, after, bad, suspected, {}, ()) is None
    # The optimizer feeds storage:2 from storage:4; storage:2's own failure would then
    # lose the range, which storage:4 keeps without the plan: that plan waits too.
    plan = _super(c).plan("contract", "storage:4", force=True).plan
    assert Copy("storage:4", "storage:2", r[300]) in plan.instructions
    with pytest.raises(MustWait, match=r"failure of storage:2 alone would leave \[300, 400\)"):
        _super(c).plan("contract", "storage:4")


def test_a_contracted_source_that_failed_feeds_nobody() -> None:
    """storage:0, contracted and still sending its ranges, is voted out: storage:4 will
    never have [0, 100) whole, though storage:0 is on no ring.  Contracting storage:2
    as the rank alone plans it leaves storage:1 the one complete holder of [0, 100)
    (storage:3's new copy comes from storage:1); counted as holding, storage:4 hid that
    storage:1 failing loses it.  The super plans around it."""
    c = _contracted_0()
    c, _ = step(c, "super:a", vote_header("storage:0"))
    ks, suspected = c.keyspace, c.excluded() | c.incomplete
    after = ks.contract("storage:2")
    ranked = optimize(ks, after, suspected, busy=c.receiving()).instructions
    flight = c.copies_in_flight()
    dead = suspected | {"storage:0"}
    assert exposure(ks, after, ranked, dead, {}, flight) == ("storage:1", _r(0))
    assert exposure(ks, after, ranked, suspected, {}, flight) is None  # storage:0 "holds"
    chosen = _super(c).plan("contract", "storage:2").plan.instructions
    assert chosen != ranked
    assert exposure(ks, after, chosen, dead, {}, flight, settled=False) is None


def _r(lo: int) -> tuple:
    return ((encode_key(lo), encode_key(lo + 100)),)


def test_a_receiver_that_said_what_it_lacks_counts_as_holding_the_rest() -> None:
    """storage:1 reported that it lacks only a point of [300, 400): the rest it holds
    whole, so its copy no longer feeds it, and only that point is at stake."""
    c = _contracted_0()
    point = ((encode_key(350), encode_key(351)),)
    c, _ = step(c, "storage:1", incomplete_header(c.version, point))
    assert c.lacking == {"storage:1": point}
    ks = c.keyspace
    plan = optimize(ks, ks.contract("storage:4"), c.excluded() | c.incomplete)
    exposed = exposure(
        ks, ks.contract("storage:4"), plan.instructions, c.excluded() | c.incomplete,
        c.sources_in_part(), c.copies_in_flight(),
    )  # fmt: skip
    assert exposed is None or exposed[1] != ((encode_key(300), encode_key(400)),)


def test_moving_a_range_with_one_replica_is_not_held_back() -> None:
    """With f = 1 the receiver's failure loses a moved range whatever is in flight:
    waiting cures nothing, so nothing waits (the optimizer's rank weighs that risk)."""
    old = Keyspace(1, [(encode_key(0), "storage:0"), (encode_key(100), "storage:1")])
    new = old.expand(encode_key(50), "storage:2")
    plan = optimize(old, new)
    assert any(isinstance(i, Copy) and i.dst == "storage:2" for i in plan.instructions)
    assert exposure(old, new, plan.instructions, frozenset(), {}, ()) is None
    # A copy to storage:1 in flight from storage:0 changes nothing for the range
    # storage:2 takes from storage:0.
    flight = (("storage:0", "storage:1", ((encode_key(0), encode_key(10)),)),)
    assert exposure(old, new, plan.instructions, frozenset(), {}, flight) is None


def test_copies_in_flight_survive_the_wire_and_an_older_state_has_none() -> None:
    c = _contracted_0()
    wire = msgpack.unpackb(msgpack.packb(c.to_state()), use_list=False)
    back = RubberbandConfig.from_state(wire)
    assert back == c and back.copies_in_flight() == c.copies_in_flight()
    older = list(wire)
    older[8] = [p[:3] for p in wire[8]]  # [version, waiting, receivers]
    assert RubberbandConfig.from_state(older).copies_in_flight() == ()
    bad = list(wire)
    bad[8] = [[*p[:3], [["storage:3", "storage:1", [["x", "y"]]]]] for p in wire[8]]
    with pytest.raises(ValueError, match="copies"):
        RubberbandConfig.from_state(bad)


def test_a_request_that_must_wait_is_planned_again_once_the_copies_are_done() -> None:
    c = _contracted_0()
    s = _super(c)
    fx = s.reconfigure("r1", "contract", "storage:4", now=0.0, timeout=10.0)
    assert not [d for d in fx.deliver if isinstance(d, (Submit, Reconfigured))]
    # Nothing changed: it keeps waiting.
    assert not s.on_tick(1.0).deliver
    s.config = _ready(c, "storage:1")
    fx = s.on_tick(2.0)
    (submit,) = [d for d in fx.deliver if isinstance(d, Submit)]
    assert submit.header["op"] == ("contract", "storage:4")
    assert s.reconfigurations.counts["waited"] == 1
    # Another request that stays blocked ends at its timeout, saying why.
    s = _super(c)
    s.reconfigure("r2", "contract", "storage:4", now=0.0, timeout=10.0)
    (done,) = [d for d in s.on_tick(10.5).deliver if isinstance(d, Reconfigured)]
    assert isinstance(done.error, TimeoutError)
    assert "still waiting" in str(done.error) and "storage:3" in str(done.error)


def test_a_new_holder_whose_own_failure_is_simulated_holds_nothing() -> None:
    """Two replicas: b and c hold [100, 200), c still receiving it from a.  Contracting b
    hands the range to a, fed by b: a's failure breaks c's copy too, while without the
    plan b keeps the range (the simulator, seed 725 with two replicas, where the new
    holder had crashed unsuspected).  A receiver of the plan's copy counted as holding
    whatever happened to it hid this."""
    ks = Keyspace(2, [(encode_key(x), n) for x, n in ((0, "a"), (100, "b"), (200, "c"))])
    after = ks.contract("b")
    plan = (Copy("b", "a", _r(100)), Delete("b", _r(100)))
    flight = (("a", "c", _r(100)),)
    assert exposure(ks, after, plan, frozenset(), {}, flight) == ("a", _r(100))
    assert exposure(ks, after, plan, frozenset(), {}, ()) is None


def test_with_two_replicas_each_part_comes_from_the_holder_that_deletes_it() -> None:
    """An expand at 2500 between storage:2 (2000) and storage:3 (3000), two replicas:
    each minimal cover sends all of [2000, 3000) from one of them, and that one's
    failure loses the half the other deletes.  Judged range by range, the plan sends
    each half from the holder that deletes it."""
    ks = Keyspace(2, [(encode_key(i * 1000), f"storage:{i}") for i in range(5)])
    after = ks.expand(encode_key(2500), "storage:6")
    ranked = optimize(ks, after).instructions
    assert {i.src for i in ranked if isinstance(i, Copy)} == {"storage:2"}
    assert exposure(ks, after, ranked, frozenset(), {}, (), settled=False) is not None
    plan = optimize(ks, after, safe=judge(ks, after, frozenset(), {}, ()))
    half = {x: ((encode_key(x), encode_key(x + 500)),) for x in (2000, 2500)}
    assert set(plan.instructions) >= {
        Copy("storage:3", "storage:6", half[2000]),
        Copy("storage:2", "storage:6", half[2500]),
    }
    assert exposure(ks, after, plan.instructions, frozenset(), {}, (), settled=False) is None
