"""The scan, Memcached and durable log engines on real daemons: a cluster that grows
from one storage process to four under load, loses one to SIGKILL and replaces it, then
reads back every row and key, at every level and from every replica, equal to a
reference model."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import rubberband.sdk as rbsdk
from ecast import local
from rubberband import BadOperation
from rubberband.client import Rejected
from tests.integration.test_rubberband import cli, kill_and_replace, state, status

KEYS = 1_000_000


@pytest.fixture
def engine_cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    d = tmp_path / "rb"
    engine = request.param
    up = cli(
        "cluster", "up", "--routers", "3", "--supers", "1", "--storage", "1",
        "--engine", engine, "--no-auto-repair", "--state-dir", str(d),
    )  # fmt: skip
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        added = cli("cluster", "add", "--storage", "4", "--state-dir", str(d))
        assert added.returncode == 0, added.stdout + added.stderr
        yield engine, d
    finally:
        cli("cluster", "down", "--state-dir", str(d))


class Workload:
    """Writes of unique keys, overwrites and deletes of acknowledged ones, in one client
    session: what was acknowledged is the reference; what failed without an answer may
    or may not have landed, and is left out of the comparison."""

    def __init__(self, engine: str, rb: rbsdk.RubberbandClient) -> None:
        self.engine = engine
        self.rb = rb
        self.model: dict[int, str] = {}
        self.unsure: set[int] = set()
        self.rng = random.Random(7)
        if engine == "scan":
            self.t = rb.table("t", key="k")

    async def setup(self) -> None:
        if self.engine == "scan":
            await self.rb.create_table("t", {"k": "int", "v": "str", "n": "int"}, key="k")

    async def step(self, i: int) -> None:
        roll = self.rng.random()
        if roll < 0.15 and self.model:
            keys = self.rng.sample(sorted(self.model), min(3, len(self.model)))
            await self._do(keys, None)
        elif roll < 0.35 and self.model:
            keys = self.rng.sample(sorted(self.model), min(5, len(self.model)))
            await self._do(keys, f"again{i}")
        else:
            keys = []
            while len(keys) < 20:
                k = self.rng.randrange(KEYS)
                if k not in self.model and k not in self.unsure and k not in keys:
                    keys.append(k)
            await self._do(keys, f"v{i}")

    async def _do(self, keys: list[int], value: str | None) -> None:
        try:
            if self.engine == "scan":
                if value is None:
                    await self.t.delete([("k", "in", keys)])
                else:
                    await self.t.upsert([{"k": k, "v": value, "n": k % 97} for k in keys])
            elif value is None:
                await self.rb.write(("delete", tuple(keys)))
            else:
                await self.rb.put_many({k: value for k in keys})
        except (rbsdk.Unavailable, rbsdk.Indeterminate, TimeoutError) as e:
            self.unsure.update(keys)
            for k in keys:
                self.model.pop(k, None)
            print("unsure:", type(e).__name__, e)
            return
        for k in keys:
            if value is None:
                self.model.pop(k, None)
            else:
                self.model[k] = value

    async def read_all(self, isolation: str) -> dict[int, str]:
        if self.engine == "scan":
            rows = await self.t.select(columns=["k", "v", "n"], isolation=isolation)
            assert all(r["n"] == r["k"] % 97 for r in rows)
            return {r["k"]: r["v"] for r in rows}
        return dict(await self.rb.scan(None, None, isolation=isolation))

    def check(self, got: dict[int, str], what: str) -> None:
        sure = {k: v for k, v in got.items() if k not in self.unsure}
        assert sure == self.model, f"{what}: {len(sure)} rows against {len(self.model)}"


def _engine_items(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith('rubberband_engine{stat="items"}'):
                return int(float(line.split()[-1]))
    raise AssertionError("no items figure in /metrics")


@pytest.mark.parametrize("engine_cluster", ["scan", "memcached", "log"], indirect=True)
def test_an_engine_grows_from_one_to_four_loses_one_and_reads_back_everywhere(
    engine_cluster: tuple[str, Path],
) -> None:
    engine, d = engine_cluster
    st = state(d)
    ops = "storage_adapters.scan:ScanOps" if engine == "scan" else None
    loop_errors: list[BaseException] = []

    async def go() -> Workload:
        rb = await rbsdk.connect(
            st["routers"], "client:load", ops=ops, credentials=st["client_credentials"]
        )
        w = Workload(engine, rb)
        await w.setup()
        if engine == "memcached":
            # A value near the limit is copied whole when its holder is replaced; one
            # over it is refused at the call, never acknowledged and then dropped.
            w.model[KEYS] = "B" * 900_000
            await rb.put(KEYS, w.model[KEYS])
            with pytest.raises(BadOperation, match="over the key-value limit"):
                await rb.put(KEYS + 1, b"x" * 2_000_000)
        stop = asyncio.Event()

        async def load() -> None:
            i = 0
            while not stop.is_set():
                i += 1
                await w.step(i)

        async def nemesis() -> None:
            loop = asyncio.get_running_loop()
            await asyncio.sleep(2)
            for name, at in (
                ("storage:2", 250_000),
                ("storage:3", 500_000),
                ("storage:4", 750_000),
            ):
                out = await loop.run_in_executor(
                    None, cli, "admin", "--state-dir", str(d), "expand", name, str(at)
                )
                assert out.returncode == 0, out.stdout + out.stderr
                await asyncio.sleep(1)
            await kill_and_replace(d, 2, 5)
            await asyncio.sleep(2)
            stop.set()

        task = asyncio.ensure_future(load())
        try:
            await nemesis()
        finally:
            stop.set()
            try:
                await task
            except BaseException as e:  # report after the reads
                loop_errors.append(e)
        # Each read's replica offset turns: three reads in a row ask every replica of
        # every range (replication 3).
        for level in ("sequential", "sequential", "sequential", "snapshot", "basic", "basic"):
            w.check(await w.read_all(level), level)
        if engine == "scan":
            # The table surface: a count agrees, and an insert of a key that exists is
            # rejected at the call (every holder refuses it alike).
            counted = await w.t.select(agg=("count", "*"))
            assert len(w.model) <= counted["count(*)"] <= len(w.model) + len(w.unsure)
            taken = next(iter(w.model))
            with pytest.raises(Rejected):
                await w.t.insert([{"k": taken, "v": "twice", "n": taken % 97}])
            # Key predicates that contradict each other match nothing: answered as SQL
            # answers them (no rows, a count of 0, zero rows changed), never refused.
            for where in ([("k", "=", 1), ("k", "=", 2)], [("k", "<", 18934), ("k", ">", 58621)]):
                for level in ("sequential", "snapshot", "basic"):
                    assert await w.t.select(where, isolation=level) == []
                    got = await w.t.select(where, agg=("count", "*"), isolation=level)
                    assert got == {"count(*)": 0}
                await w.t.update(where, {"v": "never"})
                await w.t.delete(where)
            w.check(await w.read_all("sequential"), "after writes that match nothing")
        else:
            assert await rb.get(KEYS + 1) is None
            # More keys than one header may name (4,096 ranges): one atomic put_many of
            # 5,000 keys, read back by one get, and the keys are gone after one delete.
            free = [k for k in range(0, KEYS, 150) if k not in w.model and k not in w.unsure]
            many = {k: f"many{k}" for k in free[:5000]}  # over every segment of the ring
            assert len(many) == 5000
            await rb.put_many(many)
            assert await rb.get_many(list(many)) == many
            await rb.write(("delete", tuple(many)))
            assert await rb.get_many(list(many)) == {}
        await rb.close()
        return w

    w = asyncio.run(go())
    assert not loop_errors, loop_errors
    assert len(w.model) > 300, len(w.model)
    s = status(d)
    ring = [r["name"] for r in s["ring"]]
    assert ring == ["storage:1", "storage:5", "storage:3", "storage:4"], ring
    # Every key is held by exactly three replicas, and nothing else is left behind.
    ports = state(d)["storage"]
    held = sum(_engine_items(ports[name]) for name in ring)
    expected = 3 * len(w.model)
    assert expected <= held <= 3 * (len(w.model) + len(w.unsure)), (held, expected)
    if engine == "log":  # each holder wrote its data to a log of its own, synced
        for n in (1, 3, 4, 5):
            assert list((d / "data" / f"storage{n}").glob("log-*.seg")), n
    if engine == "memcached":
        # Each live storage process drives its own server; the killed one's died with it.
        # Only this cluster's servers count: tests beside this one run their own.
        pids = json.loads((d / "processes.json").read_text())
        live = {pids[f"storage{n}"]["pid"] for n in (1, 3, 4, 5)}
        idle = {pids["storage6"]["pid"]} if "storage6" in pids else set()
        ours = {entry["pid"] for name, entry in pids.items() if name.startswith("storage")}
        servers = {p: o for p, o in _memcached_servers().items() if o[0] in ours}
        assert live <= {parent for _, parent in servers.values()}, (live, servers)
        orphans = {p: o for p, o in servers.items() if o[1] != o[0] or o[0] not in live | idle}
        assert not orphans, f"memcached servers left behind (pid: owner, parent): {orphans}"


def _memcached_servers() -> dict[int, tuple[int, int]]:
    """pid -> (the storage process that started it, its parent now) of every memcached
    started the way the engine starts it: its socket's directory names its starter."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if not (cmd and cmd[0].endswith(b"memcached") and b"-M" in cmd):
            continue
        for arg in cmd:
            _, marker, rest = arg.partition(b"/rb-memcached-")
            owner = rest.split(b"-", 1)[0]
            if marker and owner.isdigit():
                out[int(entry)] = (int(owner), int(stat.rsplit(")", 1)[1].split()[1]))
    return out


