"""The list-append checker on hand-made histories: each planted anomaly is found, by name.

Every invalid history here differs from a valid one in a single detail, and most tests
check both, so a checker that flags everything fails as surely as one that flags nothing.
"""

from __future__ import annotations

import pytest

from rubberband.checkers import list_append
from rubberband.checkers.history import HistoryError
from rubberband.checkers.list_append import ListAppendOptions
from tests.checker_histories import HistoryBuilder, invoke_value


def check(builder: HistoryBuilder, model: str = "sequential", **kwargs: object):
    return list_append.check(builder.ops, ListAppendOptions.for_model(model, **kwargs))


def kinds(builder: HistoryBuilder, model: str = "sequential") -> set[str]:
    return set(check(builder, model).anomalies)


def test_a_serial_history_is_valid():
    h = HistoryBuilder()
    h.txn("p1", [["append", "x", 1], ["append", "y", 1]])
    h.txn("p2", [["r", "x", [1]], ["append", "x", 2]])
    h.txn("p1", [["r", "x", [1, 2]], ["r", "y", [1]]])
    h.txn("p3", [["r", "x", [1, 2]]], f="final-read")
    result = check(h)
    assert result.valid is True, result.render()
    assert result.anomalies == {}
    assert result.stats["edges"]["ww"] == 1
    assert result.stats["edges"]["wr"] >= 2


def test_nothing_read_is_unknown_not_valid():
    h = HistoryBuilder()
    h.txn("p1", [["append", "x", 1]])
    assert check(h).valid == "unknown"


def test_lost_append_missing_from_the_final_read():
    h = HistoryBuilder()
    h.txn("p1", [["append", "x", 1]])
    h.txn("p2", [["append", "x", 2]])
    h.txn("p3", [["r", "x", [2]]], f="final-read")
    result = check(h)
    assert set(result.anomalies) >= {"lost-append"}
    [text] = result.anomalies["lost-append"]
    assert "appended 1 to x" in text and "x = [2]" in text


def test_an_append_acknowledged_after_the_final_read_began_is_not_lost():
    h = HistoryBuilder()
    h.invoke("p1", "txn", [["append", "x", 1]])
    h.invoke("p3", "final-read", [["r", "x", None]])
    h.complete("p3", "final-read", "ok", [["r", "x", []]])
    h.complete("p1", "txn", "ok", [["append", "x", 1]])
    assert check(h).valid is True


def test_duplicate_elements_in_a_read():
    h = HistoryBuilder()
    h.txn("p1", [["append", "x", 1]])
    h.txn("p2", [["r", "x", [1, 1]]])
    assert "duplicate-elements" in kinds(h)


def test_reads_that_disagree_on_the_order_are_incompatible():
    h = HistoryBuilder()
    h.txn("p1", [["append", "x", 1]])
    h.txn("p2", [["append", "x", 2]])
    h.txn("p3", [["r", "x", [1, 2]]])
    h.txn("p4", [["r", "x", [2, 1]]])
    result = check(h)
    assert set(result.anomalies) == {"incompatible-order"}
    assert "position 0" in result.anomalies["incompatible-order"][0]


def test_g0_write_cycle():
    h = HistoryBuilder()
    h.txn("p1", [["append", "x", 1], ["append", "y", 1]])
    h.txn("p2", [["append", "x", 2], ["append", "y", 2]])
    h.txn("p3", [["r", "x", [1, 2]]])
    h.txn("p4", [["r", "y", [2, 1]]])
    result = check(h)
    assert set(result.anomalies) == {"G0"}, result.render()
    text = result.anomalies["G0"][0]
    assert "(ww)" in text and "(wr)" not in text and "(rw)" not in text


def test_g1a_aborted_read():
    h = HistoryBuilder()
    h.txn("p1", [["append", "x", 1]], outcome="fail")
    h.txn("p2", [["r", "x", [1]]])
    result = check(h)
    assert set(result.anomalies) == {"G1a"}
    assert "failed" in result.anomalies["G1a"][0]


def test_a_failed_append_that_stays_invisible_is_fine():
    h = HistoryBuilder()
    h.txn("p1", [["append", "x", 1]], outcome="fail")
    h.txn("p2", [["r", "x", []]])
    assert check(h).valid is True


def test_g1b_intermediate_read():
    h = HistoryBuilder()
    h.txn("p1", [["append", "x", 1], ["append", "x", 2]])
    h.txn("p2", [["r", "x", [1]]])
    h.txn("p3", [["r", "x", [1, 2]]], f="final-read")
    result = check(h)
    assert set(result.anomalies) == {"G1b"}
    assert "intermediate" in result.anomalies["G1b"][0]


