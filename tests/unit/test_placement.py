"""The keyspace against brute force over a small universe of keys (4.2.2, 4.3, 4.4.1)."""

from __future__ import annotations

import math

import msgpack
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rubberband import keys as K
from rubberband.placement import (
    BadKeyspace,
    BadReconfiguration,
    Keyspace,
    Unavailable,
)

E = K.encode_key
UNIVERSE = [E(None), *(E(i) for i in range(-2, 44)), E("z")]
"""Keys below, between, on and above every id the strategies draw (ids are ints 0..40)."""


@st.composite
def keyspaces(draw, min_n=0, max_n=8):
    f = draw(st.integers(1, 4))
    ids = draw(st.lists(st.integers(0, 40), min_size=min_n, max_size=max_n, unique=True))
    names = draw(st.permutations([f"p{i}" for i in range(len(ids))]))
    return Keyspace(f, [(E(i), p) for i, p in zip(ids, names, strict=True)])


@st.composite
def range_sets(draw, max_ranges=4):
    bounds = sorted(draw(st.lists(st.sampled_from(UNIVERSE), max_size=2 * max_ranges)))
    extra = draw(st.lists(st.integers(-2, 43), max_size=2))
    pairs = [(bounds[i], bounds[i + 1]) for i in range(0, len(bounds) - 1, 2)]
    pairs += [K.point(k) for k in extra]
    if draw(st.booleans()):
        pairs.append((K.MIN_EKEY, E(-1)))
    return K.normalize(pairs)


def holders(ks: Keyspace, ekey) -> set[str]:
    return {p for p in ks.processes if K.contains(ks.partition(p), ekey)}


def keys_in(rs) -> set:
    return {k for k in UNIVERSE if K.contains(rs, k)}


# ------------------------------------------------------------------ partitions
@given(keyspaces())
def test_every_key_is_held_by_min_f_n_processes_and_in_one_segment(ks):
    n = len(ks)
    for k in UNIVERSE:
        assert len(holders(ks, k)) == min(ks.f, n)
        in_segments = [i for i, seg in enumerate(ks.segments()) if K.contains(seg, k)]
        assert len(in_segments) == (1 if n else 0)
        if n:
            assert in_segments == [ks.segment_of(k)]
            assert set(ks.holders_of_segment(in_segments[0])) == holders(ks, k)
    for p in ks.processes:
        mine = [i for i in range(n) if p in ks.holders_of_segment(i)]
        assert ks.partition(p) == K.normalize(r for i in mine for r in ks.segments()[i])


def test_the_figure_4_1_shape_wraps_at_max_and_min():
    ks = Keyspace(3, [(E(0), "a"), (E(10), "b"), (E(20), "c"), (E(30), "d")])
    assert ks.partition("c") == ((E(0), E(30)),)
    assert ks.partition("a") == ((K.MIN_EKEY, E(10)), (E(20), K.MAX_EKEY))
    assert ks.segments()[3] == ((K.MIN_EKEY, E(0)), (E(30), K.MAX_EKEY))
    assert ks.holders_of_segment(3) == ("d", "a", "b")
    small = Keyspace(3, [(E(0), "a"), (E(10), "b")])
    assert small.partition("a") == K.EVERYTHING
    assert small.holders_of_segment(1) == ("b", "a")
    assert Keyspace(2).partition("a") == K.NOTHING


def test_an_id_at_min_owns_the_bottom_of_the_keyspace():
    ks = Keyspace(1, [(K.MIN_EKEY, "a"), (E(5), "b")])
    assert ks.segments() == (((K.MIN_EKEY, E(5)),), ((E(5), K.MAX_EKEY),))
    assert ks.write_set((K.point(None),)) == {"a"}
    assert ks.write_set((K.point(K.MIN),)) == {"a"}
    assert ks.read_cover(K.EVERYTHING, 0) == {
        "a": ((K.MIN_EKEY, E(5)),),
        "b": ((E(5), K.MAX_EKEY),),
    }


# ------------------------------------------------------------------ writes
@given(
    keyspaces(), st.sampled_from(UNIVERSE), st.sets(st.sampled_from([f"p{i}" for i in range(8)]))
)
def test_point_write_set_is_every_holder_of_the_key_but_excluded(ks, k, excluded):
    exclude = frozenset(excluded)
    assert ks.write_set((K.point(K.decode_key(k)),), exclude) == holders(ks, k) - exclude
    assert ks.routing(exclude).write_set(((k, K.after(k)),)) == holders(ks, k) - exclude
    assert ks.routing(exclude).key_set(k) == holders(ks, k) - exclude  # (H.KEY's routing)


@given(keyspaces(), range_sets(), st.sets(st.sampled_from([f"p{i}" for i in range(8)])))
def test_write_set_is_every_process_whose_partition_overlaps(ks, rs, excluded):
    exclude = frozenset(excluded)
    expected = {p for p in ks.processes if K.overlaps(ks.partition(p), rs)}
    assert ks.write_set(rs, exclude) == expected - exclude
    assert ks.overlapping(rs) == expected


