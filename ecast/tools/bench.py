"""``ecast bench``: E-Cast on a real local cluster, measured.

Routers run as separate OS processes (``ecast router``), receivers (many logical processes
in one OS process) and clients in their own processes.  Clients submit messages with a key
and a payload; the key-ring config routes each message to ``replication`` receivers.

Reported: ``throughput_per_s`` (stable acknowledgements per second), ``delivered_per_s``
(message-destination pairs per second), latency ``p50_ms``/``p99_ms`` from submit to stable
acknowledgement, ``rss_mb`` per role (after warm-up, at the end, and the spread and trend
between), and with ``--kill-leader-at`` the ``longest_gap_s`` without acknowledgements
and, with ``--check``, the verdict of the multicast checkers (:mod:`ecast.history`) on
the history the run recorded (``--history`` keeps it as JSON lines).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from array import array
from pathlib import Path
from typing import Any, Protocol

from ecast.core import mutations as planted_bugs
from ecast.runtime import tune_process
from ecast.tools.local import LocalCluster, Place

SECRET = "bench-0c6f3e9a41d27b58e2a9c4d1f7b03e6a"
"""The development secret of the benchmark's throw-away local cluster (strong enough to pass
the routers' check; the per-packet MAC costs the same as with credentials)."""


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


BUCKET_S = 0.0001
"""Latencies are counted in 0.1 ms buckets: memory stays flat however long the run."""


def _percentile(hist: dict[int, int], q: float) -> float:
    """The ``q`` quantile, in seconds, of a histogram of ``BUCKET_S`` buckets."""
    total = sum(hist.values())
    if not total:
        return float("nan")
    rank = q * total
    seen = 0
    for bucket in sorted(hist):
        seen += hist[bucket]
        if seen > rank:
            return bucket * BUCKET_S
    return max(hist) * BUCKET_S


def _count_at(series: list[tuple[float, int]], when: float) -> int:
    """A receiver's delivery count at wall-clock time ``when`` (linear between samples)."""
    prev_t, prev_n = 0.0, 0
    for t, n in series:
        if t >= when:
            if t == prev_t:
                return n
            return round(prev_n + (n - prev_n) * (when - prev_t) / (t - prev_t))
        prev_t, prev_n = t, n
    return prev_n


class Recorder:
    """One process's history, recorded cheaply while it runs and written as JSON lines
    (:mod:`ecast.history.jsonl`) when it ends.

    A receiver delivers tens of thousands of data messages a second: each costs four
    integers in an array (the session's index, the sequence number, ``t`` and the key of
    the header ``{"key": k}`` the bench clients send), not an event object holding the
    message.  Every other event (membership deliveries, submissions, acknowledgements) is
    rare and kept as an event; a negative session index in the array points at it, so the
    process's order is kept.
    """

    __slots__ = ("codes", "events", "process", "rows", "sessions")

    def __init__(self, process: str) -> None:
        self.process = process
        self.rows: array[int] = array("q")
        self.sessions: list[tuple[str, Any]] = []
        """Index -> (sender, session) of data messages."""
        self.codes: dict[Any, int] = {}
        self.events: list[Any] = []

    def data(self, t: int, m: Any) -> None:
        """A delivered bench data message (header ``{"key": k}``)."""
        session, seq = m.id
        code = self.codes.get(session)
        if code is None:
            code = self.codes[session] = len(self.sessions)
            self.sessions.append((m.sender, session))
        self.rows.extend((code, seq, t, m.header["key"]))

    def event(self, event: Any) -> None:
        self.events.append(event)
        self.rows.extend((-len(self.events), 0, 0, 0))

    def write(self, path: Path) -> int:
        """Write the history to ``path``; the number of events."""
        from ecast.history import Deliver, HistoryWriter

        rows, sessions, events, me = self.rows, self.sessions, self.events, self.process
        with HistoryWriter(path) as w:
            for i in range(0, len(rows), 4):
                code = rows[i]
                if code < 0:
                    w.write(me, events[-code - 1])
                    continue
                sender, session = sessions[code]
                header = {"key": rows[i + 3]}
                w.write(me, Deliver(rows[i + 2], (session, rows[i + 1]), None, sender, header))
        return len(rows) // 4


