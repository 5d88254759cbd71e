"""A change feed against real daemons: followed through a leader kill, a storage kill
(repaired by the supers) and an expand, it delivers every acknowledged write exactly
once, in the total order, and a multi-key write as one event; a table's feed (the
``scan-memory`` engine) gives every row change with images that chain without a gap."""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any

import pytest

import rubberband as rbsdk
from rubberband.tools.cli import run as cli
from storage_adapters.scan.kv import ScanKVOps
from tests.integration.test_rubberband_scenarios import (  # the same cluster as there
    _client,
    _kill_leader,
    _kill_until_replaced,
    _off,
    _status,
    cluster,  # noqa: F401  (a fixture: 4 storage processes on the ring, 2 standing by)
)

KEYS = 40
DONE = "zz-done"


@pytest.fixture
def rb_dir(cluster: Path) -> Path:  # noqa: F811
    return cluster


class Writers:
    """Clients putting unique values (sometimes two keys in one write); what was
    acknowledged and what may have applied (a write that raised)."""

    def __init__(self, d: Path) -> None:
        self.d = d
        self.acked: list[tuple[tuple[str, Any], ...]] = []
        self.unsure: list[tuple[tuple[str, Any], ...]] = []
        self.stop = asyncio.Event()

    async def run(self, i: int) -> None:
        rb = await _client(self.d, f"client:writer{i}")
        n = 0
        try:
            while not self.stop.is_set():
                n += 1
                items = {f"k{(n * 7 + i) % KEYS:02d}": f"w{i}-{n}"}
                if n % 5 == 0:
                    items[f"k{(n * 13 + i + 1) % KEYS:02d}"] = f"w{i}-{n}"
                write = tuple(sorted(items.items()))
                try:
                    await rb.put_many(items)
                except Exception:
                    self.unsure.append(write)
                    await asyncio.sleep(0.05)
                    continue
                self.acked.append(write)
        finally:
            await rb.close()


async def faults(rb_dir: Path, at: str = "k25") -> None:
    """The leading router SIGKILLed, a storage process SIGKILLed (the supers replace
    it), and a standby expanded into the ring at key ``at``."""
    await asyncio.sleep(2)
    await _kill_leader(rb_dir)
    await asyncio.sleep(3)
    await _kill_until_replaced(rb_dir)
    await asyncio.sleep(1)
    standby = (await _off(_status, rb_dir))["standby"][0]
    out = await _off(cli, "admin", "--state-dir", str(rb_dir), "expand", standby, at)
    assert out.returncode == 0, out.stdout + out.stderr
    await asyncio.sleep(2)


def test_a_feed_followed_through_a_leader_kill_a_storage_kill_and_an_expand(
    rb_dir: Path,
) -> None:
    events: list[Any] = []

    async def follow(start: int) -> None:
        rb = await _client(rb_dir, "client:watcher")
        try:
            async for event in rb.watch(since=start):
                events.append(event)
                if any(key == DONE for key, _, _ in event.changes):
                    return
        finally:
            await rb.close()

    async def go() -> tuple[Writers, dict[str, Any]]:
        rb = await _client(rb_dir, "client:setup")
        # A read's position: the feed goes on exactly after what the read saw.
        seen, start = await rb.read(("get", ("k00",)), with_position=True)
        assert seen == {} and type(start) is int
        w = Writers(rb_dir)
        watcher = asyncio.ensure_future(follow(start))
        writers = [asyncio.ensure_future(w.run(i)) for i in range(2)]
        try:
            await faults(rb_dir)
        finally:
            w.stop.set()
            await asyncio.gather(*writers)
        await rb.put(DONE, 1)
        await asyncio.wait_for(watcher, 60)
        revised = await rb.get_revisions([f"k{i:02d}" for i in range(KEYS)])
        await rb.close()
        return w, revised

    t0 = time.monotonic()
    w, revised = asyncio.run(go())
    assert len(w.acked) > 200, (len(w.acked), time.monotonic() - t0)
    positions = [e.position for e in events]
    assert positions == sorted(set(positions)), "events out of order or twice"
    seen: dict[tuple[tuple[str, Any], ...], int] = {}
    for e in events:
        write = tuple((key, value) for key, kind, value in e.changes if kind == "put")
        assert all(kind == "put" for _, kind, _ in e.changes), e
        seen[write] = seen.get(write, 0) + 1
    twice = {k: n for k, n in seen.items() if n > 1}
    assert not twice, f"writes in the feed twice: {list(twice)[:5]}"
    missing = [write for write in w.acked if write not in seen]
    assert not missing, f"{len(missing)} acknowledged writes not in the feed: {missing[:5]}"
    extra = set(seen) - set(w.acked) - set(w.unsure) - {((DONE, 1),)}
    assert not extra, f"writes nobody made: {list(extra)[:5]}"
    # Each key's revision is where the feed last changed it, through the faults too
    # (a replaced replica and an expand carried the revisions with their ranges).
    last = {key: (e.position, value) for e in events for key, _, value in e.changes}
    assert revised == {k: (value, t) for k, (t, value) in last.items() if k != DONE}
    ring = [r["name"] for r in _status(rb_dir)["ring"]]
    assert "storage:2" not in ring and len(ring) == 5, ring


