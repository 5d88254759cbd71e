"""``rubberband bench peers``: the same replicated writes against what users would pick
instead, in the same run.

The workload: writes of ``--payload``-byte values (256) to random keys, replicated on
three servers, by one pipelined client in a process of its own that keeps
``--concurrency`` writes in flight (256), for ``--duration`` seconds after a warm-up.

* **Rubberband**: 3 routers, 3 storage processes on the memory engine, replication 3,
  each storage process an OS process of its own (as ``rubberband cluster up`` runs them,
  and as etcd's members run; the other experiments pack many in one); the client is
  :mod:`rubberband.bench.load` (key-value ``put``), sending its writes as
  ``write_batch`` does (the writes of one segment together, ``--write-bundle``), and
  each in a message of its own in the row ``rubberband_alone``.  **rubberband_durable**
  (and ``rubberband_durable_alone``): the same on the durable log engine with
  ``fsync=always``, each storage process confirming a batch only once it is synced, so a
  write is acknowledged once it is on disk at all three replicas, as etcd's is.
* **etcd** (Debian ``etcd-server``): 3 members on loopback ports, data on disk; the
  client is etcd's own protocol, gRPC ``KV/Put`` (``grpcio``, the request encoded by
  hand), one HTTP/2 connection per member.  **etcd_tmpfs**: the same with every data
  directory on a RAM disk (``/dev/shm``), for the comparison without disks: Rubberband
  keeps its data in memory, etcd and ZooKeeper write it to disk.  **etcd_http** (only
  when named in ``--systems``): etcd through its JSON gateway (``/v3/kv/put``), the
  slower client this benchmark used before.
* **ZooKeeper** (Debian ``zookeeper``): 3 servers, data on disk; the client is kazoo's
  asynchronous ``set`` on 1,000 znodes (8 per write in flight at low concurrency).
* **PySyncObj**: 3 nodes with a replicated dict; the client is a read-only node that
  forwards ``set`` to the leader (PySyncObj has no other client).

Each row says how many times its writes/s Rubberband's were in the same run: bundled
(``Rubberband x``, ``rubberband_ratio``) and each write alone (``alone x``,
``alone_ratio``).  Then both Rubberband and etcd are offered etcd's peak rate (open
loop), to compare latency at the same load.  A system that fails (not installed,
crashed, no answer) gets its error in its row, never a number.  The last line is one JSON object:
``{"rubberband": {...}, "etcd": {...}, "etcd_tmpfs": {...}, "zookeeper": {...},
"pysyncobj": {...}, "concurrency": C, ...}``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from ecast import local

BUCKET_S = 0.0001

# ------------------------------------------------------------------ client side


class Meter:
    """Completions in the measured window and their latency histogram (thread-safe)."""

    def __init__(self, warm: float, end: float) -> None:
        self.warm, self.end = warm, end
        self.hist: dict[int, int] = {}
        self.done = 0
        self.errors = 0
        self.first_error: str | None = None
        self.lock = threading.Lock()

    def ok(self, t0: float) -> None:
        now = time.perf_counter()
        if self.warm <= now <= self.end:
            with self.lock:
                self.done += 1
                b = int((now - t0) / BUCKET_S)
                self.hist[b] = self.hist.get(b, 0) + 1

    def fail(self, what: object) -> None:
        with self.lock:
            self.errors += 1
            if self.first_error is None:
                self.first_error = str(what)[:300]

    def begin(self, warmup: float, duration: float) -> None:
        """Start the clock now (after the client's own set-up)."""
        now = time.perf_counter()
        self.warm, self.end = now + warmup, now + warmup + duration

    def result(self, seconds: float) -> dict[str, Any]:
        from rubberband.bench.harness import percentile

        if not self.done and self.first_error is None:
            self.first_error = "no write completed in the measured window"
        return {
            "throughput_per_s": round(self.done / seconds, 1),
            "p50_ms": round(percentile(self.hist, 0.5) * 1000, 2),
            "p99_ms": round(percentile(self.hist, 0.99) * 1000, 2),
            "errors": self.errors,
            "error": self.first_error,
        }


class Pacer:
    """Closed loop (``rate`` 0): another write as each completes.  Open loop: writes
    start at ``rate`` per second, at most ``concurrency`` in flight."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.start = time.perf_counter()
        self.issued = 0

    def due(self) -> float:
        """Seconds until the next write may start."""
        if not self.rate:
            return 0.0
        return max(0.0, self.start + self.issued / self.rate - time.perf_counter())


async def etcd_client(args: argparse.Namespace, meter: Meter) -> None:
    import aiohttp

    url = f"http://{args.targets.split(',')[0]}/v3/kv/put"
    value = base64.b64encode(os.urandom(args.payload)).decode()
    conn = aiohttp.TCPConnector(limit=args.concurrency)
    async with aiohttp.ClientSession(connector=conn) as s:

        async def put(rng: random.Random, _i: int) -> str | None:
            key = base64.b64encode(f"k{rng.randrange(1_000_000)}".encode()).decode()
            async with s.post(url, json={"key": key, "value": value}) as r:
                await r.read()
                return None if r.status == 200 else f"HTTP {r.status}"

        await _writers(args, meter, put)


async def _writers(
    args: argparse.Namespace, meter: Meter, put: Callable[[random.Random, int], Awaitable[Any]]
) -> None:
    """``--concurrency`` asyncio writers (at ``--rate`` if set) until the meter's end,
    each calling ``put(rng, i)`` for one write: it returns None when the write is
    acknowledged, a refusal's text, or raises (then the writer backs off 10 ms)."""
    pacer = Pacer(args.rate)
    meter.begin(args.warmup, args.duration)

    async def worker(i: int) -> None:
        rng = random.Random()
        while time.perf_counter() < meter.end:
            wait = pacer.due()
            pacer.issued += 1
            if wait:
                await asyncio.sleep(wait)
            t0 = time.perf_counter()
            try:
                refused = await put(rng, i)
            except Exception as e:
                meter.fail(f"{type(e).__name__}: {e}"[:200])
                await asyncio.sleep(0.01)
                continue
            if refused is not None:
                meter.fail(refused)
                continue
            meter.ok(t0)

    await asyncio.gather(*(worker(i) for i in range(args.concurrency)))


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def put_request(key: bytes, value: bytes) -> bytes:
    """etcd's ``PutRequest`` (``etcdserverpb``), encoded by hand: field 1 the key, field
    2 the value, both length-delimited.  No generated stubs: the benchmark needs
    ``grpcio`` and nothing else."""
    return b"\x0a" + _varint(len(key)) + key + b"\x12" + _varint(len(value)) + value


async def etcd_grpc_client(args: argparse.Namespace, meter: Meter) -> None:
    """etcd's fastest client from Python: gRPC (``KV/Put``, as ``etcdctl`` and every
    official client speak it) over one HTTP/2 connection per member, writes spread
    over the members, ``--concurrency`` in flight.  Measured 2.5x the JSON gateway's
    rate against the same cluster (2026-11-29)."""
    import grpc

    value = os.urandom(args.payload)
    channels = [grpc.aio.insecure_channel(t) for t in args.targets.split(",")]
    method = "/etcdserverpb.KV/Put"
    puts = [c.unary_unary(method) for c in channels]  # bytes in, bytes out

    async def put(rng: random.Random, i: int) -> None:
        key = f"k{rng.randrange(1_000_000)}".encode()
        await puts[i % len(puts)](put_request(key, value), timeout=30)

    try:
        await _writers(args, meter, put)
    finally:
        for c in channels:
            await c.close()


def _keep_in_flight(
    args: argparse.Namespace, meter: Meter, issue: Any, patience: float | None = None
) -> None:
    """Keep ``--concurrency`` writes in flight (at ``--rate`` if set) until the meter's
    end, for the clients whose libraries answer by callback.  ``issue(rng, value,
    finish)`` starts one write and calls ``finish()`` when it is acknowledged, or
    ``finish(error)``; ``patience``: give up once no slot frees for this long."""
    value = os.urandom(args.payload)
    slots = threading.Semaphore(args.concurrency)
    rng = random.Random()
    pacer = Pacer(args.rate)
    meter.begin(args.warmup, args.duration)

    def finisher(t0: float) -> Any:
        def finish(error: str | None = None) -> None:
            if error is None:
                meter.ok(t0)
            else:
                meter.fail(error)
            slots.release()

        return finish

    while time.perf_counter() < meter.end:
        if not slots.acquire(timeout=patience):
            meter.fail(f"no answer for {patience:g} s with every write in flight")
            break
        wait = pacer.due()
        pacer.issued += 1
        if wait:
            time.sleep(wait)
        issue(rng, value, finisher(time.perf_counter()))


def zookeeper_client(args: argparse.Namespace, meter: Meter) -> None:
    from kazoo.client import KazooClient

    zk = KazooClient(hosts=args.targets, timeout=15.0)
    zk.start(timeout=30)
    try:
        zk.ensure_path("/bench")
        paths = [f"/bench/k{i}" for i in range(min(1000, 8 * args.concurrency))]
        for p in paths:
            if not zk.exists(p):
                zk.create(p, b"")

        def issue(rng: random.Random, value: bytes, finish: Any) -> None:
            def cb(result: Any) -> None:
                try:
                    result.get()
                except Exception as e:
                    finish(f"{type(e).__name__}: {e}")
                else:
                    finish()

            zk.set_async(rng.choice(paths), value).rawlink(cb)

        _keep_in_flight(args, meter, issue)
    finally:
        with contextlib.suppress(Exception):
            zk.stop()
            zk.close()


def pysyncobj_client(args: argparse.Namespace, meter: Meter) -> None:
    from pysyncobj import SyncObj, SyncObjConf
    from pysyncobj.batteries import ReplDict

    d = ReplDict()
    node = SyncObj(None, args.targets.split(","), consumers=[d], conf=SyncObjConf())
    deadline = time.time() + 30
    while node._getLeader() is None and time.time() < deadline:
        time.sleep(0.1)

    def issue(rng: random.Random, value: bytes, finish: Any) -> None:
        def cb(result: Any, error: Any) -> None:
            finish(f"PySyncObj error {error}" if error else None)  # FAIL_REASON.SUCCESS is 0

        d.set(f"k{rng.randrange(1_000_000)}", value, callback=cb)

    try:
        _keep_in_flight(args, meter, issue, patience=5.0)
    finally:
        with contextlib.suppress(Exception):
            node.destroy()


def client_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser("python -m rubberband.bench.peers client")
    ap.add_argument("system", choices=("etcd", "etcd-http", "zookeeper", "pysyncobj"))
    ap.add_argument("--targets", required=True)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--payload", type=int, default=256)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--rate", type=float, default=0.0)
    args = ap.parse_args(argv)
    start = time.perf_counter()
    meter = Meter(start + args.warmup, start + args.warmup + args.duration)
    try:
        if args.system == "etcd":
            asyncio.run(etcd_grpc_client(args, meter))
        elif args.system == "etcd-http":
            asyncio.run(etcd_client(args, meter))
        elif args.system == "zookeeper":
            zookeeper_client(args, meter)
        else:
            pysyncobj_client(args, meter)
    except Exception as e:
        meter.fail(f"{type(e).__name__}: {e}")
    print(json.dumps(meter.result(args.duration)), flush=True)
    return 0


