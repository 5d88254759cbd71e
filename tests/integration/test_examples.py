"""The example and the main job run for real: the README's promises stay true."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.integration.cluster import SECRET, Cluster

ROOT = Path(__file__).resolve().parents[2]


def test_chat_example_members_see_one_conversation(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    try:
        cluster.start_group(3)
        env = {**os.environ, "ECAST_SECRET": SECRET}
        routers = ",".join(cluster.addresses())

        def member(name: str, *args: str) -> subprocess.Popen[str]:
            cmd = [sys.executable, str(ROOT / "examples" / "chat.py"), "--name", name,
                   "--routers", routers, "--linger", "2", *args]  # fmt: skip
            return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)

        # Alice joins first and speaks once Bob is in, so both hear everything.
        alice = member("alice", "--wait-for", "bob", "--script", "hello", "anyone there?")
        assert alice.stdout is not None and "joined as alice" in alice.stdout.readline()
        bob = member("bob", "--script", "hi alice", "yes")
        outs = [p.communicate(timeout=60)[0] for p in (alice, bob)]
        assert [p.returncode for p in (alice, bob)] == [0, 0], outs
        said = [
            {int(t): line for t, line in re.findall(r"\[t=(\d+)\] (<\w+> .*)", out)} for out in outs
        ]
        # Both saw every line both said, each at the same position of the conversation.
        for lines in said:
            assert sorted(lines.values()) == sorted(
                ["<alice> hello", "<alice> anyone there?", "<bob> hi alice", "<bob> yes"]
            ), outs
        common = set(said[0]) & set(said[1])
        assert len(common) == 4 and all(said[0][t] == said[1][t] for t in common)
    finally:
        cluster.stop_all()


def test_main_job_demo_passes_its_own_checks() -> None:
    cmd = [sys.executable, "-m", "ecast", "demo", "--duration", "5", "--rate", "600"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "SIGKILL the leading router" in p.stdout
    assert "acknowledgements resumed" in p.stdout
    assert "VERDICT: all checks passed" in p.stdout


def test_the_benchmark_command_runs_a_cluster_and_reports_every_figure() -> None:
    cmd = [sys.executable, "-m", "ecast", "bench", "--duration", "4", "--warmup", "1",
           "--receivers", "4", "--json"]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    result = json.loads(p.stdout)
    for key in ("throughput_per_s", "delivered_per_s", "p50_ms", "p99_ms", "routers",
                "receivers", "replication", "payload_bytes", "clients"):  # fmt: skip
        assert key in result, key
    assert result["throughput_per_s"] > 0 and result["order_ok"]
    assert 0.0 <= result["busy_before"] <= 1.0  # how busy the machine was at the start
    # Closed loop, drained at the end: every message the client submitted was acknowledged
    # (and only those: the SDK's own join is not counted), at all 3 of its destinations.
    assert result["acked"] == result["submitted"] > 0
    assert result["delivered_per_s"] > result["throughput_per_s"]
    roles = set(result["rss_mb"])
    assert {"router r1", "router r2", "router r3", "client c1", "receiver recv0"} <= roles
    assert all({"warm", "end", "slope_mb_per_min"} <= set(v) for v in result["rss_mb"].values())
