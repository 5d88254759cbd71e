"""Version chains (:mod:`rubberband.versions`): merged in any order, any number of times,
with floors raised by anyone, a chain answers every position at or above its floor as
the true history does, and refuses those below."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rubberband.errors import BadOperation
from rubberband.versions import as_of, check_version_op, merge

history = st.dictionaries(
    st.integers(0, 60), st.one_of(st.none(), st.integers(0, 5)), min_size=1, max_size=15
)
"""A row's true history: position -> value from there on (None: absent from there)."""


def entry(p: int, v: Any) -> list[Any]:
    return [p] if v is None else [p, v]


def truth(h: dict[int, Any], t: int) -> tuple[bool, Any]:
    before = [p for p in h if p <= t]
    if not before:
        return False, None
    v = h[max(before)]
    return v is not None, v


@settings(max_examples=300, deadline=None)
@given(
    h=history,
    writers=st.lists(st.one_of(st.none(), st.integers(0, 60)), min_size=1, max_size=4),
    data=st.data(),
)
def test_writers_interleaved_with_repeats_and_floors_of_their_own_answer_as_the_history_does(
    h: dict[int, Any], writers: list[int | None], data: Any
) -> None:
    """Several maintainers (a restarted one, a stale one still running) each start at a
    position of their own (from the beginning, or with a backfill: the value at their
    start) and write the versions after it in order, in batches, each raising the floor
    only as far as it has written; their messages interleave at random.  The chain then
    answers every position at or above its floor with the true value and refuses the
    positions below: never a wrong value."""
    positions = sorted(h)
    queues = []
    for backfill in writers:
        start = -1 if backfill is None else backfill
        todo = [] if backfill is None else [entry(start, truth(h, start)[1])]
        todo += [entry(p, h[p]) for p in positions if p > start]
        batches, done = [], start
        while todo:
            n = data.draw(st.integers(1, len(todo)))
            batch, todo = todo[:n], todo[n:]
            done = batch[-1][0]
            batches.append((batch, data.draw(st.integers(max(start, 0), max(done, 0)))))
        queues.append(batches)
    chain = None
    while any(queues):
        q = data.draw(st.sampled_from([q for q in queues if q]))
        batch, floor = q.pop(0)
        chain = merge(chain, batch, floor)
    if chain is None:
        return
    for t in range(0, 65):
        if t < chain[0]:
            with pytest.raises(LookupError):
                as_of(chain, t)
        elif t >= min(-1 if b is None else b for b in writers):
            assert as_of(chain, t) == truth(h, t), (t, chain)


def test_a_raised_floor_keeps_the_value_at_the_floor_and_drops_older_versions() -> None:
    chain = merge(None, [[3, "a"], [7, "b"], [9], [12, "c"]], 0)
    assert chain == [0, [3, "a"], [7, "b"], [9], [12, "c"]]
    chain = merge(chain, [], 10)
    assert chain == [10, [9], [12, "c"]]
    assert as_of(chain, 10) == (False, None)
    assert as_of(chain, 12) == (True, "c")
    with pytest.raises(LookupError):
        as_of(chain, 9)
    assert merge(chain, [[8, "x"]], 4) == chain  # below the floor, and a lower floor: nothing
    assert merge(chain, [[12, "c"]], 10) == chain  # the same version again: nothing


def test_a_version_operation_of_the_wrong_shape_is_refused_clearly() -> None:
    for op, says in [
        (("version", ((1, [3, "a"]),)), "floor"),
        (("version", ((1, [3, "a"]),), -1), "floor"),
        (("version", ((1, []),), 0), "entry"),
        (("version", ((1, ["3", "a"]),), 0), "position"),
        (("version", ((1,),), 0), "pairs"),
        (("version", 5, 0), "pairs"),  # (no pairs at all: refused as such, not a TypeError)
        (("version", "ab", 0), "pairs"),
    ]:
        with pytest.raises(BadOperation, match=says):
            check_version_op(op)
    with pytest.raises(BadOperation, match="holds a str"):
        merge("not a chain", [[1, "a"]], 0, key="k")


def test_a_chain_keeps_its_newest_versions_and_raises_its_floor_past_the_rest() -> None:
    from rubberband.versions import MAX_ENTRIES

    chain = merge(None, [[p, p] for p in range(MAX_ENTRIES + 10)], 0)
    assert len(chain) == MAX_ENTRIES + 1 and chain[0] == 10
    assert as_of(chain, 10) == (True, 10)
    with pytest.raises(LookupError):
        as_of(chain, 9)


def test_a_merge_never_changes_the_stored_chain_and_takes_one_decoded_off_the_wire() -> None:
    """An engine's reads may still be answering with the chain it holds: a merge returns
    a new one.  A chain decoded off the wire (tuples, as the log engine reads its values
    back) merges to the same chain as its list form."""
    chain = merge(None, [[p, p] for p in range(0, 50, 5)], 0)
    before = [list(e) if type(e) is list else e for e in chain]
    merged = merge(chain, [[60, "new"], [12, "between"], [20, 20]], 8)
    assert chain == before
    assert merged[0] == 8 and merged[1] == [5, 5] and merged[-1] == [60, "new"]
    assert as_of(merged, 12) == (True, "between") and as_of(merged, 14) == (True, "between")
    assert as_of(merged, 15) == (True, 15)
    decoded = tuple([chain[0], *(tuple(e) for e in chain[1:])])
    assert merge(decoded, [[60, "new"], [12, "between"], [20, 20]], 8) == merged


def test_a_value_that_only_looks_like_a_chain_is_refused_clearly() -> None:
    for bad in (["x"], [1, 5], [1, [2], {"a": 1}], [1, [2], [3, 4, 5]], [1, ["p"]], "s", 5):
        with pytest.raises(BadOperation, match="no version chain"):
            merge(bad, [[0, 1], [9, 1]], 0, key="k")


def test_a_stored_value_of_any_shape_is_merged_or_refused_never_crashes() -> None:
    """A client may put any value under any key, a view's included: whatever a merge
    meets there it merges or refuses with BadOperation (any other exception stops
    every replica of the range)."""
    weird = [
        [0, [float("inf"), 1], [5, 2]],
        [0, [float("nan"), 1]],
        [0, ["x", 1], [2, 3]],
        [0, [2, 1], ["x"]],
        [0, [10**30, 1]],
        [0, [2.5, "a"], [7, "b"]],
        (0, (1, {"a": 1}), (4, 2)),
    ]
    for chain in weird:
        try:
            merged = merge(chain, [[3, "z"], [9]], 1, key="k")
        except BadOperation:
            continue
        assert merged[0] == 1 and [3, "z"] in merged and [9] in merged, (chain, merged)
    merged = merge([0, [2.5, "a"], [7, "b"]], [[3, "z"]], 0)
    assert merged == [0, [2.5, "a"], [3, "z"], [7, "b"]]  # a float position kept in order


@given(
    p=st.integers(0, 30),
    value=st.one_of(st.none(), st.integers(0, 5)),
    floor=st.integers(0, 30),
)
def test_a_new_rows_one_version_is_merged_as_any_batch_is(p: int, value: Any, floor: int) -> None:
    """A new row's single version takes a short road; the same entry twice takes the
    general one (a repeat is dropped there): both make the same chain."""
    e = entry(p, value)
    assert merge(None, [e], floor) == merge(None, [e, list(e)], floor)
