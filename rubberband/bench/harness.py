"""A local Rubberband cluster for one measurement, its load, and the baseline.

:class:`Bench` brings up routers and a super with ``rubberband cluster up`` (separate OS
processes), then storage processes packed into a few OS processes
(:mod:`rubberband.bench.pack`), places them on the ring evenly, runs load processes
(:mod:`rubberband.bench.load`) that measure one common window, and takes everything down
again.  :func:`ecast_baseline` runs ``ecast bench`` at the same size, the yardstick every
write experiment reports its ratio against: this machine varies by 10-15 % from run to
run, so only figures of the same run compare.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ecast
from ecast import local
from rubberband.bench.load import COUNTS
from rubberband.tools.cli import run as _cli

BUCKET_S = 0.0001


@dataclass
class Bench:
    """One cluster: sizes and settings, fixed for its life."""

    d: Path
    routers: int = 3
    storage: int = 16
    replication: int = 3
    engine: str = "null"
    packs: int = 0
    """OS processes for the storage processes (0: one per 16, at least one)."""
    partitioning: str = "range"
    key_space: int = 1 << 30
    router_args: list[str] = field(default_factory=list)
    expand: int | None = None
    """Storage processes placed on the ring at start (None: all; the rest stay standby)."""
    names: list[str] = field(default_factory=list)
    loads: int = 0
    """Load processes started so far: each takes fresh client names."""
    load_procs: list[subprocess.Popen[str]] = field(default_factory=list)
    """Every load process started: those still running when the bench ends (an
    experiment that raised) are killed with the cluster, not left writing to the next."""

    def placement(self) -> dict[str, Any]:
        return {
            "routers": f"{self.routers} OS processes",
            "supers": "1 OS process",
            "storage": f"{self.storage} logical processes in {self.pack_count()} OS processes",
        }

    def pack_count(self) -> int:
        return self.packs or max(1, math.ceil(self.storage / 16))

    # ------------------------------------------------------------------ up and down
    def up(self) -> None:
        out = _cli(
            "cluster", "up", "--routers", str(self.routers), "--supers", "1",
            "--storage", "0", "--replication", str(self.replication),
            "--partitioning", self.partitioning, "--engine", self.engine,
            "--key-space", str(self.key_space), "--no-auto-repair",
            "--state-dir", str(self.d), *(f"--router-arg={a}" for a in self.router_args),
            timeout=300,
        )  # fmt: skip
        if out.returncode != 0:
            raise RuntimeError(f"cluster up failed: {out.stderr[-2000:]}")
        st = self.st()
        state = local.StateDir(self.d)
        packs = self.pack_count()
        per = math.ceil(self.storage / packs)
        started = []
        for j in range(1, packs + 1):
            names = [f"storage:b{j}-{i}" for i in range(1, per + 1)]
            names = names[: max(0, self.storage - len(self.names))]
            if not names:
                break
            self.names += names
            port = local.free_port()
            auth = (
                ["--credentials", str(state.issue("application", [f"storage:b{j}-*"]))]
                if state.credentials
                else ["--secret", state.secret]
            )
            argv = state.python(
                "rubberband.bench.pack", "--routers", ",".join(st["routers"]),
                "--names", ",".join(names), "--engine", self.engine,
                "--metrics", f"127.0.0.1:{port}", *auth,
            )  # fmt: skip
            state.start(f"pack{j}", argv, ports={"metrics": port}, health_port=port)
            started.append(f"pack{j}")
        for name in started:
            state.wait_healthy(name, timeout=180)
        space = 2**32 if self.partitioning == "hash" else self.key_space
        ring = self.names[: self.storage if self.expand is None else self.expand]
        step = space // len(ring)
        for n, name in enumerate(ring):
            self.reconfigure("expand", name, n * step)

    def reconfigure(self, op: str, *args: Any) -> float:
        """One admin request, waited for; the seconds it took."""
        from rubberband.tools.cluster import admin_request

        t0 = time.monotonic()
        code, body = admin_request(str(self.d), "/reconfigure", {"op": op, "args": list(args)})
        if code != 200:
            raise RuntimeError(f"{op} {args}: {body.get('error', body)}")
        return time.monotonic() - t0

    def st(self) -> dict[str, Any]:
        return dict(json.loads((self.d / "cluster.json").read_text()))

    def status(self) -> dict[str, Any]:
        out = _cli("cluster", "status", "--state-dir", str(self.d), "--json", timeout=30)
        return dict(json.loads(out.stdout)) if out.returncode == 0 else {}

    def down(self) -> None:
        for p in self.load_procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        _cli("cluster", "down", "--state-dir", str(self.d), timeout=120)

    def __enter__(self) -> Bench:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    # ------------------------------------------------------------------ load
    def start_load(
        self, procs: int = 1, clients: int = 1, **options: Any
    ) -> list[subprocess.Popen[str]]:
        """Load processes, connected and waiting for :meth:`go`."""
        st = self.st()
        flags = load_flags(options)
        out = []
        per = math.ceil(clients / procs)
        for j in range(procs):
            n = min(per, clients - j * per)
            if n <= 0:
                break
            self.loads += 1
            cmd = [sys.executable, "-m", "rubberband.bench.load", "--routers",
                   ",".join(st["routers"]), "--credentials", st["client_credentials"],
                   "--name", f"load{self.loads}", "--clients", str(n),
                   "--out", str(self.d / f"load{self.loads}.json"), *flags]  # fmt: skip
            pipe = subprocess.PIPE
            out.append(subprocess.Popen(cmd, stdin=pipe, stdout=pipe, stderr=pipe, text=True))
            self.load_procs.append(out[-1])
        for p in out:
            line = p.stdout.readline() if p.stdout else ""
            if '"ready"' not in line:
                err = p.stderr.read() if p.stderr else ""
                raise RuntimeError(f"a load process did not start: {err[-2000:]}")
        return out

    @staticmethod
    def go(procs: list[subprocess.Popen[str]], delay: float = 0.3) -> float:
        """Start every load process's clock at the same wall-clock time; returns it."""
        at = time.time() + delay
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(f"{at}\n")
            p.stdin.flush()
        return at

    @staticmethod
    def stop(procs: list[subprocess.Popen[str]]) -> None:
        """End the load processes' runs now (they report what they measured so far)."""
        for p in procs:
            assert p.stdin is not None
            with contextlib.suppress(OSError):
                p.stdin.write("stop\n")
                p.stdin.flush()

    @staticmethod
    def collect(procs: list[subprocess.Popen[str]], timeout: float) -> list[dict[str, Any]]:
        results = []
        for p in procs:
            try:
                out, err = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
            lines = [ln for ln in out.splitlines() if ln.startswith("{")]
            if p.returncode != 0 or not lines:
                raise RuntimeError(f"a load process failed: {err[-2000:]}")
            last = json.loads(lines[-1])
            if set(last) == {"result"}:
                last = json.loads(Path(last["result"]).read_text())
            results.append(last)
        return results

    def run_load(self, procs: int = 1, clients: int = 1, **options: Any) -> dict[str, Any]:
        """Start load, measure, and summarize (:func:`summarize`), with the CPU each
        process used in the measured window (``cpu_cores``, per process) and per
        operation (``cpu_us_per_op``, per role)."""
        ps = self.start_load(procs, clients, **options)
        at = self.go(ps)
        duration = options.get("duration", 10.0)
        warmup = options.get("warmup", 3.0)
        time.sleep(max(0.0, at + warmup - time.time()))
        before = self.cpu(ps)
        time.sleep(max(0.0, at + warmup + duration - time.time()))
        after = self.cpu(ps)
        out = summarize(self.collect(ps, duration + 60))
        cores = {n: round((after[n] - before[n]) / duration, 3) for n in after if n in before}
        out["cpu_cores"] = cores
        ops = out["throughput_per_s"] * duration
        roles: dict[str, float] = {}
        for n, c in cores.items():
            role = process_role(n)
            roles[role] = roles.get(role, 0.0) + c * duration
        out["cpu_us_per_op"] = {r: round(1e6 * v / ops, 1) for r, v in roles.items()} if ops else {}
        return out

    def cpu(self, loads: list[subprocess.Popen[str]] = ()) -> dict[str, float]:  # type: ignore[assignment]
        """CPU seconds so far of every process of the cluster and of ``loads``."""
        pids = cluster_pids(self.d)
        pids |= {f"load{i + 1}": p.pid for i, p in enumerate(loads)}
        return process_cpu(pids)


