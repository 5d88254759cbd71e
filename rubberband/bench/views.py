"""``rubberband bench views``: what materialized views cost and how fresh they are.

On a local cluster (``rubberband cluster up``: 3 routers, 1 super, 4 storage processes,
the memory engine, replication 3) with one ``rubberband views maintain`` process:

1. **Base writes/s with 0, 1, 3 and 10 views** (index, aggregate, selection, projection
   and join in turn), each write of a 64-byte dict value alone in its message, from
   ``--procs`` load processes that keep ``--clients`` writes in flight each (sent in
   ``write_batch`` calls as room frees, or as a rate owes them: :data:`TICK`); a fresh
   cluster per count.
2. **Staleness at half the peak rate**: with an index and an aggregate view (then
   with the index view alone), writers held to half the rate measured without views
   while a prober, every 20 ms, writes a row of a secondary key of its own and times
   how long after the acknowledgement the index view shows it (snapshot reads every 2
   ms: the staleness a writer sees, and each lookup's own time under that load), then
   reads the aggregate (the index alone: the index) at sequential level (the wait for
   the maintainer to reach the read's position plus one read); also the view's
   distance behind a sequential read now, in positions (``rubberband views status``'s
   ``behind``); and the cores each role used meanwhile (``cpu_cores``: routers,
   storage, super, maintainer, this process's probe, the load processes) with the
   share of the machine's CPUs busy (``machine_busy``): a view whose lag grows through
   the run on a machine with no core to spare is short of CPU, not of round trips.
   Then the same load with no view (``at_rate_without_views``): the base writes'
   latency and each role's cores at that rate without a view to keep.  A write shows
   in a view no sooner than its own acknowledgement plus a row write's, so the base
   write's p99 there bounds the staleness the views can reach; the cores are what the
   views cost at that rate, where the first part measures what they cost at the peak
   (``index_cores_at_rate``: the index alone's, per role and in all).
3. **Secondary-key lookups per second** at ``--rows`` rows, each secondary key held by
   ``--rows-per-lookup`` rows (001's experiment, V-A: one, every secondary key unique),
   32 lookups at a time: on a scan-engine table (``scan-memory``), through an index view
   over its rows against the scan engine's own select ``where g = ?`` (a full scan of
   every holder's share, shared by the selects waiting); on key-value data (the memory
   engine), through an index view against a scan of the base range filtered by the
   client, and through the index view again while a writer puts rows into the leaves
   the lookups read; and SQLite with an index on that column (in this process, no
   network).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ecast import local, tune_process
from rubberband.bench import view_lag
from rubberband.bench.harness import (
    busy_between,
    check_idle,
    cluster_pids,
    cpu_times,
    machine,
    process_cpu,
    process_role,
)
from rubberband.tools.cli import run as _cli
from rubberband.views.define import meta_key

ROWS = 1_000_000
"""Base keys ``0 .. ROWS`` the writers pick from (by default: ``--keys``)."""
KEYS_LEAST = 10_000
"""The fewest base keys a run may write (``--keys``): the staleness probes write keys
``0, 1, ...`` (each with a secondary key of its own), a few hundred in a run, all of
them inside the views' sources."""
GROUPS = 1_000
SCAN_PAGE = 50_000
"""Rows a full scan of key-value data reads at once."""
AGGREGATES = {"c": ["count", None], "s": ["sum", "n"], "hi": ["max", "n"]}


def _value(rng: random.Random) -> dict[str, Any]:
    return {"g": rng.randrange(GROUPS), "n": rng.randrange(1000), "pad": "x" * 24}