ROWS = 100


async def table_writes(t: Any, stop: asyncio.Event, acked: list[Any]) -> None:
    """Inserts, upserts, updates and deletes by predicate, until ``stop``."""
    rng = random.Random(3)
    while not stop.is_set():
        roll = rng.random()
        try:
            if roll < 0.4:
                k = rng.randrange(ROWS)
                row = {"k": k, "city": rng.choice(CITIES), "age": rng.randrange(90)}
                await t.upsert([row])
                acked.append(row)
            elif roll < 0.7:
                await t.update([("city", "=", rng.choice(CITIES))], {"age": rng.randrange(90)})
            elif roll < 0.8:
                await t.delete([("age", ">", 80)])
            else:
                await t.update([("k", "<", rng.randrange(ROWS))], {"city": rng.choice(CITIES)})
        except Exception:
            await asyncio.sleep(0.05)  # unsure: the feed and the final read tell


CITIES = ("Bern", "Basel", "Zurich")


@pytest.mark.parametrize("cluster", [("--engine", "scan-memory")], indirect=True)
def test_a_tables_feed_chains_every_rows_images_through_the_faults(rb_dir: Path) -> None:
    """Every change's before image is the row as the change before it left it (None
    for a new row), so no change is missing or twice; replayed, the feed is the table
    as a read after it finds it; every acknowledged upsert is in it."""
    events: list[Any] = []

    async def go() -> tuple[list[Any], list[Any]]:
        st = json.loads((rb_dir / "cluster.json").read_text())
        rb = await rbsdk.connect(st["routers"], "client:tables", ops=ScanKVOps(),
                                 credentials=st["client_credentials"])  # fmt: skip
        t = await rb.create_table("t", {"k": "int", "city": "str", "age": "int"}, key="k")
        _, start = await rb.read(("get", ("x",)), "sequential", with_position=True)

        async def follow() -> None:
            async for event in t.watch(since=start):
                events.append(event)
                if any(k == -1 for k, _, _ in event.changes):
                    return

        watcher = asyncio.ensure_future(follow())
        stop, acked = asyncio.Event(), []
        writer = asyncio.ensure_future(table_writes(t, stop, acked))
        try:
            await faults(rb_dir, str(ROWS // 2))
        finally:
            stop.set()
            await writer
        await t.upsert([{"k": -1, "city": "done", "age": 0}])
        await asyncio.wait_for(watcher, 60)
        final = await t.select()
        await rb.close()
        return acked, final

    acked, final = asyncio.run(go())
    assert len(acked) > 50 and len(events) > 50, (len(acked), len(events))
    positions = [e.position for e in events]
    assert positions == sorted(set(positions)), "events out of order or twice"
    rows: dict[int, Any] = {}
    for e in events:
        for k, kind, value in e.changes:
            assert value["before"] == rows.get(k), (e.position, k, value, rows.get(k))
            if kind == "put":
                rows[k] = value["row"]
            else:
                rows.pop(k, None)
    assert sorted(rows.values(), key=lambda r: r["k"]) == sorted(final, key=lambda r: r["k"])
    images = {tuple(v["row"].items()) for e in events for _, kind, v in e.changes if kind == "put"}
    missing = [row for row in acked if tuple(row.items()) not in images]
    assert not missing, f"{len(missing)} acknowledged upserts not in the feed: {missing[:3]}"


def test_an_idle_watch_peeks_at_the_replicas_and_orders_one_read_a_second(rb_dir: Path) -> None:
    """A follower with nothing to follow costs the routers nothing a poll: it peeks at
    the storage processes' change logs (a basic read) and reads in the total order once
    something changed, or once a second; a write made while it idles still reaches it
    within a few polls."""
    from rubberband.sdk import WATCH_READ_EVERY

    async def go() -> tuple[int, float, list[Any]]:
        rb = await _client(rb_dir, "client:idle-watcher")
        writer = await _client(rb_dir, "client:idle-writer")
        got: list[Any] = []
        try:
            start = (await rb.changes(None)).position
            seq = rb.ecast.endpoint.next_seq
            arrived = asyncio.Event()

            async def follow() -> None:
                async for event in rb.watch(since=start, poll=0.02):
                    got.append(event)
                    arrived.set()

            watcher = asyncio.ensure_future(follow())
            await asyncio.sleep(3.0)
            ordered = rb.ecast.endpoint.next_seq - seq  # in 3 s at 50 polls a second
            t0 = time.monotonic()
            await writer.put("idle-key", "v")
            await asyncio.wait_for(arrived.wait(), 5)
            late = time.monotonic() - t0
            watcher.cancel()
            return ordered, late, got
        finally:
            await rb.close()
            await writer.close()

    ordered, late, got = asyncio.run(go())
    assert ordered <= 3.0 / WATCH_READ_EVERY + 2, f"{ordered} reads in the order in 3 s"
    assert [e.changes for e in got] == [(("idle-key", "put", "v"),)]
    assert late < 0.5, f"a write reached the idle watch after {late:.2f} s"