# ------------------------------------------------------------------ reads
names8 = st.sets(st.sampled_from([f"p{i}" for i in range(8)]), max_size=3)


@given(keyspaces(), range_sets(), st.integers(0, 10), names8, names8)
@settings(max_examples=300)
def test_read_cover_answers_the_request_exactly_from_holders(ks, rs, offset, avoided, excluded):
    avoid, exclude = frozenset(avoided), frozenset(excluded)
    unreachable = {k for k in keys_in(rs) if not holders(ks, k) - exclude}
    try:
        cover = ks.read_cover(rs, offset, avoid, exclude)
    except Unavailable as e:
        assert unreachable
        assert keys_in(e.uncovered) == unreachable
        assert K.covers(rs, e.uncovered)
        cover = e.partial
    else:
        assert not unreachable
    answered: list = []
    for p, part in cover.items():
        assert p not in exclude
        assert part and part == K.normalize(part)
        assert K.covers(ks.partition(p), part)
        for k in keys_in(part):
            assert k not in answered, "two processes answer one key"
            answered.append(k)
            if p in avoid:
                assert holders(ks, k) - exclude <= avoid, (
                    "a busy holder read though another was free"
                )
    assert set(answered) == keys_in(rs) - unreachable
    if not unreachable:
        assert K.normalize(r for part in cover.values() for r in part) == rs
    fresh = Keyspace.from_state(ks.to_state())
    try:
        again = fresh.read_cover(rs, offset, frozenset(avoided), frozenset(excluded))
    except Unavailable as e:
        again = e.partial
    assert again == cover and list(again) == list(cover)


@given(keyspaces(min_n=1), st.sampled_from(UNIVERSE))
def test_a_point_read_visits_every_holder_as_the_offset_turns(ks, k):
    m = min(ks.f, len(ks))
    chosen = [ks.read_cover(((k, K.after(k)),), o) for o in range(m)]
    assert all(len(c) == 1 for c in chosen)
    assert {p for c in chosen for p in c} == holders(ks, k)
    assert ks.read_cover(((k, K.after(k)),), m) == chosen[0]


@given(keyspaces(min_n=1), st.integers(0, 20))
def test_a_full_read_uses_whole_partitions(ks, offset):
    n, f = len(ks), ks.f
    cover = ks.read_cover(K.EVERYTHING, offset)
    if n <= f:
        assert len(cover) == 1
    elif n % f == 0:
        assert len(cover) == n // f
    else:
        assert len(cover) <= math.ceil(n / f) + 1


def test_read_cover_skips_suspects_and_prefers_idle_holders():
    ks = Keyspace(3, [(E(i * 10), n) for i, n in enumerate("abcde")])
    key = (K.point(25),)  # segment of c (20), held by c, d, e
    assert ks.read_cover(key, 2) == {"c": key}
    assert ks.read_cover(key, 2, exclude=frozenset({"c"})) == {"d": key}
    assert ks.read_cover(key, 2, avoid=frozenset({"c", "d"})) == {"e": key}
    assert ks.read_cover(key, 2, avoid=frozenset({"c", "d", "e"})) == {"c": key}
    with pytest.raises(Unavailable) as e:
        ks.read_cover(key, 0, exclude=frozenset({"c", "d", "e"}))
    assert e.value.uncovered == key


def test_an_empty_keyspace_routes_writes_nowhere_and_cannot_read():
    ks = Keyspace(3)
    assert ks.write_set((K.point(1),)) == frozenset()
    assert ks.write_set(K.EVERYTHING) == frozenset()
    with pytest.raises(Unavailable):
        ks.read_cover((K.point(1),), 0)


def test_routing_tables_are_cached_per_exclusion_sets():
    ks = Keyspace(2, [(E(1), "a"), (E(2), "b"), (E(3), "c")])
    assert ks.routing(frozenset({"a"})) is ks.routing(frozenset(["a"]))
    assert ks.routing(frozenset({"a"})) is not ks.routing(frozenset({"b"}))
    for i in range(40):
        ks.routing(frozenset({f"x{i}"}))
    assert ks.write_set((K.point(1),), frozenset({"a"})) == {"b"}


# ------------------------------------------------------------------ transformations
@given(keyspaces(), st.integers(0, 40), st.data())
def test_transformations_keep_the_invariants(ks, new_id, data):
    outcomes = []
    if E(new_id) not in ks.ids:
        outcomes.append(ks.expand(E(new_id), "fresh"))
    if len(ks):
        victim = data.draw(st.sampled_from(ks.processes))
        outcomes.append(ks.contract(victim))
        assert ks.would_underreplicate(victim) == (len(ks) - 1 < ks.f)
        # Several taken off together: the ring one at a time would leave.
        gone = data.draw(st.lists(st.sampled_from(ks.processes), unique=True))
        together = ks.contract(*gone)
        one_by_one = ks
        for p in gone:
            one_by_one = one_by_one.contract(p)
        assert together == one_by_one and not set(gone) & set(together.processes)
        outcomes.append(together)
        replaced = ks.replace(victim, "fresh")
        assert replaced.id_of("fresh") == ks.id_of(victim) and victim not in replaced
        outcomes.append(replaced)
    for out in outcomes:
        assert out.f == ks.f and out == Keyspace.from_state(out.to_state())
        for k in UNIVERSE:
            assert len(holders(out, k)) == min(out.f, len(out))