def pysyncobj_node(argv: list[str]) -> int:
    """One PySyncObj node with a replicated dict, until SIGTERM."""
    from pysyncobj import SyncObj, SyncObjConf
    from pysyncobj.batteries import ReplDict

    me, others = argv[0], argv[1].split(",")
    node = SyncObj(me, others, consumers=[ReplDict()], conf=SyncObjConf())
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    node.destroy()
    return 0


# ------------------------------------------------------------------ servers


class Servers:
    """Processes of one peer system, stopped on exit."""

    def __init__(self, d: Path) -> None:
        self.d = d
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> None:
        log = open(self.d / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        self.procs.append(
            subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        )

    def crashed(self) -> str | None:
        for p in self.procs:
            if p.poll() is not None:
                return f"{' '.join(p.args[:3])}... exited with {p.returncode}"  # type: ignore[index]
        return None

    def wait_until(self, ready: Any, timeout: float, what: str, poll: float = 0.2) -> None:
        """Poll ``ready()`` until it holds; raise if a server exits or time runs out."""
        deadline = time.monotonic() + timeout
        while not ready():
            if self.crashed():
                raise RuntimeError(f"{what} did not start: {self.crashed()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} was not ready within {timeout:g} s")
            time.sleep(poll)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()


@contextlib.contextmanager
def etcd(d: Path) -> Iterator[str]:
    binary = shutil.which("etcd")
    if binary is None:
        raise RuntimeError("etcd is not installed (apt-get install etcd-server)")
    s = Servers(d)
    client = [local.free_port() for _ in range(3)]
    peer = [local.free_port() for _ in range(3)]
    cluster = ",".join(f"e{i}=http://127.0.0.1:{peer[i]}" for i in range(3))
    try:
        for i in range(3):
            s.start(f"etcd{i}", [
                binary, "--name", f"e{i}", "--data-dir", str(d / f"e{i}"),
                "--listen-client-urls", f"http://127.0.0.1:{client[i]}",
                "--advertise-client-urls", f"http://127.0.0.1:{client[i]}",
                "--listen-peer-urls", f"http://127.0.0.1:{peer[i]}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer[i]}",
                "--initial-cluster", cluster, "--initial-cluster-state", "new",
                "--initial-cluster-token", f"bench-{os.getpid()}", "--logger", "zap",
                "--log-level", "error",
            ], env={**os.environ, "ETCD_UNSUPPORTED_ARCH": "amd64"})  # fmt: skip

        def healthy() -> bool:
            h = local.http_json(f"http://127.0.0.1:{client[0]}/health")
            return bool(h) and str(h.get("health")) == "true"  # type: ignore[union-attr]

        s.wait_until(healthy, 60, "etcd")
        yield ",".join(f"127.0.0.1:{p}" for p in client)
    finally:
        s.stop()


@contextlib.contextmanager
def zookeeper(d: Path) -> Iterator[str]:
    jar = Path("/usr/share/java/zookeeper.jar")
    java = shutil.which("java")
    if not jar.exists() or java is None:
        raise RuntimeError("ZooKeeper is not installed (apt-get install zookeeper)")
    s = Servers(d)
    client = [local.free_port() for _ in range(3)]
    quorum = [(local.free_port(), local.free_port()) for _ in range(3)]
    try:
        for i in range(3):
            data = d / f"zk{i}"
            data.mkdir(parents=True, exist_ok=True)
            (data / "myid").write_text(f"{i + 1}\n")
            cfg = d / f"zk{i}.cfg"
            lines = ["tickTime=2000", "initLimit=10", "syncLimit=5", f"dataDir={data}",
                     f"clientPort={client[i]}", "clientPortAddress=127.0.0.1",
                     "admin.enableServer=false", "4lw.commands.whitelist=*",
                     *(f"server.{j + 1}=127.0.0.1:{a}:{b}"
                       for j, (a, b) in enumerate(quorum))]  # fmt: skip
            cfg.write_text("\n".join(lines) + "\n")
            s.start(f"zookeeper{i}", [
                java, "-Xmx512m", "-cp", f"/etc/zookeeper/conf:{jar}",
                f"-Dzookeeper.log.dir={d}", "-Dzookeeper.root.logger=WARN,CONSOLE",
                "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(cfg),
            ])  # fmt: skip
        s.wait_until(lambda: all("Mode:" in _four_letters(p, b"srvr") for p in client), 90,
                     "ZooKeeper (a quorum)", poll=0.5)  # fmt: skip
        yield ",".join(f"127.0.0.1:{p}" for p in client)
    finally:
        s.stop()


def _four_letters(port: int, word: bytes) -> str:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as c:
            c.sendall(word)
            return c.recv(4096).decode(errors="replace")
    except OSError:
        return ""


@contextlib.contextmanager
def pysyncobj(d: Path) -> Iterator[str]:
    try:
        import pysyncobj as _  # noqa: F401
    except ImportError:
        raise RuntimeError("PySyncObj is not installed (pip install pysyncobj)") from None
    s = Servers(d)
    nodes = [f"127.0.0.1:{local.free_port()}" for _ in range(3)]
    try:
        for i, me in enumerate(nodes):
            s.start(f"pysyncobj{i}", [sys.executable, "-m", "rubberband.bench.peers", "node",
                                      me, ",".join(n for n in nodes if n != me)])  # fmt: skip
        time.sleep(2.0)
        if s.crashed():
            raise RuntimeError(f"PySyncObj did not start: {s.crashed()}")
        yield ",".join(nodes)
        if s.crashed():
            raise RuntimeError(f"a PySyncObj node crashed: {s.crashed()}")
    finally:
        s.stop()


def run_client(system: str, targets: str, args: argparse.Namespace, rate: float = 0) -> dict:
    cmd = [sys.executable, "-m", "rubberband.bench.peers", "client", system, "--targets",
           targets, "--concurrency", str(args.concurrency), "--payload", str(args.payload),
           "--duration", str(args.duration), "--warmup", str(args.warmup),
           "--rate", str(rate)]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True,
                         timeout=args.duration + args.warmup + 120)  # fmt: skip
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"error": f"the client failed: {out.stderr.strip()[-300:]}"}
    return dict(json.loads(lines[-1]))


