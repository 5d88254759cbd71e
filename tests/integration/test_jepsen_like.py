"""jepsen_like on real processes: each workload under every fault the nemesis knows
(kills, pauses, network partitions, stalls, slow links, packet loss, reconfigurations), and
planted bugs that a short run must catch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jepsen_like import net

EVERY = "kill,pause,partition,stall,slow,loss,reconfigure"
_NET_PROBLEM = net.problem()
needs_net = pytest.mark.skipif(
    _NET_PROBLEM is not None, reason=f"network namespaces: {_NET_PROBLEM}"
)


def _run(tmp_path: Path, *args: str, timeout: float = 300) -> tuple[int, dict, str]:
    out = subprocess.run(
        [sys.executable, "-m", "jepsen_like", "run", "--dir", str(tmp_path), "--json", *args],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    lines = out.stdout.strip().splitlines()
    report = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
    return out.returncode, report, out.stdout[-4000:] + out.stderr[-4000:]


def _caught(tmp_path: Path, *args: str) -> dict:
    """A run with a planted bug: it must fail; shows the failing verdict."""
    code, report, text = _run(tmp_path, *args)
    assert code == 1 and report, text  # failed with a verdict, not for another reason
    assert not report["valid"] and report["violations"], report
    print("failing verdict:", report["violations"][:3])
    return report


def _check_again(tmp_path: Path) -> None:
    again = subprocess.run(
        [sys.executable, "-m", "jepsen_like", "check", str(tmp_path)],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]


@needs_net
def test_a_multicast_run_under_every_fault_checks_valid(tmp_path: Path) -> None:
    code, report, text = _run(
        tmp_path, "--workload", "multicast", "--nemesis", EVERY, "--time", "50", "--seed", "5"
    )
    assert code == 0, text
    assert report["seed"] == 5 and json.loads((tmp_path / "report.json").read_text())["seed"] == 5
    assert report["valid"] and not report["violations"]
    kinds = report["faults"]["by_kind"]
    assert len(kinds) >= 3 and sum(kinds.values()) >= 6, (kinds, text)
    assert report["acknowledged"] == report["submitted"] > 0
    assert report["checks_ran"] >= 8 and report["history_events"] > report["submitted"]
    assert (tmp_path / "report.png").stat().st_size > 10_000
    assert report["per_second"] and max(p["ok"] for p in report["per_second"]) > 0
    _check_again(tmp_path)


@needs_net
def test_a_broadcast_multicast_run_under_faults_checks_valid(tmp_path: Path) -> None:
    """The broadcast config: every message to every joined process, the clients too, so
    every process's deliveries are checked against every other's (total order, no gaps,
    agreement), under leader kills, partitions and stalls; the stored history checks
    again with the config the report names."""
    code, report, text = _run(
        tmp_path, "--workload", "multicast", "--config", "broadcast", "--nemesis",
        "kill,partition,stall", "--time", "20", "--seed", "3", "--receivers", "3",
        "--rate", "1000",
    )  # fmt: skip
    assert code == 0, text
    assert report["checker"]["config"] == "ecast:BroadcastConfig"
    assert report["valid"] and not report["violations"]
    assert sum(report["faults"]["by_kind"].values()) >= 3, report["faults"]
    assert report["acknowledged"] == report["submitted"] > 0
    _check_again(tmp_path)


def test_applications_paused_past_their_lease_go_on_under_fresh_names(tmp_path: Path) -> None:
    """A client or the receivers' process stopped past the routers' client lease: the
    group suspects it, it learns so when it resumes and goes on as a new process, and
    the checkers (told where each was suspected, though nobody delivered those suspects)
    find the run valid.  Its unacknowledged messages count as indeterminate, not lost."""
    code, report, text = _run(
        tmp_path, "--workload", "multicast", "--nemesis", "pause-app", "--time", "32",
        "--seed", "5",
    )  # fmt: skip
    assert code == 0, text
    assert report["valid"] and not report["violations"]
    assert report["faults"]["by_kind"]["pause-app"] >= 2
    assert report["client_incarnations"] > 2  # c1 was suspected and replaced
    assert report["acknowledged"] + report["indeterminate"] == report["submitted"]
    assert report["acknowledged"] > report["submitted"] // 2
    _check_again(tmp_path)


@needs_net
@pytest.mark.parametrize(("workload", "engine"), [("list-append", "scan-kv"), ("bank", "memory")])
def test_a_rubberband_run_under_every_fault_checks_valid(
    workload: str, engine: str, tmp_path: Path
) -> None:
    """Storage processes, routers and supers killed and paused, partitions, slow and
    lossy links, expand/contract/replace/rebalance and router joins and parts, under
    multi-key appends and reads (or transfers and reads at every level): the cluster
    repairs itself (60 s: the nemesis waits for a healthy ring between faults, and on a
    slow machine 50 s held five faults, not the six asked for), the checker finds no
    anomaly, and the stored history checks again.
    The appends run on the scan engine (its batched Clock Scan cycles and its migration
    cursors under faults), the transfers on the memory engine."""
    code, report, text = _run(
        tmp_path, "--workload", workload, "--engine", engine, "--nemesis", EVERY,
        "--time", "60", "--seed", "4",
    )  # fmt: skip
    assert code == 0, text
    assert report["engine"] == engine
    assert report["valid"] and not report["violations"]
    kinds = report["faults"]["by_kind"]
    assert len(kinds) >= 3 and sum(kinds.values()) >= 6, (kinds, text)
    assert report["acknowledged"] > 1000
    if workload == "list-append":  # every key read again after the heal, none lost
        assert report["checker_stats"]["final_reads"] > 0
        assert report["checker_stats"]["acked_appends_never_read"] == 0
    assert len(report["ring_after"]) >= 4
    assert (tmp_path / "report.png").stat().st_size > 10_000
    _check_again(tmp_path)


def test_the_planted_lost_window_is_caught(tmp_path: Path) -> None:
    """An endpoint that never resends its window when the leader changes: its messages
    in flight at a leader kill are never acknowledged, and the run says so."""
    report = _caught(
        tmp_path, "--workload", "multicast", "--nemesis", "kill", "--time", "30",
        "--seed", "11", "--mutation", "no_window_resend",
    )  # fmt: skip
    assert any(v.startswith("termination:") for v in report["violations"]), report["violations"]


@needs_net
def test_the_planted_skip_learn_dedup_is_caught(tmp_path: Path) -> None:
    """Routers that append what they learn without dropping second copies.  The leader
    stalls (sends nothing, still receives) for longer than the clients' 0.3 s progress
    timeout: clients resend their windows through another router, which proposes again
    what the stalled leader proposed before anyone heard of it; both copies are chosen,
    and every destination delivers the second one too.  The same run without the bug is
    valid (docs/reliability.md)."""
    report = _caught(
        tmp_path, "--workload", "multicast", "--nemesis", "stall", "--time", "20",
        "--seed", "1", "--progress-timeout", "0.3", "--mutation", "skip_learn_dedup",
    )  # fmt: skip
    assert any(v.startswith("no-duplicates:") for v in report["violations"]), report


def test_the_planted_delete_before_send_is_caught(tmp_path: Path) -> None:
    """Storage processes that run a reconfiguration's deletes before its copies open
    their cursors: ranges moved by expand, replace or rebalance arrive empty, and the
    list-append checker finds acknowledged appends missing from later reads."""
    _caught(
        tmp_path, "--workload", "list-append", "--nemesis", "reconfigure", "--time", "30",
        "--seed", "9", "--mutation", "delete_before_send",
    )  # fmt: skip


def test_the_planted_reads_to_busy_is_caught(tmp_path: Path) -> None:
    """A config that sends sequential reads to replicas still receiving their ranges, as
    if they were complete: those reads wait for the copies, though another replica of
    every range could have answered at once (4.4.1), and the run fails on availability.
    The same run without the bug holds no read (docs/reliability.md)."""
    report = _caught(
        tmp_path, "--workload", "list-append", "--nemesis", "reconfigure", "--time", "20",
        "--seed", "9", "--mutation", "reads_to_busy",
    )  # fmt: skip
    assert report["reads_held"]["checked"] and sum(report["reads_held"]["by_process"].values())
    assert [v for v in report["violations"] if v.startswith("availability:")], report


def test_a_run_whose_answers_never_come_still_ends_with_a_verdict(tmp_path: Path) -> None:
    """Storage processes that never answer a client (a planted bug): every read and every
    answered write waits out its timeout, the final reads their budget, and the run still
    ends, with a verdict that names the unread keys and the time of every phase."""
    report = _caught(
        tmp_path, "--workload", "list-append", "--nemesis", "", "--time", "8", "--seed", "3",
        "--mutation", "mute_answers", "--final-read-budget", "12",
    )  # fmt: skip
    phases = report["phases"]
    assert set(phases) == {"workload_s", "settle_s", "final_reads_s", "checking_s"}
    assert 12 <= phases["final_reads_s"] <= 12 + 25, phases  # the budget, and one timeout
    assert any("final-read budget of 12 s ran out" in v for v in report["violations"]), report
    assert report["wall_s"] < 150, report["wall_s"]


def test_an_unknown_fault_is_refused_at_once(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "jepsen_like", "run", "--nemesis", "kill,meteor", "--dir",
         str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2 and "meteor" in out.stderr
    out = subprocess.run(
        [sys.executable, "-m", "jepsen_like", "run", "--workload", "bank", "--nemesis",
         "pause-app", "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2 and "pause-app is a multicast fault" in out.stderr