def cyclic_successors(ks: Keyspace) -> dict[str, str]:
    n = len(ks)
    return {ks.processes[i]: ks.processes[(i + 1) % n] for i in range(n)}


@given(keyspaces(min_n=1), st.integers(0, 40), st.data())
def test_rebalance_moves_an_id_only_when_the_cyclic_order_stays(ks, new_id, data):
    p = data.draw(st.sampled_from(ks.processes))
    target = E(new_id)
    others = {e for e, q in ks.ring() if q != p}
    assume(target not in others)
    moved_ring = [(target if q == p else e, q) for e, q in ks.ring()]
    stays = cyclic_successors(Keyspace(ks.f, moved_ring)) == cyclic_successors(ks)
    if stays:
        out = ks.rebalance(p, target)
        assert out.id_of(p) == target and cyclic_successors(out) == cyclic_successors(ks)
    else:
        with pytest.raises(BadReconfiguration, match="ring order"):
            ks.rebalance(p, target)


def test_rebalance_may_cross_the_wrap_but_not_pass_a_neighbour():
    ks = Keyspace(2, [(E(10), "a"), (E(20), "b"), (E(30), "c")])
    assert ks.rebalance("a", E(40)).processes == ("b", "c", "a")
    assert ks.rebalance("b", E(29)).id_of("b") == E(29)
    with pytest.raises(BadReconfiguration, match="ring order"):
        ks.rebalance("b", E(31))
    assert ks.rebalance("b", E(20)) is ks


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda ks: ks.expand(E(20), "x"), "20 is taken by 'b'"),
        (lambda ks: ks.expand(E(25), "a"), "already on the ring"),
        (lambda ks: ks.expand(K.MAX_EKEY, "x"), "below MAX"),
        (lambda ks: ks.expand(("bad",), "x"), "below MAX"),
        (lambda ks: ks.contract("x"), "not on the ring"),
        (lambda ks: ks.replace("x", "y"), "not on the ring"),
        (lambda ks: ks.replace("a", "b"), "already on the ring"),
        (lambda ks: ks.rebalance("a", E(30)), "30 is taken by 'c'"),
    ],
)
def test_impossible_transformations_are_refused(change, why):
    ks = Keyspace(2, [(E(10), "a"), (E(20), "b"), (E(30), "c")])
    with pytest.raises(BadReconfiguration, match=why):
        change(ks)


@pytest.mark.parametrize(
    "state",
    [
        (0, ()),
        ("3", ()),
        (3, (((2, 1), "a"), ((2, 1), "b"))),
        (3, (((2, 1), "a"), ((2, 2), "a"))),
        (3, (((2, "x"), "a"),)),
        (3, (((2, 1), ""),)),
        (3, (((2, 1), "a", "b"),)),
        (3,),
        "nope",
    ],
)
def test_malformed_states_are_refused(state):
    with pytest.raises(BadKeyspace):
        Keyspace.from_state(state)


@given(keyspaces())
def test_state_round_trips_through_msgpack(ks):
    wire = msgpack.unpackb(msgpack.packb(ks.to_state()), use_list=False)
    back = Keyspace.from_state(wire)
    assert back == ks and hash(back) == hash(ks)
    assert [back.partition(p) for p in back.processes] == [ks.partition(p) for p in ks.processes]


_any_keys = st.one_of(
    st.integers(-5, 5),
    st.floats(-5, 5, allow_nan=False),
    st.text(max_size=2),
    st.binary(max_size=2),
    st.booleans(),
    st.none(),
    st.tuples(st.integers(-2, 2), st.text(max_size=1)),
    st.tuples(st.integers(-2, 2)),
)


@given(
    st.integers(1, 3),
    st.lists(_any_keys, max_size=7),
    st.booleans(),
    st.lists(_any_keys, min_size=1, max_size=20),
)
def test_a_keys_write_set_is_its_points(f, id_keys, at_min, keys):
    """``key_set``, by which the routers route a write that names its key alone, is
    ``write_set`` of that key's range, whatever the keys' types and the ids' (one at
    MIN included)."""
    ids = sorted({K.encode_key(k) for k in id_keys} | ({K.MIN_EKEY} if at_min else set()))
    ks = Keyspace(f, [(e, f"p{i}") for i, e in enumerate(ids)])
    routing = ks.routing(frozenset({"p1"}))
    for e in [K.encode_key(k) for k in keys] + ids + [K.MIN_EKEY]:
        assert routing.key_set(e) == routing.write_set(((e, K.after(e)),)), e
