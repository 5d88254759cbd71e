"""Algorithm 13 on the dissertation's figures (4.3-4.6) and against a model of the data."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rubberband import keys as K
from rubberband.optimizer import (
    MAX_SOLUTIONS,
    BadInstruction,
    Copy,
    Delete,
    Solution,
    destinations,
    instruction_from_wire,
    instructions_from_wire,
    optimize,
    rank,
)
from rubberband.placement import BadReconfiguration, Keyspace

E = K.encode_key


def rs(*pairs) -> K.RangeSet:
    return K.normalize(K.key_range(lo, hi) for lo, hi in pairs)


def figure_4_3() -> tuple[Keyspace, Keyspace]:
    """a, b, c, d at 20, 30, 40, 50 with f = 3, inside a larger ring (y, z before a; g, h
    after d, so no partition of interest wraps); e expands at 35."""
    before = Keyspace(3, [(E(i * 10), p) for i, p in enumerate("yzabcdgh")])
    return before, before.expand(E(35), "e")


def copies(plan) -> list[Copy]:
    return [i for i in plan.instructions if isinstance(i, Copy)]


def deletes(plan) -> list[tuple[str, K.RangeSet]]:
    return [(i.process, i.ranges) for i in plan.instructions if isinstance(i, Delete)]


# ------------------------------------------------------------------ the figures
def test_figure_4_3_expand_has_three_minimal_solutions_and_the_texts_deletes():
    old, new = figure_4_3()
    assert new.partition("e") == rs((20, 40))
    assert destinations(old, new) == (("e", (("b",), ("c",), ("a", "d"))),)
    plan = optimize(old, new)
    assert plan.ranking.total == plan.ranking.considered == 3
    got = copies(plan)
    assert {c.dst for c in got} == {"e"}
    assert K.normalize(r for c in got for r in c.ranges) == rs((20, 40))
    assert deletes(plan) == [("b", rs((35, 40))), ("c", rs((20, 30))), ("d", rs((30, 35)))]
    assert plan.instructions.index(got[-1]) < len(got), "copies come before deletes"
    assert not plan.lost


def test_figure_4_3_splitting_the_copy_between_a_and_d_is_ranked_best():
    """With nothing failed, {a, d} wins: losing a (or d) leaves one group with two
    failed processes, losing b (or c, the text's example list) leaves two such groups."""
    old, new = figure_4_3()
    plan = optimize(old, new)
    assert plan.ranking.chosen.solution == Solution((("e", ("a", "d")),))
    assert [(c.src, c.ranges) for c in copies(plan)] == [("a", rs((20, 30))), ("d", rs((30, 40)))]
    assert plan.ranking.chosen.worst_case == (2, 1, 1, 1, 1)
    texts = rank(old, new, Solution((("e", ("b",)),)))
    assert texts.worst_case == (2, 2, 1, 1) and texts.worst_failure == "b"
    assert [alt.solution for alt in plan.ranking.alternatives] == [
        Solution((("e", ("b",)),)),
        Solution((("e", ("c",)),)),
    ]


def test_figure_4_4_with_d_failed_b_copies_rather_than_c():
    old, new = figure_4_3()
    plan = optimize(old, new, frozenset({"d"}))
    assert [(c.src, c.dst, c.ranges) for c in copies(plan)] == [("b", "e", rs((20, 40)))]
    assert deletes(plan) == [("b", rs((35, 40))), ("c", rs((20, 30)))], "d is failed: no delete"
    from_c = rank(old, new, Solution((("e", ("c",)),)), frozenset({"d"}))
    assert from_c.worst_failure == "c" and from_c.worst_case[0] == 3, "c, d, e all failed"
    assert plan.ranking.chosen.worst_case[0] == 2
    assert plan.ranking.total == 2


FIGURE_4_5 = {
    # e sends to b, c and d
    1: (("b", ("e",)), ("c", ("e",)), ("d", ("e",))),
    # chains from e (the figure is lost; the text says e's failure fails b, c and d)
    2: (("b", ("e",)), ("c", ("b",)), ("d", ("e",))),
    3: (("b", ("c",)), ("c", ("e",)), ("d", ("c",))),
    # b and c send to each other, a cycle
    4: (("b", ("c",)), ("c", ("b",)), ("d", ("e",))),
}


def test_figure_4_5_contract_solution_4_the_cycle_wins_with_2_2_over_3_2():
    """The text counts only g1 = {a, b, c} and g2 = {b, c, d}; the full sequences add the
    groups around them: <2,2,1,1> against <3,2,2,1,1>."""
    expanded, contracted = figure_4_3()[1], figure_4_3()[0]
    assert [d for d, _ in destinations(expanded, contracted)] == ["b", "c", "d"]
    ranked = {k: rank(expanded, contracted, Solution(v)) for k, v in FIGURE_4_5.items()}
    for k in (1, 2, 3):
        assert ranked[k].worst_case[:2] == (3, 2) and ranked[k].worst_failure == "e"
    assert ranked[4].worst_case[:2] == (2, 2) and ranked[4].worst_failure in ("b", "c")
    assert ranked[4].worst_case == (2, 2, 1, 1)
    assert min(ranked.values(), key=lambda r: r.worst_case) is ranked[4]
    plan = optimize(expanded, contracted)
    assert plan.ranking.total == 27
    assert plan.ranking.chosen.worst_case <= ranked[4].worst_case
    assert deletes(plan) == [("e", rs((20, 40)))], "e returns to standby holding nothing"


def test_a_cycle_does_not_hide_its_own_failure():
    """Skipping every node with a source would skip both b and c in Solution 4."""
    expanded, contracted = figure_4_3()[1], figure_4_3()[0]
    cyc = rank(expanded, contracted, Solution(FIGURE_4_5[4]))
    assert cyc.worst_case > (1, 1, 1)


def test_hand_made_solutions_must_feed_every_destination():
    old, new = figure_4_3()
    with pytest.raises(BadReconfiguration, match="destinations"):
        rank(old, new, Solution((("d", ("b",)),)))
    with pytest.raises(BadReconfiguration, match="holds"):
        rank(old, new, Solution((("e", ("a",)),)))
    with pytest.raises(BadReconfiguration, match="replication factor"):
        optimize(old, Keyspace(2, new.ring()))


# ------------------------------------------------------------------ special cases
def test_replacing_a_live_process_moves_its_data_and_empties_it():
    old = Keyspace(2, [(E(i * 10), p) for i, p in enumerate("abcd")])
    new = old.replace("b", "x")
    plan = optimize(old, new)
    assert K.normalize(r for c in copies(plan) if c.dst == "x" for r in c.ranges) == rs((0, 20))
    assert deletes(plan) == [("b", rs((0, 20)))]


def test_data_whose_every_holder_is_suspected_is_reported_lost_not_copied():
    old = Keyspace(2, [(E(i * 10), p) for i, p in enumerate("abcd")])
    new = old.replace("b", "x")
    plan = optimize(old, new, frozenset({"a", "b"}))
    assert plan.lost == rs((0, 10))
    assert [(c.src, c.dst, c.ranges) for c in copies(plan)] == [("c", "x", rs((10, 20)))]
    assert any("LOST" in line for line in plan.describe())


def test_an_incomplete_holder_sends_what_it_does_not_lack_and_nothing_else():
    """A holder that said which ranges it lacks (``partial``) is still suspected for
    everything else, receiving no copy and deleting nothing, but it may send a range
    outside those: here it is the only one left of [0, 10)."""
    old = Keyspace(2, [(E(i * 10), p) for i, p in enumerate("abcd")])
    new = old.replace("b", "x")
    broken = frozenset({"a", "b"})
    overlapping = optimize(old, new, broken, partial={"a": rs((5, 8))})
    assert overlapping.lost == rs((5, 8))  # what it lacks it cannot send; the rest it can
    sent = [(c.src, c.dst, c.ranges) for c in copies(overlapping)]
    assert ("a", "x", rs((0, 5), (8, 10))) in sent
    plan = optimize(old, new, broken, partial={"a": rs((10, 20))})
    assert not plan.lost
    assert sorted((c.src, c.dst, c.ranges) for c in copies(plan)) == [
        ("a", "x", rs((0, 10))),
        ("c", "x", rs((10, 20))),
    ]
    assert deletes(plan) == []  # b is still suspected: it deletes nothing
    # The replaced process itself, incomplete elsewhere, sends what it holds whole.
    itself = optimize(old, new, broken, partial={"b": rs((10, 20))})
    assert not itself.lost
    assert ("b", "x", rs((0, 10))) in [(c.src, c.dst, c.ranges) for c in copies(itself)]


def test_incomplete_holders_together_send_a_segment_none_of_them_holds_whole():
    """[10, 20) is held by b, c and d.  d failed; b and c are incomplete, b lacking its
    upper half and c its lower half.  Together they hold all of it: each sends the half
    it has, where a segment taken whole had no source and was reported lost."""
    old = Keyspace(3, [(E(i * 10), p) for i, p in enumerate("abcdef")])
    new = old.replace("b", "x")
    broken = frozenset({"b", "c", "d"})
    plan = optimize(old, new, broken, partial={"b": rs((15, 20)), "c": rs((10, 15))})
    assert not plan.lost
    sent = {c.src: K.intersect(c.ranges, rs((10, 20))) for c in copies(plan)}
    assert sent["b"] == rs((10, 15)) and sent["c"] == rs((15, 20))
    assert "d" not in sent  # failed, and not incomplete: it sends nothing
    got = K.normalize(r for c in copies(plan) for r in c.ranges)
    assert got == new.partition("x")
    # Each lacks what the other holds, and what neither holds is still lost.
    both = optimize(old, new, broken, partial={"b": rs((12, 20)), "c": rs((10, 15))})
    assert both.lost == rs((12, 15))


def test_the_first_expand_copies_nothing():
    empty = Keyspace(3)
    plan = optimize(empty, empty.expand(E(1), "a"))
    assert plan.instructions == () and not plan.lost
    assert plan.ranking.chosen.worst_case == () and plan.ranking.chosen.worst_failure is None


def test_a_large_replication_factor_is_bounded_and_still_correct():
    old = Keyspace(6, [(E(i), f"s{i:02d}") for i in range(40)])
    new = old.contract("s20")
    plan = optimize(old, new, max_solutions=200)
    assert plan.ranking.total > plan.ranking.considered
    assert plan.ranking.considered <= 200
    assert plan == optimize(old, new, max_solutions=200)
    _check_plan(old, new, frozenset(), plan)
    assert optimize(old, new).ranking.considered <= MAX_SOLUTIONS


# ------------------------------------------------------------------ the model
UNIVERSE = [E(None), *(E(i) for i in range(-1, 42)), E("z")]


@st.composite
def reconfigurations(draw):
    f = draw(st.integers(1, 4))
    ids = draw(st.lists(st.integers(0, 40), max_size=8, unique=True))
    names = draw(st.permutations([f"p{i}" for i in range(len(ids))]))
    old = Keyspace(f, [(E(i), p) for i, p in zip(ids, names, strict=True)])
    free = [i for i in range(41) if E(i) not in old.ids]
    kinds = ["expand"] + (["contract", "replace", "rebalance"] if len(old) else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "expand":
        new = old.expand(E(draw(st.sampled_from(free))), "fresh")
    elif kind == "contract":
        new = old.contract(draw(st.sampled_from(old.processes)))
    elif kind == "replace":
        new = old.replace(draw(st.sampled_from(old.processes)), "fresh")
    else:
        p = draw(st.sampled_from(old.processes))
        i = old.position(p)
        lo = old.ids[i - 1][1] if i else -1
        hi = old.ids[i + 1][1] if i + 1 < len(old) else 41
        moves = [v for v in range(lo + 1, hi) if v != old.ids[i][1]]
        new = old.rebalance(p, E(draw(st.sampled_from(moves)))) if moves else old
    suspected = frozenset(draw(st.sets(st.sampled_from([*old.processes, "fresh", "other"]))))
    return old, new, suspected


def _keys(ranges) -> set:
    return {k for k in UNIVERSE if K.contains(ranges, k)}


def _check_plan(old: Keyspace, new: Keyspace, suspected: frozenset[str], plan) -> None:
    pre = {p: _keys(old.partition(p)) for p in old.processes if p not in suspected}
    surviving = set().union(*pre.values())
    state = {p: set(v) for p, v in pre.items()}
    seen_delete = False
    fed_by = dict(plan.ranking.chosen.solution.choices)
    received: dict[str, list] = {}
    for ins in plan.instructions:
        if isinstance(ins, Copy):
            assert not seen_delete, "a copy after a delete"
            assert ins.src not in suspected and ins.dst not in suspected
            assert K.covers(old.partition(ins.src), ins.ranges), "a source sends what it lacks"
            assert ins.src in fed_by[ins.dst], "a copy from a source the ranking did not choose"
            missing = K.difference(new.partition(ins.dst), old.partition(ins.dst))
            assert K.covers(missing, ins.ranges), "a destination receives what it has"
            for r in ins.ranges:
                assert not any(K.overlaps((r,), (q,)) for q in received.get(ins.dst, []))
            received.setdefault(ins.dst, []).extend(ins.ranges)
            state.setdefault(ins.dst, set()).update(
                k for k in pre[ins.src] if K.contains(ins.ranges, k)
            )
        else:
            seen_delete = True
            assert ins.process not in suspected
            state[ins.process] -= _keys(ins.ranges)
    everyone = set(old.processes) | set(new.processes)
    for p in everyone - suspected:
        assert state.get(p, set()) == _keys(new.partition(p)) & surviving, p
    needed = set()
    for p in set(new.processes) - suspected:
        needed |= _keys(K.difference(new.partition(p), old.partition(p)))
    assert _keys(plan.lost) == (needed - surviving if len(old) else set())


@given(reconfigurations())
@settings(max_examples=300)
def test_instructions_turn_the_old_data_into_the_new_partitions(case):
    old, new, suspected = case
    plan = optimize(old, new, suspected)
    _check_plan(old, new, suspected, plan)
    assert plan.ranking.considered == plan.ranking.total
    chosen = plan.ranking.chosen
    for alt in plan.ranking.alternatives:
        assert (chosen.worst_case, chosen.senders) <= (alt.worst_case, alt.senders)
        assert alt == rank(old, new, alt.solution, suspected)


@given(reconfigurations(), st.randoms(use_true_random=False))
@settings(max_examples=100)
def test_the_plan_ignores_the_order_sets_are_built_in(case, rnd):
    old, new, suspected = case
    shuffled = list(suspected)
    rnd.shuffle(shuffled)
    fresh_old, fresh_new = (Keyspace.from_state(k.to_state()) for k in (old, new))
    again = optimize(fresh_old, fresh_new, frozenset(shuffled))
    assert again == optimize(old, new, suspected)


@st.composite
def with_incomplete_holders(draw):
    """A reconfiguration whose suspected processes are in part incomplete: each of those
    lacks some ranges (what a broken receive left it without) and holds the rest."""
    old, new, suspected = draw(reconfigurations())
    partial = {}
    for p in sorted(suspected & set(old.processes)):
        if draw(st.booleans()):
            cuts = sorted(draw(st.sets(st.integers(0, 41), min_size=2, max_size=6)))
            pairs = [(cuts[i], cuts[i + 1]) for i in range(0, len(cuts) - 1, 2)]
            partial[p] = rs(*pairs)
    return old, new, suspected, partial


@given(with_incomplete_holders())
@settings(max_examples=300)
def test_incomplete_holders_send_what_they_hold_and_only_what_nobody_holds_is_lost(case):
    """Against a model of the data: a failed process holds nothing, an incomplete one
    its old partition but what it lacks.  Every copy's source holds what it sends, every
    process ends with its new partition of the data that survives, and a range is lost
    exactly where no holder has it (not where no holder has all of a segment)."""
    old, new, suspected, partial = case
    plan = optimize(old, new, suspected, partial=partial)
    held = {
        p: _keys(K.difference(old.partition(p), partial.get(p, ())))
        for p in old.processes
        if p not in suspected or p in partial
    }
    surviving = set().union(*held.values())
    state = {p: set(v) for p, v in held.items() if p not in suspected}
    for ins in plan.instructions:
        if isinstance(ins, Copy):
            assert ins.dst not in suspected
            assert ins.src in held, "a failed process sends"
            sent = _keys(ins.ranges)
            assert not _keys(K.intersect(ins.ranges, partial.get(ins.src, ()))), "sends a gap"
            assert K.covers(old.partition(ins.src), ins.ranges), "a source sends what it lacks"
            state.setdefault(ins.dst, set()).update(held[ins.src] & sent)
        else:
            assert ins.process not in suspected
            state[ins.process] -= _keys(ins.ranges)
    for p in (set(old.processes) | set(new.processes)) - suspected:
        assert state.get(p, set()) == _keys(new.partition(p)) & surviving, p
    needed = set()
    for p in set(new.processes) - suspected:
        needed |= _keys(K.difference(new.partition(p), old.partition(p)))
    assert _keys(plan.lost) == (needed - surviving if len(old) else set())


_SCRIPT = textwrap.dedent(
    """
    from rubberband import keys as K
    from rubberband.optimizer import optimize
    from rubberband.placement import Keyspace
    names = ["alpha", "bravo", "charlie", "delta", "echo", "fox", "golf", "hotel", "india"]
    ks = Keyspace(3, [(K.encode_key(i * 10), p) for i, p in enumerate(names)])
    out = []
    for new in (ks.expand(K.encode_key(35), "new"), ks.contract("delta"),
                ks.replace("echo", "new"), ks.rebalance("fox", K.encode_key(55))):
        for sus in (frozenset(), frozenset({"charlie"}), frozenset({"golf", "bravo"})):
            out.append(optimize(ks, new, sus).to_wire())
    print(repr(out))
    """
)


def test_every_super_computes_the_same_list_whatever_the_hash_seed():
    runs = []
    for seed in ("1", "2", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, check=True
        )
        runs.append(done.stdout)
    assert runs[0] == runs[1] == runs[2] and runs[0].startswith("[((")


# ------------------------------------------------------------------ wire
def test_instructions_round_trip_through_msgpack():
    old, new = figure_4_3()
    plan = optimize(old, new, frozenset({"d"}))
    wire = msgpack.unpackb(msgpack.packb(plan.to_wire()), use_list=False)
    assert instructions_from_wire(wire) == plan.instructions


@pytest.mark.parametrize(
    "bad",
    [
        (),
        ("copy", "a", "a", ((E(1), E(2)),)),
        ("copy", "a", "b"),
        ("copy", "a", "b", ()),
        ("copy", "a", "b", ((E(2), E(1)),)),
        ("delete", "", ((E(1), E(2)),)),
        ("delete", "a", [[E(1), E(2)]]),
        ("move", "a", ((E(1), E(2)),)),
        "copy",
    ],
)
def test_malformed_instructions_are_refused(bad):
    with pytest.raises(BadInstruction):
        instruction_from_wire(bad)