def rubberband_run(
    args: argparse.Namespace, rate: float = 0, bundle: int = 0, engine: str = "memory"
) -> dict[str, Any]:
    """``bundle``: writes per message at most (0: ``--write-bundle``)."""
    from rubberband.bench.harness import Bench, state_dir

    bundle = bundle or args.write_bundle
    # One OS process per storage process, as a deployment runs them (docs/decisions.md,
    # "The peers benchmark runs each storage process in an OS process of its own").
    with Bench(state_dir(args.state_dir), storage=3, replication=3, engine=engine, packs=3) as b:
        r = b.run_load(1, 1, ops="kv", window=args.concurrency, payload=args.payload,
                       duration=args.duration, warmup=args.warmup, rate=rate,
                       write_bundle=bundle)  # fmt: skip
    return {k: r[k] for k in ("throughput_per_s", "p50_ms", "p99_ms")} | {
        "errors": r["errors"] + r["timeouts"] + r["undelivered"],
        "writes_per_message": r.get("writes_per_message"),
        "error": None,
    }


SYSTEMS = (
    "rubberband", "rubberband_alone", "rubberband_durable", "rubberband_durable_alone", "etcd",
    "etcd_tmpfs", "zookeeper", "pysyncobj",
)  # fmt: skip
"""The systems measured by default; ``etcd_http`` (etcd through its JSON gateway, the
client this benchmark used before) may be asked for by name."""
CLIENTS = {
    "rubberband": "rubberband.bench.load: the SDK's write_batch, pipelined",
    "rubberband_alone": "rubberband.bench.load: each write in a message of its own",
    "rubberband_durable": "rubberband.bench.load: write_batch, the log engine, fsync always",
    "rubberband_durable_alone": "rubberband.bench.load: writes alone, the log engine, fsync always",
    "etcd": "gRPC KV/Put (grpcio, raw), one HTTP/2 connection per member",
    "etcd_tmpfs": "gRPC KV/Put (grpcio, raw), one HTTP/2 connection per member",
    "etcd_http": "etcd's JSON gateway /v3/kv/put over keep-alive HTTP (aiohttp)",
    "zookeeper": "kazoo's asynchronous set, pipelined",
    "pysyncobj": "a PySyncObj node forwarding set to the leader",
}
"""Each system's client: the fastest one found for it, named in the results."""


