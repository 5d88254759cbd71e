"""Every ``rubberband bench`` experiment at a tiny size: it runs against a real cluster,
its JSON has the shape ``docs/benchmarks.md`` reads, and it leaves no process behind.

The sizes are the smallest that still exercise each experiment's logic (two points of a
sweep, a kill and a replacement, an expand and a contract); the figures themselves are
the benchmarks' business, not the tests'."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from ecast import local
from tests.integration.test_rubberband import cli

# Benchmarks saturate both cores and bound a failover gap: they run alone.
pytestmark = pytest.mark.exclusive

TINY = ["--duration", "0.8", "--warmup", "0.3", "--no-baseline", "--json"]


def bench(tmp_path: Path, *args: str, timeout: float = 240) -> dict[str, Any]:
    png = tmp_path / "figure.png"
    p = cli("bench", *args, "--state-dir", str(tmp_path / "clusters"), "--png", str(png),
            timeout=timeout)  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    nothing_left(tmp_path / "clusters")
    if out.get("experiment") != "cost":
        assert png.stat().st_size > 5_000, "no figure drawn"
    return dict(out)


def nothing_left(clusters: Path) -> None:
    """No process of any cluster under ``clusters`` still runs."""
    leftover = []
    for d in clusters.iterdir():
        for name, r in local.StateDir.recorded(d).items():
            if local.running(r["pid"]):
                leftover.append(name)
    assert not leftover, f"still running: {leftover}"


def writes_ok(row: dict[str, Any]) -> None:
    assert row["throughput_per_s"] > 500, row
    assert 0 < row["p50_ms"] <= row["p99_ms"], row
    assert row["errors"] == row["timeouts"] == row["undelivered"] == 0, row
    assert row["cpu_us_per_op"]["routers"] > 0 and row["cpu_us_per_op"]["storage"] > 0, row


def test_write_vs_storage_with_its_ecast_baseline(tmp_path: Path) -> None:
    out = bench(tmp_path, "write-vs-storage", "--storage", "1,3", "--replication", "3",
                *[a for a in TINY if a != "--no-baseline"])  # fmt: skip
    rows = out["rows"]
    assert [(r["storage"], r["replication"]) for r in rows] == [(3, 3)]  # 1 < 3: skipped
    for r in rows:
        writes_ok(r)
        assert r["ecast"]["throughput_per_s"] > 0
        assert r["ratio"] == pytest.approx(r["throughput_per_s"] / r["ecast"]["throughput_per_s"],
                                           abs=0.001)  # fmt: skip
        assert "3 logical processes" in r["placement"]["storage"]
    assert out["machine"]["cpus"] >= 1


def test_write_vs_storage_on_the_memory_engine(tmp_path: Path) -> None:
    # The same writes into a sorted map with a change log: the load sends puts (the
    # null engine's writes would be refused there as errors).
    out = bench(tmp_path, "write-vs-storage", "--storage", "3", "--replication", "3",
                "--engine", "memory", *TINY)  # fmt: skip
    (row,) = out["rows"]
    writes_ok(row)
    assert row["engine"] == "memory" and row["ecast"] is None
    assert row["items_held"] > 0, row  # the puts are in the engines, not refused


def test_write_vs_clients_reports_fairness(tmp_path: Path) -> None:
    out = bench(tmp_path, "write-vs-clients", "--storage", "3", "--clients", "1,6", *TINY)
    one, six = out["rows"]
    assert (one["clients"], six["clients"]) == (1, 6)
    for r in (one, six):
        writes_ok(r)
    assert 0 < six["fairness"] <= 1 and one["fairness"] == 1.0


def test_write_vs_routers_and_payload(tmp_path: Path) -> None:
    out = bench(tmp_path, "write-vs-routers", "--storage", "3", "--routers", "1", *TINY)
    assert [r["routers"] for r in out["rows"]] == [1]
    for r in out["rows"]:
        writes_ok(r)
    (routed,) = out["rows"]
    out = bench(tmp_path, "write-vs-payload", "--storage", "3", "--payloads", "16,4096",
                "--write-bundle", "8", *TINY)  # fmt: skip
    small, large = out["rows"]
    assert (small["payload"], large["payload"]) == (16, 4096)
    assert large["mb_per_s"] > small["mb_per_s"]
    for r in (small, large):  # writes of one segment share messages (bundles)
        writes_ok(r)
        assert 1.2 < r["writes_per_message"] <= 8, r
    assert routed["writes_per_message"] == 1  # each write alone by default


def test_read_isolation_counts_reads_refusals_and_retries(tmp_path: Path) -> None:
    out = bench(tmp_path, "read-isolation", "--storage", "3", "--clients", "2",
                "--shares", "0,1", *TINY)  # fmt: skip
    reads = {r["reads"]: r for r in out["rows"]}
    alone = ("0% snapshot, each read alone", "100% snapshot, each read alone")
    assert set(reads) == {
        "0% snapshot", "100% snapshot", *alone, "basic", "(writes, same clients)"
    }  # fmt: skip
    for r in reads.values():
        assert r["throughput_per_s"] > 200 and r["errors"] == 0, r
        assert r["retries"] <= r["refused"] and 0 <= r["refusal_rate"] < 1
    # Each row reads at its share: none of the 0 % row's reads is a snapshot read.
    for name in ("0% snapshot", "0% snapshot, each read alone"):
        assert reads[name]["snapshot_reads_sent"] == 0 < reads[name]["reads_sent"], reads[name]
    for name in ("100% snapshot", "100% snapshot, each read alone"):
        assert reads[name]["snapshot_reads_sent"] == reads[name]["reads_sent"] > 0, reads[name]
    # Reads of one segment share messages (bundles), unless sent alone.
    assert reads["0% snapshot"]["reads_per_message"] > 1.2
    assert reads["100% snapshot"]["reads_per_message"] > 1.2
    assert all(reads[name]["reads_per_message"] == 1 for name in alone)


def test_latency_vs_load_with_clumping_on_and_off(tmp_path: Path) -> None:
    out = bench(tmp_path, "latency-vs-load", "--storage", "3", "--fractions", "0.3", *TINY)
    settings = [r["setting"] for r in out["rows"]]
    assert settings == ["clumping + delayed acks"] * 2 + ["neither"] * 2
    offered = [r for r in out["rows"] if r["rate"]]
    for r in offered:  # an open loop at 30 % of the peak is served at about its rate
        assert r["throughput_per_s"] == pytest.approx(r["rate"], rel=0.25), r


def test_router_failover_kills_and_replaces_the_leader_then_a_follower(tmp_path: Path) -> None:
    out = bench(tmp_path, "router-failover", "--storage", "3", "--kill-at", "1.5,5",
                "--replace-after", "1.5", "--rate", "3000", "--duration", "8",
                "--warmup", "0.5", "--no-baseline", "--json")  # fmt: skip
    kill, join, kill2, join2 = out["rows"]
    assert "(leader)" in kill["event"] and "(follower)" in kill2["event"]
    assert join["event"] == "j1 joins" and join2["event"] == "j2 joins"
    # Writes stop until the failure timeout (1 s) passes, then resume; snapshot reads too.
    assert 0.5 < kill["writes_resumed_s"] < 5, kill
    assert kill["snapshot_resumed_s"] is not None and kill["snapshot_resumed_s"] < 5, kill
    assert kill2["write_gap_s"] < 5, kill2
    assert out["trace"]["writes"] and out["trace"]["snapshot_reads"]


def test_elasticity_moves_data_and_keeps_writing(tmp_path: Path) -> None:
    out = bench(tmp_path, "elasticity", "--start", "3", "--steps", "1", "--keys", "3000",
                "--step-gap", "1", "--warmup", "0.3", "--no-baseline", "--json")  # fmt: skip
    expand, contract = out["rows"]
    assert expand["step"].startswith("expand") and contract["step"].startswith("contract")
    assert expand["items_moved"] > 0 and contract["items_moved"] > 0
    assert expand["bytes_moved"] > 0
    assert out["steady_per_s"] > 0 and expand["lowest_per_s"] is not None
    # Each storage process in an OS process of its own, as a deployment runs them: packed
    # in one, they shared one core and the last contraction stalled writes.
    assert out["placement"]["storage"] == "4 logical processes in 4 OS processes", out


def test_cost_per_role_and_per_destset(tmp_path: Path) -> None:
    out = bench(tmp_path, "cost", "--storage", "3", *TINY)
    ops = {r["operation"]: r for r in out["rows"]}
    assert set(ops) == {"write", "sequential", "snapshot", "basic"}
    for r in ops.values():
        assert r["total"] > 0 and r["clients"] > 0
    assert ops["write"]["routers"] > 0
    assert out["destset_us"]["write 1 key"] > 0


@pytest.mark.skipif(shutil.which("etcd") is None, reason="etcd-server is not installed")
def test_peers_measure_every_system_or_say_why_not(tmp_path: Path) -> None:
    # etcd_tmpfs is etcd with its data in /dev/shm: the same code, left to the benchmark.
    p = cli("bench", "peers", "--duration", "1", "--warmup", "0.5", "--concurrency", "8",
            "--systems", "rubberband,rubberband_alone,rubberband_durable_alone,etcd,zookeeper,"
            "pysyncobj",
            "--state-dir", str(tmp_path), "--json", timeout=400)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["concurrency"] == 8
    for system in ("rubberband", "etcd", "zookeeper", "pysyncobj"):
        r = out[system]
        assert r.get("throughput_per_s", 0) > 0 or r.get("error"), (system, r)
    assert out["rubberband"]["throughput_per_s"] > 0
    assert out["rubberband"]["writes_per_message"] >= 1  # bundles: as write_batch sends them
    assert out["rubberband_alone"]["writes_per_message"] == 1
    assert out["etcd"]["throughput_per_s"] > 0
    assert out["etcd"]["client"].startswith("gRPC KV/Put"), out["etcd"]  # its fastest client
    # How many times etcd's writes/s Rubberband's were in this run, bundled and alone.
    ours, alone, theirs = (out[s]["throughput_per_s"] for s in ("rubberband", "rubberband_alone",
                                                                 "etcd"))  # fmt: skip
    assert out["etcd"]["rubberband_ratio"] == round(ours / theirs, 2), out["etcd"]
    assert out["etcd"]["alone_ratio"] == round(alone / theirs, 2), out["etcd"]
    assert "alone_ratio" not in out["rubberband_at_etcd_peak"]  # (open loop: a rate given)
    assert out["rubberband_at_etcd_peak"]["p99_ms"] > 0
    durable = out["rubberband_durable_alone"]  # on disk at every replica, as etcd's writes
    assert durable["throughput_per_s"] > 0 and durable["over_etcd"] > 0, durable
    assert durable["client"].endswith("fsync always")
    assert out["rubberband_durable_at_etcd_peak"]["p99_ms"] > 0


def test_views_cost_staleness_and_lookups_that_answer_right(tmp_path: Path) -> None:
    # Every part at a tiny size: writes with no view and with one, the staleness probe,
    # and lookups on both bases (the bench checks each lookup's rows against its data);
    # 10,000 keys, so that the index view also moves rows (writes that update a key).
    p = cli("bench", "views", "--views", "0,1", "--staleness-rate", "300",
            "--staleness-views", "1,0", "--rows", "600", "--lookups", "64", "--duration", "1.5",
            "--procs", "1", "--clients", "64", "--state-dir", str(tmp_path / "clusters"),
            "--keys", "10000", "--json", timeout=400)  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    nothing_left(tmp_path / "clusters")
    assert out["experiment"] == "views" and out["machine"]["cpus"] >= 1
    assert out["keys"] == 10_000
    without, one = out["writes"]["0"], out["writes"]["1"]
    for r in (without, one):
        assert r["writes_per_s"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"], r
        assert r["failed"] == 0, r
    assert one["cost"] == pytest.approx(1 - one["writes_per_s"] / without["writes_per_s"],
                                        abs=0.001)  # fmt: skip
    # The CPU of a base write by role: the maintainer's only where there is a view.
    roles = {"routers", "storage", "super", "load"}
    for r, want in ((without, roles), (one, roles | {"maintainer"})):
        per = r["cpu_us_per_write"]
        assert set(per) == want and all(per[role] > 0 for role in want - {"super"}), per
    # How far the view fell behind the load (its progress behind a sequential read,
    # sampled while the load ran, then once after), and its maintainer's starts (1:
    # never started over), from its /metrics.
    assert "views_at_end" not in without
    end = one["views_at_end"]["v0"]
    assert end["behind_max"] >= 0 and end["behind"] >= 0 and end["starts"] >= 1, end
    # And how long the storage processes held the writers back for it (a view kept by
    # slowing the writers), summed from their /metrics.
    assert one["writers_held_s"] >= 0 and "writers_held_s" not in without, one
    fresh = out["staleness_index_alone"]
    # The paced load holds its rate: none sent ahead of it, and not far behind.
    assert 200 <= fresh["writes"]["writes_per_s"] <= 300 and fresh["reads"] > 0, fresh
    assert fresh["writes"]["failed"] == 0, fresh
    assert 0 < fresh["write_to_view_p50_ms"] <= fresh["write_to_view_p99_ms"], fresh
    assert 0 < fresh["lookup_p50_ms"] <= fresh["lookup_p99_ms"], fresh
    assert 0 < fresh["sequential_view_read_p50_ms"] <= fresh["sequential_view_read_p99_ms"]
    assert 0 <= fresh["behind_positions_p50"] <= fresh["behind_positions_p99"], fresh
    # The cores each role used meanwhile: every role of the cluster, the maintainer, the
    # probe and the load; none more than the machine has, and the machine's busy share.
    cores = fresh["cpu_cores"]
    assert set(cores) == {"routers", "storage", "super", "maintainer", "probe", "load"}, cores
    assert cores["routers"] > 0 and cores["storage"] > 0 and cores["load"] > 0, cores
    assert all(0 <= c <= fresh["machine_cores"] for c in cores.values()), cores
    assert 0 < fresh["machine_busy"] <= 1, fresh
    # The same load with no view: its base writes and the cluster's cores, without a
    # maintainer or a probe (what a view costs at that rate is the difference).
    bare = out["at_rate_without_views"]
    assert 200 <= bare["writes"]["writes_per_s"] <= 300 and bare["writes"]["failed"] == 0, bare
    assert 0 < bare["writes"]["p50_ms"] <= bare["writes"]["p99_ms"], bare
    assert set(bare["cpu_cores"]) == {"routers", "storage", "super", "load"}, bare
    assert bare["cpu_cores"]["routers"] > 0 and bare["cpu_cores"]["storage"] > 0, bare
    assert "write_to_view_p50_ms" not in bare and 0 < bare["machine_busy"] <= 1, bare
    upkeep = out["index_cores_at_rate"]  # the index's own cores at that rate: the difference
    for role in ("routers", "storage", "load"):
        assert upkeep[role] == pytest.approx(cores[role] - bare["cpu_cores"][role], abs=0.011)
    assert upkeep["maintainer"] == cores["maintainer"] and upkeep["probe"] == cores["probe"]
    assert upkeep["all"] == pytest.approx(sum(cores.values()) - sum(bare["cpu_cores"].values()),
                                          abs=0.011)  # fmt: skip
    kv, table = out["lookups"], out["lookups_table"]
    for r in (kv, table):
        assert r["rows"] == 600 and r["rows_per_lookup"] == 1.0, r
        assert r["index_view_lookups_per_s"] > 0 and r["sqlite_indexed_lookups_per_s"] > 0, r
    assert kv["full_scan_lookups_per_s"] > 0 and kv["rows_per_scan_lookup"] == 1.0, kv
    assert kv["index_view_lookups_under_writes_per_s"] > 0, kv  # (their rows are checked)
    assert kv["rows_written_per_s_meanwhile"] > 0, kv
    assert table["scan_engine_select_lookups_per_s"] > 0, table
