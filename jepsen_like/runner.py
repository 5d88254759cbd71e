"""``python -m jepsen_like run``: a workload against a real local cluster while a nemesis
injects faults, then every checker of the workload on the recorded history.

The multicast workload runs E-Cast alone: routers as separate daemons, receivers logging
every delivery and clients submitting (the processes and history recording of ``ecast
bench --check``), the key-ring config with replication 3 or (``--config broadcast``)
every message to every joined process, clients included.  The nemesis
(:mod:`jepsen_like.nemesis`) kills and pauses routers from a seeded schedule; faults stop
some seconds before the end and are healed; the checkers of :mod:`ecast.history` judge
the history (validity, no duplicates, total order, no gaps per session, causal order,
every acknowledged message delivered by each of its destinations).

The run prints its seed first, then each fault as it happens, then one line per
checker; it writes ``history.jsonl`` and ``report.json`` into ``--dir``, and exits 1 on
any violation.  ``--mutation`` plants a known bug (test switch) in the routers, the
clients' endpoints, the Rubberband config or the storage processes, to show that a run
catches it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from jepsen_like import net
from jepsen_like.nemesis import KINDS, NET_KINDS, RouterNemesis
from jepsen_like.net import Net


def run(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jepsen_like run", description=__doc__)
    ap.add_argument("--workload", choices=["multicast", "list-append", "bank"], default="multicast")
    ap.add_argument("--nemesis", default="kill,pause", help=f"comma-separated: {', '.join(KINDS)}")
    ap.add_argument("--time", type=float, default=60.0, help="seconds of workload")
    ap.add_argument("--seed", type=int, default=None, help="default: from the clock")
    ap.add_argument("--dir", default=None, help="where the history and report go")
    ap.add_argument("--rate", type=float, default=3000.0, help="messages per second, in all")
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--receivers", type=int, default=8)
    ap.add_argument("--settle", type=float, default=8.0, help="seconds without faults at the end")
    ap.add_argument(
        "--min-faults",
        type=int,
        default=0,
        help="Rubberband workloads: inject faults past --time minus --settle until this many "
        "were injected (at most --time seconds more): the nemesis waits for a healthy ring "
        "between faults, so a slow machine gets the same faults later, not fewer",
    )
    ap.add_argument(
        "--mutation",
        action="append",
        default=[],
        help="plant a known bug (test switch): a router, endpoint, Rubberband config or "
        "storage mutation",
    )
    ap.add_argument(
        "--engine",
        choices=["memory", "scan-kv", "memcached", "log", "scan-log"],
        default="memory",
        help="the storage engine of the Rubberband workloads (bank keeps integers, which"
        " every engine stores; list-append keeps lists)",
    )
    ap.add_argument(
        "--config",
        choices=["key-ring", "broadcast"],
        default="key-ring",
        help="the multicast workload's config: key-ring (replication 3) or broadcast"
        " (every message to every joined process)",
    )
    ap.add_argument(
        "--progress-timeout",
        type=float,
        default=None,
        help="the multicast clients' progress timeout (default 2 s): how long a client "
        "waits for progress before it resends its window through another router.  A short "
        "one makes every stall a resend race, the race a router must deduplicate",
    )
    ap.add_argument(
        "--final-read-budget",
        type=float,
        default=120.0,
        help="seconds the Rubberband workloads' final reads have in all (what is not read"
        " by then is reported unread, a violation)",
    )
    ap.add_argument(
        "--answer-timeout",
        type=float,
        default=10.0,
        help="seconds a Rubberband client waits for a read's answers (the SDK's"
        " answer_timeout) before it reports the read indeterminate",
    )
    ap.add_argument(
        "--views",
        action="store_true",
        help="bank: an aggregate view of the accounts kept by a maintainer process and read"
        " at every view level; the checker holds every read to the initial total",
    )
    ap.add_argument("--json", action="store_true", help="the report as the last line")
    a = ap.parse_args(argv)
    # SIGTERM (a CI timeout, a user's kill) unwinds like Ctrl-C: the cluster is taken
    # down and the namespaces removed by the ``finally`` blocks, nothing left running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    seed = a.seed if a.seed is not None else int(time.time() * 1000) % 1_000_000
    print(f"seed {seed}", flush=True)
    kinds = tuple(k for k in a.nemesis.split(",") if k)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        print(f"jepsen_like run: unknown faults {unknown}; known: {', '.join(KINDS)}",
              file=sys.stderr)  # fmt: skip
        return 2
    if "power-cut" in kinds and (a.workload == "multicast" or a.engine not in ("log", "scan-log")):
        # E-Cast keeps nothing on disk; Rubberband survives losing every process only
        # on the durable engine.
        print("jepsen_like run: power-cut is a Rubberband fault on --engine log or scan-log (every "
              "process SIGKILLed, then the cluster restarted from its disks)",
              file=sys.stderr)  # fmt: skip
        return 2
    if a.workload != "multicast" and "pause-app" in kinds:
        # The Rubberband workloads' clients are tasks of this process, not processes.
        print("jepsen_like run: pause-app is a multicast fault (its clients and receivers"
              " are processes of their own)", file=sys.stderr)  # fmt: skip
        return 2
    out = Path(a.dir or f"jepsen-{a.workload}-{seed}")
    out.mkdir(parents=True, exist_ok=True)
    network: Net | None = None
    if NET_KINDS & set(kinds):
        problem = net.problem()
        if problem is not None:
            print(f"jepsen_like run: cannot inject network faults: {problem}", file=sys.stderr)
            return 2
        network = Net()
        print(f"network: namespaces on {network.prefix}.0/24 (bridge {network.bridge})")
    try:
        if a.workload in ("list-append", "bank"):
            return _rubberband(a, kinds, seed, out, network)
        return _multicast(a, kinds, seed, out, network)
    finally:
        if network is not None:
            network.destroy()


def mutation_args(names: list[str]) -> list[str]:
    """``ecast bench`` flags that plant each named bug where it lives: an endpoint's in the
    clients, the rest in the routers (which refuse one they do not know)."""
    from ecast.core import mutations

    endpoint = mutations.known("endpoint")
    return [f"--{'client' if m in endpoint else 'router'}-arg=--mutation={m}" for m in names]


def _multicast(
    a: argparse.Namespace, kinds: tuple[str, ...], seed: int, out: Path, network: Net | None
) -> int:
    from ecast import bench

    history = out / "history.jsonl"
    procs = 1
    apps = (*(f"recv{k}" for k in range(procs)), *(f"c{c + 1}" for c in range(a.clients)))
    placement = {}
    if network is not None:
        placement = {n: network.add(n) for n in ("r1", "r2", "r3", *apps)}
    nemesis = RouterNemesis(
        kinds,
        seed,
        until=max(0.0, a.time - a.settle),
        net=network,
        apps=apps if network is not None else (),
        say=_say,
    )

    argv_bench = [
        "--routers", "3", "--receivers", str(a.receivers), "--clients", str(a.clients),
        "--rate", str(a.rate), "--duration", str(a.time), "--warmup", "1",
        "--check", "--history", str(history), "--worker-sched", "normal",
        "--receiver-procs", str(procs), "--config", a.config,
    ]  # fmt: skip
    argv_bench += mutation_args(a.mutation)
    if a.progress_timeout is not None:
        argv_bench.append(f"--client-arg=--progress-timeout={a.progress_timeout}")
    if a.mutation:
        os.environ["ECAST_TEST_MUTATIONS"] = "1"
    started = time.monotonic()
    bench_args = bench.parser().parse_args(argv_bench)
    result = bench.run_bench(bench_args, nemesis, placement)
    violations = list(result.get("violations", []))
    submitted, acked = result.get("submitted") or 0, result.get("acked") or 0
    unknown = result.get("indeterminate") or 0
    if acked + unknown < submitted:
        # Clients drain their windows before they leave, after faults stopped: a
        # message never acknowledged by then was lost to the client (3.3.2, termination).
        # A client declared faulty cannot learn its messages' fate: those count as
        # indeterminate (the checkers judge them from the deliveries), not as lost.
        violations.append(
            f"termination: {submitted - acked - unknown} of {submitted} submissions never "
            "acknowledged after every fault was healed"
        )
    series = _multicast_series(history, nemesis.wall0)
    config_path, config_args = bench.config_spec(bench_args)
    report: dict[str, Any] = {
        "seed": seed,
        "workload": a.workload,
        "checker": {"name": "multicast", "config": config_path}
        | ({"config_args": config_args} if config_args else {}),
        "nemesis": list(kinds),
        "mutation": a.mutation,
        "time_s": a.time,
        "wall_s": round(time.monotonic() - started, 1),
        "submitted": result.get("submitted"),
        "acknowledged": result.get("acked"),
        "indeterminate": unknown,
        "client_incarnations": result.get("client_incarnations"),
        "throughput_per_s": result.get("throughput_per_s"),
        "p50_ms": result.get("p50_ms"),
        "p99_ms": result.get("p99_ms"),
        "faults": nemesis.report(),
        "history": str(history),
        "history_events": result.get("history_events"),
        "checks_ran": result.get("checks_ran"),
        "violations": violations,
        "valid": bool(result.get("checkers_passed")) and not violations,
        "per_second": series,
    }
    _finish(out, report)
    faults = report["faults"]["by_kind"]
    print(
        f"{report['submitted']} submitted, {report['acknowledged']} acknowledged, "
        f"{unknown} indeterminate; "
        f"faults {faults or 'none'}; {report['checks_ran']} checks on "
        f"{report['history_events']} events: "
        + ("valid" if report["valid"] else f"{len(report['violations'])} violation(s)"),
        flush=True,
    )
    for v in report["violations"][:10]:
        print(f"  violation: {str(v)[:400]}")
    if a.json:
        print(json.dumps(report))
    return 0 if report["valid"] else 1


def _finish(out: Path, report: dict[str, Any]) -> None:
    """``report.json`` and ``report.png`` (throughput and latency, faults shaded)."""
    from rubberband.tools.report import plot

    verdict = "valid" if report["valid"] else f"{len(report['violations'])} violation(s)"
    title = (f"{report['workload']}, seed {report['seed']}, faults "
             f"{', '.join(report['nemesis']) or 'none'}: {verdict}")  # fmt: skip
    why = plot(out / "report.png", title, report["per_second"], report["faults"]["faults"])
    report["png"] = why or str(out / "report.png")
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))


def _rubberband_series(history: list[dict[str, Any]]) -> list[dict[str, float]]:
    from rubberband.tools.report import per_second

    pending: dict[str, float] = {}
    ops: list[tuple[float, float | None, bool]] = []
    for r in history:
        if _final(r):
            continue
        if r["type"] == "invoke":
            pending[r["process"]] = r["time"]
        elif r["process"] in pending:
            ops.append((pending.pop(r["process"]), r["time"], r["type"] == "ok"))
    return per_second(ops)


def _multicast_series(history: Path, wall0: float | None) -> list[dict[str, float]]:
    """Submissions and their acknowledgements in the run's history, per second."""
    from rubberband.tools.report import per_second

    submitted: dict[str, float] = {}
    ops: list[tuple[float, float | None, bool]] = []
    first = None
    with open(history, encoding="utf-8") as f:
        for line in f:
            if '"submit"' not in line and '"ack"' not in line:
                continue
            e = json.loads(line)
            if "time" not in e:
                continue
            key = json.dumps([e["process"], e["id"]])
            if e["event"] == "submit":
                submitted[key] = e["time"]
                first = e["time"] if first is None else min(first, e["time"])
            elif e["event"] == "ack" and key in submitted:
                ops.append((submitted.pop(key), e["time"], True))
    base = wall0 if wall0 is not None else (first or 0.0)
    return per_second((i - base, c - base if c else None, ok) for i, c, ok in ops if i >= base)


