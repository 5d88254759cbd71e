"""The experiments of ``rubberband bench``, after the dissertation's figures.

Each one starts real local clusters (:class:`~rubberband.bench.harness.Bench`), prints a
table, draws a PNG shaped like its figure (``--png``), and with ``--json`` ends with one
JSON object: its rows, the baseline of the same run, the machine and the placement.
Every size is a flag, so a test runs each experiment at a tiny size in seconds.

* ``write-vs-storage`` (Figure 4.9), ``write-vs-clients`` (4.12), ``write-vs-routers``
  (4.14), ``write-vs-payload`` (4.15): write throughput, against ``ecast bench`` with
  ``KeyRingConfig`` at the same size;
* ``read-isolation`` (4.16): reads/s as the share of snapshot reads grows, and basic
  reads, with snapshot refusals and retries;
* ``latency-vs-load`` (4.19): p50 and p99 from light load to saturation, with message
  clumping and delayed acknowledgements on and off;
* ``router-failover`` (4.18): a trace while the leader and then a follower are killed
  and replaced;
* ``elasticity`` (4.17, 5.12): a trace while the keyspace expands and contracts
  stepwise on the scan engine with data;
* ``cost``: CPU microseconds per operation for each role, and per ``destset``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ecast import local
from rubberband.bench.harness import Bench, check_idle, ecast_baseline, machine, state_dir

# ------------------------------------------------------------------ common


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def parser(name: str, doc: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(f"rubberband bench {name}", description=doc)
    ap.add_argument("--duration", type=float, default=10.0, help="measured seconds per point")
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds not measured")
    ap.add_argument("--payload", type=int, default=256, help="bytes per write")
    ap.add_argument("--state-dir", default=None, help="where the clusters' directories go")
    ap.add_argument("--png", default=None, help="draw the figure here")
    ap.add_argument("--json", action="store_true", help="end with one JSON object")
    ap.add_argument("--no-baseline", action="store_true", help="skip ecast bench")
    ap.add_argument("--write-bundle", type=int, default=1,
                    help="writes of one segment per message (write_batch's bundles; "
                    "1: each alone)")  # fmt: skip
    return ap


@contextlib.contextmanager
def cluster(args: argparse.Namespace, **settings: Any) -> Iterator[Bench]:
    check_idle()
    b = Bench(state_dir(args.state_dir), **settings)
    try:
        b.up()
        yield b
    finally:
        b.down()


def load_options(args: argparse.Namespace, **more: Any) -> dict[str, Any]:
    return {"duration": args.duration, "warmup": args.warmup, "payload": args.payload,
            "write_bundle": args.write_bundle, **more}  # fmt: skip


def baseline(args: argparse.Namespace, **kw: Any) -> dict[str, Any] | None:
    """``ecast bench`` at the same size and placement: as many receivers as storage
    processes, in as many OS processes as the storage processes' packs."""
    if args.no_baseline:
        return None
    storage = kw.get("storage", 16)
    procs = Bench(Path("."), storage=storage).pack_count()
    extra = [*(kw.get("extra") or ()), "--receiver-procs", str(procs)]
    return ecast_baseline(
        kw.get("routers", 3), storage, kw.get("replication", 3),
        kw.get("payload", args.payload), args.duration, args.warmup,
        clients=kw.get("clients", 1), extra=extra,
    )  # fmt: skip


def ratio(row: dict[str, Any]) -> None:
    base = row.get("ecast")
    if base and base.get("throughput_per_s"):
        row["ratio"] = round(row["throughput_per_s"] / base["throughput_per_s"], 3)


def table(rows: list[dict[str, Any]], columns: list[tuple[str, str]]) -> str:
    """A text table; ``columns`` are (title, key) with ``a.b`` reaching into dicts."""

    def get(row: dict[str, Any], key: str) -> Any:
        v: Any = row
        for part in key.split("."):
            v = v.get(part) if isinstance(v, dict) else None
        if isinstance(v, float):
            return f"{v:,.1f}" if abs(v) >= 10 else f"{v:.3g}"
        return "-" if v is None else f"{v:,}" if isinstance(v, int) else str(v)

    cells = [[t for t, _ in columns]] + [[get(r, k) for _, k in columns] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True))
                     for line in cells)  # fmt: skip


