"""``ecast demo``: the main job, a real E-Cast cluster on this machine doing real work.

Three router daemons (separate OS processes, ``ecast router``) order the operations of a
replicated bank.  Replicas (SDK clients, each with its own authenticated TCP connections)
submit transfers between accounts; every replica applies every delivered transfer in
``t`` order, and a transfer that would overdraw its source account is refused.  Whether a
transfer is refused depends on everything ordered before it, so the replicas agree only
if every one of them saw the same total order: the demo checks that they did.

On the way it kills the leading router with SIGKILL, measures how long stable
acknowledgements stopped, adds a replacement router that joins the running group, and
at the end verifies: identical state and order digests at every replica, money neither
created nor destroyed, and, by the multicast checkers (:mod:`ecast.history`) on the
history every replica recorded, one total order, no gaps or duplicates, and every
acknowledged transfer applied everywhere.  The history is kept as JSON lines in the
demo's directory.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import random
import struct
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ecast.history import Ack, Deliver, History, Submit, check_history, write_history
from ecast.runtime import tune_process
from ecast.tools.local import LocalCluster

ACCOUNTS = 64
OPENING = 1_000
_OP = struct.Struct(">HHI")


@dataclass
class Replica:
    """One application process: submits transfers, applies the delivered ones in order."""

    name: str
    client: Any = None
    balances: list[int] = field(default_factory=lambda: [OPENING] * ACCOUNTS)
    digest: Any = field(default_factory=hashlib.sha256)
    applied: int = 0
    refused: int = 0
    submitted: int = 0
    acked: dict[Any, int] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    task: asyncio.Task[None] | None = None
    events: list[Any] = field(default_factory=list)
    """What this replica submitted, delivered and had acknowledged (its history)."""

    def connected(self) -> None:
        ep = self.client.endpoint
        if ep is not None and ep._join_id is not None:
            self.events.append(Submit(ep._join_id, time.time()))

    async def apply_deliveries(self) -> None:
        async for d in self.client.deliveries():
            m = d.message
            self.events.append(Deliver(d.t, m.id, time.time(), m.sender, m.header))
            if type(m.payload) is not bytes or len(m.payload) != _OP.size:
                continue  # join, part: membership, not money
            src, dst, amount = _OP.unpack(m.payload)
            if self.balances[src] >= amount:
                self.balances[src] -= amount
                self.balances[dst] += amount
            else:
                self.refused += 1
            self.digest.update(m.payload)
            self.digest.update(repr(m.id).encode())
            self.applied += 1

    def submit_transfer(self, rng: random.Random) -> None:
        src, dst = rng.sample(range(ACCOUNTS), 2)
        payload = _OP.pack(src, dst, rng.randint(1, 400))
        sent = time.monotonic()
        ep = self.client.endpoint
        sid = (ep.session, ep.next_seq)  # the id submit_nowait gives it
        fut = self.client.submit_nowait(payload)
        self.events.append(Submit(sid, time.time()))
        self.submitted += 1

        def done(f: asyncio.Future[Any]) -> None:
            if not f.cancelled() and f.exception() is None:
                ack = f.result()
                self.acked[ack.id] = ack.t
                self.latencies.append(time.monotonic() - sent)
                self.events.append(Ack(ack.id, ack.t, ack.delivered, time.time()))

        fut.add_done_callback(done)


def _p50(values: list[float]) -> float:
    if not values:
        return float("nan")
    return sorted(values)[len(values) // 2] * 1000


async def run_demo(args: argparse.Namespace) -> int:
    import ecast

    workdir = Path(tempfile.mkdtemp(prefix="ecast-demo-"))
    say = print
    say(
        f"E-Cast demo: {args.routers} router daemons, {args.replicas} replicas, "
        f"{args.rate} transfers/s for {args.duration:g}s (logs in {workdir})"
    )
    cluster = LocalCluster(workdir, args=["--log-level", "info"])  # a CA, a credential each
    ok = True
    try:
        t0 = time.monotonic()
        cluster.start_group(args.routers)
        say(
            f"  routers up in {time.monotonic() - t0:.1f}s: "
            + ", ".join(f"{r.id}@{r.address}" for r in cluster.routers.values())
        )
        replicas = [Replica(f"replica-{i + 1}") for i in range(args.replicas)]
        for rep in replicas:
            rep.client = await ecast.connect(
                cluster.addresses(), name=rep.name, **cluster.client_auth(rep.name)
            )
            rep.connected()
            rep.task = asyncio.create_task(rep.apply_deliveries())
        say(f"  {len(replicas)} replicas joined; leader is {replicas[0].client.leader}")
        ok = await _drive(args, cluster, replicas, say) and ok
        ok = _verify(replicas, say) and ok
        ok = _check_history(replicas, workdir / "history.jsonl", say) and ok
        for rep in replicas:
            await rep.client.close()
    finally:
        cluster.stop_all()
    say("VERDICT: " + ("all checks passed" if ok else "FAILED"))
    return 0 if ok else 1


async def _drive(
    args: argparse.Namespace, cluster: LocalCluster, replicas: list[Replica], say: Any
) -> bool:
    rng = random.Random(args.seed)
    start = time.monotonic()
    kill_at = args.duration * 0.35 if args.faults else None
    join_at = args.duration * 0.6 if args.faults else None
    killed: str | None = None
    killed_at = 0.0
    acked_before_kill = 0
    resumed_after: float | None = None
    next_report = 1.0
    last_acked = 0
    per_replica = args.rate / len(replicas)
    budget = 0.0
    last = start
    ok = True
    while (now := time.monotonic()) - start < args.duration:
        elapsed = now - start
        budget += (now - last) * per_replica
        last = now
        whole = int(budget)
        budget -= whole
        for rep in replicas:
            for _ in range(whole):
                rep.submit_transfer(rng)
        acked = sum(len(r.acked) for r in replicas)
        if kill_at is not None and killed is None and elapsed >= kill_at:
            killed = replicas[0].client.leader or cluster.leader()
            if killed is not None:
                cluster.kill(killed)
                killed_at, acked_before_kill = now, acked
                say(f"  t={elapsed:5.1f}s  SIGKILL the leading router {killed}")
        if killed is not None and resumed_after is None and acked > acked_before_kill:
            resumed_after = now - killed_at
            say(
                f"  t={elapsed:5.1f}s  acknowledgements resumed {resumed_after:.2f}s after the "
                f"kill; new leader {replicas[0].client.leader}"
            )
        if join_at is not None and elapsed >= join_at:
            join_at = None
            rid = f"r{len(cluster.routers) + 1}"
            cluster.start(rid, cluster.addresses()[0])
            say(f"  t={elapsed:5.1f}s  a replacement router {rid} joins the running group")
        if elapsed >= next_report:
            next_report += 1.0
            lat = [x for r in replicas for x in r.latencies[-500:]]
            say(
                f"  t={elapsed:5.1f}s  leader={replicas[0].client.leader}  "
                f"submitted={sum(r.submitted for r in replicas):6d}  "
                f"stable={acked:6d} ({acked - last_acked:5d}/s)  "
                f"applied={'/'.join(str(r.applied) for r in replicas)}  "
                f"p50={_p50(lat):5.1f}ms"
            )
            last_acked = acked
        await asyncio.sleep(0.005)
    say("  submitting stopped; waiting for the last acknowledgements")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if all(len(r.acked) == r.submitted for r in replicas):
            break
        await asyncio.sleep(0.05)
    want = max(r.applied for r in replicas)
    while time.monotonic() < deadline and any(r.applied < want for r in replicas):
        await asyncio.sleep(0.05)
    missing = sum(r.submitted - len(r.acked) for r in replicas)
    if missing:
        say(f"  FAIL: {missing} transfers never acknowledged")
        ok = False
    if killed is not None:
        if resumed_after is None:
            say("  FAIL: acknowledgements never resumed after the leader was killed")
            ok = False
        else:
            say(
                f"  leader failover: acknowledgements stopped for {resumed_after:.2f}s "
                "(failure timeout 1s)"
            )
    return ok


def _verify(replicas: list[Replica], say: Any) -> bool:
    ok = True
    digests = {r.digest.hexdigest() for r in replicas}
    total = sum(r.applied for r in replicas[:1])
    refused = replicas[0].refused
    say(f"  every replica applied {total} transfers ({refused} refused for lack of funds)")
    if len(digests) != 1 or len({r.applied for r in replicas}) != 1:
        say(
            "  FAIL: replicas disagree: "
            + ", ".join(f"{r.name}={r.applied}/{r.digest.hexdigest()[:12]}" for r in replicas)
        )
        ok = False
    else:
        say(f"  same order everywhere: digest {digests.pop()[:16]} at all {len(replicas)} replicas")
    if any(r.balances != replicas[0].balances for r in replicas):
        say("  FAIL: balances differ between replicas")
        ok = False
    conserved = True
    for r in replicas:
        if sum(r.balances) != ACCOUNTS * OPENING:
            say(f"  FAIL: {r.name} created or destroyed money: {sum(r.balances)}")
            conserved = False
    if conserved:
        say("  money conserved at every replica")
    return ok and conserved


def _check_history(replicas: list[Replica], path: Path, say: Any) -> bool:
    """The multicast checkers on what the replicas recorded (safety; times not compared
    across replicas, which note an event after their endpoint saw it)."""
    from ecast.core.config import BroadcastConfig

    history = History()
    for r in replicas:
        history.log(r.name).extend(r.events)
    write_history(history, path)
    verdict = check_history(history, BroadcastConfig.initial(), liveness=False, time_tolerance=None)
    acked = sum(len(r.acked) for r in replicas)
    if verdict.ok:
        say(
            f"  multicast checkers passed ({len(verdict.ran)} checks on {len(history)} events: "
            f"one total order, every one of the {acked} acknowledged transfers applied at "
            f"every replica); history in {path}"
        )
        return True
    for line in verdict.messages():
        say(f"  FAIL: {line}")
    say(f"  history in {path}")
    return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ecast demo", description=__doc__.split("\n")[0])
    ap.add_argument("--routers", type=int, default=3)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--rate", type=int, default=2000, help="transfers per second, in total")
    ap.add_argument("--duration", type=float, default=15.0, help="seconds of load")
    ap.add_argument(
        "--no-faults",
        dest="faults",
        action="store_false",
        help="do not kill the leader or add a router",
    )
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    tune_process()
    return asyncio.run(run_demo(args))


if __name__ == "__main__":
    sys.exit(main())
