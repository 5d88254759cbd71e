"""jepsen_like on real processes, Rubberband's workloads (list-append, bank) under every
fault the nemesis knows, and planted bugs that a short run must catch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.jepsen_rig import EVERY, caught, check_again, needs_net, valid


@needs_net
@pytest.mark.parametrize(("workload", "engine"), [("list-append", "scan-kv"), ("bank", "memory")])
def test_a_rubberband_run_under_every_fault_checks_valid(
    workload: str, engine: str, tmp_path: Path
) -> None:
    """Storage processes, routers and supers killed and paused, partitions, slow and
    lossy links, expand/contract/replace/rebalance and router joins and parts, under
    multi-key appends and reads (or transfers and reads at every level): the cluster
    repairs itself, the checker finds no anomaly, and the stored history checks again.
    The nemesis waits for a healthy ring between faults, so a slow machine fits fewer
    faults in the same time (five, not six, in 50 s and once in 60 s): the run goes on
    until six faults were injected.
    The appends run on the scan engine (its batched Clock Scan cycles and its migration
    cursors under faults), the transfers on the memory engine, with an aggregate view of
    the accounts kept by a maintainer process and read at every view level: each read
    shows the initial total at the position it reports."""
    report, text = valid(
        tmp_path, "--workload", workload, "--engine", engine, "--nemesis", EVERY,
        "--time", "50", "--min-faults", "6", "--seed", "4",
        *(["--views"] if workload == "bank" else []),
    )  # fmt: skip
    assert report["engine"] == engine
    kinds = report["faults"]["by_kind"]
    assert len(kinds) >= 3 and sum(kinds.values()) >= 6, (kinds, text)
    assert report["acknowledged"] > 1000
    if workload == "bank":  # the accounts' aggregate view read at every level, exact
        stats = report["checker_stats"]
        assert all(stats.get(f"view_reads_{lv}", 0) > 0 for lv in ("sequential", "snapshot")), stats
    if workload == "list-append":  # every key read again after the heal, none lost
        assert report["checker_stats"]["final_reads"] > 0
        assert report["checker_stats"]["acked_appends_never_read"] == 0
    assert len(report["ring_after"]) >= 4
    assert (tmp_path / "report.png").stat().st_size > 10_000
    check_again(tmp_path)


def test_power_cuts_on_the_durable_engine_lose_no_acknowledged_append(tmp_path: Path) -> None:
    """Every router, super and storage process SIGKILLed at once, twice, between kills of
    single processes, on the durable log engine; the cluster restarts from its disks each
    time (``rubberband cluster up`` on the same directory) and the clients reconnect to
    the new routers: every acknowledged append is read back, and the history checks
    valid across the cuts."""
    report, _ = valid(
        tmp_path, "--workload", "list-append", "--engine", "log", "--nemesis",
        "power-cut,kill", "--time", "40", "--min-faults", "3", "--seed", "5",
        "--answer-timeout", "4",
    )  # fmt: skip
    assert report["faults"]["by_kind"].get("power-cut", 0) >= 1, report["faults"]
    assert report["acknowledged"] > 1000
    stats = report["checker_stats"]
    assert stats["final_reads"] > 0 and stats["acked_appends_never_read"] == 0, stats


def test_a_views_maintainer_that_outlives_power_cuts_rebuilds_and_stays_exact(
    tmp_path: Path,
) -> None:
    """Transfers on the durable engine with an aggregate view of the accounts, and
    power cuts that SIGKILL every router, super and storage process but not the view's
    maintainer (a client, as on a machine of its own): it goes on against each restarted
    cluster from its old progress, finds its feed compacted (positions rise across the
    restart) and rebuilds; every view read shows the initial total at its position, and
    sequential ones after the first cut are answered at positions above every one before
    it."""
    report, _ = valid(
        tmp_path, "--workload", "bank", "--views", "--engine", "log", "--nemesis",
        "power-cut", "--time", "50", "--min-faults", "1", "--seed", "11",
        "--answer-timeout", "4",
    )  # fmt: skip
    cuts = report["faults"]["faults"]
    assert len(cuts) >= 1 and {c["kind"] for c in cuts} == {"power-cut"}, cuts
    reads = [json.loads(line) for line in (tmp_path / "history.jsonl").open()]
    views = [e for e in reads if e["f"] == "view-read" and e["type"] == "ok"]
    before = [e["value"]["position"] for e in views if e["time"] < cuts[0]["start"]]
    after = [e["value"]["position"] for e in views
             if e["time"] > cuts[0]["end"] and e["level"] == "sequential"]  # fmt: skip
    assert before and after, (len(before), len(after))
    assert min(after) > max(before)


def test_the_planted_delete_before_send_is_caught(tmp_path: Path) -> None:
    """Storage processes that run a reconfiguration's deletes before its copies open
    their cursors: ranges moved by expand, replace or rebalance arrive empty, and the
    list-append checker finds acknowledged appends missing from later reads."""
    caught(
        tmp_path, "--workload", "list-append", "--nemesis", "reconfigure", "--time", "30",
        "--seed", "9", "--mutation", "delete_before_send",
    )  # fmt: skip


def test_the_planted_reads_to_busy_is_caught(tmp_path: Path) -> None:
    """A config that sends sequential reads to replicas still receiving their ranges, as
    if they were complete: those reads wait for the copies, though another replica of
    every range could have answered at once (4.4.1), and the run fails on availability.
    The same run without the bug holds no read (docs/reliability.md)."""
    report = caught(
        tmp_path, "--workload", "list-append", "--nemesis", "reconfigure", "--time", "20",
        "--seed", "9", "--mutation", "reads_to_busy",
    )  # fmt: skip
    assert report["reads_held"]["checked"] and sum(report["reads_held"]["by_process"].values())
    assert [v for v in report["violations"] if v.startswith("availability:")], report


def test_a_run_whose_answers_never_come_still_ends_with_a_verdict(tmp_path: Path) -> None:
    """Storage processes that never answer a client (a planted bug): every read and every
    answered write waits out its timeout, the final reads their budget, and the run still
    ends, with a verdict that names the unread keys and the time of every phase."""
    report = caught(
        tmp_path, "--workload", "list-append", "--nemesis", "", "--time", "8", "--seed", "3",
        "--mutation", "mute_answers", "--final-read-budget", "12", "--answer-timeout", "2",
    )  # fmt: skip
    phases = report["phases"]
    assert set(phases) == {"workload_s", "settle_s", "final_reads_s", "checking_s"}
    assert 12 <= phases["final_reads_s"] <= 12 + 25, phases  # the budget, and one timeout
    assert any("final-read budget of 12 s ran out" in v for v in report["violations"]), report
    assert report["wall_s"] < 150, report["wall_s"]
