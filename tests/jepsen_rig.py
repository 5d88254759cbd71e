"""What the jepsen_like tests on real processes share: running ``python -m jepsen_like
run`` and reading its verdict, and the mark for tests that need network namespaces."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jepsen_like import net

EVERY = "kill,pause,partition,stall,slow,loss,reconfigure"
NET_PROBLEM = net.problem()
needs_net = pytest.mark.skipif(NET_PROBLEM is not None, reason=f"network namespaces: {NET_PROBLEM}")


def run(tmp_path: Path, *args: str, timeout: float = 300) -> tuple[int, dict, str]:
    out = subprocess.run(
        [sys.executable, "-m", "jepsen_like", "run", "--dir", str(tmp_path), "--json", *args],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    lines = out.stdout.strip().splitlines()
    report = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
    return out.returncode, report, out.stdout[-4000:] + out.stderr[-4000:]


def valid(tmp_path: Path, *args: str) -> tuple[dict, str]:
    """A run that must pass: exit 0 with a valid verdict and no violation; the report
    and the run's output."""
    code, report, text = run(tmp_path, *args)
    assert code == 0, text
    assert report["valid"] and not report["violations"], text
    return report, text


def caught(tmp_path: Path, *args: str) -> dict:
    """A run with a planted bug: it must fail; shows the failing verdict."""
    code, report, text = run(tmp_path, *args)
    assert code == 1 and report, text  # failed with a verdict, not for another reason
    assert not report["valid"] and report["violations"], report
    print("failing verdict:", report["violations"][:3])
    return report


def check_again(tmp_path: Path) -> None:
    again = subprocess.run(
        [sys.executable, "-m", "jepsen_like", "check", str(tmp_path)],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
