"""History records: JSON lines in and out, and pairing invokes with their completions."""

from __future__ import annotations

import io
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rubberband.checkers.history import (
    HistoryError,
    Op,
    pair_calls,
    parse_lines,
    read_history,
    write_history,
)

LINES = """\
{"process": 0, "type": "invoke", "f": "txn", "value": [["append", 1, 5], ["r", "y", null]], "time": 0.5, "index": 0}
{"process": 0, "type": "ok", "f": "txn", "value": [["append", 1, 5], ["r", "y", [2]]], "time": 0.75, "index": 1, "node": "n3"}
{"process": "nemesis", "type": "info", "f": "partition", "value": "cut n1", "index": 2}
{"process": "c2", "type": "invoke", "f": "read", "value": null, "level": "snapshot", "index": 3}

"""  # noqa: E501


def test_reading_keeps_int_and_string_keys_and_unknown_fields():
    ops = list(parse_lines(io.StringIO(LINES)))
    assert len(ops) == 4
    first, second = ops[0], ops[1]
    assert first.process == "0"  # Jepsen numbers processes; names are strings here
    assert first.value == [["append", 1, 5], ["r", "y", None]]
    assert second.time == 0.75 and second.extra == {"node": "n3"}
    assert ops[3].level == "snapshot" and ops[3].time is None


def test_writing_then_reading_gives_the_same_ops(tmp_path):
    ops = read_history(io.StringIO(LINES))
    path = tmp_path / "history.jsonl"
    write_history(ops, path)
    assert read_history(path) == ops
    for line in path.read_text().splitlines():
        json.loads(line)


json_scalars = st.one_of(st.integers(), st.text(max_size=5), st.booleans(), st.none())
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3), max_leaves=6)


@given(
    process=st.text(min_size=1, max_size=4),
    op_type=st.sampled_from(["invoke", "ok", "fail", "info"]),
    value=json_values,
    index=st.integers(min_value=0, max_value=10**9),
    time=st.none() | st.floats(allow_nan=False, allow_infinity=False),
    level=st.sampled_from([None, "sequential", "snapshot", "basic"]),
)
def test_any_op_survives_a_round_trip(process, op_type, value, index, time, level):
    op = Op(process, op_type, "txn", value, index, time, level, {"note": value})
    buffer = io.StringIO()
    write_history([op], buffer)
    assert read_history(io.StringIO(buffer.getvalue())) == [op]


@pytest.mark.parametrize(
    ("line", "complaint"),
    [
        ('{"type": "ok", "f": "txn"}', "lacks field 'process'"),
        ('{"process": 1, "type": "done", "f": "txn"}', "is not one of"),
        ('{"process": 1, "type": "ok", "f": "txn", "index": "7"}', "not an integer"),
        ('{"process": 1, "type": "ok", "f": "txn", "level": "strong"}', "level"),
        ("[1, 2]", "JSON object"),
        ("{nope", "not JSON"),
    ],
)
def test_malformed_lines_are_errors_that_name_the_line(line, complaint):
    with pytest.raises(HistoryError, match=complaint) as err:
        list(parse_lines(["", line]))
    assert "line 2" in str(err.value)


def test_missing_indices_default_to_the_line_position():
    ops = list(parse_lines(['{"process": 1, "type": "invoke", "f": "r"}'] * 2))
    assert [op.index for op in ops] == [0, 1]


def op(process, op_type, index, f="txn", value=None):
    return Op(process, op_type, f, value, index)


def test_pairing_matches_each_completion_to_its_process():
    calls = pair_calls(
        [
            op("a", "invoke", 0, value="va"),
            op("b", "invoke", 1, value="vb"),
            op("b", "fail", 2, value="fb"),
            op("a", "ok", 3, value="oa"),
        ]
    )
    assert [(c.process, c.outcome, c.value) for c in calls] == [
        ("a", "ok", "oa"),
        ("b", "fail", "vb"),  # a failure tells nothing beyond what was asked
    ]
    assert calls[0].complete_index == 3 and calls[1].invoke_index == 1


def test_crashed_processes_leave_info_calls():
    calls = pair_calls(
        [
            op("a", "invoke", 0, value="first"),
            op("a", "invoke", 1, value="second"),  # restarted under the same name
            op("a", "ok", 2, value="done"),
            op("b", "invoke", 3, value="never"),
        ]
    )
    assert [(c.outcome, c.value, c.completion is None) for c in calls] == [
        ("info", "first", True),
        ("ok", "done", False),
        ("info", "never", True),
    ]


def test_pairing_sorts_by_index_and_skips_standalone_info():
    calls = pair_calls(
        [
            op("a", "ok", 5),
            op("nemesis", "info", 3, f="kill"),
            op("a", "invoke", 1),
        ]
    )
    assert len(calls) == 1 and calls[0].outcome == "ok"


def test_pairing_refuses_a_broken_recorder():
    with pytest.raises(HistoryError, match="no invoke"):
        pair_calls([op("a", "ok", 0)])
    with pytest.raises(HistoryError, match="completes 'read'"):
        pair_calls([op("a", "invoke", 0), op("a", "ok", 1, f="read")])
    with pytest.raises(HistoryError, match="share index"):
        pair_calls([op("a", "invoke", 0), op("b", "invoke", 0)])


def test_level_defaults_to_sequential():
    [call] = pair_calls([op("a", "invoke", 0), op("a", "ok", 1)])
    assert call.level == "sequential"
