"""The list-append and bank workloads on a real Rubberband cluster, under faults.

``rubberband cluster up`` starts 3 routers, 2 supers (automatic repair on) and 4 storage
processes, plus standby processes; with network faults every one of them runs in a
network namespace of its own (:mod:`jepsen_like.net`).  Clients (light SDK clients in
this process, each connecting from and serving on an address of its own) append to and
read small sets of keys: multi-key appends and multi-key sequential reads, each one
operation of the history, and one-key sequential and snapshot reads sent together by
``read_batch`` (read bundles), each its own operation.  The nemesis
(:class:`RubberbandNemesis`, a thread) injects one fault at a time once the ring and
the router group are healthy:

* ``kill``: SIGKILL a storage process on the ring (the super votes it out and replaces
  it with a standby on its own), a router (a new one joins under a fresh id) or a super
  (a new super starts; the next super by name takes over repairs).
* ``pause``: SIGSTOP one of them for 6 s, past every failure timeout; a voted-out
  storage process or super, or an expelled router, must stop when it resumes.
* ``partition``: the leading router isolated; a storage process cut off from the routers;
  a client cut off from everyone; or a split of the routers into a minority and a
  majority with storage processes and clients spread over both sides (2 to 4 s).
* ``stall`` / ``slow`` / ``loss``: one router or storage process sending nothing for 0.5
  to 0.9 s (while it still receives), its link at 1 Mbit/s, or losing 5 to 25 % of its
  packets (3 to 5 s).
* ``reconfigure``: expand, contract, replace or rebalance through a super's admin API,
  or a router joining or parting.
* ``power-cut`` (``--engine log`` or ``scan-log``): every router, super and storage
  process SIGKILLed at once, then ``rubberband cluster up`` restarts the cluster from its
  disks; clients reconnect to the new routers, and so does a view's maintainer, which
  outlives the cut as a client on another machine would (its feed from before the cut
  is compacted: it rebuilds the view).  Acknowledged writes are durable: the checkers
  judge the history across the cut as across any other fault.

A new standby is provisioned whenever fewer than two are left.  After the faults every
fault is healed, the ring settles, and every key is read once more; the Elle-style
list-append checker judges the history: no cycle, no lost or reordered acknowledged
append.  Indeterminate and unavailable results count as unknown.

The bank workload moves money between 8 accounts of 100 with atomic two-key ``add``
writes (deltas summing to zero) and reads every account at all three isolation levels;
the bank checker requires every sequential and snapshot read to see the initial total
and every balance to be reachable, and reports torn basic reads apart (allowed).
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ecast import local
from jepsen_like.net import Net
from rubberband.tools.cli import run as _cli
from rubberband.tools.restart import member

KEYS = 12
"""Keys in use at a time, one per twelfth of the key space."""
APPENDS_PER_KEY = 100
"""A key takes this many appends, then a fresh key takes its place (as Elle's
list-append rotates keys): reads of ever-growing lists would make the history grow
with the square of the run's length."""
SPREAD = 1_000_000
"""Integer keys ``0 .. SPREAD`` (the ids ``cluster up`` spreads its processes over):
the workload's keys lie in every segment, so every reconfiguration moves some."""
FILLER = 20_000
"""Keys of 256 bytes loaded first, so that moving a range takes a while (a read routed
to a replica still being filled has a window to land in)."""