def test_reading_a_transactions_final_append_is_not_g1b():
    h = HistoryBuilder()
    h.txn("p1", [["append", "x", 1], ["append", "x", 2]])
    h.txn("p2", [["r", "x", [1, 2]]])
    assert check(h).valid is True


def test_g1c_circular_information_flow():
    h = HistoryBuilder()
    h.txn("p1", [["append", "x", 1], ["r", "y", [1]]])
    h.txn("p2", [["append", "y", 1], ["r", "x", [1]]])
    result = check(h)
    assert set(result.anomalies) == {"G1c"}
    text = result.anomalies["G1c"][0]
    assert "Let:" in text and "T1" in text and "T2" in text and "(wr)" in text


def test_g_single_read_skew():
    h = HistoryBuilder()
    h.txn("p1", [["append", "x", 1], ["append", "y", 1]])
    h.txn("p2", [["r", "x", []], ["r", "y", [1]]])
    result = check(h)
    assert set(result.anomalies) == {"G-single"}
    text = result.anomalies["G-single"][0]
    assert text.count("(rw)") == 1 and "missed 1" in text


def test_g2_item_write_skew():
    h = HistoryBuilder()
    h.txn("p1", [["append", "x", 1], ["r", "y", []]])
    h.txn("p2", [["append", "y", 1], ["r", "x", []]])
    h.txn("p3", [["r", "x", [1]], ["r", "y", [1]]])
    result = check(h)
    assert set(result.anomalies) == {"G2-item"}
    assert result.anomalies["G2-item"][0].count("(rw)") == 2


def test_a_process_that_misses_its_own_append_is_g_single_process():
    h = HistoryBuilder()
    h.txn("p1", [["append", "x", 1]])
    h.txn("p1", [["r", "x", []]])
    h.txn("p2", [["r", "x", [1]]])
    assert kinds(h) == {"G-single-process"}
    assert kinds(h, "serializable") == set()


def test_snapshot_reads_promise_no_per_process_order():
    h = HistoryBuilder()
    h.txn("p1", [["append", "x", 1]])
    h.txn("p1", [["r", "x", []]], level="snapshot")
    h.txn("p2", [["r", "x", [1]]])
    assert check(h).valid is True


def test_real_time_edges_only_when_asked_for():
    h = HistoryBuilder()
    h.txn("p1", [["append", "x", 1]])
    h.txn("p2", [["r", "x", []]])
    h.txn("p3", [["r", "x", [1]]])
    assert check(h).valid is True
    assert kinds(h, "strict-serializable") == {"G-single-realtime"}


def test_concurrent_transactions_have_no_real_time_order():
    h = HistoryBuilder()
    h.invoke("p1", "txn", [["append", "x", 1]])
    h.invoke("p2", "txn", [["r", "x", None]])
    h.complete("p1", "txn", "ok", [["append", "x", 1]])
    h.complete("p2", "txn", "ok", [["r", "x", []]])
    h.txn("p3", [["r", "x", [1]]])
    assert check(h, "strict-serializable").valid is True


def test_an_info_append_may_explain_a_read():
    h = HistoryBuilder()
    h.txn("p1", [["append", "x", 1]], outcome="info")
    h.txn("p2", [["r", "x", [1]]])
    h.txn("p3", [["r", "x", [1]]], f="final-read")
    result = check(h)
    assert result.valid is True, result.render()
    assert result.stats["edges"]["wr"] == 2


def test_an_info_append_is_never_acknowledged():
    h = HistoryBuilder()
    h.txn("p1", [["append", "x", 1]], outcome="info")
    h.txn("p3", [["r", "x", []]], f="final-read")
    assert check(h).valid is True


def test_a_crashed_process_is_treated_as_info():
    h = HistoryBuilder()
    h.invoke("p1", "txn", [["append", "x", 1]])
    h.invoke("p1", "txn", [["append", "x", 2]])  # restarted under the same name
    h.complete("p1", "txn", "ok", [["append", "x", 2]])
    h.txn("p2", [["r", "x", [2, 1]]])
    result = check(h)
    assert result.valid is True
    assert result.stats["transactions_info"] == 1


def test_info_transactions_get_no_process_successors():
    # The info append may have landed after the same process's next read.
    h = HistoryBuilder()
    h.txn("p1", [["append", "x", 1]], outcome="info")
    h.txn("p1", [["r", "x", []]])
    h.txn("p2", [["r", "x", [1]]])
    assert check(h).valid is True


