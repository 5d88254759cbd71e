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
import re
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


async def put_all(d: Path, model: dict[Any, Any], per_write: int) -> None:
    """``model`` written, ``per_write`` keys a write."""
    rb = await connect(d, "client:before")
    items = list(model.items())
    for i in range(0, len(items), per_write):
        await rb.put_many(dict(items[i : i + per_write]))
    await rb.close()


async def connect(d: Path, name: str) -> rbsdk.RubberbandClient:
    """A client named ``name`` under the credential of its role (``client:`` or
    ``maintainer:``)."""
    st = state(d)
    role = name.partition(":")[0]
    return await rbsdk.connect(st["routers"], name, credentials=st[f"{role}_credentials"])


async def scans_equal(d: Path, name: str, model: dict[Any, Any], levels: tuple[str, ...]) -> None:
    """A scan of the whole keyspace at each of ``levels`` (in turn, one client) equals
    ``model``."""
    rb = await connect(d, name)
    try:
        for level in levels:
            got = dict(await rb.scan(None, None, isolation=level))
            assert got == model, (level, len(got), len(model))
    finally:
        await rb.close()


def test_200000_keys_and_20000_rows_come_back_after_a_power_cut_under_load(
    tmp_path: Path,
) -> None:
    """A cluster on ``scan-log`` (tables and key-value data on one log per storage
    process, checkpoints every 2 MiB of log so that several are written, and perhaps
    cut, under the load): 200,000 keys and 20,000 table rows written, some deleted and
    updated by predicate, then writers of both when every process is SIGKILLed.  After
    the restart the ring is as it was, every acknowledged write is there with its value,
    each write in flight whole or not at all, every level answers alike, and the
    cluster takes writes again."""
    from storage_adapters.scan.kv import ScanKVOps

    d = tmp_path / "rb"
    up = (*UP[:-2], "scan-log", "--engine-arg", "checkpoint_mb=2", "--engine-arg",
          "segment_mb=4", "--no-auto-repair", "--state-dir", str(d))  # fmt: skip
    assert UP[-2] == "log"
    kv: dict[int, str] = {}
    rows: dict[int, dict[str, Any]] = {}
    in_flight: list[tuple[str, dict[int, Any]]] = []

    async def client(name: str) -> rbsdk.RubberbandClient:
        st = state(d)
        return await rbsdk.connect(st["routers"], name, ops=ScanKVOps({"t": "k"}),
                                   credentials=st["client_credentials"])  # fmt: skip

    async def fill() -> None:
        rb = await client("client:fill")
        t = await rb.create_table("t", {"k": "int", "g": "int", "s": "str"}, key="k")

        async def keys(w: int) -> None:
            for i in range(w * 2_000, 200_000, 8 * 2_000):
                batch = {k: f"v{k}" for k in range(i, i + 2_000)}
                await rb.put_many(batch)
                kv.update(batch)

        async def table(w: int) -> None:
            for i in range(w * 1_000, 20_000, 4 * 1_000):
                batch = [{"k": k, "g": k % 7, "s": f"r{k}"} for k in range(i, i + 1_000)]
                await t.upsert(batch)
                rows.update({r["k"]: r for r in batch})

        await asyncio.gather(*(keys(w) for w in range(8)), *(table(w) for w in range(4)))
        gone = random.Random(3).sample(sorted(kv), 500)
        await rb.write(("delete", tuple(gone)))
        for k in gone:
            del kv[k]
        await t.delete([("k", "<", 100)])
        await t.update([("g", "=", 3)], {"s": "updated"})
        for k in list(rows):
            if k < 100:
                del rows[k]
            elif rows[k]["g"] == 3:
                rows[k] = {**rows[k], "s": "updated"}
        await rb.close()

    async def load_then_cut() -> None:
        rb = await client("client:load")
        t = rb.table("t", key="k")

        async def writer(w: int) -> None:
            for i in range(1_000_000):
                n = 200_000 + (i * 16 + w) * 4
                if w % 2:
                    batch = {(n + j) * 7919 % 1_000_003 + 300_000: f"{w}-{i}" for j in range(4)}
                    in_flight.append(("kv", batch))
                    await rb.put_many(batch)
                    kv.update(batch)
                else:
                    batch = {n + j: {"k": n + j, "g": w, "s": f"{w}-{i}"} for j in range(4)}
                    in_flight.append(("rows", batch))
                    await t.upsert(list(batch.values()))
                    rows.update(batch)
                in_flight.pop(next(j for j, (_, b) in enumerate(in_flight) if b is batch))

        tasks = [asyncio.ensure_future(writer(w)) for w in range(16)]
        await asyncio.sleep(2.5)
        power_cut(d)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    first = cli(*up)
    try:
        assert first.returncode == 0, first.stdout + first.stderr
        asyncio.run(fill())
        ring = [(r["name"], r["id"]) for r in status(d)["ring"]]
        asyncio.run(load_then_cut())
        assert len(kv) > 199_000 and len(rows) > 19_900 and in_flight, (len(kv), len(rows))
        again = cli(*up)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "restored" in again.stdout, again.stdout
        assert [(r["name"], r["id"]) for r in status(d)["ring"]] == ring
        asyncio.run(_check_keys_and_rows(client, kv, rows, in_flight))
    finally:
        cli("cluster", "down", "--state-dir", str(d))