def _measure(system: str, args: argparse.Namespace) -> dict[str, Any]:
    """One system's closed-loop run at ``--concurrency``, printed as it ends."""
    from rubberband.bench.harness import state_dir

    if system not in CLIENTS:
        raise SystemExit(f"unknown system {system!r}; known: {', '.join(CLIENTS)}")
    try:
        if system == "rubberband":
            r = rubberband_run(args)
        elif system == "rubberband_alone":
            r = rubberband_run(args, bundle=1)
        elif system == "rubberband_durable":
            r = rubberband_run(args, engine="log")
        elif system == "rubberband_durable_alone":
            r = rubberband_run(args, bundle=1, engine="log")
        else:
            base = Path("/dev/shm") if system == "etcd_tmpfs" else None
            d = state_dir(str(base) if base else args.state_dir)
            start = {"etcd": etcd, "etcd_tmpfs": etcd, "etcd_http": etcd,
                     "zookeeper": zookeeper, "pysyncobj": pysyncobj}[system]  # fmt: skip
            client = "etcd-http" if system == "etcd_http" else system.split("_")[0]
            try:
                with start(d) as targets:
                    r = run_client(client, targets, args)
            finally:
                shutil.rmtree(d, ignore_errors=True)
    except Exception as e:
        r = {"error": f"{type(e).__name__}: {e}"}
    r["client"] = CLIENTS[system]
    print(f"{system}: {r.get('throughput_per_s', '-')}/s {r.get('error') or ''}", flush=True)
    return r


