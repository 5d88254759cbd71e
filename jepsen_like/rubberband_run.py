"""The list-append and bank workloads on a real Rubberband cluster, with storage
processes failing.

``rubberband cluster up`` starts 3 routers, a super (automatic repair on) and 4 storage
processes, plus standby processes.  Clients (light SDK clients in this process) append to
and read small sets of keys: multi-key appends and multi-key sequential reads, each one
operation of the history.  The nemesis SIGKILLs or SIGSTOPs a storage process on the ring
once the ring is healthy; the super votes it out and replaces it with a standby on its
own (nobody at the admin API), a new standby is provisioned, and a paused process that
resumes after its replacement must stop.  After the faults every key is read once more,
and the Elle-style list-append checker judges the history: no cycle, no lost or
reordered acknowledged append.  Indeterminate and unavailable results count as unknown.

The bank workload moves money between 8 accounts of 100 with atomic two-key ``add``
writes (deltas summing to zero) and reads every account at all three isolation levels;
the bank checker requires every sequential and snapshot read to see the initial total
and every balance to be reachable, and reports torn basic reads apart (allowed).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KEYS = 12
STORAGE_KINDS = ("kill-storage", "pause-storage")


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rubberband.tools.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _status(d: Path) -> dict[str, Any]:
    out = _cli("cluster", "status", "--state-dir", str(d), "--json")
    if out.returncode != 0:
        return {}
    return dict(json.loads(out.stdout))


ACCOUNTS = [f"a{i}" for i in range(8)]
INITIAL_BALANCE = 100


@dataclass(frozen=True)
class Plan:
    workload: str
    """``list-append`` or ``bank``."""
    kinds: tuple[str, ...]
    seed: int
    duration: float
    settle: float
    say: Any


def run_rubberband(d: Path, plan: Plan) -> dict[str, Any]:
    """Bring a cluster up in ``d``, run ``plan`` against it, and take it down."""
    up = _cli("cluster", "up", "--routers", "3", "--supers", "1", "--storage", "4",
              "--state-dir", str(d / "cluster"))  # fmt: skip
    if up.returncode != 0:
        raise RuntimeError(f"cluster up failed: {up.stdout[-1500:]}{up.stderr[-1500:]}")
    try:
        added = _cli("cluster", "add", "--storage", "2", "--state-dir", str(d / "cluster"))
        if added.returncode != 0:
            raise RuntimeError(f"cluster add failed: {added.stderr[-1500:]}")
        return asyncio.run(_go(d / "cluster", plan))
    finally:
        _cli("cluster", "down", "--state-dir", str(d / "cluster"))


async def _go(d: Path, plan: Plan) -> dict[str, Any]:
    import rubberband.sdk as rbsdk

    workload, kinds, seed, say = plan.workload, plan.kinds, plan.seed, plan.say
    duration, settle = plan.duration, plan.settle

    st = json.loads((d / "cluster.json").read_text())
    history: list[dict[str, Any]] = []
    faults: list[dict[str, Any]] = []
    stop = asyncio.Event()
    rng = random.Random(seed)
    t0 = time.monotonic()

    def record(
        process: str, kind: str, value: Any, f: str = "txn", level: str | None = None
    ) -> None:
        r = {"process": process, "type": kind, "f": f, "value": value,
             "index": len(history), "time": time.monotonic() - t0}  # fmt: skip
        if level is not None:
            r["level"] = level
        history.append(r)

    async def bank_client(rb: Any, i: int, crng: random.Random) -> None:
        while not stop.is_set():
            if crng.random() < 0.6:
                a, b = crng.sample(ACCOUNTS, 2)
                value = {"from": a, "to": b, "amount": crng.randint(1, 10)}
                record(f"c{i}", "invoke", value, "transfer")
                try:
                    await rb.add_many({a: -value["amount"], b: value["amount"]})
                    record(f"c{i}", "ok", value, "transfer")
                except Exception:
                    record(f"c{i}", "info", value, "transfer")
            else:
                level = crng.choice(["sequential", "sequential", "snapshot", "basic"])
                record(f"c{i}", "invoke", None, "read", level)
                try:
                    got = await rb.get_many(ACCOUNTS, isolation=level)
                    record(f"c{i}", "ok", got, "read", level)
                except Exception:
                    record(f"c{i}", "info", None, "read", level)

    async def client(i: int) -> None:
        rb = await rbsdk.connect(
            st["routers"], f"client:j{i}", credentials=st["client_credentials"]
        )
        crng = random.Random(seed * 100 + i)
        if workload == "bank":
            await bank_client(rb, i, crng)
            await rb.close()
            return
        n = 0
        while not stop.is_set():
            n += 1
            keys = crng.sample(range(KEYS), 2)
            if crng.random() < 0.6:
                txn = [["append", f"k{k}", i * 1_000_000 + n] for k in keys]
                record(f"c{i}", "invoke", txn)
                try:
                    await rb.append_many({f"k{k}": i * 1_000_000 + n for k in keys})
                    record(f"c{i}", "ok", txn)
                except Exception:
                    record(f"c{i}", "info", txn)
            else:
                txn = [["r", f"k{k}", None] for k in keys]
                record(f"c{i}", "invoke", txn)
                try:
                    got = await rb.get_many([f"k{k}" for k in keys])
                    record(f"c{i}", "ok", [["r", f"k{k}", list(got.get(f"k{k}") or ())]
                                           for k in keys])  # fmt: skip
                except Exception:
                    record(f"c{i}", "info", txn)
        await rb.close()

    async def nemesis() -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(3)
        spare = 7
        while time.monotonic() - t0 < duration - settle and kinds:
            s = await loop.run_in_executor(None, _status, d)
            ring = s.get("ring", [])
            healthy = (
                ring
                and not s.get("pending")
                and all(
                    not r.get("suspected") and not r.get("incomplete") and not r.get("busy")
                    for r in ring
                )
            )
            if not healthy:
                await asyncio.sleep(0.5)
                continue
            victim = rng.choice([r["name"] for r in ring])
            kind = rng.choice(kinds)
            pid = json.loads((d / "processes.json").read_text())[victim.replace(":", "")]["pid"]
            at = time.monotonic() - t0
            if kind == "kill-storage":
                os.kill(pid, signal.SIGKILL)
                say(f"{at:7.2f}s  kill {victim}")
            else:
                os.kill(pid, signal.SIGSTOP)
                say(f"{at:7.2f}s  pause {victim} for 6s")
            faults.append({"kind": kind, "target": victim, "start": round(at, 2)})
            # The super votes it out (3 s) and replaces it; a standby takes the next one.
            await loop.run_in_executor(
                None, _cli, "cluster", "add", "--storage", "1", "--state-dir", str(d)
            )
            spare += 1
            if kind == "pause-storage":
                await asyncio.sleep(6)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
                say(f"{time.monotonic() - t0:7.2f}s  resume {victim}")
            await asyncio.sleep(rng.uniform(2, 4))
        await asyncio.sleep(max(0.0, duration - (time.monotonic() - t0)))
        stop.set()

    if workload == "bank":
        rb = await rbsdk.connect(
            st["routers"], "client:jsetup", credentials=st["client_credentials"]
        )
        await rb.put_many(dict.fromkeys(ACCOUNTS, INITIAL_BALANCE))
        await rb.close()
    workers = [asyncio.ensure_future(client(i)) for i in range(4)]
    await nemesis()
    await asyncio.gather(*workers, return_exceptions=True)
    # Settle: the ring healthy again, then every key read once more.
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        s = _status(d)
        if (
            s.get("ring")
            and not s.get("pending")
            and not any(r.get("suspected") or r.get("incomplete") for r in s["ring"])
        ):
            break
        await asyncio.sleep(0.5)
    rb = await rbsdk.connect(st["routers"], "client:jfinal", credentials=st["client_credentials"])
    if workload == "bank":
        record("final", "invoke", None, "read", "sequential")
        record("final", "ok", await rb.get_many(ACCOUNTS), "read", "sequential")
    else:
        for k in range(KEYS):
            record("final", "invoke", [["r", f"k{k}", None]])
            got = await rb.get(f"k{k}")
            record("final", "ok", [["r", f"k{k}", list(got or ())]])
    await rb.close()
    resumed_alive = []
    for f in faults:
        if f["kind"] == "pause-storage":
            pid = json.loads((d / "processes.json").read_text())[f["target"].replace(":", "")]
            with contextlib.suppress(ProcessLookupError, OSError):
                os.kill(pid["pid"], 0)
                if Path(f"/proc/{pid['pid']}").exists():
                    stat = Path(f"/proc/{pid['pid']}/stat").read_text().rsplit(")", 1)[1]
                    if stat.split()[0] != "Z":
                        resumed_alive.append(f["target"])
    return {"history": history, "faults": faults, "resumed_alive": resumed_alive,
            "ring": [r["name"] for r in _status(d).get("ring", [])]}  # fmt: skip
