"""Many Rubberband clients in one OS process: ``python -m rubberband.bench.load``.

Each logical client is a full ``rubberband.connect`` client (its own E-Cast connection,
session and identity).  Writes keep ``--window`` messages in flight per client through
the SDK's batch submission (acknowledgements arrive in batches; no future per write);
reads keep ``--window`` reads in flight per client through
:meth:`RubberbandClient.read_batch`.  Closed loop by default; ``--rate`` makes it an open
loop at that many operations per second for the whole process.

The process prints ``{"event": "ready"}`` once every client is connected, then waits for
one line on stdin: the wall-clock time at which every load process starts measuring
(after ``--warmup``), so that several of them measure the same window.  Its last line is
one JSON object: operations completed in the window per client and in all, a latency
histogram, refusals and retries of snapshot and basic reads, errors, and with
``--trace`` the completions per 10 ms of wall-clock time (failover and elasticity
traces).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import random
import sys
import time
from collections.abc import Callable
from typing import Any

BUCKET_S = 0.0001
"""Latency histogram buckets of 0.1 ms, as ``ecast bench`` counts them."""
TRACE_S = 0.01
OPS = {
    "null": "storage_adapters.null:NullOps",
    "kv": "storage_adapters.memory:KVOps",
    "scan-kv": "storage_adapters.scan.kv:ScanKVOps",
    "scan-memory": "storage_adapters.scan.kv:ScanKVOps",
    "scan-log": "storage_adapters.scan.kv:ScanKVOps",
}


def value_text(size: int) -> str:
    """A value of ``size`` bytes that every engine stores (text)."""
    return os.urandom(size // 2 + 1).hex()[:size]


COUNTS = (
    "refused",
    "retries",
    "errors",
    "timeouts",
    "undelivered",
    "reads_sent",
    "snapshot_reads_sent",
    "read_messages",
    "writes_sent",
    "write_messages",
)
"""What a load process counts and reports; ``reads_sent`` and ``read_messages`` are the
reads sent and the messages that carried them (bundles), over the whole run, and the
same for writes; ``snapshot_reads_sent`` the snapshot reads among them (a mix's share)."""


class Stats:
    """What every client of this process counts, together."""

    def __init__(self, warm: float, end: float) -> None:
        self.warm, self.end = warm, end
        self.hist: dict[int, int] = {}
        self.trace: dict[int, int] = {}
        self.counts = dict.fromkeys(COUNTS, 0)
        self.trace_on = False

    def done(
        self, client: Client, t0: float, now: float, wall: float | None = None, n: int = 1
    ) -> None:
        """``n`` operations completed together (a bundle's writes); ``wall``, the wall
        clock for the trace, is read here when not given (and only when tracing: a read's
        completion is counted a hundred thousand times a second)."""
        if self.warm <= now <= self.end:
            client.in_window += n
            b = int((now - t0) / BUCKET_S)
            self.hist[b] = self.hist.get(b, 0) + n
        if self.trace_on:
            k = int((time.time() if wall is None else wall) / TRACE_S)
            self.trace[k] = self.trace.get(k, 0) + n


class Client:
    """One logical client: its connection and what it has in flight."""

    def __init__(self, rb: Any, args: argparse.Namespace, stats: Stats, seed: int) -> None:
        from rubberband.client import BUNDLE_BYTES, BUNDLE_LIMIT

        self.rb = rb
        self.args = args
        self.stats = stats
        self.rng = random.Random(seed)
        space = args.key_space
        self.key: Callable[[], int] = (
            functools.partial(self.rng.getrandbits, space.bit_length() - 1)
            if space & (space - 1) == 0  # a power of two (the default): 7 times cheaper
            else functools.partial(self.rng.randrange, space)
        )
        """A uniformly random key of the key space: the load generator's own cost is
        not Rubberband's, and it shares the same two cores."""
        self.ekey = rb.placement.ekey
        # The null engine carries bytes; the key-value engines store values as their
        # engines do (the scan engine's columns hold text).
        self.blob: Any = (
            os.urandom(args.payload) if args.ops == "null" else value_text(args.payload)
        )
        self.bundle = BUNDLE_LIMIT if args.bundle is None else args.bundle
        self.refill_at = max(1, args.window // 8 if args.refill_at is None else args.refill_at)
        """Free places in the window that make the read loop send more: a few at a time
        would make every message carry a read or two, whatever ``--bundle`` allows."""
        self.write_bundle = args.write_bundle
        self.bundle_bytes = BUNDLE_BYTES
        self.in_window = 0
        self.written = 0
        self.in_flight = 0
        self.sent_at: dict[int, float] = {}
        self.carries: dict[int, int] = {}
        """Writes a message carries, where more than one (a bundle)."""
        self.read_at: dict[int, float] = {}
        self.open = True
        self.want = asyncio.Event()
        self.redo: dict[str, list[tuple[Any, float]]] = {}
        """Refused reads to read again, by level, with when each was first sent."""
        self.session = rb.ecast.endpoint.session if rb.ecast.endpoint is not None else None
        rb.ecast.ack_listener = self.on_acks

    def op(self, kind: str) -> Any:
        k = self.key()
        if self.args.ops != "null":  # the key-value engines' own operations
            if kind != "write":
                return ("get", (k,))
            # A value of its own per write: engines that compress repeated values (the
            # scan engine's dictionaries) must not store and move one value for all.
            self.written += 1
            return ("put", ((k, f"{self.written:08x}{self.blob[8:]}"),))
        e = self.ekey(k)
        if kind != "write":
            return ("point", e)  # the null engine's read of one key (``NullOps``)
        return ("set", e, self.blob)  # the null engine's write of one key (``NullOps``)

    def read_ops(self, n: int) -> list[Any]:
        """``n`` reads of one key each, in one loop: the null engine's reads are made a
        hundred thousand times a second, and a call per read was a tenth of a load
        process's time (py-spy) that the cluster under test did not get.  The null
        engine's point reads (``NullOps``), which carry their key once."""
        if self.args.ops != "null":
            return [self.op("read") for _ in range(n)]
        key, ekey = self.key, self.ekey
        return [("point", ekey(key())) for _ in range(n)]

    # ------------------------------------------------------------------ writes
    def submit_writes(self, n: int) -> None:
        core = self.rb.core
        ops = [self.op("write") for _ in range(n)]
        if self.write_bundle > 1:  # as RubberbandClient.write_batch sends them
            messages = core.writes_of(ops, self.write_bundle, self.bundle_bytes)
            ids = self.rb.ecast.submit_batch([(p, h) for _, p, h in messages])
            for sid, (indices, _, _) in zip(ids, messages, strict=True):
                if len(indices) > 1:
                    self.carries[sid[1]] = len(indices)
        else:
            ids = self.rb.ecast.submit_batch([core.write_message(op) for op in ops])
        now = time.perf_counter()
        for sid in ids:
            self.sent_at[sid[1]] = now
        self.in_flight += n
        self.stats.counts["writes_sent"] += n
        self.stats.counts["write_messages"] += len(ids)

    def on_acks(self, batch: list[Any]) -> None:
        now = time.perf_counter()
        wall = time.time()
        stats = self.stats
        for ack in batch:
            if ack.id[0] != self.session:
                continue
            t0 = self.sent_at.pop(ack.id[1], None)
            if t0 is None:
                continue
            n = self.carries.pop(ack.id[1], 1)
            self.in_flight -= n
            if not ack.delivered:
                stats.counts["undelivered"] += n
                continue
            stats.done(self, t0, now, wall, n)
        if self.open and not self.args.rate and self.args.mode == "write":
            room = self.args.window - self.in_flight
            # Writes alone go as soon as there is room; bundles wait for a refill's worth
            # (a few writes at a time would make every bundle one or two writes).
            need = self.refill_at if self.write_bundle > 1 else 1
            if room >= need or (room > 0 and not self.in_flight):
                self.submit_writes(room)

    # ------------------------------------------------------------------ reads
    def levels(self, n: int) -> dict[str, int]:
        """How many of ``n`` new reads go at each level: in a mix, each read draws its
        level (snapshot with ``--snapshot-share``); the reads themselves are all alike."""
        mode = self.args.mode
        if mode != "mix":
            return {str(mode): n}
        rnd, share = self.rng.random, self.args.snapshot_share
        if 0.0 < share < 1.0:
            snapshot = sum(1 for _ in range(n) if rnd() < share)
        else:  # all or none: what every draw would give (random() < 1), without drawing
            snapshot = n if share >= 1.0 else 0
        return {"snapshot": snapshot, "sequential": n - snapshot}

    async def read_loop(self) -> None:
        """Keep up to ``--window`` reads in flight: refill once ``--refill-at`` places are
        free (or none is in flight).

        Each read draws its level; a level's reads are sent once ``--refill-at`` of them
        are drawn (or nothing is in flight), as a client that batches its reads by level
        would.  Sending every refill at once split it in two for a mix, so each level's
        bundles carried half as many reads (spread over the same responders), and a
        half-and-half mix ran slower than either level alone."""
        held: dict[str, list[Any]] = {}
        """Reads drawn and not sent yet, by level (they count against the window)."""
        while self.open:
            # Cleared before submitting: reads that complete while a submission waits
            # for the connection set it again (cleared after, their signal was lost and
            # the client stopped reading).
            self.want.clear()
            redo, self.redo = self.redo, {}
            for level, items in redo.items():  # first, as one batch per level
                await self.submit_reads([op for op, _ in items], level, [t for _, t in items])
            room = self.args.window - self.in_flight - sum(map(len, held.values()))
            if room >= self.refill_at or (room > 0 and not self.in_flight):
                for level, n in self.levels(room).items():
                    if n:
                        held.setdefault(level, []).extend(self.read_ops(n))
            for level in list(held):
                if len(held[level]) >= self.refill_at or not self.in_flight:
                    await self.submit_reads(held.pop(level), level)
            await self.want.wait()

    async def submit_reads(
        self, ops: list[Any], level: str, starts: list[float] | None = None
    ) -> None:
        """``starts``: when each read was first sent (a retry's latency counts from
        there); now, for new reads."""
        now0 = time.perf_counter()
        first = {} if starts is None else {id(op): t for op, t in zip(ops, starts, strict=True)}
        self.in_flight += len(ops)

        def done(told: list[tuple[Any, Any]]) -> None:
            """Reads finished together (``read_batch(grouped=True)``): one clock reading,
            and new reads, which share their start, counted in one step."""
            now = time.perf_counter()
            stats, counts = self.stats, self.stats.counts
            ok = 0
            for op, gather in told:
                if gather is None:
                    counts["timeouts"] += 1
                elif gather.refused:
                    counts["refused"] += 1
                    if self.open:
                        # Read again with the next refill, batched with the other
                        # refusals (a task per refused read cost more than the reads).
                        counts["retries"] += 1
                        self.in_flight -= 1
                        self.redo.setdefault(level, []).append((op, first.get(id(op), now0)))
                        self.want.set()
                        continue
                elif gather.error is not None:
                    counts["errors"] += 1
                elif first:
                    stats.done(self, first.get(id(op), now0), now)
                else:
                    ok += 1
                self.in_flight -= 1
            if ok:
                stats.done(self, now0, now, n=ok)
            # Wake the read loop only when it would send (see ``read_loop``).
            if not self.in_flight or self.args.window - self.in_flight >= self.refill_at:
                self.want.set()

        try:
            sent = await self.rb.read_batch(
                ops,
                level,
                done,
                timeout=self.args.answer_timeout,
                bundle=self.bundle,
                grouped=True,
            )
            self.stats.counts["read_messages"] += sent
            self.stats.counts["reads_sent"] += len(ops)
            if level == "snapshot":
                self.stats.counts["snapshot_reads_sent"] += len(ops)
        except Exception:
            self.stats.counts["errors"] += len(ops)
            self.in_flight -= len(ops)
            await asyncio.sleep(0.05)
            self.want.set()


async def _connect_all(args: argparse.Namespace, rt: Any) -> list[Any]:
    """Every client of this process, 32 at a time (the routers admit them)."""
    import rubberband

    async def connect(i: int) -> Any:
        return await rubberband.connect(
            args.routers.split(","),
            f"client:{args.name}-{i}",
            ops=OPS[args.ops],
            answer_timeout=args.answer_timeout,
            connect_timeout=60.0,
            runtime=rt,
        )

    rbs: list[Any] = []
    for lo in range(0, args.clients, 32):
        rbs += await asyncio.gather(
            *(connect(i) for i in range(lo + 1, min(lo + 33, args.clients + 1)))
        )
    return rbs


async def _watch_stdin(stopped: asyncio.Event) -> None:
    """A line ``stop`` ends the run early (a trace that lasts as long as its steps)."""
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line or line.strip() == "stop":
            if line:
                stopped.set()
            return


async def _open_loop(
    args: argparse.Namespace, clients: list[Client], going: Callable[[], bool]
) -> None:
    """``--rate`` writes a second, spread over the clients; at most ``--window`` in flight
    per client: an overloaded cluster is offered less, not queued without bound (the
    report shows it)."""
    submitted = 0
    t_start = time.perf_counter()
    i = 0
    while going():
        due = int((time.perf_counter() - t_start) * args.rate) - submitted
        if due > 0:
            per = max(1, due // len(clients))
            tried = 0
            while due > 0 and tried < len(clients):
                c = clients[i % len(clients)]
                i += 1
                n = min(per, due, args.window - c.in_flight)
                tried = tried + 1 if n <= 0 else 0
                if n <= 0:
                    continue
                c.submit_writes(n)
                due -= n
                submitted += n
        await asyncio.sleep(0.001)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    import ecast

    auth = {"credentials": args.credentials} if args.credentials else {"secret": args.secret}
    # One runtime for all the clients of this process: one connection to each router.
    rt = ecast.Runtime(ecast.load_auth(**auth), host_id=f"{args.name}-{os.getpid()}")
    await rt.serve("127.0.0.1:0")
    rbs = await _connect_all(args, rt)
    print(json.dumps({"event": "ready"}), flush=True)
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    start_wall = float(line.strip() or time.time())
    # perf_counter for latency; the shared start is wall-clock time.
    start = time.perf_counter() + (start_wall - time.time())
    stats = Stats(start + args.warmup, start + args.warmup + args.duration)
    stats.trace_on = args.trace
    while time.perf_counter() < start:
        await asyncio.sleep(0.01)
    clients = [Client(rb, args, stats, seed=hash((args.name, i))) for i, rb in enumerate(rbs)]
    loops = []
    if args.mode == "write" and not args.rate:
        for c in clients:
            c.submit_writes(args.window)
    elif args.mode != "write":
        loops = [asyncio.ensure_future(c.read_loop()) for c in clients]
    stopped = asyncio.Event()
    watcher = asyncio.ensure_future(_watch_stdin(stopped))

    def going() -> bool:
        return time.perf_counter() < stats.end and not stopped.is_set()

    if args.rate:
        await _open_loop(args, clients, going)
    else:
        while going():
            await asyncio.sleep(0.05)
    if stopped.is_set():
        stats.end = time.perf_counter()
        args.duration = max(1e-9, stats.end - stats.warm)
    watcher.cancel()
    for c in clients:
        c.open = False
        c.want.set()
    for loop in loops:
        loop.cancel()
    out = {
        "role": "load",
        "name": args.name,
        "mode": args.mode,
        "clients": args.clients,
        "per_client": [c.in_window for c in clients],
        "ops_in_window": sum(c.in_window for c in clients),
        "measure_s": args.duration,
        "latency_hist": sorted(stats.hist.items()),
        "trace": sorted(stats.trace.items()),
        **stats.counts,
    }
    for rb in rbs:  # leaving: a client that does not close in time is left to its lease
        with contextlib.suppress(Exception):
            await asyncio.wait_for(rb.close(), 5.0)
    with contextlib.suppress(Exception):
        await rt.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser("python -m rubberband.bench.load", description=__doc__)
    ap.add_argument("--routers", required=True)
    ap.add_argument("--credentials")
    ap.add_argument("--secret")
    ap.add_argument("--name", default="load1")
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument(
        "--mode", choices=("write", "sequential", "snapshot", "basic", "mix"), default="write"
    )
    ap.add_argument("--ops", choices=sorted(OPS), default="null", help="the engine's operations")
    ap.add_argument("--snapshot-share", type=float, default=0.5, help="mix: snapshot reads")
    ap.add_argument("--window", type=int, default=1024, help="in flight per client")
    ap.add_argument("--payload", type=int, default=256)
    ap.add_argument("--key-space", type=int, default=1 << 30)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--rate", type=float, default=0.0, help="open loop, ops/s in all")
    ap.add_argument("--answer-timeout", type=float, default=5.0)
    ap.add_argument(
        "--refill-at",
        type=int,
        default=None,
        help="reads and write bundles: send more once this many places of the window are "
        "free (default: an eighth of the window)",
    )
    ap.add_argument(
        "--write-bundle",
        type=int,
        default=1,
        help="writes of one segment sent as one message, at most this many (write_batch's "
        "bundles; default 1: each alone)",
    )
    ap.add_argument(
        "--bundle",
        type=int,
        default=None,
        help="sequential and snapshot reads for one responder sent as one message, at most "
        "this many (default: the SDK's, 32; 1: each alone)",
    )
    ap.add_argument("--trace", action="store_true")
    ap.add_argument("--out", default="", help="write the result here, print its path")
    args = ap.parse_args(argv)
    from ecast import tune_process

    tune_process()  # uvloop, and a collector that runs rarely
    result = json.dumps(asyncio.run(run(args)))
    if args.out:  # a trace can be larger than a pipe holds while the parent is busy
        with open(args.out, "w") as f:
            f.write(result)
        print(json.dumps({"result": args.out}), flush=True)
    else:
        print(result, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
