"""Materialized views against real daemons: an index, an aggregate and a join kept by two
``rubberband views maintain`` processes at once, one SIGKILLed and restarted, through a
storage process's SIGKILL (repaired by the supers) and the leading router's, while a
client writes; every read at every level equals the view recomputed from the base
history at the position the read reports, and a read-your-writes read shows the
reader's own write."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from ecast import local
from rubberband.checkers.views import ViewRead, check_view_reads
from rubberband.errors import BadOperation, RubberbandError
from rubberband.tools.cli import run as cli
from rubberband.views import LEVELS, view_def
from rubberband.views.define import progress_keys, unit_name, units
from tests.integration.test_rubberband_scenarios import (  # the same cluster as there
    _client,
    _kill_leader,
    _kill_until_replaced,
    _off,
    _status,
    cluster,  # noqa: F401  (a fixture: 4 storage processes on the ring, 2 standing by)
)

KEYS = 60
VIEWS = [
    view_def("by_g", "index", (0, KEYS), on="g", columns=["n"], parts=[("c",)]),
    view_def(
        "per_g",
        "aggregate",
        (0, KEYS),
        group_by="g",
        aggregates={
            "rows": ["count", None],
            "sum": ["sum", "n"],
            "avg": ["avg", "n"],
            "lo": ["min", "n"],
            "hi": ["max", "n"],
        },
    ),
    view_def("pairs", "join", (0, 30), on="j", right=(30, KEYS), right_on="j", columns=["n"]),
]


@pytest.fixture
def rb_dir(cluster: Path) -> Path:  # noqa: F811
    return cluster


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return str(r.read().decode())


def _metric(text: str, name: str, view: str) -> float:
    prefix = f'{name}{{view="{view}"}} '
    return next(float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix))


def _value(rng: random.Random) -> dict[str, Any]:
    return {"g": rng.choice("abcd"), "j": rng.randrange(8), "n": rng.randrange(-50, 100)}


async def _follow(rb: Any, start: int, events: list[Any], settled: asyncio.Event) -> None:
    """The base's change feed from ``start`` into ``events``, until a page read after
    ``settled`` is set (every writer and reader has returned) comes back empty: a write
    in flight when the workload stops can be in a read still in flight."""
    while True:
        final = settled.is_set()
        page = await rb.changes(start, 0, KEYS)
        events.extend(page.events)
        start = page.position
        if final and not page.events:
            return
        await asyncio.sleep(0.02)


def _maintainer(
    d: Path, log: Path, metrics: int | None = None, shard: str | None = None
) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        argv = ["views", "maintain", "--state-dir", str(d)]
        if metrics is not None:
            argv += ["--metrics", f"127.0.0.1:{metrics}"]
        if shard is not None:
            argv += ["--shard", shard]
        return subprocess.Popen(
            [sys.executable, "-m", "rubberband.tools.cli", *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def test_views_stay_exact_at_every_level_through_maintainer_storage_and_leader_kills(
    rb_dir: Path,
) -> None:
    rng = random.Random(7)
    reads: dict[str, list[ViewRead]] = {v.name: [] for v in VIEWS}
    events: list[Any] = []
    stop, settled = asyncio.Event(), asyncio.Event()
    own: list[str] = []

    async def follow(start: int) -> None:
        rb = await _client(rb_dir, "client:base-feed")
        try:
            await _follow(rb, start, events, settled)
        finally:
            await rb.close()

    async def read_views() -> None:
        rb = await _client(rb_dir, "client:view-reader")
        levels = ["sequential", "snapshot", "any"]
        try:
            n = 0
            while not stop.is_set():
                n += 1
                view, level = VIEWS[n % 3], levels[(n // 3) % 3]
                try:
                    rows, at = await rb.view(view.name).scan(level=level, with_position=True)
                except Exception:
                    await asyncio.sleep(0.1)  # through the faults: counted below
                    continue
                reads[view.name].append(ViewRead(at, rows, level=level))
        finally:
            await rb.close()

    async def write() -> int:
        rb = await _client(rb_dir, "client:view-writer")
        n = 0
        try:
            while not stop.is_set():
                n += 1
                keys = [rng.randrange(KEYS) for _ in range(1 if n % 4 else 3)]
                try:
                    if rng.random() < 0.25:
                        await rb.write(("delete", tuple(keys)))
                        continue
                    value = _value(rng)
                    await rb.put_many({k: value for k in keys})
                    if n % 5 == 0:  # the writer sees its own write in the index
                        by_g = rb.view("by_g")
                        got, at = await by_g.lookup(
                            value["g"], "read-your-writes", with_position=True
                        )
                        reads["by_g"].append(
                            ViewRead(
                                at,
                                [((value["g"], k), r) for k, r in got],
                                keys=lambda k, g=value["g"]: k[0] == g,
                                level="read-your-writes",
                            )
                        )
                        if keys[-1] not in [k for k, _ in got]:
                            own.append(f"write of {keys} at n={n} not in its read at {at}")
                except Exception:
                    await asyncio.sleep(0.1)
            return n
        finally:
            await rb.close()

    async def faults(maintainers: list[subprocess.Popen[bytes]]) -> None:
        await asyncio.sleep(3)
        maintainers[0].send_signal(signal.SIGKILL)
        await asyncio.sleep(2)
        await _kill_until_replaced(rb_dir)
        maintainers[0] = _maintainer(rb_dir, rb_dir / "maintainer-a.log", shard="0/2")
        # The last standby placed among the aggregate's rows, by a tuple key in JSON
        # (no integer or string key falls among a view's rows): those of groups from
        # "b" on move to it while the views are written and read.
        standby = (await _off(_status, rb_dir))["standby"][0]
        out = await _off(cli, "admin", "--state-dir", str(rb_dir), "expand", standby,
                         '["~view", "per_g", "b"]')  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
        await asyncio.sleep(1)
        # A client's range delete over every view's rows deletes none of them (views'
        # rows are their maintainers'), and the views stay exact.
        hostile = await _client(rb_dir, "client:hostile")
        try:
            await hostile.delete_range(("~view",), ("~view\x00",))
        finally:
            await hostile.close()
        await asyncio.sleep(1)
        await _kill_leader(rb_dir)
        await asyncio.sleep(4)

    async def go() -> int:
        rb = await _client(rb_dir, "maintainer:setup")  # (a maintainer defines views)
        await rb.put_many({k: _value(rng) for k in range(KEYS)})
        base, start = await rb.read(("scan", 0, KEYS), with_position=True)
        feed = asyncio.ensure_future(follow(start))
        for v in VIEWS:
            spec = {k: v for k, v in v.to_dict().items() if k not in ("name", "kind", "source")}
            await rb.create_view(v.name, v.source, v.kind, **spec)
        # Each progress chain starts absent where the name was found free (no maintainer
        # runs yet): an earlier view's stopped maintainer can write none a reader takes.
        for v in VIEWS:
            keys = [k for i in range(len(v.parts) + 1) for k in progress_keys(v.name, i)]
            got = await rb.read(("get", tuple(keys)), "sequential")
            assert all(len(got[k]) == 2 and list(got[k][1]) == [got[k][0]] for k in keys), got
        port = local.free_port()
        maintainers = [  # a and c split the views (by_g's two parts apart), b keeps all
            _maintainer(rb_dir, rb_dir / "maintainer-a.log", shard="0/2"),
            _maintainer(rb_dir, rb_dir / "maintainer-b.log", port),
            _maintainer(rb_dir, rb_dir / "maintainer-c.log", shard="1/2"),
        ]
        try:
            writer = asyncio.ensure_future(write())
            reader = asyncio.ensure_future(read_views())
            await faults(maintainers)
            stop.set()
            writes = await writer
            await reader
            settled.set()
            await asyncio.wait_for(feed, 30)
            metrics = await _off(_get, f"http://127.0.0.1:{port}/metrics")
        finally:
            for m in maintainers:
                m.send_signal(signal.SIGKILL)
            await rb.close()
        for v in VIEWS:
            problems = check_view_reads(v, (dict(base), start), events, reads[v.name])
            assert not problems, "\n".join(problems[:5])
            # The maintainer that never stopped says how far it is and how fresh (each
            # part of a split view: by_g#0 and by_g#1).
            for name in [unit_name(u) for u in units(v)]:
                position = _metric(metrics, "rubberband_view_position", name)
                assert position > start, (name, position, start)
                assert 0 <= _metric(metrics, "rubberband_view_staleness_seconds", name) < 5
        return writes

    writes = asyncio.run(go())
    assert "('~view', 'per_g', 'b')" in [r["id"] for r in _status(rb_dir)["ring"]]
    assert writes > 100, writes
    assert not own, own[:3]
    for name, rs in reads.items():
        levels = {r.level for r in rs}
        assert {"sequential", "snapshot", "any"} <= levels, (name, levels)
        assert len(rs) > 20, (name, len(rs))


def test_a_view_defined_anew_while_its_maintainer_is_stopped_shows_only_the_new_one(
    rb_dir: Path,
) -> None:
    """A maintainer is stopped (SIGSTOP) while it keeps a selection under writes; the
    view is dropped and defined anew under its name with the opposite selection, and
    the maintainer is woken while writes go on.  Every read of the view is the new
    definition's, exact at its position, at every level: the woken maintainer looks at
    the catalog before it writes again (its pages come long after its last look), so it
    writes nothing of the old definition; it keeps the new one once its daemon has read
    the catalog.  (This passes on the code before the look too: on waking, the daemon's
    overdue catalog read races the loop's next page and mostly wins.  The unit tests of
    the steps pin the race it can lose: ``test_a_maintainer_writes_nothing_of_a_
    definition_gone_past_the_new_ones_position``.)"""
    rng = random.Random(7)
    old = view_def("sel", "selection", (0, KEYS), where=[("n", ">=", 0)])
    anew = view_def("sel", "selection", (0, KEYS), where=[("n", "<", 0)])
    reads: list[ViewRead] = []
    events: list[Any] = []
    stop, settled = asyncio.Event(), asyncio.Event()

    async def write(rb: Any) -> None:
        while not stop.is_set():
            try:
                await rb.put_many({rng.randrange(KEYS): _value(rng) for _ in range(2)})
            except RubberbandError:
                await asyncio.sleep(0.1)

    async def read(rb: Any) -> None:
        n = 0
        while not stop.is_set():
            n, level = n + 1, ["sequential", "snapshot", "any"][n % 3]
            try:
                rows, at = await rb.view("sel").scan(level=level, with_position=True)
            except RubberbandError:
                await asyncio.sleep(0.05)  # (no progress of the new view yet)
                continue
            reads.append(ViewRead(at, rows, level=level))

    async def go() -> None:
        admin = await _client(rb_dir, "maintainer:redefine")
        rb, reader, feeder = [await _client(rb_dir, f"client:redefine-{i}") for i in range(3)]
        await rb.put_many({k: _value(rng) for k in range(KEYS)})
        await admin.create_view(old.name, old.source, old.kind, where=old.where)
        first = _maintainer(rb_dir, rb_dir / "maintainer-first.log")
        try:
            for _ in range(30):  # its first progress
                try:
                    await rb.view("sel").scan(level="sequential")
                    break
                except RubberbandError:
                    await asyncio.sleep(1)
            writer = asyncio.ensure_future(write(rb))
            await asyncio.sleep(1.5)
            first.send_signal(signal.SIGSTOP)
            await admin.drop_view("sel")
            await admin.create_view(anew.name, anew.source, anew.kind, where=anew.where)
            base, start = await rb.read(("scan", 0, KEYS), with_position=True)
            feed = asyncio.ensure_future(_follow(feeder, start, events, settled))
            reading = asyncio.ensure_future(read(reader))
            await asyncio.sleep(2)
            first.send_signal(signal.SIGCONT)
            await asyncio.sleep(5)
            stop.set()
            await writer
            await reading
            settled.set()
            await asyncio.wait_for(feed, 30)
        finally:
            first.send_signal(signal.SIGCONT)
            first.send_signal(signal.SIGKILL)
            for c in (admin, rb, reader, feeder):
                await c.close()
        problems = check_view_reads(anew, (dict(base), start), events, reads)
        assert not problems, "\n".join(problems[:5])

    asyncio.run(go())
    assert {r.level for r in reads} == {"sequential", "snapshot", "any"}
    assert len(reads) > 20 and any(r.rows for r in reads), len(reads)


@pytest.fixture
def hash_dir(tmp_path: Path) -> Any:
    """3 routers, 1 super, 3 storage processes, hash partitioning."""
    d = tmp_path / "hash"
    up = subprocess.run(
        [sys.executable, "-m", "rubberband.tools.cli", "cluster", "up", "--routers", "3",
         "--supers", "1", "--storage", "3", "--partitioning", "hash", "--state-dir", str(d)],
        capture_output=True, text=True,
    )  # fmt: skip
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield d
    finally:
        subprocess.run(
            [sys.executable, "-m", "rubberband.tools.cli", "cluster", "down", "--state-dir",
             str(d)],
            capture_output=True,
        )  # fmt: skip


def test_views_under_hash_partitioning_read_exact_rows_from_every_bucket(hash_dir: Path) -> None:
    """Under hash partitioning a view's rows are spread over every bucket: scans, ranges
    of a scan, index lookups and gets at every level still return exactly the rows of
    the view as of the position each reports, while a client writes."""
    rng = random.Random(11)
    late = view_def("late", "selection", (0, KEYS), where=[("n", ">=", 50)])
    busy = view_def("busy", "selection", (None, None), over="per_g", base=[(0, KEYS)],
                    where=[("rows", ">=", 16)])  # fmt: skip
    views = [*VIEWS[:2], late, busy]
    reads: dict[str, list[ViewRead]] = {v.name: [] for v in views}
    events: list[Any] = []
    errors: list[str] = []
    stop, settled = asyncio.Event(), asyncio.Event()

    async def read_views(rb: Any) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            try:
                await read_one(rb, n)
            except Exception as e:  # before the backfill: no progress yet
                errors.append(repr(e))
                await asyncio.sleep(0.1)

    async def read_late(rb: Any) -> None:
        """The views defined later, in turn, each through every level, on a loop of
        their own (behind the others' reads, a loaded machine gave them too few)."""
        n = 0
        while not stop.is_set():
            n += 1
            name, level = ("late", "busy")[n % 2], LEVELS[n // 2 % 4]
            try:
                rows, at = await rb.view(name).scan(level=level, with_position=True)
            except RubberbandError:  # before it is defined and backfilled
                await asyncio.sleep(0.1)
                continue
            reads[name].append(ViewRead(at, rows, level=level))

    async def read_one(rb: Any, n: int) -> None:
        by_g, per_g = rb.view("by_g"), rb.view("per_g")
        level = LEVELS[n % 4]
        g = "abcd"[n % 4]
        if n % 3 == 0:
            rows, at = await by_g.scan(level=level, with_position=True)
            reads["by_g"].append(ViewRead(at, rows, level=level))
        elif n % 3 == 1:
            got, at = await by_g.lookup(g, level, with_position=True)
            rows = [((g, k), r) for k, r in got]
            reads["by_g"].append(ViewRead(at, rows, lambda k, g=g: k[0] == g, level))
        else:
            lo, hi = sorted(rng.sample("abcde", 2))
            rows, at = await per_g.scan(lo, hi, level, with_position=True)
            reads["per_g"].append(ViewRead(at, rows, lambda k, a=lo, b=hi: a <= k < b, level))
            got, at = await per_g.get([g, "z"], level, with_position=True)
            reads["per_g"].append(ViewRead(at, sorted(got.items()), [g, "z"], level))

    async def write(rb: Any) -> None:
        while not stop.is_set():
            keys = rng.sample(range(KEYS), 2)
            if rng.random() < 0.2:
                await rb.write(("delete", tuple(keys)))
            else:
                await rb.put_many({k: _value(rng) for k in keys})

    async def go() -> None:
        rb = await _client(hash_dir, "client:hash-views")
        admin = await _client(hash_dir, "maintainer:hash-views")  # defines the views
        maintainer = _maintainer(hash_dir, hash_dir / "maintainer.log")
        try:
            assert not rb.placement.ordered
            await rb.put_many({k: _value(rng) for k in range(KEYS)})
            base, start = await rb.read(("scan", 0, KEYS), with_position=True)
            feed = asyncio.ensure_future(_follow(rb, start, events, settled))
            # Catalog entries that are no definition (a buggy maintainer's, or from a
            # release before the catalog was maintainers' alone; one is per_g's under
            # another name): the maintainer leaves them out, says so, and keeps every
            # view (it stopped at the first, with every view it kept).
            await admin.put(("~views", "junk"), "not a definition")
            await admin.put(("~views", "mimic"), VIEWS[1].to_dict())
            # A plain value over a view's row would refuse every later version of it, and
            # the view's loop (with per_g's, which shares its feed) started over each second.
            with pytest.raises(BadOperation, match="maintainers alone"):
                await rb.put(("~view", "by_g", ("a", 1)), "junk")
            # Views' definitions are maintainers' alone: a client's definition is
            # refused before anything is sent.
            with pytest.raises(BadOperation, match="only a maintainer may"):
                await rb.create_view(late.name, late.source, late.kind, where=late.where)
            # The maintainer runs already: each view joins its group as it is defined
            # (all three read one feed), the last one while writes go on.
            for v in views[:2]:
                spec = {k: v for k, v in v.to_dict().items() if k not in ("name", "kind", "source")}
                await admin.create_view(v.name, v.source, v.kind, **spec)
            tasks = [asyncio.ensure_future(c) for c in (write(rb), read_views(rb), read_late(rb))]
            await asyncio.sleep(2)
            await admin.create_view(late.name, late.source, late.kind, where=late.where)
            await asyncio.sleep(2)
            # Views' rows and definitions are their maintainers' alone: a client's version
            # of a row is refused at every replica (the reads are checked against the
            # base throughout), and so is its drop of a view, which deletes rows; its
            # raw write over a definition and its delete of one are refused too, and
            # say so (a put was reported done): the view stays defined as it was, and
            # kept.
            junk = ("version", ((("~view", "by_g", ("a", 1)), [1, "junk"]),), 0)
            with pytest.raises(BadOperation, match="only maintainers"):
                await rb.write(junk)
            with pytest.raises(BadOperation, match="only a maintainer may"):
                await rb.drop_view(late.name)
            redefined = {**late.to_dict(), "where": [["g", "=", "z"]]}
            with pytest.raises(BadOperation, match="only maintainers"):
                await rb.put(("~views", late.name), redefined)
            with pytest.raises(BadOperation, match="only maintainers"):
                await rb.delete(("~views", views[0].name))
            defined = {v.name: v for v in await rb.views()}
            assert defined[late.name] == late and defined[views[0].name] == views[0]
            # A view over a view: the groups of 16 rows or more, kept in per_g's group.
            await admin.create_view(busy.name, "per_g", busy.kind, where=busy.where)
            await asyncio.sleep(5)
            stop.set()
            await asyncio.gather(*tasks)
            settled.set()
            await asyncio.wait_for(feed, 30)
            with pytest.raises(BadOperation, match="busy are defined over 'per_g'"):
                await rb.drop_view("per_g")
            # The admin command drops a view as a maintainer (the cluster's credential),
            # under writes, while the maintainer keeps it: the drop deletes the rows it
            # writes until it has seen the definition gone (once a second).
            stop.clear()
            writing = asyncio.ensure_future(write(rb))
            await asyncio.sleep(1)
            out = await _off(cli, "views", "drop", "--state-dir", str(hash_dir), "busy")
            assert out.returncode == 0, out.stdout + out.stderr
            assert "busy" not in [v.name for v in await rb.views()]
            await asyncio.sleep(2)
            stop.set()
            await writing
            assert await rb.read(("scan", ("~view", "busy"), ("~view", "busy\x01"))) == []
        finally:
            maintainer.send_signal(signal.SIGKILL)
            await rb.close()
            await admin.close()
        for v in views:
            under = [VIEWS[1]] if v is busy else []
            problems = check_view_reads(v, (dict(base), start), events, reads[v.name], under)
            assert not problems, "\n".join(problems[:5])
            assert len(reads[v.name]) > 10, (v.name, len(reads[v.name]), errors[-3:])
        sizes = {len(r.rows) for r in reads["busy"]}
        assert len(sizes) > 1, f"busy always had {sizes} rows: the test tests little"
        log = (hash_dir / "maintainer.log").read_text()
        assert "'junk') is no view definition" in log and "'mimic') is no" in log, log[-2000:]

    asyncio.run(go())


def test_a_maintainer_under_a_client_credential_is_refused_saying_why(rb_dir: Path) -> None:
    """Views' rows are written by maintainers alone: ``views maintain`` connects as
    ``maintainer:...``, which a ``client:*`` credential (what a deployment from before the
    role gave its maintainer) does not cover; it stops at once and says what it needs."""
    st = json.loads((rb_dir / "cluster.json").read_text())
    out = cli("views", "maintain", "--routers", ",".join(st["routers"]),
              "--credentials", st["client_credentials"], timeout=60)  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    assert "covers client:*" in out.stderr and "only maintainer:* names" in out.stderr, out.stderr


TABLE_VIEWS = [
    view_def("t_by_g", "index", (None, None), on="g", columns=["v"], table=("t", "id")),
    view_def(
        "t_per_g",
        "aggregate",
        (0, 150),
        group_by="g",
        table=("t", "id"),
        aggregates={
            "rows": ["count", None],
            "sum": ["sum", "v"],
            "lo": ["min", "v"],
            "hi": ["max", "v"],
        },
    ),
]


@pytest.mark.parametrize("cluster", [("--engine", "scan-memory")], indirect=True)
def test_views_over_a_table_stay_exact_through_updates_by_predicate_and_a_maintainer_kill(
    rb_dir: Path,
) -> None:
    """An index and an aggregate over a scan-engine table's rows, backfilled from a
    select of the table and kept from its rows' feed (images of updates and deletes by
    predicate), by a maintainer SIGKILLed and restarted and a storage process SIGKILLed
    and replaced: every read at every level equals the view recomputed from the table's
    feed at the position the read reports."""
    import rubberband as rbsdk
    from rubberband.changelog import Event
    from rubberband.engine import row_key
    from storage_adapters.scan.kv import ScanKVOps

    rng = random.Random(5)
    reads: dict[str, list[ViewRead]] = {v.name: [] for v in TABLE_VIEWS}
    events: list[Any] = []
    stop = asyncio.Event()

    async def connect(name: str) -> Any:
        st = json.loads((rb_dir / "cluster.json").read_text())
        creds = st[f"{name.partition(':')[0]}_credentials"]
        return await rbsdk.connect(st["routers"], name, ops=ScanKVOps({"t": "id"}),
                                   credentials=creds)  # fmt: skip

    def row() -> dict[str, Any]:
        return {"id": rng.randrange(200), "g": rng.choice("abcd"), "v": rng.randrange(-20, 50)}

    async def write(t: Any) -> int:
        n = 0
        while not stop.is_set():
            n += 1
            try:
                r = rng.random()
                if r < 0.5:
                    await t.upsert([row() for _ in range(3)])
                elif r < 0.75:
                    g = rng.choice("abcd")
                    await t.update([("g", "=", g), ("v", "<", 10)], set={"v": rng.randrange(50)})
                elif r < 0.9:
                    await t.update([("id", "=", rng.randrange(200))], set={"g": "e"})
                else:
                    await t.delete([("v", ">", 40)])
            except RubberbandError:
                await asyncio.sleep(0.1)  # through the faults
        return n

    async def read_views(rb: Any) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            view, level = TABLE_VIEWS[n % 2], LEVELS[(n // 2) % 4]
            try:
                if view.kind == "index" and n % 4 == 1:
                    g = "abcde"[n % 5]
                    got, at = await rb.view(view.name).lookup(g, level, with_position=True)
                    rows = [((g, k), r) for k, r in got]
                    reads[view.name].append(ViewRead(at, rows, lambda k, g=g: k[0] == g, level))
                else:
                    rows, at = await rb.view(view.name).scan(level=level, with_position=True)
                    reads[view.name].append(ViewRead(at, rows, level=level))
            except RubberbandError:
                await asyncio.sleep(0.1)

    async def go() -> tuple[int, dict[Any, Any], int]:
        rb = await connect("maintainer:table-views")  # (it defines the views)
        t = await rb.create_table("t", {"id": "int", "g": "str", "v": "int"}, key="id")
        await t.insert([{"id": i, "g": "abcd"[i % 4], "v": i % 30} for i in range(200)])
        select, pairs = rb.core.ops.rows_read("t", "id", None, None)
        result, start = await rb.read(select, "sequential", with_position=True)
        base = {row_key("t", k): {"row": r} for k, r in pairs(result)}

        async def follow() -> None:
            async for event in t.watch(since=start):
                events.append(event)
                if stop.is_set() and any(k == -1 for k, _, _ in event.changes):
                    return

        feed = asyncio.ensure_future(follow())
        for v in TABLE_VIEWS:
            spec = {k: x for k, x in v.to_dict().items()
                    if k not in ("name", "kind", "source", "tables")}  # fmt: skip
            await rb.create_view(v.name, v.source, v.kind, table=v.tables[0], **spec)
        maintainer = _maintainer(rb_dir, rb_dir / "maintainer-t.log")
        try:
            writer = asyncio.ensure_future(write(t))
            reader = asyncio.ensure_future(read_views(rb))
            await asyncio.sleep(4)
            maintainer.send_signal(signal.SIGKILL)
            await asyncio.sleep(1)
            maintainer = _maintainer(rb_dir, rb_dir / "maintainer-t.log")  # from a select
            await _kill_until_replaced(rb_dir)
            await asyncio.sleep(4)
            stop.set()
            writes = await writer
            await reader
            await t.upsert([{"id": -1, "g": "z", "v": 0}])
            await asyncio.wait_for(feed, 30)
        finally:
            maintainer.send_signal(signal.SIGKILL)
            await rb.close()
        return writes, base, start

    writes, base, start = asyncio.run(go())
    assert writes > 50, writes
    named = [Event(e.position, tuple((row_key("t", k), how, v) for k, how, v in e.changes))
             for e in events]  # fmt: skip
    for v in TABLE_VIEWS:
        problems = check_view_reads(v, (dict(base), start), named, reads[v.name])
        assert not problems, "\n".join(problems[:5])
        levels = {r.level for r in reads[v.name]}
        assert set(LEVELS) <= levels and len(reads[v.name]) > 20, (v.name, levels)
        seen = {repr(sorted(r.rows)) for r in reads[v.name]}
        assert len(seen) > 5, f"{v.name} read {len(seen)} states: the test tests little"