def test_a_replacement_whose_engine_fails_is_replaced_in_turn(tmp_path: Path) -> None:
    """The first standby a super picks to repair a killed holder cannot store (its
    memcached server is gone): it stops and parts, its peers end their transfers with
    it, and the super repairs again with the next standby; the reconfiguration never
    stays pending, and every key reads back from the ring it ends with."""
    d = tmp_path / "rb"
    up = cli("cluster", "up", "--storage", "4", "--engine", "memcached", "--state-dir", str(d))
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        added = cli("cluster", "add", "--storage", "2", "--state-dir", str(d))
        assert added.returncode == 0, added.stdout + added.stderr
        procs = json.loads((d / "processes.json").read_text())
        children = Path(f"/proc/{procs['storage5']['pid']}/task").glob("*/children")
        server = [int(p) for f in children for p in f.read_text().split()]
        assert len(server) == 1, server  # storage:5's own memcached
        os.kill(server[0], signal.SIGKILL)
        st = state(d)

        async def go() -> None:
            rb = await rbsdk.connect(
                st["routers"], "client:repairs", credentials=st["client_credentials"]
            )
            try:
                await rb.put_many({k: f"v{k}" for k in range(0, 1_000_000, 500)})
                os.kill(procs["storage2"]["pid"], signal.SIGKILL)
                loop = asyncio.get_running_loop()
                deadline = time.monotonic() + 40
                while True:
                    s = await loop.run_in_executor(None, status, d)
                    ring = [r["name"] for r in s["ring"]]
                    if not s["pending"] and ring == [
                        "storage:1", "storage:6", "storage:3", "storage:4"
                    ] and not any(r["suspected"] for r in s["ring"]):  # fmt: skip
                        break
                    assert time.monotonic() < deadline, s
                    await asyncio.sleep(0.5)
                keys = list(range(0, 1_000_000, 500))
                for level in ("sequential", "snapshot", "basic"):
                    try:
                        got = await rb.get_many(keys, isolation=level)
                    except Exception as e:
                        s = await loop.run_in_executor(None, status, d)
                        ep = rb.ecast.endpoint
                        raise AssertionError(
                            f"{level}: {e!r}; client {rb.core.counts} "
                            f"endpoint {ep.stats if ep else None}; status {s}"
                        ) from e
                    assert got == {k: f"v{k}" for k in keys}, level
            finally:
                await rb.close()

        asyncio.run(go())
        log = (d / "storage5.log").read_text()
        assert "event=stopped reason=engine_failed_to_receive" in log
    finally:
        cli("cluster", "down", "--state-dir", str(d))