# ====================================================================== workers
async def _receivers(args: argparse.Namespace) -> dict[str, Any]:
    from ecast.core.endpoint import Acked, Delivery, Endpoint, Terminated
    from ecast.history import Ack, Deliver, Submit, Terminate
    from ecast.runtime import Runtime

    rt = Runtime(SECRET.encode())
    counts = {}
    records: dict[str, Recorder] = {}
    order_ok = True
    nodes = []
    start = time.monotonic()
    series: list[tuple[float, int]] = []
    total = [0]
    rejected = [0]
    accepted = [0]

    tasks: set[asyncio.Task[None]] = set()

    async def join_as(name: str, base: str, gen: int) -> None:
        """Receiver ``name`` joins; declared faulty (a split kept it away past its lease),
        it never acts again under that name, and ``base.gen+1`` joins in its place."""
        counts[name] = 0
        rec = records[name] = Recorder(name)
        last = [-1]

        def on_deliver(node: Any, ups: list[Any]) -> None:
            nonlocal order_ok
            n = 0
            for u in ups:
                if type(u) is Delivery and not u.unsafe:
                    if u.t <= last[0]:
                        order_ok = False
                    last[0] = u.t
                    m = u.message
                    if args.record:
                        if m.kind is None:
                            rec.data(u.t, m)
                        else:
                            rec.event(Deliver(u.t, m.id, time.time(), m.sender, m.header))
                    n += 1
                elif type(u) is Delivery:
                    n += u.accepted
                    accepted[0] += u.accepted
                    rejected[0] += not u.accepted
                elif type(u) is Acked and args.record:
                    rec.event(Ack(u.id, u.t, u.delivered, time.time()))
                elif type(u) is Terminated:
                    if args.record:
                        rec.event(Terminate(u.reason, time.time(), u.at))
                    if u.reason == "suspected" and not stopping:
                        task = asyncio.get_running_loop().create_task(
                            join_as(f"{base}.{gen + 1}", base, gen + 1)
                        )
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
            counts[name] += n
            total[0] += n

        while True:
            ids = []
            for addr in _routers_now(args):
                try:
                    ids.append(await rt.connect_node(addr))
                except OSError:
                    continue
            if ids or stopping:
                break
            await asyncio.sleep(0.5)
        ep = Endpoint(name, ids)
        node = rt.add_node(
            name, ep, on_deliver=on_deliver, keep_connected=lambda ep=ep: list(ep.succession)
        )
        node.start()

        def join(core: Any, now: float) -> Any:
            sid, fx = core.join(now, role="receiver")
            if args.record:
                rec.event(Submit(sid, time.time()))
            return fx

        node.feed(join)
        nodes.append(node)

    stopping = False
    for i in range(args.count):
        await join_as(f"d{args.first + i}", f"d{args.first + i}", 0)
    print(json.dumps({"event": "ready"}), flush=True)
    # The parent stops us (the stop file) once its clients are done, which may take
    # until its own limit (duration + 90 s, + duration/2 when recording); this is only
    # the guard against a parent that went away.
    deadline = start + args.duration * 1.5 + 180
    while time.monotonic() < deadline:
        await asyncio.sleep(0.25)
        series.append((time.time(), total[0]))
        if os.path.exists(args.stop_file):
            break
    stopping = True
    out = {
        "role": "receivers",
        "delivered": total[0],
        "unsafe_rejected": rejected[0],
        "unsafe_accepted": accepted[0],
        "series": series,
        "order_ok": order_ok,
        "counts": counts,
    }
    if args.record:
        path = Path(args.record)
        path.mkdir(parents=True, exist_ok=True)
        for name, rec in records.items():
            rec.write(path / f"history-{name}.jsonl")
    return out


def _routers_now(args: argparse.Namespace) -> list[str]:
    """The routers to connect to now: the parent rewrites ``--routers-file`` whenever a
    fault replaces routers (under fresh names and ports), else the ones at the start."""
    if args.routers_file:
        with contextlib.suppress(OSError):
            now = Path(args.routers_file).read_text().strip()
            if now:
                return now.split(",")
    return list(args.routers.split(","))


class _Incarnation:
    """One client process identity.  A client declared faulty (silent past its lease
    across a split, say) never acts again under its name (3.5.3): the worker goes on as a
    new process, ``NAME.GEN``, with its own session and history file."""

    def __init__(self, client: Any, name: str) -> None:
        self.client = client
        self.name = name
        self.ep = client.endpoint
        self.session = self.ep.session
        self.rec = Recorder(name)
        self.sent_at: dict[int, float] = {}
        self.drainer: asyncio.Task[None] | None = None


async def _client(args: argparse.Namespace) -> dict[str, Any]:
    return await _BenchClient(args).run()


