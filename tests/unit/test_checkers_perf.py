"""Checking speed: a 100,000-operation history, from its file to the verdict, under 10 s.

The budget is for this project's slow shared VM; the elapsed time is in the assertion
message, and ``-s`` prints it on success too.
"""

from __future__ import annotations

import time

import pytest

from rubberband.checkers import check_all
from rubberband.checkers.history import write_history
from tests.checker_histories import bank_history, list_append_history

# A wall-clock budget: measured with the machine to itself, after the shared-core part.
pytestmark = pytest.mark.exclusive

BUDGET_SECONDS = 10.0


def test_a_100k_transaction_list_append_history_checks_in_time(tmp_path):
    ops = list_append_history(7, 100_000, processes=10, active_keys=10, appends_per_key=32)
    path = tmp_path / "list-append.jsonl"
    write_history(ops, path)
    started = time.perf_counter()
    result = check_all(path, {"name": "list-append", "model": "sequential"})
    elapsed = time.perf_counter() - started
    print(f"\nlist-append: {len(ops)} records, {result.stats['reads']} reads in {elapsed:.2f} s")
    assert result.valid is True, result.render()
    assert result.stats["transactions_ok"] > 80_000
    assert elapsed < BUDGET_SECONDS, f"took {elapsed:.2f} s"


def test_a_100k_operation_bank_history_checks_in_time(tmp_path):
    ops = bank_history(7, 100_000, accounts=8, processes=10)
    path = tmp_path / "bank.jsonl"
    write_history(ops, path)
    started = time.perf_counter()
    result = check_all(path, {"name": "bank", "accounts": list(range(8)), "initial_balance": 10})
    elapsed = time.perf_counter() - started
    print(f"\nbank: {len(ops)} records in {elapsed:.2f} s")
    assert result.valid is True, result.render()
    assert elapsed < BUDGET_SECONDS, f"took {elapsed:.2f} s"
