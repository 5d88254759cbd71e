"""The whole cluster restarts from its disks: every process SIGKILLed at once, then
``rubberband cluster up`` on the same state directory brings back a new E-Cast group,
the supers put the recorded ring back, and the storage processes rejoin with their
data (the durable log engine)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import rubberband.sdk as rbsdk
from ecast import local
from tests.integration.test_rubberband import cli, state, status

UP = ("cluster", "up", "--routers", "3", "--supers", "1", "--storage", "4", "--engine", "log",
      "--no-auto-repair")  # fmt: skip


def power_cut(d: Path) -> None:
    """SIGKILL every process of the cluster at once, and wait until they are gone."""
    pids = [e["pid"] for e in json.loads((d / "processes.json").read_text()).values()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    while any(local.running(pid) for pid in pids):
        time.sleep(0.02)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Path]:
    """A cluster on the log engine in ``tmp_path / "rb"``, taken down at the end."""
    d = tmp_path / "rb"
    up = cli(*UP, "--state-dir", str(d))
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield d
    finally:
        cli("cluster", "down", "--state-dir", str(d))


async def connect(d: Path, name: str) -> rbsdk.RubberbandClient:
    st = state(d)
    return await rbsdk.connect(st["routers"], name, credentials=st["client_credentials"])


def test_a_quiet_cluster_restarts_with_every_write_and_its_ring(cluster: Path) -> None:
    d = cluster
    rng = random.Random(3)
    model: dict[int, str] = {}

    async def write() -> None:
        rb = await connect(d, "client:before")
        for i in range(0, 20_000, 1_000):
            batch = {k: f"v{k}" for k in range(i, i + 1_000)}
            await rb.put_many(batch)
            model.update(batch)
        gone = rng.sample(sorted(model), 500)
        await rb.write(("delete", tuple(gone)))
        for k in gone:
            del model[k]
        await rb.put(7, {"n": 7})
        model[7] = {"n": 7}  # type: ignore[assignment]
        await rb.close()

    asyncio.run(write())
    ring = [(r["name"], r["id"]) for r in status(d)["ring"]]
    power_cut(d)
    again = cli(*UP, "--state-dir", str(d))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "restored" in again.stdout, again.stdout
    assert [(r["name"], r["id"]) for r in status(d)["ring"]] == ring

    async def check() -> None:
        rb = await connect(d, "client:after")
        for level in ("sequential", "snapshot", "basic", "sequential", "sequential"):
            got = dict(await rb.scan(None, None, isolation=level))
            assert got == model, (level, len(got), len(model))
        await rb.put(20_001, "after")  # and the cluster takes writes again
        assert await rb.get(20_001) == "after"
        await rb.close()

    asyncio.run(check())


def test_a_cluster_cut_under_load_restarts_level_with_every_acknowledged_write(
    cluster: Path,
) -> None:
    """Writers of multi-key puts (keys all over the ring) when every process is SIGKILLed:
    after the restart every acknowledged write is there; each write in flight is there
    whole or not at all; and every replica answers the same."""
    d = cluster
    acked: dict[int, str] = {}
    in_flight: list[dict[int, str]] = []

    async def load() -> None:
        rb = await connect(d, "client:load")

        async def writer(w: int) -> None:
            for i in range(1_000_000):
                # Each key once, four spread over the ring (a bijection mod a prime).
                n = (i * 32 + w) * 4
                batch = {(n + j) * 7919 % 1_000_003: f"{w}-{i}" for j in range(4)}
                in_flight.append(batch)
                await rb.put_many(batch)
                in_flight.remove(batch)
                acked.update(batch)

        tasks = [asyncio.ensure_future(writer(w)) for w in range(32)]
        await asyncio.sleep(3.0)
        power_cut(d)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(load())
    assert len(acked) > 1_000 and in_flight, (len(acked), len(in_flight))
    again = cli(*UP, "--state-dir", str(d))
    assert again.returncode == 0, again.stdout + again.stderr

    async def check() -> None:
        rb = await connect(d, "client:after")
        seen = []
        for level in ("sequential", "sequential", "sequential", "basic", "snapshot"):
            seen.append(dict(await rb.scan(None, None, isolation=level)))
        await rb.close()
        got = seen[0]
        assert all(s == got for s in seen), "replicas answer differently"
        assert {k: got.get(k) for k in acked} == acked  # every acknowledged write
        for batch in in_flight:  # whole or not at all
            there = [k for k in batch if got.get(k) == batch[k]]
            assert len(there) in (0, len(batch)), batch
        expected = set(acked).union(*in_flight)
        assert set(got) <= expected

    asyncio.run(check())


def test_a_cluster_cut_in_the_middle_of_a_migration_restarts_with_its_data(
    cluster: Path,
) -> None:
    """Every process SIGKILLed while a new holder receives its ranges: after the restart
    that holder is back incomplete (its copy never finished), reads avoid it, and every
    acknowledged write reads back at every level."""
    d = cluster
    assert cli("cluster", "add", "--storage", "1", "--state-dir", str(d)).returncode == 0
    model: dict[int, str] = {}

    async def fill_then_cut() -> None:
        rb = await connect(d, "client:fill")
        for i in range(0, 60_000, 2_000):
            batch = {k: "x" * 200 + str(k) for k in range(i, i + 2_000)}
            await rb.put_many(batch)
            model.update(batch)
        await rb.close()
        loop = asyncio.get_running_loop()
        expand = loop.run_in_executor(
            None, cli, "admin", "--state-dir", str(d), "expand", "storage:5", "30000"
        )
        await asyncio.sleep(0.4)  # the copy to storage:5 under way
        power_cut(d)
        await expand

    asyncio.run(fill_then_cut())
    again = cli(*UP, "--state-dir", str(d))
    assert again.returncode == 0, again.stdout + again.stderr

    async def check() -> None:
        rb = await connect(d, "client:after")
        for level in ("sequential", "sequential", "sequential", "snapshot", "basic"):
            got = dict(await rb.scan(None, None, isolation=level))
            assert got == model, (level, len(got), len(model))
        await rb.close()

    asyncio.run(check())


def test_a_restart_cuts_a_torn_tail_and_refuses_a_damaged_log(cluster: Path) -> None:
    """After the power cut, one holder's last write is torn (its log truncated in the
    middle of a record): the restart cuts it and levels that holder from the others.
    Then a flipped byte in the middle of a log: the restart refuses, naming the file."""
    d = cluster

    async def write(name: str, keys: range) -> None:
        rb = await connect(d, name)
        for i in keys:
            await rb.put(i, f"v{i}")
        await rb.close()

    asyncio.run(write("client:a", range(200)))
    power_cut(d)
    seg = sorted((d / "data" / "storage1").glob("log-*.seg"))[-1]
    os.truncate(seg, seg.stat().st_size - 20)  # the last batch, cut short
    again = cli(*UP, "--state-dir", str(d))
    assert again.returncode == 0, again.stdout + again.stderr

    async def check() -> None:
        rb = await connect(d, "client:b")
        for level in ("sequential", "sequential", "sequential", "basic"):
            got = dict(await rb.scan(None, None, isolation=level))
            assert got == {i: f"v{i}" for i in range(200)}, level
        await rb.close()

    asyncio.run(check())
    power_cut(d)
    seg = sorted((d / "data" / "storage2").glob("log-*.seg"))[0]
    data = bytearray(seg.read_bytes())
    data[len(data) // 3] ^= 0x10
    seg.write_bytes(bytes(data))
    refused = cli(*UP, "--state-dir", str(d))
    assert refused.returncode != 0
    assert "storage2/log-" in refused.stderr and "damaged record" in refused.stderr, refused


def test_a_restart_with_a_holders_disk_gone_restarts_without_it(cluster: Path) -> None:
    """After the power cut, one holder's data directory is gone: the cluster restarts on
    the other holders (every range still has two copies), that holder stays off the
    ring's reads and writes, a standby is started, and replacing the lost holder with it
    copies its ranges from the others."""
    d = cluster
    model = {k: f"v{k}" for k in range(0, 30_000, 3)}

    async def write() -> None:
        rb = await connect(d, "client:before")
        items = list(model.items())
        for i in range(0, len(items), 2_000):
            await rb.put_many(dict(items[i : i + 2_000]))
        await rb.close()

    asyncio.run(write())
    power_cut(d)
    shutil.rmtree(d / "data" / "storage2")
    again = cli(*UP, "--state-dir", str(d))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "storage [2] are gone" in again.stdout, again.stdout
    st = status(d)
    assert "storage:5" in st["standby"], st

    async def check(name: str) -> None:
        rb = await connect(d, name)
        for level in ("sequential", "sequential", "sequential", "snapshot", "basic"):
            got = dict(await rb.scan(None, None, isolation=level))
            assert got == model, (level, len(got), len(model))
        await rb.put(1, "after")
        model[1] = "after"
        await rb.close()

    asyncio.run(check("client:after"))
    out = cli("admin", "--state-dir", str(d), "replace", "storage:2", "storage:5")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "storage:5" in [r["name"] for r in status(d)["ring"]]
    asyncio.run(check("client:replaced"))