def cluster_pids(d: Path) -> dict[str, int]:
    """The process id of each process of the local cluster in state directory ``d``,
    by its name there (``r1``, ``s1``, ``storage1``, ``pack1``)."""
    return {n: r["pid"] for n, r in local.StateDir.recorded(d).items()}


def process_cpu(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far (user and system) of each of ``pids`` still running, by name."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for n, pid in pids.items():
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[n] = (int(fields[11]) + int(fields[12])) / tick
    return out


def process_role(process: str) -> str:
    """``r1`` -> routers, ``s1`` -> super, ``pack1`` and ``storage1`` -> storage,
    ``load1`` -> clients."""
    if process.startswith(("pack", "storage")):
        return "storage"
    if process.startswith("load"):
        return "clients"
    if process.startswith("s") and process[1:].isdigit():
        return "super"
    return "routers"


def load_flags(options: dict[str, Any]) -> list[str]:
    """The load process's flags for ``options``: ``True`` is a bare flag, ``False`` and
    ``None`` leave the flag out (the load's default), anything else is its value.  Tested
    by identity: a share or rate of 0 is a value (``0.0 in (False, None)`` is true, and
    a 0 % snapshot share once fell back to the load's default of half)."""
    flags = []
    for k, v in options.items():
        if v is True:
            flags.append(f"--{k.replace('_', '-')}")
        elif v is not False and v is not None:
            flags += [f"--{k.replace('_', '-')}", str(v)]
    return flags


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Load processes' results as one: throughput, latency, fairness, counts."""
    hist: dict[int, int] = {}
    trace: dict[int, int] = {}
    per_client: list[int] = []
    counts = dict.fromkeys(COUNTS, 0)
    measure = max(r["measure_s"] for r in results)
    for r in results:
        for b, n in r["latency_hist"]:
            hist[b] = hist.get(b, 0) + n
        for k, n in r["trace"]:
            trace[k] = trace.get(k, 0) + n
        per_client += r["per_client"]
        for k in counts:
            counts[k] += r.get(k, 0)
    ops = sum(per_client)
    out = {
        "throughput_per_s": round(ops / measure, 1),
        "p50_ms": round(percentile(hist, 0.5) * 1000, 2),
        "p99_ms": round(percentile(hist, 0.99) * 1000, 2),
        "clients": len(per_client),
        "fairness": round(min(per_client) / max(per_client), 3) if max(per_client) else 0.0,
        **counts,
    }
    if counts["read_messages"]:
        out["reads_per_message"] = round(counts["reads_sent"] / counts["read_messages"], 2)
    if counts["write_messages"]:
        out["writes_per_message"] = round(counts["writes_sent"] / counts["write_messages"], 2)
    if trace:
        out["trace"] = sorted(trace.items())
    return out


def percentile(hist: dict[int, int], q: float) -> float:
    total = sum(hist.values())
    if not total:
        return float("nan")
    seen = 0
    for b in sorted(hist):
        seen += hist[b]
        if seen > q * total:
            return b * BUCKET_S
    return max(hist) * BUCKET_S


def ecast_baseline(
    routers: int, receivers: int, replication: int, payload: int, duration: float,
    warmup: float, clients: int = 1, extra: list[str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """``ecast bench`` with ``KeyRingConfig`` at this size: the same messages, the same
    routers, no Rubberband."""
    cmd = [sys.executable, "-m", "ecast", "bench", "--routers", str(routers),
           "--receivers", str(max(receivers, replication)), "--replication", str(replication),
           "--payload", str(payload), "--clients", str(clients), "--duration", str(duration),
           "--warmup", str(warmup), "--json", *(extra or [])]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + warmup + 180)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"ecast bench failed: {out.stderr[-2000:]}")
    r = json.loads(lines[-1])
    if "unsafe_accepted_per_s" in r:  # unsafe messages: deliveries accepted, no latency
        keys = ("unsafe_accepted_per_s", "unsafe_submitted_per_s", "unsafe_acceptance_rate")
        return {k: r[k] for k in keys}
    return {"throughput_per_s": r["throughput_per_s"], "p50_ms": r["p50_ms"],
            "p99_ms": r["p99_ms"]}  # fmt: skip


def state_dir(given: str | None) -> Path:
    """A fresh directory for one cluster (under ``given`` when set)."""
    base = Path(given) if given else Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="rbbench-", dir=base))


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    import platform

    out: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.release()}",
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }
    if _busy:
        out["busy_before"] = _busy[0]
    return out


cpu_busy = ecast.bench.cpu_busy
cpu_times = ecast.bench.cpu_times
busy_between = ecast.bench.busy_between
_busy: list[float] = []
"""The share measured by :func:`check_idle`, once per process."""


def check_idle() -> float | None:
    """Measure, once per run, how busy the machine is before the benchmark starts, and
    say so on stderr when it is busier than ``ecast.bench.BUSY_WARNING``.  On two cores a
    second job (another benchmark, a test suite) halves every figure without any error
    showing; the JSON's ``machine`` carries the share as ``busy_before``."""
    if _busy:
        return _busy[0]
    busy = cpu_busy()
    if busy is None:
        return None
    _busy.append(busy)
    ecast.bench.warn_if_busy(busy)
    return busy