def _at_etcd_peak(args: argparse.Namespace, peak: float) -> dict[str, dict[str, Any]]:
    """Latency at the same load: etcd's peak rate offered to both (open loop)."""
    from rubberband.bench.harness import state_dir

    out = {
        "rubberband_at_etcd_peak": rubberband_run(args, rate=peak),
        "rubberband_durable_at_etcd_peak": rubberband_run(args, rate=peak, engine="log"),
    }
    d = state_dir(args.state_dir)
    try:
        with etcd(d) as targets:
            out["etcd_at_etcd_peak"] = run_client("etcd", targets, args, rate=peak)
    except Exception as e:
        out["etcd_at_etcd_peak"] = {"error": f"{type(e).__name__}: {e}"}
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["client"]:
        return client_main(argv[1:])
    if argv[:1] == ["node"]:
        return pysyncobj_node(argv[1:])
    from rubberband.bench.experiments import finish
    from rubberband.bench.harness import check_idle, machine

    ap = argparse.ArgumentParser("rubberband bench peers", description=__doc__.split("\n\n")[0])
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--payload", type=int, default=256)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--write-bundle", type=int, default=32,
                    help="Rubberband: writes of one segment per message at most")  # fmt: skip
    ap.add_argument("--state-dir", default=None)
    ap.add_argument("--png", default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    check_idle()
    results = {system: _measure(system, args) for system in args.systems.split(",")}
    peak = results.get("etcd", {}).get("throughput_per_s")
    if peak and "rubberband" in results:
        results.update(_at_etcd_peak(args, peak))
    for mine, key in (("rubberband", "rubberband_ratio"), ("rubberband_alone", "alone_ratio")):
        # Each system against Rubberband's writes, bundled and each alone, in this run.
        ours = results.get(mine, {}).get("throughput_per_s")
        for system, r in results.items():  # (not the open-loop rows at etcd's peak rate)
            if ours and r.get("throughput_per_s") and not system.endswith("at_etcd_peak"):
                r[key] = round(ours / r["throughput_per_s"], 2)
    rows = [{"system": k, **v} for k, v in results.items()]
    for name in ("rubberband_durable", "rubberband_durable_alone"):
        # Disk against disk: the durable rows over etcd's, the same run.
        ours = results.get(name, {}).get("throughput_per_s")
        theirs = results.get("etcd", {}).get("throughput_per_s")
        if ours and theirs:
            print(f"{name} / etcd: {ours / theirs:.2f}x", flush=True)
            results[name]["over_etcd"] = round(ours / theirs, 2)

    def draw(fig: Any, rs: list[dict[str, Any]]) -> None:
        closed = [r for r in rs if "at_etcd_peak" not in r["system"] and r.get("throughput_per_s")]
        ax = fig.add_subplot(1, 2, 1)
        ax.bar([r["system"] for r in closed], [r["throughput_per_s"] for r in closed])
        ax.set_ylabel(f"writes/s at concurrency {args.concurrency}")
        ax.tick_params(axis="x", rotation=30)
        ax2 = fig.add_subplot(1, 2, 2)
        ax2.bar([r["system"] for r in closed], [r["p99_ms"] for r in closed], color="#d62728")
        ax2.set_ylabel("p99 latency (ms)")
        ax2.tick_params(axis="x", rotation=30)

    finish("peers", args, rows,
           [("system", "system"), ("writes/s", "throughput_per_s"),
            ("writes/msg", "writes_per_message"), ("p50 ms", "p50_ms"),
            ("p99 ms", "p99_ms"), ("errors", "errors"), ("Rubberband x", "rubberband_ratio"),
            ("alone x", "alone_ratio"), ("client", "client"), ("error", "error")],
           draw if args.png else None)  # fmt: skip
    if args.json:
        disks = (
            "etcd and ZooKeeper write to disk (etcd_tmpfs: to a RAM disk); Rubberband "
            "keeps data in memory, rubberband_durable on disk (fsync per batch)"
        )
        print(json.dumps({**results, "concurrency": args.concurrency, "payload": args.payload,
                          "machine": machine(), "disks": disks}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
