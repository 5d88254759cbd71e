"""Rubberband on real daemons: routers, a super and storage processes started with
``rubberband cluster up``, clients through ``rubberband.connect``."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import rubberband.sdk as rbsdk
from jepsen_like.checkers.history import Op
from jepsen_like.checkers.list_append import check
from rubberband.client import Rejected

PY = sys.executable


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "rubberband.tools.cli", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def cluster(tmp_path: Path) -> Any:
    d = tmp_path / "rb"
    up = cli(
        "cluster", "up", "--routers", "3", "--supers", "1", "--storage", "4", "--state-dir", str(d)
    )
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield d
    finally:
        cli("cluster", "down", "--state-dir", str(d))


def state(d: Path) -> dict[str, Any]:
    return dict(json.loads((d / "cluster.json").read_text()))


async def client(d: Path, name: str) -> rbsdk.RubberbandClient:
    st = state(d)
    return await rbsdk.connect(st["routers"], name, credentials=st["client_credentials"])


def status(d: Path) -> dict[str, Any]:
    out = cli("cluster", "status", "--state-dir", str(d), "--json")
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def test_cluster_up_status_and_every_read_level(cluster: Path) -> None:
    s = status(cluster)
    assert [r["name"] for r in s["ring"]] == [f"storage:{i}" for i in range(1, 5)]
    assert s["version"] == 4 and len(s["routers"]) == 3

    async def go() -> None:
        rb = await client(cluster, "client:levels")
        await rb.put_many({i * 1000: i for i in range(300)})
        await rb.append("list", 1)
        await rb.append("list", 2)
        for level in ("sequential", "snapshot", "basic"):
            assert await rb.get(5000, isolation=level) == 5
            assert await rb.get_many([0, 299_000, 12], isolation=level) == {0: 0, 299_000: 299}
            rows = await rb.scan(0, 1_000_000, isolation=level)
            assert [k for k, _ in rows] == [i * 1000 for i in range(300)]
            assert tuple(await rb.get("list", isolation=level)) == (1, 2)
        await rb.delete_range(0, 150_000)
        assert len(await rb.scan(0, 1_000_000)) == 150
        with pytest.raises(Rejected, match="append to"):
            await rb.put("s", "text")
            await rb.append("s", 1)
        with pytest.raises(ValueError, match="isolation"):
            await rb.get(1, isolation="serializable")
        await rb.close()
        # A new process under the same name: its writes land and its answers reach it.
        for value in (3, 4):
            rb = await client(cluster, "client:levels")
            await rb.append("list", value)
            assert tuple(await rb.get("list")) == (1, 2, 3, 4)[:value]
            await rb.close()

    asyncio.run(go())


def test_admin_refuses_what_must_not_run(cluster: Path) -> None:
    out = cli("admin", "--state-dir", str(cluster), "contract", "storage:1")
    assert out.returncode == 0, out.stdout
    out = cli("admin", "--state-dir", str(cluster), "contract", "storage:2")
    assert out.returncode == 2 and "replication factor" in out.stdout
    out = cli("admin", "--state-dir", str(cluster), "expand", "storage:9", "5")
    assert out.returncode == 2 and "has it joined" in out.stdout
    bad_token = dict(state(cluster))
    bad_token["admin_token"] = "x" * 32
    (cluster / "cluster.json").write_text(json.dumps(bad_token))
    out = cli("admin", "--state-dir", str(cluster), "status")
    assert out.returncode == 2 and "admin token" in out.stdout


def test_appends_survive_an_expand_and_a_killed_storage_process(cluster: Path) -> None:
    """4 clients append and read for the whole run while the keyspace grows from 4 to 6
    and a SIGKILLed storage process is voted out and replaced; the list-append checker
    finds no anomaly and no acknowledged append is lost.  During the expands operations
    never stop for a second; after the kill, writes to the dead process's ranges wait for
    the supers' vote (ROWA), which comes within the suspicion timeout (3 s)."""
    added = cli("cluster", "add", "--storage", "3", "--state-dir", str(cluster))
    assert added.returncode == 0, added.stderr
    history: list[dict[str, Any]] = []
    completions: list[float] = []
    stop = asyncio.Event()
    phases: dict[str, float] = {}

    def record(process: str, kind: str, value: Any) -> None:
        history.append(
            {"process": process, "type": kind, "f": "txn", "value": value, "index": len(history)}
        )

    async def worker(i: int) -> None:
        rb = await client(cluster, f"client:w{i}")
        n = 0
        while not stop.is_set():
            n += 1
            key = f"k{n % 8}"
            if n % 3:
                value = i * 1_000_000 + n
                record(f"c{i}", "invoke", [["append", key, value]])
                try:
                    await rb.append(key, value)
                    record(f"c{i}", "ok", [["append", key, value]])
                except Exception:
                    record(f"c{i}", "info", [["append", key, value]])
                    continue
            else:
                record(f"c{i}", "invoke", [["r", key, None]])
                try:
                    got = await rb.get(key)
                    record(f"c{i}", "ok", [["r", key, list(got or ())]])
                except Exception:
                    record(f"c{i}", "info", [["r", key, None]])
                    continue
            completions.append(time.monotonic())
        await rb.close()

    async def nemesis() -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(3)
        phases["expand"] = time.monotonic()
        for name, at in (("storage:5", 1_500_000), ("storage:6", 3_500_000)):
            out = await loop.run_in_executor(
                None, cli, "admin", "--state-dir", str(cluster), "expand", name, str(at)
            )
            assert out.returncode == 0, out.stdout + out.stderr
        phases["expanded"] = time.monotonic()
        await asyncio.sleep(2)
        phases["kill"] = time.monotonic()
        pid = json.loads((cluster / "processes.json").read_text())["storage2"]["pid"]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            ring = (await loop.run_in_executor(None, status, cluster))["ring"]
            if any(r["name"] == "storage:2" and r["suspected"] for r in ring):
                break
            await asyncio.sleep(0.2)
        else:
            raise AssertionError("storage:2 was never suspected")
        out = await loop.run_in_executor(
            None, cli, "admin", "--state-dir", str(cluster), "replace", "storage:2", "storage:7"
        )
        assert out.returncode == 0, out.stdout + out.stderr
        await asyncio.sleep(3)
        stop.set()

    async def go() -> None:
        started = time.monotonic()
        workers = [asyncio.ensure_future(worker(i)) for i in range(4)]
        await nemesis()
        await asyncio.gather(*workers)
        rb = await client(cluster, "client:final")
        for k in range(8):
            got = await rb.get(f"k{k}")
            record("final", "invoke", [["r", f"k{k}", None]])
            record("final", "ok", [["r", f"k{k}", list(got or ())]])
        await rb.close()

        def longest_stop(lo: float, hi: float) -> float:
            marks = [lo, *sorted(t for t in completions if lo <= t <= hi), hi]
            return max(b - a for a, b in itertools.pairwise(marks))

        during_expand = longest_stop(phases["expand"], phases["expanded"])
        assert during_expand < 1.0, f"operations stopped for {during_expand:.2f} s in an expand"
        after_kill = longest_stop(phases["kill"], time.monotonic())
        assert after_kill < 3.0 + 2.0, f"operations stopped for {after_kill:.2f} s after a kill"
        assert longest_stop(started, phases["expand"]) < 1.0

    asyncio.run(go())
    s = status(cluster)
    assert [r["name"] for r in s["ring"]] == [
        "storage:1",
        "storage:7",
        "storage:3",
        "storage:4",
        "storage:5",
        "storage:6",
    ]
    result = check(Op.from_json(r) for r in history)
    assert result.valid is True, json.dumps(result.to_json(), indent=1)[:3000]
    assert result.stats["transactions_ok"] > 200
    assert not result.stats["acked_appends_never_read"]