def kid(k: int) -> int:
    """The storage key of the workload's key ``k{k}``: key ``k`` lives in slot
    ``k % KEYS`` of the key space, generation ``k // KEYS`` (odd; filler keys are even)."""
    return 1_235 + (k % KEYS) * (SPREAD // KEYS // 2 * 2) + (k // KEYS) * 2


def filler() -> dict[int, str]:
    step = SPREAD // FILLER
    taken = set(ACCOUNT_KEY.values())
    # Text, which every engine stores (the scan engine keeps values as JSON text).
    return {k: "f" * 256 for k in range(step // 2 * 2, SPREAD, step) if k not in taken}


ROLES = ("storage", "router", "super")
"""What ``kill`` and ``pause`` hit."""


def _status(d: Path) -> dict[str, Any]:
    """The cluster's status from a super's admin API, or {} while no super answers (the
    nemesis then waits).  In this process: a ``rubberband cluster status`` child per
    check cost a Python start-up, seconds on a slow machine, between every two faults."""
    from rubberband.tools.cluster import admin_request

    try:
        code, body = admin_request(str(d), "/status", timeout=5.0)
    except (OSError, ValueError):
        return {}
    return dict(body) if code == 200 else {}


ACCOUNTS = [f"a{i}" for i in range(8)]
ACCOUNT_KEY = {a: 5_678 + i * (SPREAD // len(ACCOUNTS)) for i, a in enumerate(ACCOUNTS)}
INITIAL_BALANCE = 100
VIEW = "bank_total"
VIEW_SPEC: dict[str, Any] = {
    "where": [(None, "<", "")],  # the accounts' integers, not the filler's text
    "aggregates": {"total": ["sum", None], "accounts": ["count", None]},
}
"""One row (no ``group_by``): every position's total must be the initial one."""


@dataclass(frozen=True)
class Plan:
    workload: str
    """``list-append`` or ``bank``."""
    kinds: tuple[str, ...]
    seed: int
    duration: float
    settle: float
    say: Any
    net: Net | None = None
    mutation: tuple[str, ...] = field(default=())
    """Planted router bugs (``RubberbandConfig.MUTATIONS``), tests only."""
    engine: str = "memory"
    """The storage processes' engine (``cluster up --engine``)."""
    final_read_budget: float = 120.0
    """Seconds the final reads have in all; what is not read by then is reported unread."""
    answer_timeout: float = 10.0
    """The clients' ``answer_timeout`` (seconds a read waits for its answers)."""
    views: bool = False
    """Bank only: an aggregate view of the accounts (``VIEW``), kept by a ``rubberband
    views maintain`` process, read at every view level beside the accounts."""
    min_faults: int = 0
    """Faults go on past ``duration - settle`` until this many were injected (for at most
    ``duration`` seconds more): the nemesis waits for a healthy ring between faults, and
    a slow machine heals more slowly, so it gets the same faults later, not fewer."""


def run_rubberband(d: Path, plan: Plan) -> dict[str, Any]:
    """Bring a cluster up in ``d``, run ``plan`` against it, and take it down."""
    cdir = d / "cluster"
    if plan.net is not None:
        names = ["r1", "r2", "r3", "s1", "s2", *(f"storage{i}" for i in range(1, 7)),
                 "maintainer"]  # fmt: skip
        local.StateDir(cdir, placement={n: plan.net.add(n) for n in names})
    if plan.mutation:
        os.environ[local.MUTATIONS_ENV] = "1"
    up = _cli("cluster", "up", "--routers", "3", "--supers", "2", "--storage", "4",
              "--engine", plan.engine, "--state-dir", str(cdir),
              *(f"--mutation={m}" for m in plan.mutation))  # fmt: skip
    if up.returncode != 0:
        raise RuntimeError(f"cluster up failed: {up.stdout[-1500:]}{up.stderr[-1500:]}")
    try:
        added = _cli("cluster", "add", "--storage", "2", "--state-dir", str(cdir))
        if added.returncode != 0:
            raise RuntimeError(f"cluster add failed: {added.stderr[-1500:]}")
        return asyncio.run(_go(cdir, plan))
    finally:
        _cli("cluster", "down", "--state-dir", str(cdir))


async def _go(d: Path, plan: Plan) -> dict[str, Any]:
    return await Workload(d, plan).run()


class Workload:
    """The clients of a run: four client slots doing the workload's operations, each
    recorded in the history, while the nemesis faults the cluster; then the settle and
    the final reads."""

    def __init__(self, d: Path, plan: Plan) -> None:
        self.d = d
        self.plan = plan
        self.st = json.loads((d / "cluster.json").read_text())
        self.history: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self.t0 = time.monotonic()
        self.clients = [f"c{i}" for i in range(4)]
        self.active = list(range(KEYS))
        """The keys clients pick from; a key that took its appends gives way to a fresh
        one."""
        self.appends: dict[int, int] = {}
        self.next_key = KEYS
        self._given: dict[int, list[str]] = {}
        """Per client (by ``id``), the routers it was given at its connect."""

    def record(
        self,
        process: str,
        kind: str,
        value: Any,
        f: str = "txn",
        level: str | None = None,
        error: BaseException | None = None,
    ) -> None:
        r = {"process": process, "type": kind, "f": f, "value": value,
             "index": len(self.history), "time": time.monotonic() - self.t0}  # fmt: skip
        if level is not None:
            r["level"] = level
        if error is not None:
            r["error"] = f"{type(error).__name__}: {error}"[:300]
        self.history.append(r)

    def connect(self, name: str, slot: str | None = None, role: str = "client") -> Any:
        """A light client ``client:jNAME`` (``role`` ``maintainer``: ``maintainer:jNAME``,
        which may define views); with network faults it connects from, and serves on,
        the address of its slot (one per client, kept across reconnects)."""
        import rubberband.sdk as rbsdk

        where: dict[str, Any] = {}
        if self.plan.net is not None:
            ip = self.plan.net.source(slot or name)
            where = {"listen": f"{ip}:0", "source": ip}
        routers = json.loads((self.d / "cluster.json").read_text())["routers"]
        creds = self.st[f"{role}_credentials"]
        if "power-cut" in self.plan.kinds:
            # A write to routers that all died waits out its acknowledgement timeout
            # before its client learns to go to the new ones: keep it short.
            where["ack_timeout"] = self.plan.answer_timeout
        return self._connected(rbsdk.connect(
            routers, f"{role}:j{name}", credentials=creds,
            answer_timeout=self.plan.answer_timeout, **where,
        ), routers)  # fmt: skip

    async def _connected(self, connecting: Any, routers: list[str]) -> Any:
        rb = await connecting
        self._given[id(rb)] = routers
        return rb

    # ------------------------------------------------------------------ operations
    async def bank_op(self, rb: Any, proc: str, i: int, n: int, crng: random.Random) -> Any:
        """One transfer or read; the exception of an indeterminate one, else None."""
        record = self.record
        if self.plan.views and crng.random() < 0.15:
            return await self.view_read(rb, proc, crng)
        if crng.random() < 0.6:
            a, b = crng.sample(ACCOUNTS, 2)
            value = {"from": a, "to": b, "amount": crng.randint(1, 10)}
            record(proc, "invoke", value, "transfer")
            try:
                amount = value["amount"]
                await rb.add_many({ACCOUNT_KEY[a]: -amount, ACCOUNT_KEY[b]: amount})
                record(proc, "ok", value, "transfer")
            except Exception as e:
                record(proc, "info", value, "transfer", error=e)
                return e
            return None
        level = crng.choice(["sequential", "sequential", "snapshot", "basic"])
        record(proc, "invoke", None, "read", level)
        try:
            got = await rb.get_many(list(ACCOUNT_KEY.values()), isolation=level)
            record(proc, "ok", {a: got.get(ACCOUNT_KEY[a]) for a in ACCOUNTS}, "read", level)
        except Exception as e:
            record(proc, "info", None, "read", level, e)
            return e
        return None

    async def append_op(self, rb: Any, proc: str, i: int, n: int, crng: random.Random) -> Any:
        """One two-key append or read; the exception of an indeterminate one, else None."""
        record = self.record
        keys = crng.sample(self.active, 2)
        if crng.random() < 0.6:
            txn = [["append", f"k{k}", i * 1_000_000 + n] for k in keys]
            record(proc, "invoke", txn)
            self._count_appends(keys)
            try:
                await rb.append_many({kid(k): i * 1_000_000 + n for k in keys})
                record(proc, "ok", txn)
            except Exception as e:
                record(proc, "info", txn, error=e)
                return e
            return None
        if crng.random() < 0.5:
            level = crng.choice(["sequential", "snapshot"])
            return await self.bundled_reads(rb, proc, keys, level)
        txn = [["r", f"k{k}", None] for k in keys]
        record(proc, "invoke", txn)
        try:
            got = await rb.get_many([kid(k) for k in keys])
            record(proc, "ok", [["r", f"k{k}", list(got.get(kid(k)) or ())] for k in keys])
        except Exception as e:
            record(proc, "info", txn, error=e)
            return e
        return None

    def _count_appends(self, keys: list[int]) -> None:
        for k in keys:
            self.appends[k] = self.appends.get(k, 0) + 1
            if self.appends[k] == APPENDS_PER_KEY and k in self.active:
                self.active[self.active.index(k)] = self.next_key
                self.next_key += 1

    async def bundled_reads(self, rb: Any, proc: str, keys: list[int], level: str) -> Any:
        """One-key reads of ``keys`` through ``read_batch`` (reads of one responder in one
        message), each its own operation of the history, by a process of its own
        (``c1/0``, ``c1/1``: a process runs one operation at a time): the checker holds
        each to its level, as it holds a read alone.  A refused snapshot read did not
        happen (``fail``); one that timed out or was never sent is unknown."""
        record = self.record
        txns = {kid(k): [["r", f"k{k}", None]] for k in keys}
        procs = {key: f"{proc}/{j}" for j, key in enumerate(txns)}
        for key, txn in txns.items():
            record(procs[key], "invoke", txn, level=level)
        left = set(txns)
        finished = asyncio.Event()
        failure: list[Exception] = []

        def done(op: Any, gather: Any) -> None:
            key = op[1][0]
            left.discard(key)
            txn = txns[key]
            if gather is None or (gather.error is not None and not gather.refused):
                error = TimeoutError("no answer") if gather is None else RuntimeError(gather.error)
                record(procs[key], "info", txn, level=level, error=error)
                failure.append(error)
            elif gather.refused:
                record(procs[key], "fail", txn, level=level)
            else:
                got = rb.core.result(gather)
                record(procs[key], "ok", [["r", txn[0][1], list(got.get(key) or ())]], level=level)
            if not left:
                finished.set()

        try:
            await rb.read_batch([("get", (key,)) for key in txns], level, done)
        except Exception as e:
            for key in list(left):
                record(procs[key], "info", txns[key], level=level, error=e)
            return e
        await finished.wait()  # every read completes or times out (answer_timeout)
        return failure[0] if failure else None

    # ------------------------------------------------------------------ clients
    async def client(self, i: int) -> None:
        """Client slot ``i``.  As in Jepsen, a process whose operation ended indeterminate
        is done (that operation may still take effect after later ones): the slot goes
        on as a new process, ``c{i}.{gen}``.  A client that was declared faulty (silent
        past its lease, say across a partition) cannot act again: the slot connects a
        new one under a fresh name."""
        op = self.bank_op if self.plan.workload == "bank" else self.append_op
        crng = random.Random(self.plan.seed * 100 + i)
        rb = await self.connect(self.clients[i])
        gen = n = 0
        while not self.stop.is_set():
            n += 1
            failure = await op(rb, f"c{i}" if gen == 0 else f"c{i}.{gen}", i, n, crng)
            if failure is None:
                continue
            gen += 1
            if _unreachable(failure) or self._routers_replaced(rb):
                # Declared faulty, or every router it knows is gone (routers are
                # replaced under fresh names all run long, or the cluster restarted): a
                # new client, from the routers the cluster has now.
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(rb.close(), 0.5)
                rb = await self._reconnect(i, gen)
                if rb is None:
                    return
            await asyncio.sleep(0.01)  # a failing call must not starve the other clients
        with contextlib.suppress(Exception):
            await rb.close()

    def _routers_replaced(self, rb: Any) -> bool:
        """Whether none of the routers ``rb`` was given is the cluster's any more (the
        cluster restarted after a power cut: a new group, on new ports)."""
        now = set(json.loads((self.d / "cluster.json").read_text())["routers"])
        return not now & set(self._given.get(id(rb), now))

    async def _reconnect(self, i: int, gen: int) -> Any:
        while not self.stop.is_set():
            try:
                return await self.connect(f"{self.clients[i]}-{gen}", self.clients[i])
            except Exception:
                await asyncio.sleep(0.5)
        return None

    async def load_data(self) -> None:
        rb = await self.connect("setup", role="maintainer")  # (it may define the view)
        load = list(filler().items())
        for i in range(0, len(load), 1000):
            await rb.put_many(dict(load[i : i + 1000]))
        if self.plan.workload == "bank":
            await rb.put_many(dict.fromkeys(ACCOUNT_KEY.values(), INITIAL_BALANCE))
            if self.plan.views:
                await rb.create_view(VIEW, (0, SPREAD), "aggregate", **VIEW_SPEC)
                self.start_maintainer()
                await rb.view(VIEW).get([None])  # backfilled before the faults
        await rb.close()

    def start_maintainer(self) -> None:
        """``rubberband views maintain`` as a daemon of the cluster (in its own network
        namespace under network faults); ``cluster down`` stops it."""
        state = local.StateDir(self.d)
        host = state.place("maintainer").host
        argv = state.python("rubberband.tools.cli", "views", "maintain", "--state-dir",
                            str(self.d), "--listen", f"{host}:0", "--source", host)  # fmt: skip
        state.start("maintainer", argv)

    async def view_read(self, rb: Any, proc: str, crng: random.Random) -> Any:
        """A read of the accounts' aggregate view at a view level, with its position."""
        level = crng.choice(["sequential", "read-your-writes", "snapshot", "any"])
        self.record(proc, "invoke", None, "view-read", level)
        try:
            got, at = await rb.view(VIEW).get([None], level, with_position=True)
        except Exception as e:
            self.record(proc, "info", None, "view-read", level, e)
            return e
        row = got.get(None) or {}
        value = {"total": row.get("total"), "accounts": row.get("accounts"), "position": at}
        self.record(proc, "ok", value, "view-read", level)
        return None

    async def run(self) -> dict[str, Any]:
        await self.load_data()
        self.t0 = time.monotonic()
        nemesis = RubberbandNemesis(self.d, self.plan, self.clients)
        workers = [asyncio.ensure_future(self.client(i)) for i in range(len(self.clients))]
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, nemesis.run, self.t0, self.stop)
        finally:
            self.stop.set()
            nemesis.heal()
        # Every operation ends within its own timeouts (the SDK's); a client still busy
        # after WORKERS_GRACE is cancelled, its operation unknown (never waited for), and
        # the run fails on liveness.
        _, busy = await asyncio.wait(workers, timeout=WORKERS_GRACE)
        stuck = [f"c{i}" for i, w in enumerate(workers) if w in busy]
        for w in busy:
            w.cancel()
        phases = {"workload_s": round(time.monotonic() - self.t0, 1)}
        # Settle: the ring healthy again, then every key read once more.
        mark = time.monotonic()
        deadline = mark + 40
        while time.monotonic() < deadline:
            if await loop.run_in_executor(None, nemesis.ring_healthy, False):
                break
            await asyncio.sleep(0.5)
        phases["settle_s"] = round(time.monotonic() - mark, 1)
        mark = time.monotonic()
        bank = self.plan.workload == "bank"
        keys = [ACCOUNT_KEY[a] for a in ACCOUNTS] if bank else list(range(self.next_key))
        unread = await final_reads(
            self.connect, self.record, self.plan.workload, keys, self.plan.final_read_budget
        )
        phases["final_reads_s"] = round(time.monotonic() - mark, 1)
        await loop.run_in_executor(None, nemesis.sample_held)
        return {"history": self.history, "faults": nemesis.faults,
                "reads_held": nemesis.reads_held, "resumed_alive": nemesis.resumed_alive(),
                "phases": phases, "unread": unread, "stuck": stuck,
                "ring": [r["name"] for r in _status(self.d).get("ring", [])]}  # fmt: skip


def _unreachable(failure: Exception) -> bool:
    """A client that cannot go on: declared faulty, or every router it knows gone."""
    import ecast

    return isinstance(failure, ecast.SuspectedError | ecast.Unavailable) or (
        "unavailable" in str(failure)
    )


WORKERS_GRACE = 90.0
"""Seconds the clients have, once the workload ends, to finish the operation each has
in flight (an SDK call ends within its timeouts, 40 s at most by default)."""


async def final_reads(
    connect: Callable[[str], Any],
    record: Callable[..., None],
    workload: str,
    keys: list[int],
    budget: float,
) -> int:
    """Read every key once more after the faults, within ``budget`` seconds in all: the
    reads go pipelined (``read_batch``, sequential), those refused or timed out are tried
    again while the budget lasts, and what is still unread at the end is recorded
    unknown (``info``) with the reason; returns how many.  Under list-append each key is
    one ``final-read`` (the checker requires every acknowledged append in it); under
    bank, one read of every account."""
    deadline = time.monotonic() + budget
    if workload == "bank":
        record("final", "invoke", None, "read", "sequential")
    else:
        for k in keys:  # a process per read: they are in flight together
            record(f"final/{k}", "invoke", [["r", f"k{k}", None]], "final-read")
    got: dict[int, Any] = {}
    last_error: BaseException | None = None
    rb = None
    try:
        rb = await asyncio.wait_for(connect("final"), max(1.0, deadline - time.monotonic()))
        ops = [("get", (k if workload == "bank" else kid(k),)) for k in keys]
        wanted = {op[1][0]: k for op, k in zip(ops, keys, strict=True)}
        while len(got) < len(keys) and time.monotonic() < deadline:
            left = [op for op in ops if wanted[op[1][0]] not in got]
            finished = asyncio.Event()
            pending = {op[1][0] for op in left}

            def done(op: Any, gather: Any, pending: set[Any] = pending,
                     finished: asyncio.Event = finished) -> None:  # fmt: skip
                key = op[1][0]
                pending.discard(key)
                if gather is not None and not gather.refused and gather.error is None:
                    got[wanted[key]] = rb.core.result(gather).get(key)
                if not pending:
                    finished.set()

            timeout = max(1.0, min(rb.answer_timeout, deadline - time.monotonic()))
            await rb.read_batch(left, "sequential", done, timeout=timeout)
            await asyncio.wait_for(finished.wait(), timeout + 5.0)
    except (Exception, TimeoutError) as e:  # unread keys say why, below
        last_error = e
    finally:
        if rb is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(rb.close(), 10)
    why = RuntimeError(
        f"unread when the final-read budget of {budget:g} s ran out"
        + (f" (last error: {type(last_error).__name__}: {last_error})" if last_error else "")
    )
    if workload == "bank":
        if len(got) == len(keys):
            balances = {a: got.get(ACCOUNT_KEY[a]) for a in ACCOUNTS}
            record("final", "ok", balances, "read", "sequential")
            return 0
        record("final", "info", None, "read", "sequential", why)
        return 1
    for k in keys:
        if k in got:
            record(f"final/{k}", "ok", [["r", f"k{k}", list(got[k] or ())]], "final-read")
        else:
            record(f"final/{k}", "info", [["r", f"k{k}", None]], "final-read", error=why)
    return len(keys) - len(got)


class RubberbandNemesis:
    """One fault at a time from a seeded schedule, on a thread of its own (every step
    blocks: signals, CLI calls, admin requests)."""

    def __init__(self, d: Path, plan: Plan, clients: list[str]) -> None:
        self.d = d
        self.plan = plan
        self.net = plan.net
        self.clients = clients
        self.rng = random.Random(plan.seed)
        self.faults: list[dict[str, Any]] = []
        self.paused: list[tuple[str, int]] = []
        """(name, pid) of every process that was paused: checked after the run."""
        self.st = json.loads((d / "cluster.json").read_text())
        self.cluster = local.LocalCluster(d, args=self.st["router_args"])
        self.routers = 3
        """Routers the group keeps (4 after a reconfiguration adds one)."""
        self._fresh = 0
        self._supers = len(self.st["supers"])
        self._active: dict[str, Any] | None = None
        self._next_at = 0.0
        """When the next fault may start (seconds into the run)."""
        self._t0 = 0.0
        self.reads_held: dict[str, int] = {}
        """Per storage process, the reads it held for a copy (its ``reads_held``; a
        process keeps counting until it stops, so the largest sample is its count)."""

    # ------------------------------------------------------------------ state
    def _recorded(self) -> dict[str, Any]:
        return local.StateDir.recorded(self.d)

    def _routers(self) -> dict[str, dict[str, Any]]:
        """Live router processes by name."""
        return {n: p for n, p in self._recorded().items()
                if "router" in p.get("argv", ()) and local.running(p["pid"])}  # fmt: skip

    def _health(self, p: dict[str, Any]) -> dict[str, Any] | None:
        return local.http_json(f"http://{p.get('host', '127.0.0.1')}:{p['health_port']}/health")

    def _router_view(self) -> tuple[bool, str | None]:
        """(every live router is a member of one view of exactly the live routers,
        the leader)."""
        live = self._routers()
        leader = None
        for p in live.values():
            h = self._health(p)
            if not h or h.get("status") != "ok":
                return False, None
            if sorted(h.get("members", ())) != sorted(live):
                return False, None
            leader = h.get("leader") or leader
        return len(live) >= 1, leader

    def _members(self) -> list[str]:
        """The members of the router view as its leader says now (empty if no leader
        answers): what a router fault may take one of."""
        leader = self._router_view()[1]
        p = self._recorded().get(leader) if leader else None
        h = self._health(p) if p is not None else None
        return list(h.get("members", ())) if h and h.get("leader") == leader else []

    def _may_take_a_router(self) -> bool:
        """Whether the router view can lose one member and keep a majority: at least
        three members, every one of them running.  A view is checked as it is when the
        fault starts, not as it was when the loop last saw a healthy ring: a paused
        router voted out as it resumed left a view of two, and killing one of those two
        lost the group's quorum for good (the run never ended)."""
        members = self._members()
        live = self._routers()
        return len(members) >= 3 and all(m in live for m in members)

    def sample_held(self) -> None:
        """Read every live storage process's count of reads held for a copy."""
        for name, p in self._recorded().items():
            if "storage" not in p.get("argv", ()) or not local.running(p["pid"]):
                continue
            h = self._health(p)
            n = (h or {}).get("reads_held")
            if type(n) is int:
                self.reads_held[name] = max(n, self.reads_held.get(name, 0))

    def ring_healthy(self, routers_too: bool = True) -> bool:
        s = _status(self.d)
        ring = s.get("ring", [])
        # Busy (receiving) and incomplete holders are lists beside the ring: a holder
        # still receiving does not hold all of its data, so a fault now could take a
        # range's last complete copy.
        ok = (
            bool(ring)
            and not s.get("pending")
            and not s.get("busy")
            and not s.get("incomplete")
            and not any(r.get("suspected") for r in ring)
        )
        return ok and (not routers_too or self._router_view()[0])

    # ------------------------------------------------------------------ the loop
    def run(self, t0: float, stop: threading.Event) -> None:
        self._t0 = t0
        plan = self.plan
        time.sleep(3)
        while plan.kinds and not self._faults_over():
            a = self._active
            if a is not None:
                if self._elapsed() >= a["heal_at"]:
                    self._heal(a)
                    time.sleep(max(0.0, self._next_at - self._elapsed()))
                else:
                    time.sleep(0.05)
                continue
            if not self._replenish():
                time.sleep(0.5)
                continue
            self.sample_held()
            if not self.ring_healthy():
                time.sleep(0.5)
                continue
            kind = self.rng.choice(plan.kinds)
            fault = getattr(self, "_" + kind.replace("-", "_"))()
            if fault is None:
                continue
            fault = {"kind": kind, "start": round(fault.pop("at"), 2), **fault}
            self.faults.append(fault)
            # The next fault comes 2 to 4 s after this one starts, and not before it is
            # healed (on time, above).
            self._next_at = self._elapsed() + self.rng.uniform(2, 4)
            if "heal_at" in fault:
                self._active = fault
            else:
                fault.setdefault("end", fault["start"])
                time.sleep(max(0.0, self._next_at - self._elapsed()))
        settled_at = max(plan.duration, self._elapsed() + plan.settle)
        while self._elapsed() < settled_at and not stop.is_set():
            if self._active is not None and self._elapsed() >= self._active["heal_at"]:
                self._heal(self._active)
            time.sleep(0.25)

    def _faults_over(self) -> bool:
        """Past the fault phase (``duration - settle``) with ``min_faults`` injected, or
        past its extension (``duration`` more seconds)."""
        plan, elapsed = self.plan, self._elapsed()
        end = plan.duration - plan.settle
        enough = len(self.faults) >= plan.min_faults
        return elapsed >= end and (enough or elapsed >= end + plan.duration)

    def _elapsed(self) -> float:
        return time.monotonic() - self._t0

    def _say(self, text: str) -> None:
        self.plan.say(f"{self._elapsed():7.2f}s  {text}")

    def _replenish(self) -> bool:
        """Routers back to their number, at least two standby storage processes and
        the supers back to two; False while that is under way."""
        live = self._routers()
        if len(live) < self.routers:
            if not self._router_view()[0]:
                return False
            fresh = self._join_router(sorted(live))
            self._say(f"{fresh} joins ({self.routers - len(live)} router(s) gone)")
            return False
        st = json.loads((self.d / "cluster.json").read_text())
        if len(st["supers"]) < 2:
            name = self._start_super()
            self._say(f"{name} starts (a super is gone)")
        s = _status(self.d)
        if len(s.get("standby", ())) < 2:
            self._add_storage()
        return True

    def _update_routers(self) -> None:
        """Record the live routers' addresses: new processes and clients connect there."""
        from rubberband.tools.cluster import router_address

        live = self._routers()
        st = json.loads((self.d / "cluster.json").read_text())
        st["routers"] = [router_address(p) for _, p in sorted(live.items())]
        (self.d / "cluster.json").write_text(json.dumps(st, indent=1))
        self.st = st

    def _add_storage(self) -> None:
        st = json.loads((self.d / "cluster.json").read_text())
        n = max(int(k.split(":")[1]) for k in st["storage"]) + 1
        if self.net is not None:
            local.StateDir(self.d, placement={f"storage{n}": self.net.add(f"storage{n}")})
        _cli("cluster", "add", "--storage", "1", "--state-dir", str(self.d))

    def _join_router(self, live: list[str]) -> str:
        self._fresh += 1
        fresh = f"j{self._fresh}"
        if self.net is not None:
            self.cluster.state.set_places({fresh: self.net.add(fresh)})
        join = self._recorded()[live[0]]
        host = join.get("host", "127.0.0.1")
        self.cluster.start(fresh, f"{host}:{join['ports']['listen']}")
        self._update_routers()
        return fresh

    def _start_super(self) -> str:
        from rubberband.tools.cluster import start_super

        self._supers += 1
        n = self._supers
        if self.net is not None:
            self.cluster.state.set_places({f"s{n}": self.net.add(f"s{n}")})
        common = ["--routers", ",".join(self.st["routers"]), "--state-dir", str(self.d)]
        name, address = start_super(self.cluster.state, n, common, True, 60.0)
        st = json.loads((self.d / "cluster.json").read_text())
        st["supers"][name] = address
        (self.d / "cluster.json").write_text(json.dumps(st, indent=1))
        return name

    def _forget_super(self, name: str) -> None:
        """A super that is gone (or will be voted out) is not asked any more."""
        st = json.loads((self.d / "cluster.json").read_text())
        st["supers"].pop(name, None)
        (self.d / "cluster.json").write_text(json.dumps(st, indent=1))

    def _victim(self) -> tuple[str, str, str]:
        """(role, process name as the cluster knows it, name in processes.json)."""
        role = self.rng.choice(ROLES)
        if role == "router" and not self._may_take_a_router():
            role = self.rng.choice([r for r in ROLES if r != "router"])
        if role == "router":
            live = sorted(self._members())
            leader = self._router_view()[1]
            r = leader if leader in live and self.rng.random() < 0.5 else self.rng.choice(live)
            return ("leader" if r == leader else "router"), r, r
        if role == "super":
            st = json.loads((self.d / "cluster.json").read_text())
            name = self.rng.choice(sorted(st["supers"]))
            return "super", name, name.split(":")[1]
        ring = [r["name"] for r in _status(self.d).get("ring", [])]
        name = self.rng.choice(ring)
        return "storage", name, name.replace(":", "")

    # ------------------------------------------------------------------ faults
    def _kill(self) -> dict[str, Any] | None:
        role, name, proc = self._victim()
        at = self._elapsed()
        try:
            os.kill(self._recorded()[proc]["pid"], signal.SIGKILL)
        except ProcessLookupError:
            return None  # it left on its own (voted out, expelled) since we looked
        detail: dict[str, Any] = {"target": name, "role": role, "at": at}
        if role in ("leader", "router"):
            live = sorted(n for n in self._routers() if n != proc)
            detail["replacement"] = self._join_router(live)
        elif role == "super":
            self._forget_super(name)
            detail["replacement"] = self._start_super()
        self._say(f"kill {role} {name}" + (f"; {detail['replacement']} replaces it"
                                           if "replacement" in detail else ""))  # fmt: skip
        return detail

    def _power_cut(self) -> dict[str, Any] | None:
        at = self._elapsed()
        victims = [p["pid"] for p in self._recorded().values()
                   if member(p) and local.running(p["pid"])]  # fmt: skip
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        while any(local.running(pid) for pid in victims):
            time.sleep(0.05)
        self._say(f"power cut: {len(victims)} processes SIGKILLed; restarting from the disks")
        up = _cli("cluster", "up", "--routers", "3", "--supers", "2", "--engine", self.plan.engine,
                  "--state-dir", str(self.d), timeout=300)  # fmt: skip
        # Held until the clients came back: each notices with its calls in flight
        # timing out (a write's acknowledgement after a resend: two answer timeouts),
        # then connects to the new routers.
        back = self._elapsed() + 2 * self.plan.answer_timeout + 3.0
        detail: dict[str, Any] = {"target": "cluster", "role": "every process", "at": at,
                                  "restart_s": round(self._elapsed() - at, 1),
                                  "heal_at": back}  # fmt: skip
        if up.returncode != 0:
            detail["error"] = f"the restart failed: {(up.stdout + up.stderr)[-600:]}"
            self._say(detail["error"])
        self.st = json.loads((self.d / "cluster.json").read_text())
        self.cluster = local.LocalCluster(self.d, args=self.st["router_args"])
        self.routers, self._supers = 3, len(self.st["supers"])
        return detail

    def _pause(self) -> dict[str, Any] | None:
        role, name, proc = self._victim()
        at = self._elapsed()
        pid = self._recorded()[proc]["pid"]
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            return None  # it left on its own (voted out, expelled) since we looked
        self.paused.append((name, pid))
        if role == "super":
            self._forget_super(name)
        self._say(f"pause {role} {name} for 6s")
        return {"target": name, "role": role, "pid": pid, "at": at, "heal_at": at + 6.0}

    def _partition(self) -> dict[str, Any] | None:
        if self.net is None:
            return None
        routers = sorted(self._routers())
        leader = self._router_view()[1] or routers[0]
        s = _status(self.d)
        ring = [r["name"].replace(":", "") for r in s.get("ring", [])]
        standby = [n.replace(":", "") for n in s.get("standby", ())]
        supers = [n.split(":")[1] for n in json.loads((self.d / "cluster.json").read_text())
                  ["supers"]]  # fmt: skip
        at = self._elapsed()
        hold = self.rng.uniform(2.0, 4.0)
        variant = self.rng.choice(["leader", "storage", "client", "split"])
        if variant == "leader":
            side_a = [leader]
            side_b = [r for r in routers if r != leader] + ring + standby + supers + self.clients
            what = f"leading router {leader} isolated"
        elif variant == "storage":
            side_a, side_b = [self.rng.choice(ring)], routers
            what = f"{side_a[0]} cut off from the routers"
        elif variant == "client":
            side_a = [self.rng.choice(self.clients)]
            side_b = routers + ring + standby + supers
            hold = min(hold, 3.5)
            what = f"client {side_a[0]} cut off"
        else:
            # A router minority with at most one storage process of the ring: a split
            # longer than the supers' suspicion votes out whoever is on the minority
            # side, and more than f - 1 holders of a range gone at once is data loss,
            # beyond what the product promises.
            minority = self.rng.choice(routers)
            others = standby + self.clients
            self.rng.shuffle(others)
            k = self.rng.randint(0, len(others) // 2)
            holder = [self.rng.choice(ring)] if ring and self.rng.random() < 0.5 else []
            side_a = [minority, *holder, *others[:k]]
            side_b = ([r for r in routers if r != minority] + others[k:] + supers
                      + [p for p in ring if p not in holder])  # fmt: skip
            what = f"split {'+'.join(side_a)} | the rest"
        self.net.cut(side_a, side_b)
        self._say(f"partition: {what} for {hold:.1f}s")
        return {"target": side_a[0], "variant": variant, "sides": [side_a, side_b],
                "at": at, "heal_at": at + hold}  # fmt: skip

    def _link_target(self) -> tuple[str, str]:
        if self.rng.random() < 0.5:
            return "router", self.rng.choice(sorted(self._routers()))
        ring = [r["name"].replace(":", "") for r in _status(self.d).get("ring", [])]
        return "storage", self.rng.choice(ring)

    def _stall(self) -> dict[str, Any] | None:
        if self.net is None:
            return None
        role, target = self._link_target()
        at, hold = self._elapsed(), self.rng.uniform(0.5, 0.9)
        self.net.stall(target)
        self._say(f"stall: {role} {target} sends nothing for {hold:.2f}s")
        return {"target": target, "role": role, "at": at, "heal_at": at + hold}

    def _slow(self) -> dict[str, Any] | None:
        if self.net is None:
            return None
        role, target = self._link_target()
        at, hold = self._elapsed(), self.rng.uniform(3.0, 5.0)
        self.net.slow(target, 1000)
        self._say(f"slow link: {role} {target} at 1 Mbit/s for {hold:.1f}s")
        return {"target": target, "role": role, "kbit": 1000, "at": at, "heal_at": at + hold}

    def _loss(self) -> dict[str, Any] | None:
        if self.net is None:
            return None
        role, target = self._link_target()
        at, hold, pct = self._elapsed(), self.rng.uniform(3.0, 5.0), self.rng.randint(5, 25)
        self.net.loss(target, pct)
        self._say(f"packet loss: {role} {target} {pct}% for {hold:.1f}s")
        return {"target": target, "role": role, "percent": pct, "at": at, "heal_at": at + hold}

    def _reconfigure(self) -> dict[str, Any] | None:
        from rubberband.tools.cluster import admin_request

        s = _status(self.d)
        # Ids are shown as Python literals; this cluster's are integers (cluster up).
        ring = sorted(
            ({**r, "id": ast.literal_eval(r["id"])} for r in s.get("ring", [])),
            key=lambda r: r["id"],
        )
        if any(type(r["id"]) is not int for r in ring):
            return None
        standby = sorted(s.get("standby", ()))
        ops = ["expand", "replace", "rebalance", "router"] + (
            ["contract", "drain"] if len(ring) > 4 else []
        )
        op = self.rng.choice(ops)
        at = self._elapsed()
        if op == "router":
            if self.routers == 3:
                self.routers = 4
                fresh = self._join_router(sorted(self._routers()))
                self._say(f"reconfigure: router {fresh} joins (4 routers)")
                return {"target": fresh, "op": "router-join", "at": at}
            self.routers = 3
            live = sorted(self._routers())
            victim = self.rng.choice(live)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._recorded()[victim]["pid"], signal.SIGTERM)
            self._say(f"reconfigure: router {victim} parts (3 routers)")
            return {"target": victim, "op": "router-part", "at": at}
        if op == "drain":
            # SIGTERM on an active storage process: it asks a super to contract it and
            # parts once its ranges have their new holders (the operator's way to stop
            # one); the run checks that nothing acknowledged went with it.
            victim = self.rng.choice(ring)["name"]
            key = victim.replace(":", "")
            pid = self._recorded().get(key, {}).get("pid")
            if pid is None or not local.running(pid):
                return None
            self._say(f"reconfigure: drain {victim} (SIGTERM)")
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 60
            while local.running(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            result = "done" if not local.running(pid) else "still up after 60 s"
            self._say(f"reconfigure: drain {victim} {result}")
            return {"target": victim, "op": "drain", "result": result, "at": at,
                    "end": round(self._elapsed(), 2)}  # fmt: skip
        ids = [r["id"] for r in ring]
        if op == "expand" and standby:
            i = self.rng.randrange(len(ids))
            lo, hi = ids[i], ids[(i + 1) % len(ids)] if i + 1 < len(ids) else 1_000_000
            args: list[Any] = [standby[0], self.rng.randint(lo + 1, max(lo + 1, hi - 1))]
        elif op == "replace" and standby:
            args = [self.rng.choice(ring)["name"], standby[0]]
        elif op == "contract":
            args = [self.rng.choice(ring)["name"]]
        elif op == "rebalance" and len(ids) > 2:
            i = self.rng.randrange(1, len(ids) - 1)
            if ids[i + 1] - ids[i - 1] < 3:
                return None
            args = [ring[i]["name"], self.rng.randint(ids[i - 1] + 1, ids[i + 1] - 1)]
        else:
            return None
        self._say(f"reconfigure: {op} {' '.join(map(str, args))}")
        code, body = admin_request(
            str(self.d), "/reconfigure", {"op": op, "args": args, "wait": True}, timeout=60
        )
        result = "done" if code == 200 else f"refused ({code}): {body.get('error')}"
        self._say(f"reconfigure: {op} {result}")
        return {"target": str(args[0]), "op": op, "args": args, "result": result, "at": at,
                "end": round(self._elapsed(), 2)}  # fmt: skip

    # ------------------------------------------------------------------ healing
    def _heal(self, fault: dict[str, Any]) -> None:
        if fault["kind"] == "pause":
            with contextlib.suppress(ProcessLookupError):
                os.kill(fault["pid"], signal.SIGCONT)
        elif fault["kind"] != "power-cut" and self.net is not None:
            self.net.heal()
        fault["end"] = round(self._elapsed(), 2)
        self._active = None
        self._say(f"heal {fault['kind']} of {fault['target']}")

    def heal(self) -> None:
        if self._active is not None:
            self._heal(self._active)
        # Resumed processes that were voted out or expelled learn it and stop.
        time.sleep(1.0)

    def resumed_alive(self) -> list[str]:
        """Paused processes that are not members any more yet still run.  A paused
        router that the group kept (the view change had not happened) may run on."""
        members = set()
        for p in self._routers().values():
            h = self._health(p)
            members |= set((h or {}).get("members", ()))
        s = _status(self.d)
        in_cluster = {r["name"] for r in s.get("ring", [])} | set(s.get("standby", ()))
        in_cluster |= set(json.loads((self.d / "cluster.json").read_text())["supers"])
        out = []
        for name, pid in self.paused:
            if not local.running(pid):
                continue
            if name in members or name in in_cluster:
                continue
            out.append(name)
        return out