def test_an_acknowledged_write_is_on_disk_at_every_replica_when_every_holder_dies(
    tmp_path: Path,
) -> None:
    """The log engine confirms a delivery to E-Cast only once its batch is written, so a
    write is acknowledged only when all three replicas have it in their logs: SIGKILL
    every storage process at once under load, open each one's log offline, and find
    every acknowledged write three times."""
    d = tmp_path / "rb"
    up = cli(
        "cluster", "up", "--routers", "3", "--supers", "1", "--storage", "4",
        "--engine", "log", "--no-auto-repair", "--state-dir", str(d),
    )  # fmt: skip
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        st = state(d)
        acked: set[int] = set()

        async def go() -> None:
            rb = await rbsdk.connect(
                st["routers"], "client:load", credentials=st["client_credentials"],
                answer_timeout=5.0,
            )  # fmt: skip

            async def writer(w: int) -> None:
                for i in range(1_000_000):
                    key = w * 1_000_000 + i
                    await rb.put(key, f"v{key}")
                    acked.add(key)

            tasks = [asyncio.ensure_future(writer(w)) for w in range(48)]
            await asyncio.sleep(3.0)
            pids = json.loads((d / "processes.json").read_text())
            for n in range(1, 5):  # every holder at once, writes in flight
                os.kill(pids[f"storage{n}"]["pid"], signal.SIGKILL)
            while any(local.running(pids[f"storage{n}"]["pid"]) for n in range(1, 5)):
                await asyncio.sleep(0.02)  # gone, and their logs' locks with them
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(rb.close(), 5)

        asyncio.run(go())
        assert len(acked) > 1_000, len(acked)
        from storage_adapters.log import LogEngine

        copies: dict[int, int] = {}
        for n in range(1, 5):
            e = LogEngine(path=str(d / "data" / f"storage{n}"))
            for k, v in e.items():
                if type(k) is int:
                    assert v == f"v{k}", (n, k, v)
                    copies[k] = copies.get(k, 0) + 1
            e.close()
        short = sorted(k for k in acked if copies.get(k, 0) < 3)
        assert not short, f"{len(short)} of {len(acked)} acked writes on < 3 disks: {short[:9]}"
    finally:
        cli("cluster", "down", "--state-dir", str(d))