def test_garbage_read():
    h = HistoryBuilder()
    h.txn("p1", [["append", "x", 1]])
    h.txn("p2", [["r", "x", [1, 9]]])
    result = check(h)
    assert "garbage-read" in result.anomalies
    assert "9" in result.anomalies["garbage-read"][0]


def test_a_transaction_must_see_its_own_appends():
    h = HistoryBuilder()
    h.txn("p1", [["append", "x", 1], ["r", "x", []]])
    assert "internal" in kinds(h)
    good = HistoryBuilder()
    good.txn("p1", [["append", "x", 1], ["r", "x", [1]], ["append", "x", 2], ["r", "x", [1, 2]]])
    assert check(good).valid is True


def test_torn_basic_read_is_an_observation_but_torn_snapshot_is_g_single():
    for level, valid in (("basic", True), ("snapshot", False), ("sequential", False)):
        h = HistoryBuilder()
        h.txn("p1", [["append", "x", 1], ["append", "y", 1]])
        h.txn("p2", [["r", "x", [1]], ["r", "y", []]], level=level)
        h.txn("p3", [["r", "x", [1]], ["r", "y", [1]]], f="final-read")
        result = check(h)
        assert result.valid is valid, (level, result.render())
        if valid:
            assert list(result.observations) == ["torn-basic-read"]
        else:
            assert set(result.anomalies) == {"G-single"}


def test_basic_reads_are_still_checked_key_by_key():
    h = HistoryBuilder()
    h.txn("p1", [["append", "x", 1]])
    h.txn("p1", [["append", "x", 2]])
    h.txn("p2", [["r", "x", [2]]], level="basic")
    h.txn("p3", [["r", "x", [1, 2]]], f="final-read")
    assert kinds(h) == {"incompatible-order"}


def test_unobserved_appends_follow_every_observed_element():
    # p1's append of 2 was never read; p1 then reads x without it: read-your-writes broke.
    h = HistoryBuilder()
    h.txn("p2", [["append", "x", 1]])
    h.txn("p1", [["append", "x", 2]])
    h.txn("p1", [["r", "x", [1]]])
    assert kinds(h) == {"G-single-process"}


def test_explanations_are_capped_but_counted():
    h = HistoryBuilder()
    for i in range(5):
        h.txn("p1", [["r", f"k{i}", [7]]])
    result = check(h, max_examples=2)
    assert len(result.anomalies["garbage-read"]) == 2
    assert result.stats["anomaly_counts"]["garbage-read"] == 5
    assert "first 2 shown" in result.render()


def test_malformed_transactions_are_errors():
    h = HistoryBuilder()
    h.txn("p1", [["write", "x", 1]])
    with pytest.raises(HistoryError, match="neither append nor r"):
        check(h)
    dup = HistoryBuilder()
    dup.txn("p1", [["append", "x", 1]])
    dup.txn("p2", [["append", "x", 1]])
    with pytest.raises(HistoryError, match="twice"):
        check(dup)


def test_other_functions_are_ignored():
    h = HistoryBuilder()
    h.invoke("nemesis", "partition", None).complete("nemesis", "partition", "info", "cut")
    h.txn("p1", [["append", "x", 1]])
    h.txn("p2", [["r", "x", [1]]])
    result = check(h)
    assert result.valid is True
    assert result.stats["other_calls"] == 1


def test_invoke_value_hides_read_results():
    assert invoke_value([["r", "x", [1]], ["append", "x", 2]]) == [
        ["r", "x", None],
        ["append", "x", 2],
    ]


def test_an_unobserved_append_follows_the_last_observed_one():
    # T2's append of 2 to x was never read, so it comes after T1's 1: with y's order
    # (T2 before T1) that is a write cycle.
    h = HistoryBuilder()
    h.txn("p1", [["append", "x", 1], ["append", "y", 2]])
    h.txn("p2", [["append", "x", 2], ["append", "y", 1]])
    h.txn("p3", [["r", "x", [1]], ["r", "y", [1, 2]]])
    assert "G0" in kinds(h)


def test_real_time_reaches_past_concurrent_completions():
    # p1 completes, then p2 (invoked before p1 completed) completes; p3 starts after
    # both, so p1's append precedes p3's read even though p2 completed in between.
    h = HistoryBuilder()
    h.invoke("p1", "txn", [["append", "x", 1]])
    h.invoke("p2", "txn", [["append", "y", 1]])
    h.complete("p1", "txn", "ok", [["append", "x", 1]])
    h.complete("p2", "txn", "ok", [["append", "y", 1]])
    h.txn("p3", [["r", "x", []]])
    h.txn("p4", [["r", "x", [1]]])
    assert kinds(h, "strict-serializable") == {"G-single-realtime"}