async def _check_keys_and_rows(
    client: Any, kv: dict[int, str], rows: dict[int, Any], in_flight: list[Any]
) -> None:
    rb = await client("client:after")
    t = rb.table("t", key="k")
    levels = ("sequential", "snapshot", "basic", "sequential")
    got_kv = [dict(await rb.scan(None, None, isolation=level)) for level in levels]
    got_rows = [{r["k"]: r for r in await t.select(isolation=level)} for level in levels]
    assert all(g == got_kv[0] for g in got_kv) and all(g == got_rows[0] for g in got_rows)
    got, table = got_kv[0], got_rows[0]
    assert {k: got.get(k) for k in kv} == kv  # every acknowledged write
    assert {k: table.get(k) for k in rows} == rows
    for kind, batch in in_flight:  # whole or not at all
        seen = got if kind == "kv" else table
        there = [k for k in batch if seen.get(k) == batch[k]]
        assert len(there) in (0, len(batch)), batch
    assert set(got) <= set(kv).union(*(b for kind, b in in_flight if kind == "kv"))
    assert set(table) <= set(rows).union(*(b for kind, b in in_flight if kind == "rows"))
    await rb.put(-1, "after")  # and the cluster takes writes again
    await t.upsert([{"k": -1, "g": 0, "s": "after"}])
    assert await rb.get(-1) == "after" and len(await t.select([("k", "=", -1)])) == 1
    await rb.close()


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

    levels = ("sequential", "sequential", "sequential", "snapshot", "basic")
    asyncio.run(scans_equal(d, "client:after", model, levels))


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
    # Brought level by the coordinating super: the one write its replicas had.
    assert "'storage:1': 1" in again.stdout, again.stdout

    levels = ("sequential", "sequential", "sequential", "basic")
    asyncio.run(scans_equal(d, "client:b", {i: f"v{i}" for i in range(200)}, levels))
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

    asyncio.run(put_all(d, model, 2_000))
    power_cut(d)
    shutil.rmtree(d / "data" / "storage2")
    again = cli(*UP, "--state-dir", str(d))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "storage [2] are gone" in again.stdout, again.stdout
    st = status(d)
    assert "storage:5" in st["standby"], st

    async def check(name: str) -> None:
        await scans_equal(d, name, model, ("sequential",) * 3 + ("snapshot", "basic"))
        rb = await connect(d, name)
        await rb.put(1, "after")
        model[1] = "after"
        await rb.close()

    asyncio.run(check("client:after"))
    out = cli("admin", "--state-dir", str(d), "replace", "storage:2", "storage:5")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "storage:5" in [r["name"] for r in status(d)["ring"]]
    asyncio.run(check("client:replaced"))


def test_holders_restarted_under_new_names_come_back_with_their_data(cluster: Path) -> None:
    """The deploys restart every process under a new name (``--unique-name``): each
    storage process says whose data it kept, the coordinating super brings them level
    under their new names (one holder's last write torn, so it is given that write) and
    restores the recorded ring onto them; a second restart finds them under those
    names."""
    d = cluster
    model = {k: f"v{k}" for k in range(0, 3_000, 3)}

    async def write() -> None:
        await put_all(d, model, 500)
        rb = await connect(d, "client:last")
        for k in range(5):  # one write a batch: the last is the one torn below
            await rb.put(10_000 + k, "last")
            model[10_000 + k] = "last"
        await rb.close()

    asyncio.run(write())
    ring = status(d)["ring"]
    power_cut(d)
    seg = sorted((d / "data" / "storage1").glob("log-*.seg"))[-1]
    os.truncate(seg, seg.stat().st_size - 20)  # its last batch, cut short
    again = cli(*UP, "--new-names", "--state-dir", str(d))
    assert again.returncode == 0, again.stdout + again.stderr
    assert re.search(r"'storage:\d+': 1\b", again.stdout), again.stdout  # levelled
    now = status(d)["ring"]
    assert [r["id"] for r in now] == [r["id"] for r in ring]
    assert not {r["name"] for r in now} & {r["name"] for r in ring}  # every name new
    levels = ("sequential", "basic", "basic", "basic", "snapshot")
    asyncio.run(scans_equal(d, "client:after", model, levels))
    power_cut(d)
    again = cli(*UP, "--state-dir", str(d))
    assert again.returncode == 0, again.stdout + again.stderr
    assert [(r["name"], r["id"]) for r in status(d)["ring"]] == [(r["name"], r["id"]) for r in now]
    asyncio.run(scans_equal(d, "client:after", model, levels))


