"""The jepsen_like runner's refusals and its report, without a cluster."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from jepsen_like import net, runner
from rubberband.tools.report import per_second, plot


def test_network_faults_without_namespaces_exit_2_and_say_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(net, "problem", lambda: "network faults need root (test)")
    code = runner.run(["--nemesis", "kill,partition", "--dir", str(tmp_path), "--seed", "1"])
    assert code == 2
    err = capsys.readouterr().err
    assert "cannot inject network faults" in err and "need root (test)" in err


def test_per_second_counts_ok_operations_and_their_latency() -> None:
    ops = [(0.1, 0.2, True), (0.5, 0.9, True), (1.0, 1.5, False), (1.2, None, False),
           (1.3, 2.3, True)]  # fmt: skip
    series = per_second(ops)
    assert [p["ok"] for p in series] == [2.0, 0.0, 1.0]
    assert series[0]["p99_ms"] == pytest.approx(400.0)
    assert series[2]["p50_ms"] == pytest.approx(1000.0)
    # No operation completed in second 1: no latency there (the chart leaves a gap).
    assert series[1]["p50_ms"] is None and series[1]["p99_ms"] is None


def test_the_report_png_shades_fault_windows(tmp_path: Path) -> None:
    series = per_second((t / 10, t / 10 + 0.01, True) for t in range(300) if not 150 <= t < 180)
    faults = [{"kind": "partition", "start": 5.0, "end": 9.0},
              {"kind": "kill", "start": 12.0, "end": 12.0}]  # fmt: skip
    assert plot(tmp_path / "r.png", "test", series, faults) == ""
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_runs_side_by_side_never_share_a_network_tag() -> None:
    """A run starts by removing what a run of its tag left behind, processes included: a
    second run on the same tag would kill the first.  Tags are held by a lock that dies
    with its holder."""
    first, fd1 = net._claim(None)
    second, fd2 = net._claim(None)
    try:
        assert first != second
        with pytest.raises(RuntimeError, match=f"network tag {first} is held by another run"):
            net._claim(first)
    finally:
        os.close(fd1)
        os.close(fd2)
    again, fd = net._claim(first)  # released with its descriptor
    os.close(fd)
    assert again == first


def test_partitions_never_cut_an_application_off_for_its_lease() -> None:
    """Every partition that leaves an application process without the routers'
    majority heals well inside the 5 s client lease: 3.5 s for one cut off alone, 3 s
    for one on a split's minority side, which must also find the majority's new leader
    after the heal (a 3.9 s split got a client suspected on a loaded machine)."""
    from jepsen_like.nemesis import RouterNemesis

    class Cuts:
        def cut(self, a: list[str], b: list[str]) -> None:
            pass

    seen: dict[str, float] = {}
    routers, apps = ["r1", "r2", "r3"], ("c1", "c2", "recv")
    for seed in range(300):
        n = RouterNemesis(("partition",), seed, 60.0, net=Cuts(), apps=apps)  # type: ignore[arg-type]
        f = n._partition(10.0, None, routers, "r3", "leader")  # type: ignore[arg-type]
        hold = f.detail["heal_at"] - 10.0
        variant = f.detail["variant"]
        minority = f.detail["sides"][0]
        assert 2.0 <= hold <= 4.0
        if variant == "app-cut":
            assert hold <= 3.5 and minority[0] in apps
        elif variant == "split" and len(minority) > 1:
            assert hold <= 3.0, (seed, f.detail)
        seen[variant] = max(seen.get(variant, 0.0), hold)
    # Every variant drawn, and routers alone are still cut off for up to 4 s.
    assert set(seen) == {"isolated", "split", "app-cut"} and seen["isolated"] > 3.5


def _nemesis_with_view(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, live: list[str], members: list[str]
) -> Any:
    """A nemesis whose routers are ``live`` (running) and whose leader's view holds
    ``members`` (the leader is the first), without processes: its probes are stubbed."""
    import json
    import random

    from jepsen_like import rubberband_run as rr

    (tmp_path / "cluster.json").write_text(json.dumps({"supers": {"super:s1": "x:1"}}))
    monkeypatch.setattr(rr, "_status", lambda d: {"ring": [{"name": "storage:1"}]})
    nem = rr.RubberbandNemesis.__new__(rr.RubberbandNemesis)
    nem.d = tmp_path
    nem.rng = random.Random(0)
    procs = {n: {"health_port": i, "pid": i} for i, n in enumerate(live, 1)}
    nem._routers = lambda: procs  # type: ignore[method-assign]
    nem._recorded = lambda: procs  # type: ignore[method-assign]
    nem._router_view = lambda: (sorted(live) == sorted(members), members[0])  # type: ignore[method-assign]
    nem._health = lambda p: {"leader": members[0], "members": members}  # type: ignore[method-assign]
    return nem


def test_no_router_fault_takes_a_view_of_two_below_its_majority(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 300-second run that never ended: a paused leader (j14) was voted out as it
    resumed, leaving the view j15, j17; while j14 still ran, the nemesis counted three
    routers and killed j17, and the group lost its quorum for good (every final read then
    waited out its timeout, key after key).  A router is faulted only while the view
    can lose one member and keep a majority."""
    nem = _nemesis_with_view(tmp_path, monkeypatch, ["j14", "j15", "j17"], ["j15", "j17"])
    roles = {nem._victim()[0] for _ in range(300)}
    assert roles == {"storage", "super"}
    nem = _nemesis_with_view(tmp_path, monkeypatch, ["j15", "j17", "j18"], ["j15", "j17", "j18"])
    victims = [nem._victim() for _ in range(300)]
    assert {r for r, _, _ in victims} == {"storage", "super", "router", "leader"}
    assert {n for r, n, _ in victims if r in ("router", "leader")} <= {"j15", "j17", "j18"}