def finish(
    name: str,
    args: argparse.Namespace,
    rows: list[dict[str, Any]],
    columns: list[tuple[str, str]],
    draw: Callable[[Any, list[dict[str, Any]]], None] | None,
    **extra: Any,
) -> int:
    print(table(rows, columns), flush=True)
    why = ""
    if args.png and draw is not None:
        why = _plot(args.png, draw, rows)
        print(f"figure: {args.png}" if not why else f"figure not drawn: {why}")
    if args.json:
        out = {"experiment": name, "rows": rows, "machine": machine(), **extra}
        print(json.dumps(out, default=str))
    return 0


def _plot(path: str, draw: Callable[[Any, list[dict[str, Any]]], None], rows: list[Any]) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install '.[dev]')"
    fig = plt.figure(figsize=(8, 5))
    draw(fig, rows)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return ""


WRITE_COLUMNS = [("writes/s", "throughput_per_s"), ("writes/msg", "writes_per_message"),
                 ("p50 ms", "p50_ms"), ("p99 ms", "p99_ms"),
                 ("ecast/s", "ecast.throughput_per_s"), ("ratio", "ratio")]  # fmt: skip


def _series(
    fig: Any,
    rows: list[dict[str, Any]],
    x: str,
    group: str | None,
    xlabel: str,
    log: bool = True,
    y: str = "throughput_per_s",
    ylabel: str = "writes/s",
) -> None:
    ax = fig.add_subplot(1, 1, 1)
    groups = sorted({r.get(group) for r in rows}) if group else [None]
    for g in groups:
        mine = [r for r in rows if group is None or r.get(group) == g]
        label = f"{group} {g}" if group else "Rubberband"
        line = ax.plot([r[x] for r in mine], [r[y] for r in mine], marker="o", label=label)
        base = [(r[x], r["ecast"][y]) for r in mine if r.get("ecast")]
        if base:
            ax.plot(*zip(*base, strict=True), ls="--", color=line[0].get_color(),
                    label=f"ecast bench{', ' + label if group else ''}")  # fmt: skip
    if log:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


# ------------------------------------------------------------------ writes


def write_vs_storage(argv: list[str] | None = None) -> int:
    ap = parser("write-vs-storage", "Write throughput against storage processes (Figure 4.9).")
    ap.add_argument("--storage", type=_ints, default=_ints("1,2,4,8,16,32,64"))
    ap.add_argument("--replication", type=_ints, default=_ints("1,3,5"))
    ap.add_argument("--routers", type=int, default=3)
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--engine", choices=("null", "memory"), default="null",
                    help="the storage processes' engine: the null engine (the protocol "
                    "alone) or the memory engine (a sorted map and a change log)")  # fmt: skip
    args = ap.parse_args(argv)
    ops = {"null": None, "memory": "kv"}[args.engine]  # (None: the load's null-engine writes)
    rows = []
    for f in args.replication:
        for n in args.storage:
            if n < f:
                continue
            with cluster(args, routers=args.routers, storage=n, replication=f,
                         engine=args.engine) as b:  # fmt: skip
                r = b.run_load(1, 1, **load_options(args, window=args.window, ops=ops))
                placement = b.placement()
                if ops is not None:  # an engine that keeps data: the writes are in it
                    r["items_held"] = _items_held(b)
            row = {"storage": n, "replication": f, "engine": args.engine, **r,
                   "placement": placement}  # fmt: skip
            row["ecast"] = baseline(args, routers=args.routers, storage=n, replication=f)
            ratio(row)
            rows.append(row)
            print(f"storage {n}, replication {f}: {r['throughput_per_s']:,.0f}/s", flush=True)
    return finish("write-vs-storage", args, rows,
                  [("storage", "storage"), ("f", "replication"), *WRITE_COLUMNS],
                  lambda fig, rs: _series(fig, rs, "storage", "replication",
                                          "storage processes"))  # fmt: skip