def test_a_cluster_in_memory_starts_anew_in_its_directory(tmp_path: Path) -> None:
    """Its supers recorded the ring too, but its data died with it: `cluster up` again on
    the directory starts a new cluster (the supers would otherwise wait to restore the
    old ring and refuse to place the new storage processes)."""
    d = tmp_path / "rb"
    up = ("cluster", "up", "--routers", "1", "--supers", "1", "--storage", "3",
          "--state-dir", str(d))  # fmt: skip
    for _ in range(2):
        out = cli(*up)
        try:
            assert out.returncode == 0, out.stdout + out.stderr
            assert len(status(d)["ring"]) == 3
        finally:
            cli("cluster", "down", "--state-dir", str(d))


def test_views_feeds_and_positions_carry_on_across_a_power_cut(cluster: Path) -> None:
    """Positions keep rising across a restart of the whole cluster (the new group numbers
    from the clock), so what holds a position from before the cut stays meaningful: a
    view's maintainer restarted from its old progress finds the feed compacted and
    rebuilds from a snapshot instead of skipping the new group's first writes; a view
    read at any level reports a position the base had, and a sequential read after
    the restart is the view of the base at its position; a feed asked from before the
    cut says it was compacted instead of going on with a gap."""
    from rubberband.checkers.views import ViewRead, check_view_reads
    from rubberband.errors import Compacted
    from rubberband.views import view_def
    from tests.integration.test_views import _maintainer

    d = cluster
    view = view_def("by_g", "index", (0, 200), on="g", columns=["n"])
    spec = {k: v for k, v in view.to_dict().items() if k not in ("name", "kind", "source")}

    async def before() -> tuple[int, list[Any]]:
        rb = await connect(d, "maintainer:before")  # (it defines the view)
        await rb.put_many({k: {"g": "ab"[k % 2], "n": k} for k in range(200)})
        await rb.create_view(view.name, view.source, view.kind, **spec)
        seen = []
        for i in range(20):  # the view follows the writes
            await rb.put_many({k: {"g": "c", "n": -k} for k in range(i, 200, 20)})
            seen.append(await rb.view(view.name).scan(level="sequential", with_position=True))
        _, last = await rb.read(("scan", 0, 200), with_position=True)
        await rb.close()
        return last, seen

    maintainer = _maintainer(d, d / "maintainer.log")
    try:
        last, seen = asyncio.run(before())
        power_cut(d)
    finally:
        maintainer.kill()
        maintainer.wait()
    assert {r[0][0][0] for r in seen[-1][0]} == {"c"}, "the view followed the writes"
    again = cli(*UP, "--state-dir", str(d))
    assert again.returncode == 0, again.stdout + again.stderr

    async def after() -> None:
        rb = await connect(d, "client:after")
        # Before any maintainer: the view as of a position before the cut, said so
        # (the maintainer's last page may have come after the last read above).
        _, old = await rb.view(view.name).scan(level="any", with_position=True)
        with pytest.raises(Compacted) as cut:
            await rb.changes(last, 0, 200)
        assert cut.value.position > last
        await rb.put_many({k: {"g": "d", "n": k} for k in range(0, 200, 3)})
        base, start = await rb.read(("scan", 0, 200), with_position=True)
        assert start > max(last, old) and cut.value.position > old, (start, last, old)
        m = _maintainer(d, d / "maintainer.log")
        try:
            rows, at = await asyncio.wait_for(
                rb.view(view.name).scan(level="sequential", with_position=True), 120
            )
        finally:
            m.kill()
            m.wait()
        await rb.close()
        assert at >= start
        assert {r[0][0] for r in rows} == {"c", "d"}, "the writes after the restart are in it"
        problems = check_view_reads(view, (dict(base), start), [], [ViewRead(at, rows)])
        assert not problems, problems[:3]

    asyncio.run(after())


def test_a_restart_whose_positions_would_repeat_waits_and_a_clock_restart_recovers(
    cluster: Path,
) -> None:
    """Routers started with an origin below the positions the holders hold (a clock set
    back, a wrong flag): the ring is not restored, rather than give two writes one
    position, the holders wait with their data, and ``cluster up`` says why; the next
    restart, from the clock, brings every write back."""
    d = cluster
    model = {k: f"v{k}" for k in range(300)}
    asyncio.run(put_all(d, model, 50))
    power_cut(d)
    low = cli(*UP, "--router-arg=--origin=0", "--timeout", "20", "--state-dir", str(d))
    assert low.returncode == 1, low.stdout + low.stderr
    assert "not restored" in low.stderr and "--origin above" in low.stderr, low.stderr
    power_cut(d)
    again = cli(*UP, "--state-dir", str(d))
    assert again.returncode == 0, again.stdout + again.stderr
    asyncio.run(scans_equal(d, "client:after", model, ("sequential", "snapshot")))