def _views(n: int, keys: int = ROWS) -> list[tuple[str, tuple[Any, Any], str, dict[str, Any]]]:
    """``n`` views over the base keys below ``keys`` (a join of their two halves)."""
    kinds = [
        ("index", {"on": "g", "columns": ["n"]}),
        ("aggregate", {"group_by": "g", "aggregates": AGGREGATES}),
        ("selection", {"where": [["n", ">=", 500]]}),
        ("projection", {"columns": ["g"]}),
        ("join", {"on": "g", "right": (keys // 2, keys), "right_on": "g", "columns": ["n"]}),
    ]
    out = []
    for i in range(n):
        kind, spec = kinds[i % len(kinds)]
        source = (0, keys // 2) if kind == "join" else (0, keys)
        out.append((f"v{i}", source, kind, spec))
    return out


# ------------------------------------------------------------------ a load process
TICK = 0.005
"""Seconds between a paced load process's looks at the writes it owes: those due go out
in ``write_batch`` calls, each write alone in its message (the cluster's work is that
of as many ``put`` calls).  Writers awaiting a ``put`` each took the load processes a
fifth of this 2-core machine at 7,300 writes/s (55 µs a write; batches: 45) and more
at the peak, where refilling the window in batches let the cluster reach
23,000-25,000 writes/s instead of 14,500: CPU taken from the cluster under test, whose
clients in production are not on its cores (docs/benchmarks.md).  A call costs about
a packet each way, so a look every millisecond (5 writes a call at 5,000 writes/s a
process) cost 51 µs of the load process's CPU a write, and every 5 ms 27 µs.  At
10,000 writes/s the load processes took 0.37 of the two cores, then 0.26; at the
views benchmark's half peak a write showed in the index about twice as soon."""

CHUNK = 16
"""Writes per ``write_batch`` call at most.  A batch ends when its last write is stable,
so a window sent as one batch emptied before any of it was sent again (the window went
256, 0, 256: rounds in lockstep, the rate a round's latency, not the cluster's peak)."""


async def _worker(
    st: dict[str, Any], clients: int, seconds: float, rate: float, seed: int, keys: int
) -> Any:
    """``clients`` writes in flight at most, as many as ``rate`` owes by now (every
    :data:`TICK`), or as many as there is room for (closed loop, ``rate`` 0), each to a
    key below ``keys``.  A write's latency is its batch's: from the call until every
    write of it is stable."""
    import rubberband

    rb = await rubberband.connect(st["routers"], f"client:bv{os.getpid()}",
                                  credentials=st["client_credentials"])  # fmt: skip
    rng = random.Random(seed)
    lat: list[float] = []
    got = {"writes": 0, "failed": 0, "in_flight": 0}
    room = asyncio.Event()

    async def batch(n: int) -> None:
        ops = [("put", ((rng.randrange(keys), _value(rng)),)) for _ in range(n)]
        t = time.monotonic()
        outcomes = await rb.write_batch(ops, bundle=1)
        took = time.monotonic() - t
        ok = outcomes.count(None)
        got["writes"] += ok
        got["failed"] += n - ok
        got["in_flight"] -= n
        lat.extend([took] * ok)
        room.set()

    flying: set[asyncio.Future[None]] = set()
    sent = 0
    cpu = time.process_time()
    start = time.monotonic()
    end = start + seconds
    while (now := time.monotonic()) < end:
        n = min(int((now - start) * rate) - sent if rate else clients, clients - got["in_flight"])
        for i in range(0, max(0, n), CHUNK):
            m = min(CHUNK, n - i)
            got["in_flight"] += m
            sent += m
            f = asyncio.ensure_future(batch(m))
            flying.add(f)
            f.add_done_callback(flying.discard)
        if rate:
            await asyncio.sleep(TICK)
            continue
        room.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(room.wait(), end - now)
    await asyncio.gather(*flying)
    cpu = time.process_time() - cpu
    await rb.close()
    lat.sort()
    return {"writes": got["writes"], "failed": got["failed"], "cpu_s": cpu,
            "p50": lat[len(lat) // 2] if lat else None,
            "p99": lat[int(len(lat) * 0.99)] if lat else None}  # fmt: skip


def _load(
    d: Path, procs: int, clients: int, seconds: float, rate: float, keys: int = ROWS
) -> dict[str, Any]:
    argv = [sys.executable, "-m", "rubberband.bench.views", "--worker", str(d), str(clients),
            str(seconds), str(rate / procs if rate else 0)]  # fmt: skip
    ps = [
        subprocess.Popen([*argv, str(i), str(keys)], stdout=subprocess.PIPE, text=True)
        for i in range(procs)
    ]
    outs = [
        json.loads(p.communicate(timeout=seconds + 120)[0].strip().splitlines()[-1]) for p in ps
    ]
    p50 = sorted(o["p50"] for o in outs if o["p50"] is not None)
    p99 = sorted(o["p99"] for o in outs if o["p99"] is not None)
    return {
        "writes_per_s": round(sum(o["writes"] for o in outs) / seconds),
        "failed": sum(o["failed"] for o in outs),
        "p50_ms": round(1000 * p50[len(p50) // 2], 1) if p50 else None,
        "p99_ms": round(1000 * max(p99), 1) if p99 else None,
        "cpu_s": sum(o["cpu_s"] for o in outs),
    }


# ------------------------------------------------------------------ the cluster
class Cluster:
    def __init__(self, base: Path, engine: str = "memory") -> None:
        self.d = Path(tempfile.mkdtemp(prefix="rbviews-", dir=base))
        self.engine = engine
        self.maintainer: subprocess.Popen[bytes] | None = None
        self.metrics = ""  # its maintainer's /metrics, once it runs

    def __enter__(self) -> Cluster:
        out = _cli("cluster", "up", "--state-dir", str(self.d), "--no-auto-repair",
                   "--engine", self.engine, timeout=300)  # fmt: skip
        if out.returncode != 0:
            raise RuntimeError(out.stderr[-2000:])
        return self

    def maintain(self) -> None:
        log = (self.d / "maintainer.log").open("ab")
        self.metrics = f"127.0.0.1:{local.free_port()}"
        self.maintainer = subprocess.Popen(
            [sys.executable, "-m", "rubberband.tools.cli", "views", "maintain", "--state-dir",
             str(self.d), "--metrics", self.metrics], stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def st(self) -> dict[str, Any]:
        return dict(json.loads((self.d / "cluster.json").read_text()))

    def __exit__(self, *exc: object) -> None:
        if self.maintainer is not None:
            self.maintainer.kill()
        _cli("cluster", "down", "--state-dir", str(self.d), timeout=120)


async def _client(c: Cluster, name: str, ops: Any = None, role: str = "client") -> Any:
    """A client of the cluster; ``role`` ``maintainer`` for one that defines views
    (their definitions are maintainers' to write, as their rows are)."""
    import rubberband

    st = c.st()
    name = f"{role}:{name}-{os.getpid()}"
    auth = st[f"{role}_credentials"]
    return await rubberband.connect(st["routers"], name, credentials=auth, answer_timeout=60.0,
                                    ops=ops)  # fmt: skip


async def _ready(rb: Any, name: str, timeout: float) -> float:
    """When the view's maintainer first published its progress (its backfill done):
    ``create_view`` starts the progress chain absent, so a chain alone says nothing
    (taken for the progress, it made every ``backfill_s`` about 0)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = await rb.read(("get", (meta_key(name),)), "sequential")
        chain = got.get(meta_key(name))
        if chain and len(chain[-1]) > 1:  # (a maintainer's progress carries its floor)
            return time.monotonic()
        await asyncio.sleep(0.1)
    raise TimeoutError(f"view {name} was not backfilled in {timeout:.0f} s")


async def _define(c: Cluster, n: int, keys: int = ROWS) -> None:
    rb = await _client(c, "define", role="maintainer")
    for name, source, kind, spec in _views(n, keys):
        await rb.create_view(name, source, kind, **spec)
    for name, *_ in _views(n, keys):  # every view backfilled before the load
        await _ready(rb, name, 120.0)
    await rb.close()


async def _visible(rb: Any, i: int, lookups: list[float]) -> float:
    """Seconds from a base write's acknowledgement until the index view ``v0`` shows it
    (snapshot reads every 2 ms): the view's staleness as a writer sees it.  Each
    lookup's own time goes to ``lookups``: a row that became visible is seen about a
    lookup and a half later, and under load a lookup is no longer a millisecond."""
    g = GROUPS + i  # a secondary key of its own: no load writer's row has it
    await rb.put(i % ROWS, {"g": g, "n": i, "pad": "probe"})
    acked = time.monotonic()
    view = rb.view("v0")
    while True:
        t = time.monotonic()
        found = await view.lookup(g, "snapshot")
        lookups.append(time.monotonic() - t)
        if found:
            return time.monotonic() - acked
        if t - acked > VISIBLE_WITHIN:
            raise RuntimeError(
                f"the index view v0 did not show a write acknowledged {t - acked:.0f} s ago "
                "(is its maintainer running? its log is maintainer.log in the state dir)"
            )
        await asyncio.sleep(0.002)


VISIBLE_WITHIN = 120.0
"""Seconds a probe's write may take to show in the index before the run fails: a
maintainer that stopped made the run wait for ever (once, for ten minutes, before a
`timeout` killed it)."""


def _ms(seconds: list[float], q: float) -> float:
    """The ``q`` quantile of ``seconds``, in milliseconds."""
    ordered = sorted(seconds)
    return round(1000 * ordered[int(len(ordered) * q)], 1)


async def _probe(c: Cluster, seconds: float, sequential: str) -> dict[str, Any]:
    rb = await _client(c, "probe")
    lat: list[float] = []
    seen: list[float] = []
    behind: list[int] = []
    looked: list[float] = []
    view = rb.view(sequential)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        seen.append(await _visible(rb, len(seen), looked))
        t = time.monotonic()
        await view.get([0], "sequential")
        lat.append(time.monotonic() - t)
        got, now = await rb.read(("get", (meta_key(sequential),)), "sequential",
                                 with_position=True)  # fmt: skip
        chain = got.get(meta_key(sequential))
        if chain and len(chain) > 1:
            behind.append(now - chain[-1][0])
        await asyncio.sleep(0.02)
    await rb.close()
    behind.sort()
    return {
        "write_to_view_p50_ms": _ms(seen, 0.5),
        "write_to_view_p99_ms": _ms(seen, 0.99),
        "lookup_p50_ms": _ms(looked, 0.5),
        "lookup_p99_ms": _ms(looked, 0.99),
        "sequential_view_read_p50_ms": _ms(lat, 0.5),
        "sequential_view_read_p99_ms": _ms(lat, 0.99),
        "behind_positions_p50": behind[len(behind) // 2] if behind else None,
        "behind_positions_p99": behind[int(len(behind) * 0.99)] if behind else None,
        "reads": len(lat),
    }


def _base_rows(rows: int, per: int) -> list[tuple[int, int, int]]:
    """``(key, g, n)`` for the lookups: ``per`` rows of each secondary key ``g`` (001's
    experiment, section V-A: one, every secondary key unique), spread over the keys."""
    rng = random.Random(1)
    shuffled = list(range(rows))
    rng.shuffle(shuffled)
    return [(k, shuffled[k] // per, k % 1000) for k in range(rows)]


async def _at_once(calls: list[Any], n: int = 32) -> tuple[float, list[Any]]:
    """Seconds to run ``calls`` (coroutine functions) ``n`` at a time, and their answers."""
    sem = asyncio.Semaphore(n)

    async def one(call: Any) -> Any:
        async with sem:
            return await call()

    t = time.monotonic()
    got = await asyncio.gather(*(one(c) for c in calls))
    return time.monotonic() - t, got


def _wanted(groups: int, lookups: int) -> list[int]:
    """The secondary keys looked up, at random (the same in every run)."""
    rng = random.Random(2)
    return [rng.randrange(groups) for _ in range(lookups)]


def _check_found(data: list[tuple[int, int, int]], wanted: list[int], found: list[Any]) -> None:
    """Every lookup's answer is exactly the rows of its secondary key, ``(key, n)``: a
    benchmark of lookups that answered wrongly would measure nothing."""
    rows: dict[int, list[tuple[int, int]]] = {}
    for k, g, n in data:
        rows.setdefault(g, []).append((k, n))
    for g, got in zip(wanted, found, strict=True):
        if sorted((k, r["n"]) for k, r in got) != sorted(rows.get(g, [])):
            raise AssertionError(f"the index view's lookup of {g} answered {got!r:.200}")


def _sqlite(data: list[tuple[int, int, int]], wanted: list[int]) -> float:
    """Lookups per second in SQLite with an index on ``g``, in this process."""
    db = sqlite3.connect(":memory:")
    db.execute("create table t (k integer primary key, g integer, n integer)")
    db.executemany("insert into t values (?, ?, ?)", data)
    db.execute("create index t_g on t (g)")
    t = time.monotonic()
    for g in wanted:
        db.execute("select k, n from t where g = ?", (g,)).fetchall()
    return len(wanted) / (time.monotonic() - t)


async def _lookups(c: Cluster, rows: int, lookups: int, per: int) -> dict[str, Any]:
    """Key-value base (memory engine): the index view against a scan of the base range
    filtered by the client (a key-value engine has no predicates of its own)."""
    rb = await _client(c, "lookups", role="maintainer")
    data = _base_rows(rows, per)
    for i in range(0, rows, 2_000):
        await rb.put_many({k: {"g": g, "n": n} for k, g, n in data[i : i + 2_000]})
    created = time.monotonic()
    # (the source reaches past the rows: the lookups under writes insert there)
    await rb.create_view("by_g", (0, 2 * rows), "index", on="g", columns=["n"])
    backfill = await _ready(rb, "by_g", 900.0) - created
    wanted = _wanted(rows // per, lookups)
    view = rb.view("by_g")
    index_s, found = await _at_once([lambda g=g: view.lookup(g, "snapshot") for g in wanted])
    _check_found(data, wanted, found)
    under = await _lookups_under_writes(rb, data, wanted, rows, rows // per)
    scans = max(1, lookups // 100)
    t = time.monotonic()
    matched = 0
    for g in wanted[:scans]:
        start: Any = 0
        while True:  # in pages: one answer of a million rows held the client's loop so
            # long that the routers took it for dead
            got = await rb.read(("scan", start, rows, SCAN_PAGE + 1), "snapshot")
            matched += sum(1 for _k, v in got[:SCAN_PAGE] if v["g"] == g)
            if len(got) <= SCAN_PAGE:
                break
            start = got[SCAN_PAGE][0]
    scan_s = (time.monotonic() - t) / scans
    await rb.close()
    return {
        "rows": rows,
        "backfill_s": round(backfill, 1),
        "backfill_rows_per_s": round(rows / backfill),
        "index_view_lookups_per_s": round(lookups / index_s),
        **under,
        "rows_per_lookup": round(sum(map(len, found)) / len(found), 1),
        "full_scan_lookups_per_s": round(1 / scan_s, 2),  # one at a time: each is long
        "sqlite_indexed_lookups_per_s": round(_sqlite(data, wanted)),
        "index_over_scan": round(scan_s / (index_s / lookups), 1),
        "rows_per_scan_lookup": round(matched / scans, 1),
    }


UNDER_WRITES_BATCH = 100
"""Rows each of the writer's calls inserts while the lookups run again."""


async def _lookups_under_writes(
    rb: Any, data: list[tuple[int, int, int]], wanted: list[int], rows: int, groups: int
) -> dict[str, Any]:
    """The same lookups again while a writer puts rows past the base's, one call of
    :data:`UNDER_WRITES_BATCH` after another (keys ``rows`` to ``2 * rows``, then over
    again), each row with a secondary value half-way between two looked up (``g +
    0.5``): the view's rows land in the very leaves the lookups read, and no lookup's
    answer changes (each is checked)."""
    rng = random.Random(3)
    done = asyncio.Event()
    written = 0

    async def writer() -> None:
        nonlocal written
        while not done.is_set():
            first = rows + written % rows
            n = min(UNDER_WRITES_BATCH, 2 * rows - first)
            rows_ = {first + i: {"g": rng.randrange(groups) + 0.5, "n": 0} for i in range(n)}
            await rb.put_many(rows_)
            written += n

    started = time.monotonic()
    task = asyncio.create_task(writer())
    await asyncio.sleep(0.5)  # the writes under way first
    view = rb.view("by_g")
    took, found = await _at_once([lambda g=g: view.lookup(g, "snapshot") for g in wanted])
    done.set()
    await task
    rate = written / (time.monotonic() - started)
    _check_found(data, wanted, found)
    return {
        "index_view_lookups_under_writes_per_s": round(len(wanted) / took),
        "rows_written_per_s_meanwhile": round(rate),
    }


async def _table_lookups(c: Cluster, rows: int, lookups: int, per: int) -> dict[str, Any]:
    """A scan-engine table (``scan-memory``): an index view over its rows against the
    scan engine's own select ``where g = ?`` (Clock Scan: every holder scans its share
    once for all the selects waiting, 2.4.3), both at snapshot level, 32 at a time; the
    answers of the first lookups are compared between the two."""
    rb = await _client(
        c, "table-lookups", ops="storage_adapters.scan.kv:ScanKVOps", role="maintainer"
    )
    data = _base_rows(rows, per)
    t = await rb.create_table("t", {"k": "int", "g": "int", "n": "int"}, key="k")
    batches = [data[i : i + 5_000] for i in range(0, rows, 5_000)]
    load_s, _ = await _at_once(
        [lambda b=b: t.insert([{"k": k, "g": g, "n": n} for k, g, n in b]) for b in batches], 4
    )
    created = time.monotonic()
    await rb.create_view("t_by_g", (None, None), "index", on="g", columns=["n"], table=("t", "k"))
    backfill = await _ready(rb, "t_by_g", 900.0) - created
    wanted = _wanted(rows // per, lookups)
    view = rb.view("t_by_g")
    index_s, found = await _at_once([lambda g=g: view.lookup(g, "snapshot") for g in wanted])
    _check_found(data, wanted, found)
    scans = wanted[: max(32, lookups // 10)]
    scan_s, selected = await _at_once(
        [lambda g=g: t.select([("g", "=", g)], ["k", "n"], isolation="snapshot") for g in scans]
    )
    for got, rows_ in zip(found[:32], selected[:32], strict=False):
        if not got or sorted((k, r["n"]) for k, r in got) != sorted(
            (r["k"], r["n"]) for r in rows_
        ):
            raise AssertionError("the index view and the scan engine's select disagree")
    one_s, _ = await _at_once([lambda: t.select([("g", "=", scans[0])], isolation="snapshot")], 1)
    await rb.close()
    return {
        "rows": rows,
        "load_rows_per_s": round(rows / load_s),
        "backfill_s": round(backfill, 1),
        "backfill_rows_per_s": round(rows / backfill),
        "index_view_lookups_per_s": round(lookups / index_s),
        "rows_per_lookup": round(sum(map(len, found)) / len(found), 1),
        "scan_engine_select_lookups_per_s": round(len(scans) / scan_s, 1),
        "scan_engine_select_alone_ms": round(1000 * one_s, 1),
        "sqlite_indexed_lookups_per_s": round(_sqlite(data, wanted)),
        "index_over_scan": round((lookups / index_s) / (len(scans) / scan_s), 1),
    }


async def _staleness(c: Cluster, a: argparse.Namespace, rate: float, views: int) -> Any:
    """The load at ``rate`` and the probe's figures, with the cores each role used
    meanwhile and how busy the machine's CPUs were: a view that falls behind on a
    machine with no core to spare is slow for want of CPU, not of a round trip.  With
    no view (``views`` 0) the load alone: no maintainer, no probe."""
    pids = _pids(c) | ({"probe": os.getpid()} if views else {})
    before, machine_before, t = process_cpu(pids), cpu_times(), time.monotonic()
    probe = asyncio.create_task(_probe(c, a.duration, f"v{views - 1}")) if views else None
    half = await asyncio.to_thread(_load, c.d, a.procs, a.clients, a.duration, rate, a.keys)
    fresh = await probe if probe is not None else {}
    took = time.monotonic() - t
    busy = busy_between(machine_before, cpu_times())
    cpu = _cpu_by_role(pids, before, half.pop("cpu_s"))
    # (the load processes' own CPU is of their load alone: a.duration of it)
    fresh["cpu_cores"] = {
        r: round(v / (a.duration if r == "load" else took), 2) for r, v in sorted(cpu.items())
    }
    fresh["machine_busy"] = busy
    fresh["machine_cores"] = os.cpu_count()
    return half, fresh


def _pids(c: Cluster) -> dict[str, int]:
    """The cluster's processes by name, its views' maintainer as ``maintainer``."""
    pids = cluster_pids(c.d)
    if c.maintainer is not None:
        pids["maintainer"] = c.maintainer.pid
    return pids


def _cpu_by_role(pids: dict[str, int], before: dict[str, float], load: float) -> dict[str, float]:
    """CPU seconds each role's processes used since ``before`` (``process_cpu`` of
    ``pids``), the load processes' ``load`` among them."""
    cpu: dict[str, float] = {"load": load}
    for name, used in process_cpu(pids).items():
        if name in before:
            role = name if name in ("probe", "maintainer") else process_role(name)
            cpu[role] = cpu.get(role, 0.0) + used - before[name]
    return cpu


STALENESS_RUNS = {"2": "staleness", "1": "staleness_index_alone", "0": "at_rate_without_views"}
"""The staleness runs by view count (``--staleness-views``), as the result names them."""


def _freshness(
    a: argparse.Namespace, base: Path, rate: float, counts: list[str], result: dict[str, Any]
) -> None:
    """The staleness runs at ``rate``, each on a fresh cluster, into ``result``, and the
    index's own cores at that rate where both its run and the run without views were."""
    for count in counts:
        views, key = int(count), STALENESS_RUNS[count]
        with Cluster(base) as c:
            if views:
                c.maintain()
                asyncio.run(_define(c, views, a.keys))  # v0: the index, v1: the aggregate
            half, fresh = asyncio.run(_staleness(c, a, rate, views))
            result[key] = {"writes": half, **fresh}
            print(f"{key} at {half['writes_per_s']:,} writes/s: {result[key]}", flush=True)
    upkeep = _upkeep(result)
    if upkeep is not None:
        result["index_cores_at_rate"] = upkeep
        print(f"index_cores_at_rate: {upkeep}", flush=True)


def _upkeep(result: dict[str, Any]) -> dict[str, float] | None:
    """The cores the index view took at the staleness rate, per role and in all: the
    staleness run's against the same load's with no view (None without both).  The
    maintainer's and the probe's (its lookups of the view, a reader's) count whole; a
    role that used fewer with the view counts negative (the routers batch more at the
    higher latency)."""
    with_view, bare = result.get("staleness_index_alone"), result.get("at_rate_without_views")
    if with_view is None or bare is None:
        return None
    a, b = with_view["cpu_cores"], bare["cpu_cores"]
    out = {r: round(a.get(r, 0.0) - b.get(r, 0.0), 2) for r in sorted({*a, *b})}
    out["all"] = round(sum(a.values()) - sum(b.values()), 2)
    return out


def _median_run(runs: list[dict[str, Any]], without: list[dict[str, Any]] | None) -> Any:
    """The median of ``runs`` (writes/s, with every run's), and its cost against the
    median run ``without`` views: on a machine whose speed drifts between runs by more
    than a view costs, one run of each said 5 % once and 48 % the next."""
    r = dict(sorted(runs, key=lambda x: x["writes_per_s"])[len(runs) // 2])
    r.pop("cost", None)
    r["runs"] = [x["writes_per_s"] for x in runs]
    if without is not None and without is not runs:
        base = sorted(x["writes_per_s"] for x in without)[len(without) // 2]
        if base:
            r["cost"] = round(1 - r["writes_per_s"] / base, 3)
    return r


def _writes(a: argparse.Namespace, base: Path) -> dict[int, Any]:
    """Base writes/s with each count of views (``--views``), ``--repeat`` times
    interleaved: each count's median run."""
    counts = [int(x) for x in a.views.split(",") if x.strip()]
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in counts}
    for i in range(a.repeat):
        for n in counts:
            with Cluster(base) as c:
                if n:
                    c.maintain()
                    asyncio.run(_define(c, n, a.keys))
                pids = _pids(c)
                before = process_cpu(pids)
                load = functools.partial(_load, c.d, a.procs, a.clients, a.duration, 0.0, a.keys)
                connect = functools.partial(_client, c, "lag")
                storage = view_lag.storage_metrics(c.st())
                r = view_lag.watched(load, connect, c.metrics, storage) if n else load()
                cpu = _cpu_by_role(pids, before, r.pop("cpu_s"))
            # CPU a base write, by role: less at the mercy of the machine's phase than
            # writes/s (a view's cost in it is the same work whatever the peak).
            writes = r["writes_per_s"] * a.duration
            r["cpu_us_per_write"] = {
                role: round(1e6 * used / writes, 1) for role, used in sorted(cpu.items())
            } if writes else {}  # fmt: skip
            runs[n].append(r)
            without = runs[0][i] if 0 in runs and len(runs[0]) > i else None
            cost = ""
            if n and without and without["writes_per_s"]:
                # What maintaining the views costs the base's writes (the target for one
                # index view: at most 35 %); with one load process the client may be the
                # bottleneck, with more the cluster is.
                r["cost"] = round(1 - r["writes_per_s"] / without["writes_per_s"], 3)
                cost = f"  cost {100 * r['cost']:.0f} % of the writes without views"
            run = f" (run {i + 1} of {a.repeat})" if a.repeat > 1 else ""
            per = r["cpu_us_per_write"]
            roles = ", ".join(f"{role} {us:g}" for role, us in per.items())
            print(f"views {n:>2}: {r['writes_per_s']:>7,} writes/s  p50 {r['p50_ms']} ms  "
                  f"p99 {r['p99_ms']} ms{cost}{run}\n"
                  f"          CPU {sum(per.values()):.1f} µs a write ({roles})",
                  flush=True)  # fmt: skip
            if n:
                print(f"          {view_lag.behind_text(r)}", flush=True)
    out: dict[int, Any] = {}
    for n in counts:
        r = out[n] = _median_run(runs[n], runs.get(0))
        if a.repeat > 1:
            cost = f"  cost {100 * r['cost']:.0f} %" if "cost" in r else ""
            print(f"views {n:>2}: median {r['writes_per_s']:,} writes/s{cost}  runs "
                  f"{', '.join(f'{x:,}' for x in r['runs'])}", flush=True)  # fmt: skip
    return out


def _worker_main(args: list[str]) -> int:
    """A load process (:func:`_load` starts it): its figures as one JSON line."""
    tune_process()  # uvloop and a rare collector, as every other benchmark's load process
    d, clients, seconds, rate, seed, keys = args[:6]
    st = json.loads((Path(d) / "cluster.json").read_text())
    out = asyncio.run(_worker(st, int(clients), float(seconds), float(rate), int(seed), int(keys)))
    print(json.dumps(out), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--worker"]:
        return _worker_main(args[1:])
    ap = argparse.ArgumentParser(
        prog="rubberband bench views", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--views", default="0,1,3,10",
                    help="view counts to measure writes with ('': none)")  # fmt: skip
    ap.add_argument("--staleness-rate", type=float, default=0.0,
                    help="writes/s to measure staleness at (default: half the peak)")  # fmt: skip
    ap.add_argument("--staleness-views", default="2,1,0",
                    help="staleness with 2 views (index, aggregate), 1 (index); 0: the "
                    "same load with no view, for its base writes and cores")  # fmt: skip
    ap.add_argument("--procs", type=int, default=2, help="load processes")
    ap.add_argument("--clients", type=int, default=256,
                    help="writes in flight per load process at most (enough that the "
                    "cluster, not the window, sets the peak)")  # fmt: skip
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--keys", type=int, default=ROWS,
                    help="base keys the writers pick from: each run starts from an empty "
                    "table, so a few (50,000) make most writes updates, as on a full "
                    "table, where an index view writes two rows a change")  # fmt: skip
    ap.add_argument("--rows", type=int, default=100_000, help="rows for the lookups (0: none)")
    ap.add_argument("--lookups", type=int, default=2_000)
    ap.add_argument(
        "--rows-per-lookup",
        type=int,
        default=1,
        help="rows of each secondary key (001's experiment: 1, every one unique)",
    )
    ap.add_argument("--lookups-on", default="table,kv",
                    help="the lookups' base: a scan-engine table (against the scan "
                    "engine's select), key-value data (against a scan by the client)")  # fmt: skip
    ap.add_argument("--state-dir", "--dir", dest="dir", default=None,
                    help="where the clusters' directories go")  # fmt: skip
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeat", type=int, default=1,
                    help="measure the view counts this many times, interleaved (0, 1, 0, 1, "
                    "...), and report the median of each with every run")  # fmt: skip
    a = ap.parse_args(args)
    if a.repeat < 1:
        ap.error("--repeat takes 1 or more")
    if not KEYS_LEAST <= a.keys <= ROWS:
        ap.error(f"--keys takes {KEYS_LEAST:,} to {ROWS:,}")
    counts = [x.strip() for x in a.staleness_views.split(",") if x.strip()]
    if not set(counts) <= set(STALENESS_RUNS):
        ap.error("--staleness-views takes 0, 1 and 2")
    bases = [x.strip() for x in a.lookups_on.split(",") if x.strip()]
    if not set(bases) <= {"table", "kv"}:
        ap.error("--lookups-on takes table and kv")
    if a.rows and not 1 <= a.rows_per_lookup <= a.rows:
        ap.error("--rows-per-lookup takes 1 to --rows")
    base = Path(a.dir or tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    check_idle()
    tune_process()  # the probes and lookups are clients: uvloop and a rare collector
    result: dict[str, Any] = {"experiment": "views", "keys": a.keys, "writes": _writes(a, base)}
    rate = a.staleness_rate
    if not rate and result["writes"]:
        rate = result["writes"].get(0, next(iter(result["writes"].values())))["writes_per_s"] / 2
    if rate:
        _freshness(a, base, rate, counts, result)
    for on in bases if a.rows else []:
        key = {"table": "lookups_table", "kv": "lookups"}[on]
        with Cluster(base, "scan-memory" if on == "table" else "memory") as c:
            c.maintain()
            run = _table_lookups if on == "table" else _lookups
            result[key] = asyncio.run(run(c, a.rows, a.lookups, a.rows_per_lookup))
            print(f"{key}: {result[key]}", flush=True)
    if a.json:
        print(json.dumps({**result, "machine": machine()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