def _final(r: dict[str, Any]) -> bool:
    """An operation of the final reads (process ``final``, or ``final/KEY``)."""
    p = r["process"]
    return p == "final" or p.startswith("final/")


def _say(text: str) -> None:
    print(text, flush=True)


STORAGE_OUTAGES = frozenset({"kill", "pause", "partition"})
"""Faults that can take a storage process out while a range's other replicas are busy
receiving it: then a read may rightly wait at a busy replica (the only one left), so
reads held for copies are reported, not judged, in runs with these faults."""


def _rubberband(
    a: argparse.Namespace, kinds: tuple[str, ...], seed: int, out: Path, network: Net | None
) -> int:
    """Rubberband: list-append or bank while storage processes fail."""
    from jepsen_like.rubberband_run import ACCOUNTS, INITIAL_BALANCE, Plan, run_rubberband
    from rubberband.checkers.history import Op
    from rubberband.checkers.run import check_all

    started = time.monotonic()
    plan = Plan(a.workload, kinds, seed, a.time, a.settle, _say, network, tuple(a.mutation),
                engine=a.engine, final_read_budget=a.final_read_budget,
                answer_timeout=a.answer_timeout, min_faults=a.min_faults,
                views=a.views)  # fmt: skip
    got = run_rubberband(out, plan)
    history = got["history"]
    with open(out / "history.jsonl", "w", encoding="utf-8") as f:
        for r in history:
            f.write(json.dumps(r) + "\n")
    checker: dict[str, Any] = {"name": a.workload}
    if a.workload == "bank":
        checker |= {"initial": dict.fromkeys(ACCOUNTS, INITIAL_BALANCE), "allow_negative": True}
    checking = time.monotonic()
    result = check_all([Op.from_json(r) for r in history], checker)
    phases = {**got["phases"], "checking_s": round(time.monotonic() - checking, 1)}
    violations = [
        f"{kind}: {json.dumps(example, default=str)[:2000]}"
        for kind, examples in result.to_json()["anomalies"].items()
        for example in examples
    ]
    for f in got["faults"]:
        if f["kind"] == "power-cut" and f.get("error"):
            violations.append(f"a whole-cluster restart failed: {f['error']}")
    if got["resumed_alive"]:
        violations.append(
            f"voted-out or expelled processes kept running after they resumed: "
            f"{got['resumed_alive']}"
        )
    if got.get("stuck"):
        from jepsen_like.rubberband_run import WORKERS_GRACE

        violations.append(
            f"liveness: the operation in flight of client slot(s) {got['stuck']} had not "
            f"ended {WORKERS_GRACE:g} s after the workload did (an SDK call ends within "
            "its own timeouts)"
        )
    unread = [r for r in history if _final(r) and r["type"] == "info"]
    if unread:
        # After every fault was healed the ring serves every key: a final read that
        # fails leaves that key's acknowledged appends unverified, which is no pass.
        first = unread[0]["value"][0][1] if unread[0]["value"] else "the accounts"
        violations.append(
            f"availability: {len(unread)} final read(s) failed after every fault was healed"
            f" (first: {first}: {unread[0].get('error')})"
        )
    held = {k: v for k, v in sorted(got["reads_held"].items()) if v}
    held_checked = not set(kinds) & STORAGE_OUTAGES
    if held and held_checked:
        violations.append(
            f"availability: {sum(held.values())} sequential read(s) waited for a copy at a "
            f"replica still receiving its ranges ({held}), though every range kept a "
            "replica that was not (4.4.1: reads go to non-busy replicas where there is one)"
        )
    by_kind: dict[str, int] = {}
    for fault in got["faults"]:
        by_kind[fault["kind"]] = by_kind.get(fault["kind"], 0) + 1
    invokes = [r for r in history if r["type"] == "invoke" and not _final(r)]
    report: dict[str, Any] = {
        "seed": seed,
        "workload": a.workload,
        "engine": a.engine,
        "checker": checker,
        "nemesis": list(kinds),
        "time_s": a.time,
        "wall_s": round(time.monotonic() - started, 1),
        "phases": phases,
        "submitted": len(invokes),
        "acknowledged": sum(1 for r in history if r["type"] == "ok" and not _final(r)),
        "failed": sum(1 for r in history if r["type"] == "fail"),
        "indeterminate": sum(1 for r in history if r["type"] == "info"),
        "faults": {"by_kind": by_kind, "faults": got["faults"]},
        "ring_after": got["ring"],
        "history": str(out / "history.jsonl"),
        "history_events": len(history),
        "checks_ran": 1,
        "checker_stats": result.stats,
        "violations": violations,
        "reads_held": {"by_process": held, "checked": held_checked},
        "valid": result.valid is True and not violations,
        "per_second": _rubberband_series(history),
    }
    _finish(out, report)
    print(
        f"{report['submitted']} operations, {report['acknowledged']} acknowledged, "
        f"{report['indeterminate']} indeterminate; faults {by_kind or 'none'}; "
        f"{', '.join(f'{k[:-2]} {v:g} s' for k, v in phases.items())}; {a.workload}: "
        + ("valid" if report["valid"] else f"{len(violations)} violation(s)"),
        flush=True,
    )
    for v in violations[:10]:
        print(f"  violation: {v[:400]}")
    if a.json:
        print(json.dumps(report, default=str))
    return 0 if report["valid"] else 1