class _BenchClient:
    """The benchmark's client process: submits in a closed loop (``--window`` in
    flight), an open loop (``--rate``) or unsafe, counts acknowledgements into a latency
    histogram, and goes on as a new incarnation when the group declares it faulty."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.payload = os.urandom(args.payload)
        self.hist: dict[int, int] = {}
        self.done: list[_Incarnation] = []
        self.submitted = 0
        self.open = True
        self.counts = {"acked": 0, "acked_in_window": 0, "submitted_in_window": 0,
                       "indeterminate": 0}  # fmt: skip
        self.last_ack = 0.0
        self.longest_gap = 0.0
        # Not loop.time(): uvloop's clock has millisecond resolution and is read once per
        # loop turn, which rounds every latency to whole milliseconds.
        self.clock = time.perf_counter
        self.start = self.clock()
        self.end = self.start + args.duration
        self.warm = self.start + args.warmup
        self.wall = time.time() - self.start  # our clock -> wall clock, shared with receivers
        self.inc: _Incarnation

    async def connect(self, name: str) -> Any:
        import ecast
        from ecast.core.endpoint import EndpointParams

        args = self.args
        timeouts = {} if args.progress_timeout is None else {
            "progress_timeout": args.progress_timeout
        }  # fmt: skip
        return await ecast.connect(
            _routers_now(args),
            name=name,
            secret=SECRET.encode(),
            params=EndpointParams(max_window=args.max_window, **timeouts),
            join_header={"role": "client"},
            queue_size=1 << 20,
            max_queued=1 << 20,
        )

    async def run(self) -> dict[str, Any]:
        self.inc = _Incarnation(await self.connect(self.args.name), self.args.name)
        self.leader = self.inc.client.leader
        print(json.dumps({"event": "ready", "leader": self.leader}), flush=True)
        self.begin(self.inc)
        if self.args.unsafe:
            await self.unsafe_loop()
        else:
            await self.safe_loop()
        self.open = False
        # Let the last acknowledgements arrive.
        for _ in range(200):
            if self.faulty() or (not self.inc.ep.window and not self.inc.ep.queued):
                break
            await asyncio.sleep(0.05)
        if self.faulty():
            self.give_up(self.inc)
        return await self.finish()

    # ------------------------------------------------------------------ submitting
    def submit(self, n: int) -> None:
        from ecast.history import Submit

        i = self.submitted
        inc = self.inc
        ids = inc.client.submit_batch([(self.payload, {"key": i + k}) for k in range(n)])
        now = self.clock()
        for sid in ids:
            inc.sent_at[sid[1]] = now
        if self.args.record:
            when = time.time()
            for sid in ids:
                inc.rec.event(Submit(sid, when))
        self.submitted = i + n

    async def unsafe_loop(self) -> None:
        """Open loop at --rate, else as fast as the connection to the routers drains."""
        args, batch = self.args, 256
        while (now := self.clock()) < self.end:
            due = int((now - self.start) * args.rate) - self.submitted if args.rate else batch
            n = min(due, 4 * batch)
            if n > 0:
                i = self.submitted
                items = [(self.payload, {"key": i + k}) for k in range(n)]
                await self.inc.client.submit_unsafe_batch(items)
                self.submitted = i + n
                if self.warm <= now:
                    self.counts["submitted_in_window"] += n
            await asyncio.sleep(0.001 if args.rate else 0)

    async def safe_loop(self) -> None:
        import ecast

        args = self.args
        if not args.rate:
            self.submit(args.window)
        while self.clock() < self.end:
            try:
                if args.rate:
                    due = int((self.clock() - self.start) * args.rate) - self.submitted
                    if due > 0:
                        self.submit(due)
                    await asyncio.sleep(0.001)
                else:
                    await asyncio.sleep(0.05)
            except ecast.ClosedError:
                if not self.faulty():
                    raise
            if self.faulty() and not await self.replace():
                break
            if self.inc.client.leader != self.leader:
                self.leader = self.inc.client.leader
                print(json.dumps({"event": "leader", "leader": self.leader}), flush=True)

    # ------------------------------------------------------------------ incarnations
    def begin(self, me: _Incarnation) -> None:
        from ecast.history import Submit

        if self.args.record and me.ep._join_id is not None:
            me.rec.event(Submit(me.ep._join_id))  # connect submitted it
        me.client.ack_listener = functools.partial(self.on_acks, me)
        me.drainer = asyncio.create_task(self.drain(me))

    def on_acks(self, me: _Incarnation, batch: list[Any]) -> None:
        args = self.args
        now = self.clock()
        in_window = self.warm <= now <= self.end
        mine = 0  # not the SDK's own membership messages (its join)
        if args.record:
            from ecast.history import Ack

            when = time.time()
            for ack in batch:
                me.rec.event(Ack(ack.id, ack.t, ack.delivered, when))
        # The benchmark's own loop runs per message in the client it measures: locals only.
        session = me.session
        pop = me.sent_at.pop
        hist = self.hist
        for ack in batch:
            sid = ack.id
            if sid[0] != session:
                continue  # its own join or part (the control session)
            t0 = pop(sid[1], None)
            if t0 is None:
                continue
            mine += 1
            if in_window:
                b = int((now - t0) / BUCKET_S)
                hist[b] = hist.get(b, 0) + 1
        self.counts["acked"] += mine
        if in_window:
            self.counts["acked_in_window"] += mine
        if self.last_ack:
            self.longest_gap = max(self.longest_gap, now - self.last_ack)
        self.last_ack = now
        refill = self.open and not args.rate and not args.unsafe and me is self.inc
        if refill and me.client.terminated is None:  # closed loop: refill
            room = args.window - len(me.ep.window) - len(me.ep.queued)
            if room > 0:
                self.submit(room)

    async def drain(self, me: _Incarnation) -> None:
        from ecast.history import Deliver

        async for d in me.client.deliveries():
            if self.args.record and not d.unsafe:
                m = d.message
                me.rec.event(Deliver(d.t, m.id, time.time(), m.sender, m.header))

    def give_up(self, me: _Incarnation) -> None:
        """``me`` was declared faulty: its messages not acknowledged are indeterminate
        (delivered or not, as the m-seq says), never counted as lost."""
        self.counts["indeterminate"] += len(me.sent_at)
        me.sent_at.clear()

    async def replace(self) -> bool:
        """The current incarnation was declared faulty: a new one takes over."""
        old = self.inc
        self.give_up(old)
        self.done.append(old)
        event = {"event": "suspected", "name": old.name, "reason": old.client.terminated}
        print(json.dumps(event), flush=True)
        with contextlib.suppress(Exception):
            await old.client.close(timeout=1)  # no part: it only lets its connections go
        while self.clock() < self.end:
            name = f"{self.args.name}.{len(self.done)}"
            try:
                self.inc = _Incarnation(await self.connect(name), name)
            except Exception:
                await asyncio.sleep(0.5)
                continue
            self.begin(self.inc)
            if not self.args.rate and not self.args.unsafe:
                self.submit(self.args.window)
            return True
        return False

    def faulty(self) -> bool:
        return self.inc.client.terminated not in (None, "closed", "detached")

    # ------------------------------------------------------------------ the end
    async def finish(self) -> dict[str, Any]:
        import ecast
        from ecast.history import Submit, Terminate

        args, inc, counts = self.args, self.inc, self.counts
        # ``inc`` is in ``done`` too when no replacement could connect before the end.
        incarnations = list(dict.fromkeys((*self.done, inc)))
        out = {
            "role": "client",
            "name": args.name,
            "submitted": self.submitted,
            "submitted_in_window": counts["submitted_in_window"],
            "acked": counts["acked"],
            "indeterminate": counts["indeterminate"],
            "incarnations": len(incarnations),
            "acked_in_window": counts["acked_in_window"],
            "measure_s": max(1e-9, self.end - self.warm),
            "window_wall": (self.warm + self.wall, self.end + self.wall),
            "latency_hist": sorted(self.hist.items()),
            "longest_gap_s": self.longest_gap,
            "leader": inc.client.leader,
        }
        ep = inc.ep
        if args.record and ep.terminated is None and not ep.closing:
            # The part close submits, recorded before anything of it can be delivered.
            inc.rec.event(Submit((ep.control_session, ep.next_control), time.time()))
        try:
            # The window drained above (or never will: a planted bug); the part gets the
            # rest, and a loaded machine can take seconds to order and deliver it.
            await inc.client.close(timeout=10)
        except ecast.PartFailedError as e:
            # Reported, not raised: the run's result and history still have to be
            # written (the group suspects this client once its lease runs out).
            out["part_failed"] = str(e)
            print(f"{args.name}: {e}", file=sys.stderr, flush=True)
        for me in incarnations:
            if me.drainer is not None:
                me.drainer.cancel()
            if args.record:
                if me.ep.terminated is not None:
                    me.rec.event(Terminate(me.ep.terminated, time.time(), me.ep.suspected_at))
                Path(args.record).mkdir(parents=True, exist_ok=True)
                me.rec.write(Path(args.record) / f"history-{me.name}.jsonl")
        return out


def worker_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="ecast bench worker")
    ap.add_argument("role", choices=["receivers", "client"])
    ap.add_argument("--routers", required=True)
    ap.add_argument("--routers-file", default="", help="the routers now, kept by the parent")
    ap.add_argument("--count", type=int, default=1)
    ap.add_argument("--first", type=int, default=1)
    ap.add_argument("--name", default="c1")
    ap.add_argument("--duration", type=float, default=10)
    ap.add_argument("--warmup", type=float, default=5)
    ap.add_argument("--payload", type=int, default=256)
    ap.add_argument("--rate", type=float, default=0)
    ap.add_argument("--window", type=int, default=4096)
    ap.add_argument("--max-window", type=int, default=1024)
    ap.add_argument("--unsafe", action="store_true")
    ap.add_argument("--record", default="")
    ap.add_argument("--sched", choices=("batch", "normal"), default="normal")
    ap.add_argument("--stop-file", default="/nonexistent")
    ap.add_argument("--out", required=True, help="file for the JSON result")
    ap.add_argument("--mutation", action="append", default=[], help="plant an endpoint bug")
    ap.add_argument(
        "--progress-timeout",
        type=float,
        default=None,
        help="seconds without progress before the client resends its window elsewhere",
    )
    args = ap.parse_args(argv)
    try:
        planted_bugs.check(args.mutation)
        planted_bugs.plant(args.mutation)
    except (ValueError, PermissionError) as e:
        ap.error(f"--mutation: {e}")
    tune_process()
    if args.sched == "batch" and hasattr(os, "sched_setscheduler"):
        # Load generators and sinks do throughput work: they should not preempt the
        # leader router each time a packet wakes them (see --worker-sched).
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    run = _receivers if args.role == "receivers" else _client
    result = asyncio.run(run(args))
    # Results can be large (latency samples): they go to a file, the pipe gets a pointer.
    out = Path(args.out)
    out.write_text(json.dumps(result))
    print(json.dumps({"role": result["role"], "result": str(out)}), flush=True)
    return 0


# ====================================================================== parent
class Proc:
    """A worker process: its JSON lines come over a pipe, its standard error goes to
    ``NAME.stderr`` in the run's directory (a pipe nobody reads would block a worker
    that logs much, and would lose why one ended)."""

    def __init__(
        self,
        role: str,
        name: str,
        cmd: list[str],
        env: dict[str, str],
        place: Place | None,
        logs: Path,
    ) -> None:
        self.role = role
        self.name = name
        full = [*(place.launcher if place else ()), *cmd]
        self.stderr_path = logs / f"{name}.stderr"
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(full, stdout=subprocess.PIPE, stderr=err, env=env)
        self.lines: list[dict[str, Any]] = []

    def stderr_tail(self, limit: int = 2000) -> str:
        """The end of what the worker wrote to standard error, and how it ended."""
        try:
            text = self.stderr_path.read_bytes()[-limit:].decode(errors="replace")
        except OSError:
            text = ""
        code = self.proc.poll()
        status = "still running" if code is None else f"exit status {code}"
        return f"{self.name} ({status}): {text.strip() or '(no standard error)'}"

    def read_line(self, timeout: float) -> dict[str, Any] | None:
        import select

        r, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not r:
            return None
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            return None
        obj = json.loads(line)
        self.lines.append(obj)
        return obj


class Nemesis(Protocol):
    """Faults injected while a run goes on (``jepsen_like``): called every quarter second
    with the seconds since the clients started, the cluster and the leader the clients
    last heard of; ``heal`` undoes whatever is still in effect before the run ends."""

    def __call__(self, elapsed: float, cluster: LocalCluster, leader: str) -> None: ...

    def heal(self, cluster: LocalCluster) -> None: ...

    def attach(self, apps: dict[str, int]) -> None:
        """The application processes (clients, receivers) by name, with their pids."""


def run_bench(
    args: argparse.Namespace,
    nemesis: Nemesis | None = None,
    placement: dict[str, Place] | None = None,
) -> dict[str, Any]:
    """``placement`` puts routers (``r1``...), receiver processes (``recv0``...) and
    clients (``c1``...) in places of their own (network namespaces, for jepsen_like).
    Whatever happens (an error, SIGTERM turned into an exception), no process it
    started outlives it."""
    started: list[Proc] = []
    clusters: list[LocalCluster] = []
    try:
        return _run_bench(args, nemesis, placement or {}, started, clusters)
    finally:
        for p in started:
            if p.proc.poll() is None:
                p.proc.kill()
                p.proc.wait()
        for c in clusters:
            c.stop_all()


def _run_bench(
    args: argparse.Namespace,
    nemesis: Nemesis | None,
    placement: dict[str, Place],
    started: list[Proc],
    clusters: list[LocalCluster],
) -> dict[str, Any]:
    env = {**os.environ, "ECAST_SECRET": SECRET}
    py = sys.executable
    tmp = Path(tempfile.mkdtemp(prefix="ecast-bench-"))
    stop_file = str(tmp / "stop")
    extra = [] if args.clumping else ["--no-clumping"]
    extra += [] if args.delayed_acks else ["--no-delayed-acks"]
    extra += list(args.router_arg)
    config_path, config_args = config_spec(args)
    cluster = LocalCluster(
        tmp,
        SECRET,
        [
            "--config",
            config_path,
            *(a for k, v in config_args.items() for a in ("--config-arg", f"{k}={v}")),
            "--log-level",
            "warning",
            *extra,
        ],
        placement=placement,
    )
    clusters.append(cluster)
    cluster.start_group(args.routers)
    routers = cluster.routers
    addresses = ",".join(cluster.addresses())
    routers_file = tmp / "routers"
    routers_file.write_text(addresses)
    record = str(tmp / "record") if args.kill_leader_at is not None or args.check else ""
    workers: list[Proc] = []
    per = max(1, -(-args.receivers // args.receiver_procs))
    n = 0
    for k in range(args.receiver_procs):
        count = min(per, args.receivers - n)
        if count <= 0:
            break
        cmd = [
            py,
            "-m",
            "ecast.tools.bench",
            "worker",
            "receivers",
            "--routers",
            addresses,
            "--count",
            str(count),
            "--first",
            str(n + 1),
            "--duration",
            str(args.duration),
            "--routers-file",
            str(routers_file),
            "--stop-file",
            stop_file,
            "--out",
            str(tmp / f"recv{k}.json"),
            "--sched",
            args.worker_sched,
        ]
        cmd += ["--record", record] if record else []
        workers.append(Proc("receiver", f"recv{k}", cmd, env, placement.get(f"recv{k}"), tmp))
        started.append(workers[-1])
        n += count
    for w in workers:
        if w.read_line(60) is None:
            raise SystemExit(f"receivers did not start: {w.stderr_tail()}")
    clients = []
    for c in range(args.clients):
        cmd = [
            py,
            "-m",
            "ecast.tools.bench",
            "worker",
            "client",
            "--routers",
            addresses,
            "--routers-file",
            str(routers_file),
            "--name",
            f"c{c + 1}",
            "--duration",
            str(args.duration),
            "--warmup",
            str(args.warmup),
            "--payload",
            str(args.payload),
            "--window",
            str(args.window),
            "--max-window",
            str(args.max_window),
            "--out",
            str(tmp / f"c{c + 1}.json"),
            "--sched",
            args.worker_sched,
        ]
        if args.rate:
            cmd += ["--rate", str(args.rate / args.clients)]
        if args.unsafe:
            cmd += ["--unsafe"]
        if record:
            cmd += ["--record", record]
        cmd += list(args.client_arg)
        clients.append(Proc("client", f"c{c + 1}", cmd, env, placement.get(f"c{c + 1}"), tmp))
        started.append(clients[-1])
    leader = "r1"
    for c in clients:
        first = c.read_line(60)
        if first is None:
            raise SystemExit(f"client did not start: {c.stderr_tail()}")
        leader = first.get("leader") or leader
    if nemesis is not None:
        nemesis.attach({p.name: p.proc.pid for p in (*workers, *clients)})
    t0 = time.monotonic()
    rss_series: dict[str, list[tuple[float, float, bool]]] = {}
    """Per role: (seconds, MB, in the warm-up); every 0.25 s in the warm-up, then every 1 s."""
    next_rss = 0.0
    killed = None
    results: dict[str, dict[str, Any]] = {}
    while True:
        elapsed = time.monotonic() - t0
        for c in clients:
            while True:
                line = c.read_line(0)
                if line is None:
                    break
                if line.get("event") == "leader" and line.get("leader"):
                    leader = line["leader"]
                elif line.get("role") == "client":
                    results[c.name] = json.loads(Path(line["result"]).read_text())
        if args.kill_leader_at is not None and killed is None and elapsed >= args.kill_leader_at:
            killed = leader
            cluster.kill(leader)
        if nemesis is not None:
            nemesis(elapsed, cluster, leader)
            now = ",".join(cluster.addresses())
            if now != addresses:
                # Routers replaced under fresh names: workers that reconnect read these.
                addresses = now
                (tmp / "routers.new").write_text(now)
                (tmp / "routers.new").replace(routers_file)
        warm = elapsed < args.warmup + 1
        if warm or elapsed >= next_rss:
            if not warm:
                next_rss = elapsed + 1.0
            for role, pid in _live_pids(routers, workers + clients):
                rss_series.setdefault(role, []).append((elapsed, _rss_mb(pid), warm))
        if len(results) == len(clients):
            break
        # Clients drain their windows, part, and (with --record) write a history that
        # grows with the run: a 600 s run's is a few million events.
        if elapsed > args.duration + 90 + (args.duration / 2 if record else 0):
            unfinished = [c.stderr_tail() for c in clients if c.name not in results]
            raise SystemExit(f"clients did not finish: {'; '.join(unfinished)}")
        time.sleep(0.25)
    if nemesis is not None:
        nemesis.heal(cluster)
    Path(stop_file).touch()
    recv_results = []
    # A recording receivers process writes its history when it stops: millions of
    # events after a long run, which take a while.  A history cut short would be judged
    # as if the missing deliveries never happened, so a run whose receivers do not
    # report fails instead of checking what is there.
    wait = 30.0 + (args.duration / 2 if record else 0.0)
    for w in workers:
        deadline = time.monotonic() + wait
        line = None
        while time.monotonic() < deadline:
            line = w.read_line(max(0.1, deadline - time.monotonic()))
            if line is None or line.get("role") == "receivers":
                break
        if line is not None and line.get("role") == "receivers":
            recv_results.append(json.loads(Path(line["result"]).read_text()))
        elif record:
            raise SystemExit(
                f"receivers {w.name} did not report within {wait:.0f} s of the stop, so"
                f" their history is incomplete: {w.stderr_tail()}"
            )
    cluster.stop_all()
    rss = {role: _rss_summary(series) for role, series in rss_series.items()}
    return _summarize(args, results, recv_results, rss, killed, record, routers)


def _live_pids(routers: dict[str, Any], workers: list[Any]) -> list[tuple[str, int]]:
    out = [(f"router {rid}", r.proc.pid) for rid, r in routers.items() if r.alive()]
    out += [(f"{w.role} {w.name}", w.proc.pid) for w in workers if w.proc.poll() is None]
    return out


def _rss_summary(series: list[tuple[float, float, bool]]) -> dict[str, float]:
    """``warm`` (the last sample of the warm-up) and ``end``, and over the samples after
    the warm-up their ``min``, ``max`` and least-squares ``slope_mb_per_min``.

    Two samples alone cannot tell growth from the heap's breathing (glibc's heap moves by
    about a megabyte within a second under load); a leak shows as a slope that stays
    positive however long the run, breathing as a spread around a flat line.
    """
    warm = [mb for _t, mb, w in series if w]
    after = [(t, mb) for t, mb, w in series if not w]
    out = {"warm": warm[-1] if warm else series[0][1], "end": series[-1][1]}
    if after:
        out["min"] = min(mb for _t, mb in after)
        out["max"] = max(mb for _t, mb in after)
    if len(after) >= 2:
        n = len(after)
        mt = sum(t for t, _mb in after) / n
        mm = sum(mb for _t, mb in after) / n
        var = sum((t - mt) ** 2 for t, _mb in after)
        if var > 0:
            cov = sum((t - mt) * (mb - mm) for t, mb in after)
            out["slope_mb_per_min"] = cov / var * 60
    return out


def _summarize(
    args: argparse.Namespace,
    clients: dict[str, dict[str, Any]],
    receivers: list[dict[str, Any]],
    rss: dict[str, dict[str, float]],
    killed: str | None,
    record: str,
    routers: dict[str, Any],
) -> dict[str, Any]:
    hist: dict[int, int] = {}
    for c in clients.values():
        for bucket, n in c["latency_hist"]:
            hist[bucket] = hist.get(bucket, 0) + n
    measure = max(c["measure_s"] for c in clients.values())
    acked = sum(c["acked_in_window"] for c in clients.values())
    # Delivered over the clients' measurement window, from the receivers' timed counters.
    w0 = min(c["window_wall"][0] for c in clients.values())
    w1 = max(c["window_wall"][1] for c in clients.values())
    delivered = 0
    for r in receivers:
        delivered += _count_at(r["series"], w1) - _count_at(r["series"], w0)
    measure = max(measure, w1 - w0)
    out: dict[str, Any] = {
        "throughput_per_s": round(acked / measure, 1),
        "delivered_per_s": round(delivered / measure, 1),
        "p50_ms": round(_percentile(hist, 0.5) * 1000, 1),
        "p99_ms": round(_percentile(hist, 0.99) * 1000, 1),
        "rss_mb": {k: {s: round(v, 1) for s, v in d.items()} for k, d in sorted(rss.items())},
        "routers": args.routers,
        "receivers": args.receivers,
        "config": args.config,
        "replication": args.replication if args.config == "key-ring" else None,
        "payload_bytes": args.payload,
        "clients": args.clients,
        "duration_s": args.duration,
        "mode": "unsafe"
        if args.unsafe
        else (f"open loop {args.rate}/s" if args.rate else f"closed loop window {args.window}"),
        "clumping": args.clumping,
        "delayed_acks": args.delayed_acks,
        "worker_sched": args.worker_sched,
        "submitted": sum(c["submitted"] for c in clients.values()),
        "acked": sum(c["acked"] for c in clients.values()),
        # Unacknowledged messages of a client declared faulty (then replaced under a
        # fresh name): delivered or not, as the m-seq says; never counted as lost.
        "indeterminate": sum(c.get("indeterminate", 0) for c in clients.values()),
        "client_incarnations": sum(c.get("incarnations", 1) for c in clients.values()),
        "order_ok": all(r["order_ok"] for r in receivers),
    }
    if args.unsafe:
        # Acceptance over the whole run: of the copies every submission owed its
        # destinations (replication per message), how many were delivered and accepted.
        owed = sum(c["submitted"] for c in clients.values()) * args.replication
        got = sum(r["unsafe_accepted"] for r in receivers)
        out["unsafe_accepted_per_s"] = out.pop("delivered_per_s")
        in_window = sum(c["submitted_in_window"] for c in clients.values())
        out["unsafe_submitted_per_s"] = round(in_window / measure, 1)
        out["unsafe_acceptance_rate"] = round(got / owed, 4) if owed else None
        out["unsafe_rejected"] = sum(r["unsafe_rejected"] for r in receivers)
        for key in ("throughput_per_s", "p50_ms", "p99_ms"):
            out.pop(key)
    if killed is not None:
        out["killed_leader"] = killed
        out["longest_gap_s"] = round(max(c["longest_gap_s"] for c in clients.values()), 3)
    if record:
        out.update(_check_history(Path(record), args))
    return out


def _check_history(path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The multicast checkers on the run's history: every process's file joined into one
    (``--history``, else ``history.jsonl`` beside them), read back and checked.

    Safety only, and times not compared across processes: the run stops its receivers
    without waiting for quiescence, and a receiver notes a delivery after its endpoint
    confirmed it.  Acknowledgement safety then says every acknowledged message was
    delivered by each of its destinations (the run's config replayed over the m-seq the
    deliveries and acknowledgements imply).
    """
    from ecast.core.config import load_config
    from ecast.history import check_history, read_history

    target = Path(args.history) if args.history else path / "history.jsonl"
    with open(target, "w", encoding="utf-8") as out:
        for part in sorted(path.glob("history-*.jsonl")):
            with open(part, encoding="utf-8") as f:
                while chunk := f.read(1 << 20):
                    out.write(chunk)
    history = read_history(target)
    config_path, config_args = config_spec(args)
    config = load_config(config_path, **config_args)
    verdict = check_history(history, config, liveness=False, time_tolerance=None)
    return {
        "history": str(target),
        "history_events": verdict.stats["events"],
        "checks_ran": len(verdict.ran),
        "check_s": verdict.stats["check_s"],
        "violations": verdict.messages(),
        "checkers_passed": verdict.ok,
    }