def test_the_rubberband_nemesis_waits_for_receivers_and_incomplete_holders(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A fault only once no holder is receiving or incomplete (the super's status lists
    them beside the ring): a holder still receiving does not hold all of its data."""
    from jepsen_like import rubberband_run

    ring = [{"name": f"storage:{i}", "suspected": False} for i in range(1, 5)]
    status = {"ring": ring, "pending": {}, "busy": [], "incomplete": []}
    monkeypatch.setattr(rubberband_run, "_status", lambda d: status)
    nemesis = object.__new__(rubberband_run.RubberbandNemesis)
    nemesis.d = tmp_path
    assert nemesis.ring_healthy(routers_too=False)
    for field, value in (
        ("busy", ["storage:2"]),
        ("incomplete", ["storage:3"]),
        ("pending", {"7": ["storage:1"]}),
    ):
        status[field] = value
        assert not nemesis.ring_healthy(routers_too=False), field
        status[field] = type(value)()
    ring[0]["suspected"] = True
    assert not nemesis.ring_healthy(routers_too=False)
    status["ring"] = []  # no super answered: wait
    assert not nemesis.ring_healthy(routers_too=False)


def test_an_operation_that_outlives_every_timeout_fails_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A client slot still in one operation long after the workload ended (the runner
    gave up on it) is a liveness failure, not an indeterminate operation: a sequential
    read answered just before a power cut once waited for its acknowledgement for ever,
    and the run passed."""
    from jepsen_like import rubberband_run

    history = [
        {"process": "c0", "type": "invoke", "f": "read", "value": None, "index": 0,
         "time": 1.0, "level": "sequential"},
    ]  # fmt: skip
    got = {"history": history, "faults": [], "reads_held": {}, "resumed_alive": [],
           "phases": {"workload_s": 91.0}, "unread": [], "stuck": ["c0"], "ring": []}  # fmt: skip
    monkeypatch.setattr(rubberband_run, "run_rubberband", lambda out, plan: got)
    code = runner.run(["--workload", "bank", "--nemesis", "kill", "--time", "1", "--seed", "1",
                       "--dir", str(tmp_path)])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 1 and "1 violation(s)" in out, out
    assert "violation: liveness: the operation in flight of client slot(s) ['c0']" in out
    got["stuck"] = []
    runner.run(["--workload", "bank", "--nemesis", "kill", "--time", "1", "--seed", "1",
                "--dir", str(tmp_path)])  # fmt: skip
    assert "liveness" not in capsys.readouterr().out
