"""Generated list-append histories: serial executions pass, a single planted bug is caught.

The executor (``tests.checker_histories``) applies every transaction atomically between
its invocation and its completion, so its histories are strictly serializable: the
checker must accept them under every model, with no observation either.  Each mutation
changes one read in a way no sequentially consistent store could produce (see
``drop_acked_element`` and ``swap_elements`` for why), so it must always be rejected.
"""

from __future__ import annotations

import random

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rubberband.checkers import list_append
from rubberband.checkers.list_append import MODELS, ListAppendOptions
from tests.checker_histories import drop_acked_element, list_append_history, swap_elements

seeds = st.integers(0, 2**32 - 1)
shapes = st.fixed_dictionaries(
    {
        "transactions": st.integers(1, 80),
        "processes": st.integers(1, 5),
        "active_keys": st.integers(1, 4),
        "appends_per_key": st.integers(2, 8),
    }
)


@settings(max_examples=150, deadline=None)
@given(seed=seeds, shape=shapes, model=st.sampled_from(sorted(MODELS)))
def test_serial_executions_are_valid_under_every_model(seed, shape, model):
    ops = list_append_history(seed, **shape)
    result = list_append.check(ops, ListAppendOptions.for_model(model))
    assert result.valid is True, result.render()
    assert result.observations == {}


@settings(max_examples=150, deadline=None)
@given(seed=seeds, shape=shapes)
def test_dropping_an_acknowledged_element_is_caught(seed, shape):
    ops = list_append_history(seed, **shape)
    mutated = drop_acked_element(ops, random.Random(seed))
    assume(mutated is not None)
    bad, how = mutated
    result = list_append.check(bad)
    assert result.valid is False, how
    # The version orders and every ww and wr edge are still those of the serial run, so
    # only a read that misses something can be blamed, never a write or visibility cycle.
    impossible = {"garbage-read", "duplicate-elements", "G1a", "G0", "G1c"}
    assert not set(result.anomalies) & impossible, result.render()


@settings(max_examples=150, deadline=None)
@given(seed=seeds, shape=shapes)
def test_swapping_two_elements_of_a_read_is_caught(seed, shape):
    ops = list_append_history(seed, **shape)
    mutated = swap_elements(ops, random.Random(seed))
    assume(mutated is not None)
    bad, how = mutated
    result = list_append.check(bad)
    assert result.valid is False, how
    assert "incompatible-order" in result.anomalies, (how, result.render())


@settings(max_examples=100, deadline=None)
@given(seed=seeds, shape=shapes)
def test_reduced_real_time_edges_keep_every_real_time_order(seed, shape):
    """The frontier leaves out implied edges; what it keeps must still imply them all."""
    from rubberband.checkers.graph import REALTIME
    from rubberband.checkers.history import pair_calls
    from rubberband.checkers.list_append import _Checker

    ops = list_append_history(seed, **shape)
    checker = _Checker(pair_calls(ops), ListAppendOptions.for_model("strict-serializable"))
    checker._realtime_edges()
    out = checker.graph.out
    txns = checker.txns
    for txn in txns:
        reach, stack = set(), [txn.node]
        while stack:
            for nxt, mask in out[stack.pop()].items():
                if mask & REALTIME and nxt not in reach:
                    reach.add(nxt)
                    stack.append(nxt)
        done = txn.call.complete_index if txn.ok else None
        expected = {
            other.node for other in txns if done is not None and done < other.call.invoke_index
        }
        assert reach == expected, (txn.call.describe(), sorted(reach ^ expected))
