"""The leaf map against a dict and ``sorted``: the same items, and every walk in order,
whatever mix of writes and walks (small leaves, so splits, sweeps and emptied leaves
come often)."""

from __future__ import annotations

import bisect
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage_adapters import leafmap
from storage_adapters.leafmap import LeafMap

PAIR = st.tuples(st.integers(0, 3), st.integers(0, 60))
KEY = st.one_of(PAIR, PAIR, st.tuples(st.integers(0, 3), st.integers(0, 60), st.integers(0, 2)))
"""Mostly pairs of one rank (a leaf of them sorts by their second elements), and some
longer keys sharing their ranks (which such a leaf must notice)."""
BOUND = st.one_of(st.none(), KEY)
STEP = st.one_of(
    st.tuples(st.just("set"), KEY, st.integers()),
    st.tuples(st.just("new"), KEY, st.integers()),
    st.tuples(st.just("setdefault"), KEY, st.integers()),
    st.tuples(st.just("del"), KEY),
    st.tuples(st.just("pop"), KEY),
    st.tuples(st.just("update"), st.lists(st.tuples(KEY, st.integers()), max_size=8)),
    st.tuples(st.just("walk"), BOUND, BOUND, st.booleans(), st.booleans()),
    st.tuples(st.just("clear")),
)


def expected_walk(model: dict[Any, Any], lo: Any, hi: Any, inc: tuple[bool, bool]) -> list[Any]:
    keys = sorted(model)
    above = bisect.bisect_left if inc[0] else bisect.bisect_right
    below = bisect.bisect_right if inc[1] else bisect.bisect_left
    return keys[0 if lo is None else above(keys, lo) : len(keys) if hi is None else below(keys, hi)]


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 5), st.lists(STEP, max_size=120), st.sampled_from([0, 1, 3, 1_000]))
def test_a_leaf_map_is_a_dict_walked_in_order(load: int, steps: list[Any], placed: int) -> None:
    """``placed``: keys appended that a read puts in place one by one (0: every read of
    an unsorted leaf sorts it whole; 1,000: none does, these leaves being small)."""
    kept, leafmap._PLACED = leafmap._PLACED, placed
    try:
        _walked_in_order(load, steps)
    finally:
        leafmap._PLACED = kept


def _walked_in_order(load: int, steps: list[Any]) -> None:
    m, model = LeafMap(load), {}
    for step in steps:
        kind = step[0]
        if kind == "set":
            m[step[1]] = model[step[1]] = step[2]
        elif kind == "new" and step[1] not in model:
            m.add_new(step[1], step[2])
            model[step[1]] = step[2]
        elif kind == "setdefault":  # the memory engine's put: set, and place if new
            value = (step[2],)
            if dict.setdefault(m, step[1], value) is value:
                m.place_new(step[1])
            else:
                dict.__setitem__(m, step[1], value)
            model[step[1]] = value
        elif kind == "del":
            if step[1] in model:
                del m[step[1]]
                del model[step[1]]
            else:
                with pytest.raises(KeyError):
                    del m[step[1]]
        elif kind == "pop":
            assert m.pop(step[1], "none") == model.pop(step[1], "none")
        elif kind == "update":
            m.update(step[1])
            model.update(step[1])
        elif kind == "walk":
            inc = (step[3], step[4])
            assert list(m.irange(step[1], step[2], inclusive=inc)) == expected_walk(
                model, step[1], step[2], inc
            )
        elif kind == "clear":
            m.clear()
            model.clear()
        assert dict(m) == model
        assert_leaves_in_order(m)
    assert m.ordered_keys() == sorted(model)
    assert m.ordered_values() == [model[k] for k in sorted(model)]
    held = sorted(k for leaf in m._leaves for k in leaf)
    assert held == sorted(set(held)), "a key in two places"
    assert set(held) == set(model) | m._ghosts and not set(model) & m._ghosts
    assert_under_bounds(m)


def assert_leaves_in_order(m: LeafMap) -> None:
    """A leaf not marked unsorted is sorted; a marked one, up to the keys it says are."""
    for i, leaf in enumerate(m._leaves):
        ordered = m._unsorted.get(id(leaf), len(leaf))
        assert leaf[:ordered] == sorted(leaf[:ordered]), (i, ordered, leaf)
    assert set(m._unsorted) <= {id(leaf) for leaf in m._leaves}


def assert_under_bounds(m: LeafMap) -> None:
    """Each leaf holds keys above the bound before it and up to its own, none empty."""
    bounds = m._bounds
    assert len(bounds) == len(m._leaves)
    for i, leaf in enumerate(m._leaves):
        assert leaf, f"leaf {i} is empty"
        assert all(k <= bounds[i] for k in leaf), (i, bounds[i], leaf)
        assert i == 0 or all(bounds[i - 1] < k for k in leaf), (i, bounds[i - 1], leaf)


def test_a_walk_with_writes_between_gives_no_key_twice_and_every_key_held_throughout() -> None:
    m = LeafMap(4)
    for k in range(0, 200, 2):
        m[k] = k
    walk = m.irange(None, None)
    seen = [next(walk) for _ in range(30)]
    for k in range(1, 200, 2):  # new keys on both sides of the walk: leaves split
        m[k] = k
    for k in range(100, 140):
        m.pop(k, None)
    seen += list(walk)
    assert seen == sorted(set(seen))
    held_throughout = [k for k in range(0, 200, 2) if not 100 <= k < 140]
    assert set(held_throughout) <= set(seen)
    assert not [k for k in seen if 100 <= k < 140], "removed far ahead of the walk, and given"
    assert m.ordered_keys() == sorted(m)