def write_vs_clients(argv: list[str] | None = None) -> int:
    ap = parser("write-vs-clients", "Write throughput and fairness against clients (4.12).")
    ap.add_argument("--clients", type=_ints, default=_ints("1,4,16,64,256"))
    ap.add_argument("--storage", type=int, default=16)
    ap.add_argument("--replication", type=int, default=3)
    ap.add_argument("--in-flight", type=int, default=1024, help="in all, split among clients")
    ap.add_argument("--load-procs", type=int, default=2, help="OS processes for the clients")
    args = ap.parse_args(argv)
    rows = []
    with cluster(args, storage=args.storage, replication=args.replication) as b:
        for c in args.clients:
            window = max(1, args.in_flight // c)
            r = b.run_load(min(args.load_procs, c), c, **load_options(args, window=window))
            rows.append({"clients": c, "window": window, **r, "placement": b.placement()})
            print(f"{c} clients: {r['throughput_per_s']:,.0f}/s fairness {r['fairness']}",
                  flush=True)  # fmt: skip
    for row in rows:  # ecast bench runs a process per client: at most 4 of them here
        c = min(4, row["clients"])
        row["ecast"] = baseline(args, storage=args.storage, replication=args.replication,
                                clients=c)  # fmt: skip
        if row["ecast"]:
            row["ecast"]["clients"] = c
        ratio(row)
    return finish("write-vs-clients", args, rows,
                  [("clients", "clients"), *WRITE_COLUMNS, ("fairness", "fairness")],
                  lambda fig, rs: _series(fig, rs, "clients", None, "clients"))  # fmt: skip


def write_vs_routers(argv: list[str] | None = None) -> int:
    ap = parser("write-vs-routers", "Write throughput against routers (4.14).")
    ap.add_argument("--routers", type=_ints, default=_ints("1,3,5"))
    ap.add_argument("--storage", type=int, default=16)
    ap.add_argument("--replication", type=int, default=3)
    args = ap.parse_args(argv)
    rows = []
    for n in args.routers:
        with cluster(args, routers=n, storage=args.storage, replication=args.replication) as b:
            r = b.run_load(1, 1, **load_options(args))
            row = {"routers": n, **r, "placement": b.placement()}
        row["ecast"] = baseline(args, routers=n, storage=args.storage,
                                replication=args.replication)  # fmt: skip
        ratio(row)
        rows.append(row)
    return finish("write-vs-routers", args, rows, [("routers", "routers"), *WRITE_COLUMNS],
                  lambda fig, rs: _series(fig, rs, "routers", None, "routers",
                                          log=False))  # fmt: skip


def write_vs_payload(argv: list[str] | None = None) -> int:
    ap = parser("write-vs-payload", "Write throughput against payload size (4.15).")
    ap.add_argument("--payloads", type=_ints, default=_ints("16,64,256,1024,4096,16384"))
    ap.add_argument("--storage", type=int, default=16)
    ap.add_argument("--replication", type=int, default=3)
    args = ap.parse_args(argv)
    rows = []
    with cluster(args, storage=args.storage, replication=args.replication) as b:
        for size in args.payloads:
            r = b.run_load(1, 1, **{**load_options(args), "payload": size})
            mb = r["throughput_per_s"] * size / 1e6
            rows.append({"payload": size, **r, "mb_per_s": round(mb, 2),
                         "placement": b.placement()})  # fmt: skip
    for row in rows:
        row["ecast"] = baseline(args, storage=args.storage, replication=args.replication,
                                payload=row["payload"])  # fmt: skip
        ratio(row)
    return finish("write-vs-payload", args, rows,
                  [("bytes", "payload"), *WRITE_COLUMNS, ("MB/s", "mb_per_s")],
                  lambda fig, rs: _series(fig, rs, "payload", None, "payload (bytes)"))  # fmt: skip


# ------------------------------------------------------------------ reads


def read_isolation(argv: list[str] | None = None) -> int:
    ap = parser("read-isolation", "Reads/s as the share of snapshot reads grows (4.16).")
    ap.add_argument("--shares", type=_floats, default=_floats("0,0.25,0.5,0.75,1"))
    ap.add_argument("--storage", type=int, default=16)
    ap.add_argument("--replication", type=int, default=3)
    ap.add_argument("--clients", type=int, default=4)
    # 1,024 per client, 4,096 in all: the messages `ecast bench` keeps outstanding by
    # default.  At 256 per client the clients waited on round trips half the time and
    # snapshot reads peaked at about two thirds of what the same cluster serves.
    ap.add_argument("--window", type=int, default=1024, help="reads in flight per client")
    ap.add_argument("--bundle", type=int, default=32,
                    help="reads for one responder per message (read_batch's bundle)")  # fmt: skip
    ap.add_argument("--no-alone", action="store_true",
                    help="skip the rows that send each read alone (bundle 1)")  # fmt: skip
    args = ap.parse_args(argv)
    rows = []
    with cluster(args, storage=args.storage, replication=args.replication) as b:
        opts = load_options(args, window=args.window)
        cells = [(share, args.bundle) for share in args.shares]
        if not args.no_alone and args.bundle > 1:
            cells += [(share, 1) for share in (min(args.shares), max(args.shares))]
        for share, bundle in cells:
            r = b.run_load(min(2, args.clients), args.clients, mode="mix", snapshot_share=share,
                           bundle=bundle, **opts)  # fmt: skip
            name = f"{share:.0%} snapshot" + (", each read alone" if bundle == 1 else "")
            rows.append({"reads": name, "share": share, "bundle": bundle, **r})
            print(f"{name}: {r['throughput_per_s']:,.0f} reads/s", flush=True)
        r = b.run_load(min(2, args.clients), args.clients, mode="basic", **opts)
        rows.append({"reads": "basic", "share": None, **r})
        r = b.run_load(min(2, args.clients), args.clients, mode="write", **opts)
        rows.append({"reads": "(writes, same clients)", "share": None, **r})
        placement = b.placement()
    for row in rows:
        done = row["throughput_per_s"] * args.duration
        row["refusal_rate"] = round(row["refused"] / (done + row["refused"]), 4) if done else 0
    base = baseline(args, storage=args.storage, replication=args.replication)
    unsafe = None
    if not args.no_baseline:
        unsafe = ecast_baseline(3, args.storage, args.replication, args.payload, args.duration,
                                args.warmup, extra=["--unsafe"])  # fmt: skip

    def draw(fig: Any, rs: list[dict[str, Any]]) -> None:
        ax = fig.add_subplot(1, 1, 1)
        for alone, label in ((False, "sequential/snapshot mix"), (True, "each read alone")):
            mix = [r for r in rs if r["share"] is not None and (r["bundle"] == 1) == alone]
            if mix:
                ax.plot([100 * r["share"] for r in mix], [r["throughput_per_s"] for r in mix],
                        marker="o", ls="--" if alone else "-", label=label)  # fmt: skip
        for r, style in zip([r for r in rs if r["share"] is None], (":", "-."), strict=False):
            ax.axhline(r["throughput_per_s"], ls=style, color="gray", label=r["reads"])
        ax.set_xlabel("snapshot reads (%)")
        ax.set_ylabel("reads/s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)

    return finish("read-isolation", args, rows,
                  [("reads", "reads"), ("reads/s", "throughput_per_s"), ("p50 ms", "p50_ms"),
                   ("p99 ms", "p99_ms"), ("refused", "refused"), ("retries", "retries"),
                   ("refusal rate", "refusal_rate"), ("timeouts", "timeouts"),
                   ("reads/message", "reads_per_message")],
                  draw, ecast=base, ecast_unsafe=unsafe, placement=placement)  # fmt: skip


# ------------------------------------------------------------------ latency


def latency_vs_load(argv: list[str] | None = None) -> int:
    ap = parser("latency-vs-load", "Write latency from light load to saturation (4.19).")
    ap.add_argument("--fractions", type=_floats, default=_floats("0.1,0.25,0.5,0.75,0.9"))
    ap.add_argument("--storage", type=int, default=16)
    ap.add_argument("--replication", type=int, default=3)
    args = ap.parse_args(argv)
    rows: list[dict[str, Any]] = []
    peak = 0.0
    for on in (True, False):
        flags = [] if on else ["--no-clumping", "--no-delayed-acks"]
        setting = "clumping + delayed acks" if on else "neither"
        with cluster(args, storage=args.storage, replication=args.replication,
                     router_args=flags) as b:  # fmt: skip
            sat = b.run_load(1, 1, **load_options(args))
            peak = peak or sat["throughput_per_s"]
            rows.append({"setting": setting, "offered": "closed loop", "rate": None, **sat})
            for frac in args.fractions:
                rate = round(frac * peak)
                r = b.run_load(1, 4, **load_options(args, rate=rate))
                rows.append({"setting": setting, "offered": rate, "rate": rate, **r})
                print(f"{setting}: {rate}/s offered -> p50 {r['p50_ms']} ms", flush=True)
    if not args.no_baseline:
        for frac in args.fractions:
            rate = round(frac * peak)
            base = baseline(args, storage=args.storage, replication=args.replication,
                            extra=["--rate", str(rate)])  # fmt: skip
            rows.append({"setting": "ecast bench", "offered": rate, "rate": rate, **(base or {})})

    def draw(fig: Any, rs: list[dict[str, Any]]) -> None:
        ax = fig.add_subplot(1, 1, 1)
        for setting in dict.fromkeys(r["setting"] for r in rs):
            mine = [r for r in rs if r["setting"] == setting and r["rate"]]
            xs = [r["throughput_per_s"] for r in mine]
            line = ax.plot(xs, [r["p50_ms"] for r in mine], marker="o", label=f"{setting} p50")
            ax.plot(xs, [r["p99_ms"] for r in mine], marker="x", ls="--",
                    color=line[0].get_color(), label=f"{setting} p99")  # fmt: skip
        ax.set_xlabel("writes/s completed")
        ax.set_ylabel("latency (ms)")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)

    return finish("latency-vs-load", args, rows,
                  [("setting", "setting"), ("offered/s", "offered"),
                   ("done/s", "throughput_per_s"), ("p50 ms", "p50_ms"),
                   ("p99 ms", "p99_ms")], draw)  # fmt: skip


# ------------------------------------------------------------------ failover


def _leader(b: Bench) -> str | None:
    for p in local.StateDir.recorded(b.d).values():
        if "router" not in p.get("argv", ()) or not local.running(p["pid"]):
            continue
        h = local.http_json(f"http://{p.get('host', '127.0.0.1')}:{p['health_port']}/health")
        if h and h.get("leader"):
            return str(h["leader"])
    return None


def _gaps(trace: list[Any], after: float, until: float, bucket: float = 0.01) -> float:
    """The longest stretch without completions between ``after`` and ``until`` (wall-clock
    seconds), the edges included."""
    times = [k * bucket for k, _ in trace if after <= k * bucket < until]
    edges = [after, *times, until]
    return round(max(b - a for a, b in itertools.pairwise(edges)), 3)


def _resumed(trace: list[Any], after: float, until: float, bucket: float = 0.01) -> float | None:
    """Seconds from ``after`` to the end of the longest stretch without completions
    before ``until``: when completions came back after the fault.  Not the first
    completion after it: what was in flight when the router died may straggle in for a
    while first (on a slow machine, 0.18 s after a kill, before a 1 s stall)."""
    times = [k * bucket for k, _ in trace if after <= k * bucket < until]
    resumed, longest = None, -1.0
    for a, b in itertools.pairwise([after, *times]):
        if b - a > longest:
            resumed, longest = b, b - a
    return None if resumed is None else round(resumed - after, 3)


def _draw_failover(fig: Any, trace: dict[str, Any], events: list[dict[str, Any]]) -> None:
    ax = fig.add_subplot(1, 1, 1)
    for name, series in trace.items():
        ax.plot([t for t, _ in series], [n for _, n in series], lw=1, label=f"{name}/s")
    for e in events:
        ax.axvline(e["at"], color="red" if "SIGKILL" in e["what"] else "green", alpha=0.6)
        ax.text(e["at"], ax.get_ylim()[1] * 0.95, e["what"], fontsize=7, rotation=90)
    ax.set_xlabel("seconds")
    ax.set_ylabel("completed per second (0.1 s bins)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def router_failover(argv: list[str] | None = None) -> int:
    ap = parser("router-failover", "A trace while the leader, then a follower, are killed (4.18).")
    ap.add_argument("--storage", type=int, default=16)
    ap.add_argument("--replication", type=int, default=3)
    ap.add_argument(
        "--kill-at",
        type=_floats,
        default=_floats("6,16"),
        help="seconds into the measured window: the leader, then a follower",
    )
    ap.add_argument("--replace-after", type=float, default=4.0, help="seconds from a kill to "
                    "the start of its replacement")  # fmt: skip
    ap.add_argument("--rate", type=float, default=20_000.0, help="writes/s offered: a "
                    "saturated cluster sheds snapshot reads")  # fmt: skip
    ap.set_defaults(duration=25.0)
    args = ap.parse_args(argv)
    events: list[dict[str, Any]] = []
    kills = [(w, "kill", i) for i, w in enumerate(args.kill_at)]
    plan = sorted(kills + [(w + args.replace_after, "join", i) for w, _, i in kills])
    with cluster(args, storage=args.storage, replication=args.replication) as b:
        routers = local.LocalCluster(b.d, args=b.st()["router_args"])
        writes = b.start_load(1, 4, **load_options(args, trace=True, rate=args.rate))
        # A read sent through a router that dies is lost: it times out after a second
        # (not the SDK's default ten) and is read again through the new leader.
        reads = b.start_load(1, 1, mode="snapshot", window=16, duration=args.duration,
                             warmup=args.warmup, trace=True, answer_timeout=1.0)  # fmt: skip
        at = b.go(writes + reads)
        fresh = 0
        for when, kind, i in plan:
            time.sleep(max(0.0, at + args.warmup + when - time.time()))
            recorded = local.StateDir.recorded(b.d)
            live = [n for n, p in recorded.items()
                    if "router" in p.get("argv", ()) and local.running(p["pid"])]  # fmt: skip
            t = time.time()
            if kind == "kill":
                leader = _leader(b)
                victim = leader if i == 0 else next((n for n in live if n != leader), None)
                if victim is None or victim not in recorded:
                    continue
                os.kill(recorded[victim]["pid"], signal.SIGKILL)
                what = f"SIGKILL {victim} ({'leader' if i == 0 else 'follower'})"
            else:
                fresh += 1
                join = recorded[live[0]]
                routers.start(f"j{fresh}", f"{join.get('host', '127.0.0.1')}:"
                                           f"{join['ports']['listen']}")  # fmt: skip
                what = f"j{fresh} joins"
            events.append({"what": what, "wall": t, "at": round(t - at - args.warmup, 3)})
        w = Bench.collect(writes, args.duration + 60)[0]
        r = Bench.collect(reads, args.duration + 60)[0]
        placement = b.placement()
    start = at + args.warmup
    end = start + args.duration
    rows = []
    for e, nxt in zip(events, [*events[1:], None], strict=True):
        until = nxt["wall"] if nxt else end
        rows.append({"event": e["what"], "at_s": e["at"],
                     "writes_resumed_s": _resumed(w["trace"], e["wall"], until),
                     "write_gap_s": _gaps(w["trace"], e["wall"], until),
                     "snapshot_resumed_s": _resumed(r["trace"], e["wall"], until),
                     "snapshot_gap_s": _gaps(r["trace"], e["wall"], until)})  # fmt: skip
    trace = {"writes": _per(w["trace"], start, 0.1), "snapshot_reads": _per(r["trace"], start, 0.1)}

    def draw(fig: Any, rs: list[dict[str, Any]]) -> None:
        _draw_failover(fig, trace, events)

    return finish("router-failover", args, rows,
                  [("event", "event"), ("at s", "at_s"),
                   ("writes resumed s", "writes_resumed_s"), ("writes gap s", "write_gap_s"),
                   ("snapshots resumed s", "snapshot_resumed_s"),
                   ("snapshots gap s", "snapshot_gap_s")], draw,
                  trace=trace, placement=placement)  # fmt: skip


def _per(trace: list[Any], start: float, width: float) -> list[tuple[float, float]]:
    """Completions per second in bins of ``width`` seconds from ``start``."""
    bins: dict[int, int] = {}
    for k, n in trace:
        t = k * 0.01 - start
        if t >= 0:
            bins[int(t / width)] = bins.get(int(t / width), 0) + n
    if not bins:
        return []
    return [(round(i * width, 2), bins.get(i, 0) / width) for i in range(max(bins) + 1)]


# ------------------------------------------------------------------ elasticity


def _elasticity_args(argv: list[str] | None) -> argparse.Namespace:
    ap = parser("elasticity", "A trace while the keyspace expands and contracts (4.17, 5.12).")
    ap.add_argument("--engine", default="scan-kv", help="an engine that keeps data")
    ap.add_argument("--start", type=int, default=4, help="storage processes on the ring first")
    ap.add_argument("--steps", type=int, default=4, help="processes expanded, then contracted")
    ap.add_argument("--replication", type=int, default=3)
    ap.add_argument("--keys", type=int, default=100_000, help="loaded before the trace")
    ap.add_argument("--step-gap", type=float, default=3.0, help="seconds between steps")
    ap.add_argument("--rate", type=float, default=1000.0, help="writes/s offered (open loop)")
    ap.add_argument("--packed", action="store_true",
                    help="storage processes packed 16 to an OS process, as the other "
                    "experiments run them (default: each apart, as `rubberband cluster up` "
                    "does)")  # fmt: skip
    ap.set_defaults(duration=0.0)
    return ap.parse_args(argv)


def elasticity(argv: list[str] | None = None) -> int:
    args = _elasticity_args(argv)
    total = args.start + args.steps
    steps: list[dict[str, Any]] = []
    with cluster(args, storage=total, replication=args.replication, engine=args.engine,
                 key_space=args.keys, expand=args.start,
                 packs=0 if args.packed else total) as b:  # fmt: skip
        ops = "kv" if args.engine == "memory" else "scan-kv"
        _preload(b, args.keys, args.payload, ops)
        # Long enough for slow migrations; the run is stopped once the steps are done.
        duration = args.duration or 2 * args.steps * (args.step_gap + 120) + 30
        load = b.start_load(1, 4, ops=ops, duration=duration, warmup=args.warmup, trace=True,
                            key_space=args.keys, payload=args.payload, window=256,
                            rate=args.rate)  # fmt: skip
        at = b.go(load)
        start = at + args.warmup
        time.sleep(max(0.0, start + args.step_gap - time.time()))
        space = args.keys
        plan = [("expand", n) for n in b.names[args.start :]]
        plan += [("contract", n) for n in reversed(b.names[args.start :])]
        for op, name in plan:
            before = _bytes(b)
            t0 = time.time()
            if op == "expand":
                # Split the widest range: the new id halves the largest gap on the ring.
                b.reconfigure("expand", name, _widest_gap(b, space))
            else:
                b.reconfigure("contract", name)
            t1 = time.time()
            time.sleep(args.step_gap)  # heartbeats bring the sizes up to date meanwhile
            after = _bytes(b)
            # Items that arrived somewhere (receivers grow; the others shrink or stay);
            # bytes at the engines' own bytes per item, since a table's byte count
            # keeps the room a delete freed.
            moved = sum(max(0, after.get(p, (0, 0))[0] - before.get(p, (0, 0))[0])
                        for p in after)  # fmt: skip
            per_item = max((v[1] / v[0] for v in before.values() if v[0]), default=0.0)
            steps.append({"step": f"{op} {name}", "start_s": round(t0 - start, 2),
                          "end_s": round(t1 - start, 2), "migration_s": round(t1 - t0, 2),
                          "items_moved": moved,
                          "bytes_moved": round(moved * per_item)})  # fmt: skip
        time.sleep(args.step_gap)  # the steady state after the last step, in the trace
        Bench.stop(load)
        result = Bench.collect(load, 120)[0]
        placement = b.placement()
    series = _per(result["trace"], start, 1.0)
    steady = [n for t, n in series if t < steps[0]["start_s"] - 1] if steps else []
    base = sum(steady) / len(steady) if steady else 0.0
    for s in steps:
        inside = [n for t, n in series if s["start_s"] - 1 < t <= s["end_s"] + 1]
        s["lowest_per_s"] = min(inside) if inside else None
        s["lowest_vs_steady"] = round(min(inside) / base, 3) if inside and base else None

    def draw(fig: Any, rs: list[dict[str, Any]]) -> None:
        ax = fig.add_subplot(1, 1, 1)
        ax.plot([t for t, _ in series], [n for _, n in series], lw=1.2, label="writes/s")
        for s in rs:
            ax.axvspan(s["start_s"], s["end_s"], alpha=0.2,
                       color="green" if s["step"].startswith("expand") else "orange")  # fmt: skip
        ax.set_xlabel("seconds")
        ax.set_ylabel("writes/s (1 s bins)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)

    return finish("elasticity", args, steps,
                  [("step", "step"), ("start s", "start_s"), ("migration s", "migration_s"),
                   ("items moved", "items_moved"), ("bytes moved", "bytes_moved"),
                   ("lowest/s", "lowest_per_s"),
                   ("lowest/steady", "lowest_vs_steady")], draw,
                  steady_per_s=round(base, 1), trace=series, placement=placement)  # fmt: skip


def _preload(b: Bench, keys: int, payload: int, ops: str) -> None:
    """Every key written once, through a client: the data the migrations move."""
    import asyncio

    import rubberband
    from rubberband.bench.load import OPS, value_text

    st = b.st()

    async def go() -> None:
        rb = await rubberband.connect(st["routers"], "client:preload", ops=OPS[ops],
                                      credentials=st["client_credentials"])  # fmt: skip
        try:
            blob = value_text(payload)  # with the key in front: a value of its own per key
            for lo in range(0, keys, 500):
                await asyncio.gather(*(rb.put_many({k: f"{k:08x}{blob[8:]}"
                                                    for k in range(i, min(i + 50, keys))})
                                       for i in range(lo, min(lo + 500, keys), 50)))  # fmt: skip
        finally:
            await rb.close()

    asyncio.run(go())


def _bytes(b: Bench) -> dict[str, tuple[int, int]]:
    """(items, bytes) each storage process's engine holds (the supers' heartbeat figures)."""
    load = b.status().get("load", {})
    return {p: (int(v.get("items") or 0), int(v.get("bytes") or 0)) for p, v in load.items()}


def _items_held(b: Bench, wait: float = 5.0) -> int:
    """Items the storage processes' engines hold in all, once their heartbeats say any
    (a second apart): a run whose writes the engine refused holds none."""
    deadline = time.monotonic() + wait
    while True:
        held = sum(items for items, _ in _bytes(b).values())
        if held or time.monotonic() > deadline:
            return held
        time.sleep(0.2)


def _widest_gap(b: Bench, space: int) -> int:
    ids = sorted(int(r["id"]) for r in b.status().get("ring", []))
    if not ids:
        return space // 2
    gaps = [(ids[(i + 1) % len(ids)] - ids[i]) % space or space for i in range(len(ids))]
    i = max(range(len(ids)), key=lambda j: gaps[j])
    return (ids[i] + gaps[i] // 2) % space


# ------------------------------------------------------------------ cost


def cost(argv: list[str] | None = None) -> int:
    ap = parser("cost", "CPU microseconds per operation, per role, and per destset.")
    ap.add_argument("--storage", type=int, default=16)
    ap.add_argument("--replication", type=int, default=3)
    args = ap.parse_args(argv)
    rows = []
    with cluster(args, storage=args.storage, replication=args.replication) as b:
        for mode in ("write", "sequential", "snapshot", "basic"):
            window = 1024 if mode == "write" else 256
            r = b.run_load(1, 1, **load_options(args, mode=mode, window=window))
            row = {"operation": mode, "per_s": r["throughput_per_s"], **r["cpu_us_per_op"],
                   "cores": r["cpu_cores"]}  # fmt: skip
            row["total"] = round(sum(v for k, v in r["cpu_us_per_op"].items()), 1)
            rows.append(row)
            print(f"{mode}: {row['total']} µs per operation", flush=True)
        placement = b.placement()
    from rubberband.tools.cost import measure

    destset = measure(args.storage, args.replication, repeat=7, seed=1)["us_per_destset"]
    return finish("cost", args, rows,
                  [("operation", "operation"), ("per s", "per_s"), ("routers µs", "routers"),
                   ("storage µs", "storage"), ("clients µs", "clients"),
                   ("super µs", "super"), ("total µs", "total")], None,
                  destset_us=destset, placement=placement)  # fmt: skip


EXPERIMENTS: dict[str, Callable[[list[str] | None], int]] = {
    "write-vs-storage": write_vs_storage,
    "write-vs-clients": write_vs_clients,
    "write-vs-routers": write_vs_routers,
    "write-vs-payload": write_vs_payload,
    "read-isolation": read_isolation,
    "latency-vs-load": latency_vs_load,
    "router-failover": router_failover,
    "elasticity": elasticity,
    "cost": cost,
}


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in EXPERIMENTS:
        print(f"experiments: {', '.join(EXPERIMENTS)}", file=sys.stderr)
        return 2
    return EXPERIMENTS[args[0]](args[1:])


if __name__ == "__main__":
    sys.exit(main())