def config_spec(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The routers' config for ``--config``: its class and ``initial`` arguments, as the
    routers are started with it, the history is checked against it and jepsen_like's
    report names it."""
    if args.config == "broadcast":
        return "ecast:BroadcastConfig", {}
    return "ecast:KeyRingConfig", {"replication": args.replication}


def parser(prog: str = "ecast bench") -> argparse.ArgumentParser:
    """The benchmark's options (fault-injection runs build on them too)."""
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    ap.add_argument("--routers", type=int, default=3)
    ap.add_argument("--receivers", type=int, default=16)
    ap.add_argument("--receiver-procs", type=int, default=1)
    ap.add_argument("--replication", type=int, default=3)
    ap.add_argument(
        "--config",
        choices=("key-ring", "broadcast"),
        default="key-ring",
        help="key-ring: each message to --replication receivers by its key; broadcast:"
        " every message to every joined process, clients included",
    )
    ap.add_argument("--payload", type=int, default=256, help="bytes")
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--duration", type=float, default=20, help="seconds")
    ap.add_argument("--warmup", type=float, default=5, help="seconds not measured")
    ap.add_argument("--rate", type=float, default=0, help="open loop: messages per second")
    ap.add_argument(
        "--window",
        type=int,
        default=1024,
        help="closed loop: messages outstanding (the SDK admits at most 1,024 at a time)",
    )
    ap.add_argument(
        "--max-window",
        type=int,
        default=1024,
        help="the SDK's largest congestion window (routers need --congestion-threshold and "
        "--ack-cache to match, through --router-arg)",
    )
    ap.add_argument("--unsafe", action="store_true", help="submit unsafe messages")
    ap.add_argument("--clumping", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--delayed-acks", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--kill-leader-at", type=float, default=None, help="seconds")
    ap.add_argument(
        "--router-arg",
        action="append",
        default=[],
        help="extra flag for every router daemon, e.g. --router-arg=--max-batch=256",
    )
    ap.add_argument(
        "--client-arg",
        action="append",
        default=[],
        help="extra flag for every client process, e.g. --client-arg=--mutation=NAME",
    )
    ap.add_argument(
        "--worker-sched",
        choices=("batch", "normal"),
        default="batch",
        help="CPU policy of the client and receiver processes: batch (SCHED_BATCH) keeps "
        "them from preempting the leader router when a packet wakes them (routers do the "
        "same while following: ecast router --follower-sched)",
    )
    ap.add_argument(
        "--check",
        action="store_true",
        help="record the run's history and run the multicast checkers on it",
    )
    ap.add_argument(
        "--history",
        default="",
        help="with --check: keep the history here as JSON lines "
        "(the checkers' command line checks it again, workload multicast)",
    )
    ap.add_argument("--json", action="store_true")
    return ap


BUSY_WARNING = 0.25
"""A machine busier than this before a benchmark starts gets a warning."""


def cpu_times() -> tuple[int, int] | None:
    """All CPUs' time so far and the idle part of it, in ticks (``/proc/stat``: idle
    and I/O wait are idle); None where there is no ``/proc/stat``."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal (guest time is inside user)
    return sum(fields[:8]), fields[3] + fields[4]


def busy_between(a: tuple[int, int] | None, b: tuple[int, int] | None) -> float | None:
    """The share of all CPUs' time spent busy from :func:`cpu_times` ``a`` to ``b``."""
    if a is None or b is None or b[0] <= a[0]:
        return None
    return round(1 - (b[1] - a[1]) / (b[0] - a[0]), 3)


def cpu_busy(seconds: float = 0.5) -> float | None:
    """The share of all CPUs' time spent busy over the next ``seconds``."""
    a = cpu_times()
    time.sleep(seconds)
    return busy_between(a, cpu_times())


def warn_if_busy(busy: float | None) -> None:
    """On two cores a second job (another benchmark, a test suite) halves every figure
    without any error showing: say so when the machine was busy before the start."""
    if busy is not None and busy > BUSY_WARNING:
        print(
            f"warning: the machine was {busy:.0%} busy before this benchmark started "
            "(another job?): its figures will be low",
            file=sys.stderr,
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "worker":
        return worker_main(argv[1:])
    ap = parser()
    args = ap.parse_args(argv)
    if args.unsafe and args.config == "broadcast":
        ap.error("--unsafe measures acceptance against the key ring's replication")
    busy = cpu_busy()
    warn_if_busy(busy)
    result = run_bench(args)
    result["busy_before"] = busy
    if args.json:
        print(json.dumps(result))
    else:
        width = max(len(k) for k in result)
        for k, v in result.items():
            if k == "rss_mb":
                for role, d in v.items():
                    print(f"{'rss_mb ' + role:<{width + 12}} {d}")
            else:
                print(f"{k:<{width + 12}} {v}")
    return 0 if result.get("checkers_passed", True) and result.get("order_ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())
