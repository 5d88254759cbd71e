"""The shared result: JSON round trip, rendering, and ``check_all`` over files and specs."""

from __future__ import annotations

import json

import pytest

from rubberband.checkers import BankOptions, CheckResult, ListAppendOptions, check_all
from rubberband.checkers.history import write_history
from rubberband.checkers.result import Findings
from rubberband.checkers.run import workload_options
from tests.checker_histories import HistoryBuilder


def test_findings_decide_validity():
    assert Findings().result("x", {}, checked_anything=False).valid == "unknown"
    assert Findings().result("x", {}, checked_anything=True).valid is True
    findings = Findings()
    findings.observation("torn-basic-read", "allowed")
    assert findings.result("x", {}, checked_anything=True).valid is True
    findings.anomaly("G0", "forbidden")
    assert findings.result("x", {}, checked_anything=False).valid is False


def test_results_round_trip_through_json():
    findings = Findings(max_examples=1)
    findings.anomaly("G1c", "first\nsecond line")
    findings.anomaly("G1c", "dropped from the examples")
    findings.observation("torn-basic-read", "seen")
    result = findings.result("list-append", {"reads": 3, "edges": {"ww": 1}}, True)
    text = json.dumps(result.to_json())
    again = CheckResult.from_json(json.loads(text))
    assert again == result
    assert again.stats["anomaly_counts"] == {"G1c": 2}
    rendered = result.render()
    assert rendered.startswith("list-append: INVALID (2 anomalies of 1 kind)")
    assert "G1c (2, first 1 shown)" in rendered
    assert "      second line" in rendered
    assert "observations" in rendered and "reads=3" in rendered


def test_from_json_refuses_a_strange_verdict():
    with pytest.raises(ValueError, match="valid"):
        CheckResult.from_json({"checker": "x", "valid": "maybe"})


def test_check_all_reads_a_file_and_a_workload_description(tmp_path):
    h = HistoryBuilder()
    h.txn("p1", [["append", 1, 1]])
    h.txn("p2", [["r", 1, [1]]])
    path = tmp_path / "h.jsonl"
    write_history(h.ops, path)
    assert check_all(path, "list-append").valid is True
    assert check_all(str(path), {"name": "list-append", "model": "serializable"}).valid is True
    bank = HistoryBuilder()
    bank.invoke("p1", "read", None).complete("p1", "read", "ok", {"0": 10, "1": 10})
    spec = {"name": "bank", "accounts": [0, 1], "initial_balance": 10}
    assert check_all(bank.ops, spec).valid is True


def test_workload_descriptions():
    la = workload_options({"name": "list-append", "edges": ["ww", "wr", "rw", "realtime"]})
    assert isinstance(la, ListAppendOptions) and "realtime" in la.edges
    bank = workload_options({"name": "bank", "initial": {"a": 1, "b": 2}, "allow_negative": True})
    assert isinstance(bank, BankOptions) and bank.total == 3 and bank.allow_negative
    for bad, complaint in [
        ({"name": "queue"}, "unknown workload"),
        ({"name": "list-append", "model": "linearizable"}, "unknown model"),
        ({"name": "list-append", "model": "sequential", "edges": ["ww"]}, "not both"),
        ({"name": "list-append", "colour": "red"}, "no setting"),
        ({"name": "bank", "accounts": [1]}, "initial_balance"),
        ({"name": "bank", "initial": {"a": 1.5}}, "not an integer"),
    ]:
        with pytest.raises(ValueError, match=complaint):
            workload_options(bad)


def test_the_command_line_reports_and_sets_the_exit_status(tmp_path, capsys):
    from rubberband.checkers.__main__ import main

    h = HistoryBuilder()
    h.txn("p1", [["append", "x", 1]])
    h.txn("p2", [["r", "x", [1, 1]]])
    path = tmp_path / "h.jsonl"
    write_history(h.ops, path)
    assert main([str(path), "list-append"]) == 1
    assert "duplicate-elements" in capsys.readouterr().out
    spec = tmp_path / "w.json"
    spec.write_text('{"name": "list-append", "model": "serializable"}')
    assert main([str(path), f"@{spec}", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["valid"] is False
    assert main([str(path), '{"name": "bank"}']) == 3
    assert "accounts" in capsys.readouterr().err
