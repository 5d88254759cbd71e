"""The append-order checker: a client's appends in its order, gap-free, in every list."""

from __future__ import annotations

from rubberband.checkers import order
from tests.checker_histories import HistoryBuilder


def test_in_order_appends_are_valid_and_nothing_read_is_unknown() -> None:
    h = HistoryBuilder()
    h.txn("p1", [["append", "x", 1], ["append", "y", 1]])
    h.txn("p2", [["append", "x", 10]])
    h.txn("p1", [["append", "x", 2]])
    assert order.check(h.ops).valid == "unknown"
    h.txn("p3", [["r", "x", [1, 10, 2]], ["r", "y", [1]]], f="final-read")
    result = order.check(h.ops)
    assert result.valid is True, result.render()
    assert result.stats["client_sequences"] == 3


def test_a_clients_appends_out_of_its_order_are_reordered() -> None:
    h = HistoryBuilder()
    h.txn("p1", [["append", "x", 1]])
    h.txn("p2", [["append", "x", 10]])
    h.txn("p1", [["append", "x", 2]])
    h.txn("p3", [["r", "x", [2, 10, 1]]], f="final-read")
    result = order.check(h.ops)
    assert set(result.anomalies) == {"reordered"}
    [text] = result.anomalies["reordered"]
    assert "process p1 appended 1" in text and "before 2" in text


def test_an_acknowledged_append_missing_before_a_later_one_is_a_gap() -> None:
    h = HistoryBuilder()
    h.txn("p1", [["append", "x", 1]])
    h.txn("p1", [["append", "x", 2]])
    h.txn("p1", [["append", "x", 3]])
    h.txn("p3", [["r", "x", [1, 3]]], f="final-read")
    result = order.check(h.ops)
    assert set(result.anomalies) == {"gap"}
    assert "appended 2" in result.anomalies["gap"][0]
    # The last ones missing is no gap here (the list-append checker's lost-append is).
    h2 = HistoryBuilder()
    h2.txn("p1", [["append", "x", 1]])
    h2.txn("p1", [["append", "x", 2]])
    h2.txn("p3", [["r", "x", [1]]], f="final-read")
    assert order.check(h2.ops).valid is True


def test_an_unacknowledged_append_may_be_absent_but_not_out_of_place() -> None:
    h = HistoryBuilder()
    h.txn("p1", [["append", "x", 1]])
    h.txn("p1", [["append", "x", 2]], outcome="info")
    h.txn("p2", [["r", "x", [1]]], f="final-read")
    assert order.check(h.ops).valid is True
    h2 = HistoryBuilder()
    h2.txn("p1", [["append", "x", 1]], outcome="info")
    h2.txn("p1", [["append", "x", 2]])
    h2.txn("p2", [["r", "x", [2]]], f="final-read")
    assert order.check(h2.ops).valid is True  # 1 never happened: fine
    h3 = HistoryBuilder()
    h3.txn("p1", [["append", "x", 1]], outcome="info")
    h3.txn("p1", [["append", "x", 2]])
    h3.txn("p2", [["r", "x", [2, 1]]], f="final-read")
    assert set(order.check(h3.ops).anomalies) == {"reordered"}
