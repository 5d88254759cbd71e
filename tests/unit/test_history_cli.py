"""The multicast workload of the checkers' command line: a history file written by a
recorder is judged with the exit status and report of every workload."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ecast.core.config import KeyRingConfig
from ecast.history import Ack, Deliver, Submit, read_history, write_history
from ecast.tools.bench import Recorder
from rubberband.checkers import MulticastOptions, check_all
from rubberband.checkers.__main__ import main
from tests import history_gen as g

ROOT = Path(__file__).resolve().parents[2]
RING = '{"name": "multicast", "config": "ecast:KeyRingConfig", "config_args": {"replication": 2}}'


def ring_run(tmp_path: Path, learned: bool = False) -> Path:
    config = KeyRingConfig.initial(replication=2)
    ms = [
        g.join("d1", role="receiver"),
        g.join("d2", role="receiver"),
        g.join("d3", role="receiver"),
        g.join("c1", role="client"),
        *(g.data("c1", i, {"key": i}) for i in range(1, 200)),
    ]
    path = tmp_path / "run.jsonl"
    write_history(g.run(ms, config, learned=learned), path)
    return path


def test_a_valid_history_passes_with_status_0(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = ring_run(tmp_path)
    assert main([str(path), RING]) == 0
    out = capsys.readouterr().out
    assert out.startswith("multicast: VALID")
    assert "partly-checked" in out  # no routers' m-seq in a real run: said so
    # Without a config the checks that need destination sets say they did not run.
    assert main([str(path), "multicast"]) == 0
    assert "not-checked" in capsys.readouterr().out


def test_a_violation_fails_with_status_1_and_its_counterexample(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = ring_run(tmp_path)
    lines = path.read_text().splitlines(keepends=True)
    # d1 delivers one message twice: a duplicate, and t going backwards.
    dup = next(x for x in lines[40:] if '"process":"d1","event":"deliver"' in x)
    lines.insert(lines.index(dup) + 3, dup)
    path.write_text("".join(lines))
    assert main([str(path), RING, "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["valid"] is False
    assert set(result["anomalies"]) == {"no-duplicates", "total-order"}
    (dup_text,) = result["anomalies"]["no-duplicates"]
    assert dup_text.startswith("d1 delivered (('c1', 0, ''), ") and dup_text.endswith(" twice")


def test_liveness_and_time_settings_from_the_workload(tmp_path: Path) -> None:
    path = ring_run(tmp_path, learned=True)
    history = read_history(path)
    d2 = history.processes["d2"]
    d2[:] = d2[: len(d2) // 2]  # d2 stopped recording halfway
    spec = {"name": "multicast", "config": "ecast:KeyRingConfig", "config_args": {"replication": 2}}
    assert check_all(history, spec).valid is False  # acked messages d2 never delivered
    lax = check_all(history, {**spec, "only": ["total-order", "termination"]})
    assert lax.valid is True
    live = check_all(history, {**spec, "liveness": True, "only": ["termination"]})
    assert live.valid is False and "correct d2 never delivered" in live.anomalies["termination"][0]
    assert MulticastOptions.from_spec({"time_tolerance": 0.5}).time_tolerance == 0.5


def test_nothing_to_check_is_status_2_and_bad_input_status_3(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main([str(empty), "multicast"]) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"process": "a", "event": "deliver"}\n')
    assert main([str(bad), "multicast"]) == 3
    assert "line 1: a deliver event needs 't'" in capsys.readouterr().err
    good = ring_run(tmp_path)
    assert main([str(good), '{"name": "multicast", "colour": 1}']) == 3
    assert main([str(good), '{"name": "multicast", "config": "nowhere:Nothing"}']) == 3
    assert main([str(good), '{"name": "multicast", "only": ["no-such"]}']) == 3


@pytest.mark.parametrize("plant", [False, True])
def test_the_bench_recorder_writes_a_history_the_cli_checks(tmp_path: Path, plant: bool) -> None:
    """The rows a bench receiver records come back as the deliveries they stand for."""
    config = KeyRingConfig.initial(replication=1)
    ms = [
        g.join("d1", role="receiver"),
        g.join("c1", role="client"),
        *(g.data("c1", i, {"key": i}) for i in range(1, 50)),
    ]
    h = g.run(ms, config)
    for p in ("d1", "c1"):
        rec = Recorder(p)
        for e in h.processes[p]:
            if type(e) is Deliver and ms[e.t].kind is None:
                rec.data(e.t, ms[e.t])  # a data message: four integers
            else:
                rec.event(e)
        if plant and p == "d1":
            rec.data(60, g.data("c1", 7, {"key": 7}))  # c1#7 again, at a t of its own
        rec.write(tmp_path / f"history-{p}.jsonl")
    if not plant:
        assert read_history(tmp_path / "history-d1.jsonl").processes["d1"] == [
            e._replace(time=None, payload=None)
            if type(e) is Deliver and ms[e.t].kind is None
            else e
            for e in h.processes["d1"]
        ]
    joined = tmp_path / "history.jsonl"
    joined.write_text(
        (tmp_path / "history-c1.jsonl").read_text() + (tmp_path / "history-d1.jsonl").read_text()
    )
    spec = {"name": "multicast", "config": "ecast:KeyRingConfig", "config_args": {"replication": 1}}
    cmd = [sys.executable, "-m", "rubberband.checkers", str(joined), json.dumps(spec)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == (1 if plant else 0), p.stdout + p.stderr
    if plant:
        assert "no-duplicates" in p.stdout


def test_submissions_and_acks_of_a_client_keep_their_order(tmp_path: Path) -> None:
    rec = Recorder("c1")
    rec.event(Submit((("c1", 0, ""), 1), 1.0))
    rec.data(0, g.data("c1", 1, {"key": 0}))
    rec.event(Ack((("c1", 0, ""), 1), 0, True, 2.0))
    assert rec.write(tmp_path / "c1.jsonl") == 3
    kinds = [json.loads(x)["event"] for x in (tmp_path / "c1.jsonl").read_text().splitlines()]
    assert kinds == ["submit", "deliver", "ack"]