def test_a_leaf_map_refuses_writes_that_would_skip_its_order() -> None:
    m = LeafMap()
    for write in (lambda: m.setdefault(1, 2), m.popitem, lambda: m.update(a=1)):
        with pytest.raises(TypeError):
            write()
    assert not m and m.ordered_keys() == []


def test_a_key_put_back_at_a_bound_its_ghost_left_is_walked() -> None:
    """A leaf's bound outlives its key (removed, its ghost dropped by a sort): the key
    put back belongs to that leaf still, and every walk finds it."""
    m = LeafMap(2)
    for k in range(10):
        m[k] = k
    bound = m._bounds[0]
    m[-0.5] = "unsorts the first leaf"
    del m[bound]
    assert bound not in list(m.irange())  # the sort drops its ghost
    m[bound] = "back"
    assert list(m.irange()) == sorted(m)
    assert list(m.irange(bound, bound + 3)) == [bound, bound + 1, bound + 2]


@pytest.mark.parametrize("seed", range(20))
def test_long_random_runs_of_puts_removes_and_walks_agree_with_a_dict(seed: int) -> None:
    """Many more steps than the property test: a key's leaf, bound and ghost go through
    every state (put, removed, swept or sorted away, put back) many times over."""
    rng = random.Random(seed)
    m, model = LeafMap(rng.randint(1, 4)), {}
    for _ in range(3_000):
        k, roll = rng.randrange(40), rng.random()
        if roll < 0.45:
            m[k] = model[k] = rng.random()
        elif roll < 0.75:
            assert m.pop(k, None) == model.pop(k, None)
        elif roll < 0.8:
            lo, hi = sorted((rng.randrange(41), rng.randrange(41)))
            gone = [(x, model.pop(x)) for x in sorted(model) if lo <= x < hi]
            assert m.remove_range(lo, hi) == gone
        else:
            lo, hi = sorted((rng.randrange(41), rng.randrange(41)))
            assert list(m.irange(lo, hi)) == [x for x in sorted(model) if lo <= x < hi]
        # ghosts never outnumber the live keys by more than the sweep allows
        assert len(m._ghosts) <= max(m._load, len(m) // 2), (len(m._ghosts), len(m))
        assert_leaves_in_order(m)
    assert m.ordered_keys() == sorted(model)


@pytest.mark.parametrize("seed", range(4))
def test_large_leaves_keep_every_key_under_its_bound(seed: int) -> None:
    """Larger leaves (40 to 100 keys), keys arriving out of order and leaving: every key
    stays under its leaf's bound, walks between the writes agree with the dict, and the
    leaves stay within twice the load."""
    rng = random.Random(seed)
    load = rng.choice([40, 70, 100])
    m, model = LeafMap(load), {}
    for n in range(6_000):
        k, roll = rng.randrange(5_000), rng.random()
        if roll < 0.7:
            m[k] = model[k] = n
        elif roll < 0.9:
            assert m.pop(k, None) == model.pop(k, None)
        elif roll < 0.995:
            lo = rng.randrange(5_000)
            assert list(m.irange(lo, lo + 40)) == [x for x in sorted(model) if lo <= x < lo + 40]
        else:
            assert_under_bounds(m)
    assert_under_bounds(m)
    assert all(len(leaf) <= 2 * load for leaf in m._leaves)
    assert len(m._leaves) > 10  # cut many times
    assert m.ordered_keys() == sorted(model)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("placed", [0, 32])
def test_leaves_sort_in_key_order_whatever_their_bounds_share(
    seed: int, placed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The memory engine's keys: pairs ``(2, int)`` and ``(3, str)``, sorted by their
    second elements when a leaf holds nothing else; longer keys of the same rank
    (``(2, 5, 1)`` beside ``(2, 5)``: a tie of second elements) among them, which must
    sort as tuples do; and a view's rows, sorted past the start their leaf's bounds
    share (some a prefix of others).  With no key placed by bisection (``placed``
    0), every read and every split sorts its leaf whole."""
    monkeypatch.setattr(leafmap, "_PLACED", placed)
    rng = random.Random(seed)
    m, model = LeafMap(30), {}
    for n in range(6_000):
        x = rng.randrange(400)
        roll = rng.random()
        if roll < 0.6:
            k: tuple[Any, ...] = (2, x) if rng.random() < 0.8 else (3, f"{x:04}")
        elif roll < 0.7:
            k = (2, x, rng.randrange(3))
        elif roll < 0.8:  # a view's rows: a long shared start, then a secondary value
            k = (5, 3, "~view", 3, "v", 5, 2, x // 100, 2, x % 100, *(-2,) * rng.randrange(2))
        else:
            assert m.pop((2, x), None) == model.pop((2, x), None)
            continue
        m[k] = model[k] = n
        if n % 500 == 0:
            assert m.ordered_keys() == sorted(model)
    assert m.ordered_keys() == sorted(model)
    assert_under_bounds(m)


def test_a_sample_draws_live_values_about_evenly() -> None:
    d = LeafMap(load=50)
    for k in range(20_000):
        d[k] = k
    for k in range(0, 20_000, 2):
        del d[k]  # ghosts, until the leaves are next sorted
    assert sorted(d.sample(len(d), random.Random(0))) == list(range(1, 20_000, 2))  # all
    got = d.sample(4_000, random.Random(1))
    assert len(got) == 4_000 and all(v % 2 for v in got)  # live values only
    low = sum(v < 10_000 for v in got) / len(got)
    assert 0.45 < low < 0.55, low  # the first half of the keys drawn half the time
    assert LeafMap().sample(8, random.Random(2)) == []
