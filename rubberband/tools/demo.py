"""``rubberband demo`` (``./run demo``): the main job.  It runs Rubberband's own checkers
(``rubberband.checkers``) and names the scan engine's Ticket table by module path, as the
daemons name their engine, so Rubberband still imports no engine.  A local Rubberband
cluster on the scan engine does
real work through expand, a leader kill, a storage kill and its repair, and a contract,
and checks at the end that nothing acknowledged was lost or reordered and that every
replica agrees.

Steps (about 90 s in all):

1. ``rubberband cluster up``: 3 routers, 1 super, 4 storage processes
   (``scan-memory``: the scan engine's tables beside key-value data in one engine), hash
   partitioning, replication 3, and 2 standby processes.
2. A Ticket table (the dissertation's Appendix A, 22 attributes) is loaded, and a bank's
   accounts with two materialized views of them and an index view of the tickets by
   status (:mod:`.demo_views`), kept by a ``rubberband views maintain`` process.
3. Clients run a mixed workload: two-key list-appends and reads (the list-append
   checker's workload), on the tickets inserts, status updates by key and queries at all
   three isolation levels (sequential, snapshot, basic), transfers between accounts, and
   reads of the views at their four levels.
4. Meanwhile: ``expand`` a standby onto the ring; SIGKILL the leading router and start a
   replacement; SIGKILL the views' maintainer and start another; SIGKILL a storage
   process, which the super replaces with a standby on its own; ``contract`` the
   expanded process again.  Each line of progress shows the step, throughput, latency
   and keyspace version.
5. Checks: final reads of every list, then the list-append checker over the recorded
   history (nothing acknowledged lost, no cycle) and the append-order checker (each
   client's appends in every list in its order, gap-free); every acknowledged ticket
   insert and the last acknowledged update of each ticket present; every view read equal
   to the view recomputed from the accounts' (or the Ticket rows') change feed at its
   position, and the bank's total in every one; every holder of every segment answering
   the same data (tables, lists, accounts and the views' version chains).
6. A PNG of throughput and latency with the fault and reconfiguration windows shaded, a
   summary, a verdict, and the cluster shut down.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from rubberband.tools.cli import run as _cli
from rubberband.tools.demo_views import BankViews

OPS = "storage_adapters.scan.kv:ScanKVOps"
TICKETS = "tickets"
ROWS = 20_000
KEYS = 200
"""The lists of the list-append workload are keys 1 to KEYS - 1."""
PROGRESS = "▮"


SCHEDULE_LIMIT = 2
"""The schedule of faults may run this many times ``--seconds`` (the workload then runs
until it is through): its waits are fixed (failure detection, a repair's copy), and at
``--seconds 30`` on a loaded machine they once took 31 s."""


class Demo:
    def __init__(self, d: Path, seconds: float, png: Path, seed: int) -> None:
        self.d = d
        self.seconds = seconds
        self.png = png
        self.rng = random.Random(seed)
        self.t0 = 0.0
        self.history: list[dict[str, Any]] = []
        self.latencies: list[tuple[float, float | None, bool]] = []
        self.windows: list[dict[str, Any]] = []
        self.step = "starting"
        self.version: Any = "?"
        self.stop = asyncio.Event()
        self.inserted: set[str] = set()
        self.status_of: dict[str, str] = {}
        self.unsure: set[str] = set()
        self.failures: list[str] = []
        self.bank = BankViews(self, seed + 1)

    # ------------------------------------------------------------------ plumbing
    def now(self) -> float:
        return time.monotonic() - self.t0

    def st(self) -> dict[str, Any]:
        return dict(json.loads((self.d / "cluster.json").read_text()))

    async def status(self) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        out = await loop.run_in_executor(
            None, _cli, "cluster", "status", "--state-dir", str(self.d), "--json"
        )
        return dict(json.loads(out.stdout)) if out.returncode == 0 else {}

    async def connect(self, name: str, role: str = "client") -> Any:
        """A client of the demo's cluster; ``role`` ``maintainer`` for one that defines
        views (maintainers alone write views' definitions and rows)."""
        import rubberband

        st = self.st()
        return await rubberband.connect(
            st["routers"], f"{role}:demo-{name}-{os.urandom(3).hex()}", ops=OPS,
            credentials=st[f"{role}_credentials"], answer_timeout=2.0,
        )  # fmt: skip

    def timed(self, invoked: float, ok: bool) -> None:
        self.latencies.append((invoked, self.now(), ok))

    # ------------------------------------------------------------------ workload
    async def appender(self, i: int) -> None:
        """Two-key list-appends and reads, recorded for the list-append checker.  An
        operation that ends without an answer makes this process done, as in Jepsen:
        the slot goes on as a new process."""
        gen = 0
        rb = await self.connect(f"a{i}")
        n = 0
        try:
            while not self.stop.is_set():
                proc = f"c{i}.{gen}"
                keys = self.rng.sample(range(1, KEYS), 2)
                if self.rng.random() < 0.6:
                    txn: list[list[Any]] = [["append", k, i * 10**7 + n] for k in keys]
                    call = rb.append_many({k: i * 10**7 + n for k in keys})
                else:
                    txn = [["r", k, None] for k in keys]
                    call = rb.get_many(keys)
                n += 1
                t = self.now()
                self.record(proc, "invoke", txn)
                try:
                    got = await call
                except Exception as e:
                    self.record(proc, "info", txn, e)
                    self.timed(t, False)
                    gen += 1
                    with contextlib.suppress(Exception):
                        await rb.close()
                    await asyncio.sleep(0.05)
                    rb = await self.connect(f"a{i}")
                    continue
                if txn[0][0] == "r":
                    txn = [["r", k, list(got.get(k) or ())] for k in keys]
                self.record(proc, "ok", txn)
                self.timed(t, True)
        finally:
            with contextlib.suppress(Exception):
                await rb.close()

    def record(
        self, proc: str, kind: str, value: Any, error: BaseException | None = None, f: str = "txn"
    ) -> None:
        r = {"process": proc, "type": kind, "f": f, "value": value,
             "index": len(self.history), "time": self.now()}  # fmt: skip
        if error is not None:
            r["error"] = f"{type(error).__name__}: {error}"[:200]
        self.history.append(r)

    async def tickets(self) -> None:
        """Inserts, status updates by key and queries at every isolation level."""
        rb = await self.connect("tickets")
        table = rb.table(TICKETS, key="rloc")
        known = sorted(self.status_of)
        n = 0
        try:
            while not self.stop.is_set():
                r = self.rng.random()
                t = self.now()
                try:
                    if r < 0.2:
                        rloc = f"N{n:05d}"
                        n += 1
                        row = {"rloc": rloc, "provider": "RB", "bookingStatus": "HK"}
                        try:
                            await table.insert([row])
                        except Exception:
                            self.unsure.add(rloc)
                            raise
                        self.inserted.add(rloc)
                        self.status_of[rloc] = "HK"
                    elif r < 0.45:
                        rloc = self.rng.choice(known)
                        status = self.rng.choice(["HK", "TK", "UN", "HL", "KL"])
                        try:
                            await table.update({"rloc": rloc}, set={"bookingStatus": status})
                        except Exception:
                            self.unsure.add(rloc)
                            raise
                        self.status_of[rloc] = status
                    else:
                        level = ("sequential", "snapshot", "basic")[n % 3]
                        n += 1
                        if r < 0.75:
                            await table.select({"rloc": self.rng.choice(known)}, isolation=level)
                        else:
                            city = self.rng.choice(["cityFrom", "cityTo"])
                            await table.select(
                                [(city, "prefix", "A")], columns=["rloc"], isolation=level
                            )
                    self.timed(t, True)
                except Exception:
                    self.timed(t, False)
                    await asyncio.sleep(0.05)
                    with contextlib.suppress(Exception):
                        await rb.close()
                    rb = await self.connect("tickets")
                    table = rb.table(TICKETS, key="rloc")
        finally:
            with contextlib.suppress(Exception):
                await rb.close()

    # ------------------------------------------------------------------ the schedule
    async def admin(self, *args: str) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        argv = ("admin", "--json", "--state-dir", str(self.d), *args)
        out = await loop.run_in_executor(None, _cli, *argv)
        if out.returncode != 0:
            raise RuntimeError(f"admin {' '.join(args)}: {out.stdout} {out.stderr}")
        return dict(json.loads(out.stdout))

    async def window(self, kind: str, what: str, coro: Any) -> None:
        start = self.now()
        self.step = what
        try:
            await coro
        finally:
            self.windows.append({"kind": kind, "start": start, "end": self.now(), "what": what})
            self.step = "steady"

    async def wait_until(self, what: str, check: Any, timeout: float = 40.0) -> None:
        deadline = time.monotonic() + timeout
        base = self.step
        while time.monotonic() < deadline:
            if await check():
                self.step = base
                return
            waited = int(time.monotonic() - (deadline - timeout))
            self.step = f"{base} (waiting: {what}) {PROGRESS * min(waited, 20)}"
            await asyncio.sleep(0.5)
        self.failures.append(f"{what} did not happen in {timeout:g} s")

    async def schedule(self) -> None:
        s = self.seconds
        await asyncio.sleep(s * 0.1)
        await self.window("reconfigure", "expand storage:5 onto the ring",
                          self.admin("expand", "storage:5", str(2**32 * 7 // 8)))  # fmt: skip
        await asyncio.sleep(s * 0.12)
        await self.window("kill", "SIGKILL the leading router", self.kill_leader())
        await asyncio.sleep(s * 0.06)
        await self.window("kill", "SIGKILL the views' maintainer; start another",
                          self.bank.kill_maintainer())  # fmt: skip
        await asyncio.sleep(s * 0.06)
        await self.window("kill", "SIGKILL storage:2; the super replaces it", self.kill_storage())
        await asyncio.sleep(s * 0.12)
        await self.window("reconfigure", "contract storage:5",
                          self.admin("contract", "storage:5"))  # fmt: skip
        self.step = "steady"

    async def kill_leader(self) -> None:
        from ecast import local

        st = await self.status()
        leader = st.get("leader")
        recorded = local.StateDir.recorded(str(self.d))
        if leader not in recorded:
            self.failures.append(f"no leading router to kill (status said {leader!r})")
            return
        os.kill(recorded[leader]["pid"], signal.SIGKILL)
        live = [r for r in recorded if r.startswith("r") and r != leader]
        cluster = local.LocalCluster(self.d, args=self.st()["router_args"])
        join = recorded[live[0]]
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(
            None, cluster.start, "r4", f"{join.get('host', '127.0.0.1')}:{join['ports']['listen']}"
        )
        routers = local.StateDir.recorded(str(self.d))
        st2 = self.st()
        st2["routers"] = [
            f"{p.get('host', '127.0.0.1')}:{p['ports']['listen']}"
            for n, p in sorted(routers.items())
            if n.startswith("r") and n != leader and "router" in p.get("argv", ())
        ]
        (self.d / "cluster.json").write_text(json.dumps(st2, indent=1))

        async def new_leader() -> bool:
            s2 = await self.status()
            return bool(s2.get("leader")) and s2.get("leader") != leader

        await self.wait_until("a new leader", new_leader)

    async def kill_storage(self) -> None:
        from ecast import local

        pid = local.StateDir.recorded(str(self.d))["storage2"]["pid"]
        os.kill(pid, signal.SIGKILL)

        async def repaired() -> bool:
            s2 = await self.status()
            names = [r["name"] for r in s2.get("ring", ())]
            return "storage:2" not in names and len(names) == 5 and not s2.get("pending")

        await self.wait_until("the super's repair", repaired)

    async def progress(self) -> None:
        last, last_t = 0, self.now()
        while not self.stop.is_set():
            await asyncio.sleep(1.0)
            st = await self.status()
            self.version = st.get("version", self.version)
            t = self.now()
            recent = [c - i for i, c, ok in self.latencies[last:] if ok and c is not None]
            failed = sum(1 for _, _, ok in self.latencies[last:] if not ok)
            last = len(self.latencies)
            # Lines come every second or more (the status request takes its time): the
            # rate is per second of the time since the last line, not per line.
            rate = len(recent) / max(t - last_t, 1e-3)
            last_t = t
            recent.sort()
            p50 = 1000 * recent[len(recent) // 2] if recent else 0.0
            p99 = 1000 * recent[min(len(recent) - 1, int(len(recent) * 0.99))] if recent else 0.0
            line = f"{t:5.1f} s  {rate:5.0f} ops/s  p50 {p50:6.1f} ms  p99 {p99:7.1f} ms"
            print(f"{line}  {failed:3d} failed  version {self.version}  {self.step}", flush=True)

    # ------------------------------------------------------------------ checks
    async def verify(self) -> dict[str, Any]:
        from rubberband.checkers import order
        from rubberband.checkers.history import Op
        from rubberband.checkers.list_append import check

        result: dict[str, Any] = {}
        rb = await self.connect("verify")
        try:
            # Final reads of every list (sequential): every acknowledged append must be
            # in them, and they fix the order the order checker judges.
            for lo in range(1, KEYS, 50):
                keys = list(range(lo, min(lo + 50, KEYS)))
                txn = [["r", k, None] for k in keys]
                self.record("final", "invoke", txn, f="final-read")
                try:
                    got = await rb.get_many(keys)
                except Exception as e:
                    self.record("final", "info", txn, e, f="final-read")
                    self.failures.append(f"a final read failed: {e}")
                    break
                txn = [["r", k, list(got.get(k) or ())] for k in keys]
                self.record("final", "ok", txn, f="final-read")
            ops = [Op.from_json(r) for r in self.history]
            la = check(ops)
            result["list_append_valid"] = la.valid is True
            result["list_append_anomalies"] = sorted(la.anomalies)[:5]
            result["final_reads"] = la.stats.get("final_reads", 0)
            od = order.check(ops)
            result["order_valid"] = od.valid is True
            result["order_anomalies"] = sorted(od.anomalies)[:5]
            result["order_sequences"] = od.stats.get("client_sequences", 0)
            rows = await rb.table(TICKETS, key="rloc").select(
                columns=["rloc", "bookingStatus"], isolation="sequential"
            )
            found = {r["rloc"]: r["bookingStatus"] for r in rows}
            result["tickets"] = len(found)
            missing = sorted(r for r in self.inserted if r not in found)
            wrong = sorted(
                r for r, s in self.status_of.items()
                if r not in self.unsure and found.get(r) != s
            )  # fmt: skip
            result["tickets_missing"] = missing[:5]
            result["tickets_wrong_status"] = wrong[:5]
            result["replicas"] = await self.replicas(rb)
        finally:
            await rb.close()
        return result

    async def replicas(self, rb: Any) -> dict[str, Any]:
        """Every holder of every segment answers the same lists and the same tickets."""
        from rubberband.keys import encode_key

        await rb.refresh()
        ks = rb.core.keyspace
        table_op = rb.core.ops.select(TICKETS, columns=["rloc", "bookingStatus"])
        table_op["key"] = "rloc"
        compared = 0
        differ: list[str] = []
        for i, segment in enumerate(ks.segments()):
            answers = {}
            for p in ks.holders_of_segment(i):
                try:
                    kv = await rb.read_replica(p, ("scan", None, None), segment)
                    tab = await rb.read_replica(p, table_op, segment)
                except Exception as e:  # a holder that cannot answer fails the check
                    differ.append(f"segment {i}: {p} did not answer ({type(e).__name__}: {e})")
                    continue
                kv = sorted(map(tuple, kv), key=lambda item: encode_key(item[0]))
                answers[p] = (kv, sorted(zip(*tab["data"], strict=True)))
            if not answers:
                continue
            first = next(iter(answers.values()))
            compared += len(answers)
            differ += [f"segment {i}: {p}" for p, a in answers.items() if a != first]
        return {"answers_compared": compared, "disagree": differ}

    # ------------------------------------------------------------------ run
    async def run(self) -> int:
        from rubberband.tools.report import per_second, plot

        # The demo's data is the scan engine's Ticket table, named by path as the
        # daemons name their engine: Rubberband imports no engine.
        ticket = importlib.import_module("storage_adapters.scan.ticket")
        SCHEMA, generate = ticket.SCHEMA, ticket.generate

        rb = await self.connect("load")
        try:
            await rb.create_table(TICKETS, schema=SCHEMA, key="rloc")
            data = generate(ROWS, seed=7)
            cols = list(data.columns)
            for lo in range(0, ROWS, 2000):
                await rb.write(rb.core.ops.insert(
                    TICKETS, columns=cols, data=[data.columns[c][lo:lo + 2000] for c in cols]
                ) | {"key": "rloc"})  # fmt: skip
            self.status_of = dict(
                zip(data.columns["rloc"], data.columns["bookingStatus"], strict=True)
            )
        finally:
            await rb.close()
        await self.bank.setup()
        print(f"loaded {ROWS:,} tickets and the bank's accounts, 3 views; the workload "
              f"runs for {self.seconds:g} s", flush=True)  # fmt: skip
        self.t0 = time.monotonic()
        workers = [asyncio.ensure_future(c) for c in (
            self.appender(0), self.appender(1), self.tickets(), self.bank.transfer(),
            self.bank.read(), self.progress())]  # fmt: skip
        # The workload runs ``seconds``, or until the schedule is through if its faults
        # took longer (a repair on a busy machine): a fault cut short proves nothing.
        # Twice ``seconds`` is the most it may take.
        try:
            await asyncio.wait_for(self.schedule(), SCHEDULE_LIMIT * self.seconds)
        except TimeoutError:
            self.failures.append(
                f"the schedule did not finish within {SCHEDULE_LIMIT * self.seconds:g} s"
            )
        rest = self.seconds - self.now()
        if rest > 0:
            await asyncio.sleep(rest)
        ran = self.now()
        self.stop.set()
        await asyncio.gather(*workers, return_exceptions=True)
        print("workload stopped; checking", flush=True)
        await asyncio.sleep(1.0)  # the last writes become stable everywhere
        # The views first: they stop the maintainer, the last writer, so the replicas
        # compared next hold still.
        checks = await self.bank.verify()
        checks.update(await self.verify())
        series = per_second([x for x in self.latencies if x[1] is not None and x[1] <= ran])
        why = plot(self.png, "rubberband demo: ok operations and latency", series, self.windows)
        verdict = (
            checks["list_append_valid"]
            and checks["order_valid"]
            and not checks["tickets_missing"]
            and not checks["tickets_wrong_status"]
            and not checks["replicas"]["disagree"]
            and BankViews.valid(checks)
            and not self.failures
        )
        self.summary(checks, ran, why)
        print(f"\nVERDICT: {'all checks passed' if verdict else 'FAILED'}")
        return 0 if verdict else 1

    def summary(self, checks: dict[str, Any], ran: float, why: str | None) -> None:
        ok_ops = sum(1 for *_, ok in self.latencies if ok)
        print("\nsummary")
        print(f"  operations acknowledged: {ok_ops:,} in {ran:.0f} s "
              f"({sum(1 for *_, ok in self.latencies if not ok)} failed or unsure)")  # fmt: skip
        for w in self.windows:
            print(f"  {w['start']:5.1f}-{w['end']:5.1f} s  {w['what']}")
        print(f"  list-append history: {len(self.history):,} events, "
              f"{'valid' if checks['list_append_valid'] else 'INVALID'} "
              f"{checks['list_append_anomalies'] or ''}, "
              f"{checks['final_reads']} final reads")  # fmt: skip
        print(f"  append order: {checks['order_sequences']:,} client sequences, "
              f"{'in order, gap-free' if checks['order_valid'] else 'BROKEN'} "
              f"{checks['order_anomalies'] or ''}")  # fmt: skip
        print(f"  tickets: {checks['tickets']:,}; acknowledged inserts missing: "
              f"{checks['tickets_missing'] or 'none'}; statuses wrong: "
              f"{checks['tickets_wrong_status'] or 'none'}")  # fmt: skip
        for line in BankViews.summary(checks):
            print(line)
        r = checks["replicas"]
        print(f"  replicas: {r['answers_compared']} answers compared, disagreeing: "
              f"{r['disagree'] or 'none'}")  # fmt: skip
        for f in self.failures:
            print(f"  problem: {f}")
        print(f"  chart: {self.png}" if not why else f"  chart: not drawn ({why})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rubberband demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="how long the workload runs")
    ap.add_argument("--png", default="rubberband-demo.png", help="the chart's file")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--state-dir", help="keep the cluster's files here (default: a temp dir)")
    args = ap.parse_args(argv)
    d = Path(args.state_dir or tempfile.mkdtemp(prefix="rubberband-demo-")) / "cluster"
    started = time.monotonic()
    print("starting a cluster: 3 routers, 1 super, 4 storage processes (scan-engine tables "
          "beside key-value data, replication 3, hash partitioning) and 2 standbys",
          flush=True)  # fmt: skip
    up = _cli("cluster", "up", "--routers", "3", "--supers", "1", "--storage", "4", "--engine",
              "scan-memory", "--partitioning", "hash", "--state-dir", str(d))  # fmt: skip
    try:
        if up.returncode != 0:
            print(up.stdout + up.stderr, file=sys.stderr)
            return 1
        print(up.stdout.strip(), flush=True)
        added = _cli("cluster", "add", "--storage", "2", "--state-dir", str(d))
        if added.returncode != 0:
            print(added.stdout + added.stderr, file=sys.stderr)
            return 1
        demo = Demo(d, args.seconds, Path(args.png), args.seed)
        try:
            code = asyncio.run(demo.run())
        finally:
            demo.bank.close()  # the views' maintainer, whatever happened
    finally:
        down = threading.Thread(target=_cli, args=("cluster", "down", "--state-dir", str(d)))
        down.start()
        down.join()
    print(f"done in {time.monotonic() - started:.0f} s; the cluster is down")
    return code
