"""jepsen_like on real processes: a multicast run while routers are killed and paused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def test_a_multicast_run_survives_kills_and_pauses_and_its_history_checks(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "jepsen_like", "run", "--workload", "multicast", "--nemesis",
         "kill,pause", "--time", "30", "--seed", "3", "--dir", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "seed 3"
    report = json.loads(lines[-1])
    assert report["valid"] and not report["violations"]
    kinds = report["faults"]["by_kind"]
    assert kinds.get("kill", 0) >= 1 and kinds.get("pause", 0) >= 1, kinds
    assert report["acknowledged"] > 0.9 * report["submitted"] > 0
    assert report["checks_ran"] >= 8 and report["history_events"] > report["submitted"]
    assert json.loads((tmp_path / "report.json").read_text())["seed"] == 3
    # The stored history checks again on its own.
    again = subprocess.run(
        [sys.executable, "-m", "jepsen_like", "check", str(tmp_path)],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]


@pytest.mark.parametrize("workload", ["list-append", "bank"])
def test_a_rubberband_run_survives_failing_storage_processes(workload: str, tmp_path: Path) -> None:
    """Storage processes killed and paused under multi-key appends and reads (or
    transfers and reads at every level): the super repairs the ring on its own, the
    checker finds no anomaly, and the stored history checks again."""
    out = subprocess.run(
        [sys.executable, "-m", "jepsen_like", "run", "--workload", workload, "--nemesis",
         "kill,pause", "--time", "30", "--seed", "4", "--dir", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["valid"] and not report["violations"]
    kinds = report["faults"]["by_kind"]
    assert kinds.get("kill-storage", 0) + kinds.get("pause-storage", 0) >= 2, kinds
    assert report["acknowledged"] > 1000
    assert len(report["ring_after"]) == 4  # repaired to full size
    again = subprocess.run(
        [sys.executable, "-m", "jepsen_like", "check", str(tmp_path)],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]


def test_an_unknown_fault_is_refused_at_once(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "jepsen_like", "run", "--nemesis", "kill,meteor", "--dir",
         str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2 and "meteor" in out.stderr
