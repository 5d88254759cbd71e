"""``rubberband cost``: microseconds the routers spend in Rubberband's config per message,
and a storage process per write with and without its change log, and per new key.

``destset`` runs on the leading router once per message, on the hot path, so its cost
caps the cluster's throughput as surely as the network does.  This times it for the
shapes of message that matter (point writes and reads, multi-key writes, range reads over
a whole cluster) on a keyspace of ``--storage`` processes, beside E-Cast's
``KeyRingConfig`` routing the same number of point messages (the baseline every run
carries, since this machine varies by 10-15 % from run to run).  Headers are decoded off
the wire first, as a router sees them.  Budgets: 3 us for a point write, 15 us for a
4-range read over 16 processes.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable
from typing import Any

import msgpack

from ecast import KeyRingConfig, Message
from rubberband.config import RubberbandConfig
from rubberband.keys import encode_key, key_range, normalize, point
from rubberband.optimizer import optimize
from rubberband.proto import keyspace_header, read_header, write_header

BUDGET_US = {"write 1 key": 3.0, "read 4 ranges": 15.0}


def build(storage: int, f: int) -> RubberbandConfig:
    """A settled cluster: one super, ``storage`` processes expanded at ids 0, 1000, ..."""
    c = RubberbandConfig.initial(replication=f)
    n = 0

    def send(sender: str, header: Any) -> None:
        nonlocal c, n
        n += 1
        c = c.apply(Message(sender, (("cost", 0, sender), n), header, None))

    send("super:s", {"kind": "join"})
    for i in range(storage):
        send(f"storage:{i}", {"kind": "join"})
    for i in range(storage):
        ek = encode_key(i * 1000)
        new = c.keyspace.expand(ek, f"storage:{i}")
        plan = optimize(c.keyspace, new, max_solutions=64)
        send("super:s", keyspace_header(c.version, ("expand", f"storage:{i}", ek), plan.to_wire()))
    for v in sorted(c.pending):
        for p in sorted(c.pending[v].waiting):
            send(p, {"kind": "ready", "v": v})
    return c


def wire(header: Any) -> Any:
    """The header as a router decodes it (tuples, not lists)."""
    return msgpack.unpackb(msgpack.packb(header), use_list=False)


def workloads(storage: int, rng: random.Random) -> dict[str, list[Any]]:
    span = storage * 1000
    out: dict[str, list[Any]] = {
        "write 1 key": [],
        "read 1 key": [],
        "write 10 keys": [],
        "read 4 ranges": [],
        "read everything": [],
    }
    for i in range(1000):
        k = rng.randrange(span)
        out["write 1 key"].append(wire(write_header((point(k),))))
        out["read 1 key"].append(wire(read_header((point(k),), i)))
        keys = normalize(point(rng.randrange(span)) for _ in range(10))
        out["write 10 keys"].append(wire(write_header(keys)))
        starts = sorted(rng.sample(range(0, span, 10), 4))
        ranges = normalize(key_range(s, s + rng.randrange(1, span // 8)) for s in starts)
        out["read 4 ranges"].append(wire(read_header(ranges, i)))
        out["read everything"].append(wire(read_header((key_range(),), i)))
    return out


def per_call(fn: Callable[[Message], Any], msgs: list[Message], repeat: int) -> float:
    """Best of ``repeat`` passes, microseconds per call."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for m in msgs:
            fn(m)
        best = min(best, (time.perf_counter() - t0) / len(msgs))
    return best * 1e6


def measure(storage: int, f: int, repeat: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    c = build(storage, f)
    rows: dict[str, float] = {}
    for name, headers in workloads(storage, rng).items():
        msgs = [Message("client:c", (("c", 0, ""), i), h, b"") for i, h in enumerate(headers)]
        assert all(c.destset(m) for m in msgs), name
        rows[name] = per_call(c.destset, msgs, repeat)
    ring = KeyRingConfig(f)
    for i in range(storage):
        ring = ring.apply(
            Message(f"r{i}", (("j", 0, ""), i), {"kind": "join", "role": "receiver"}, None)
        )
    ring = ring.apply(Message("c", (("j", 0, ""), 99), {"kind": "join"}, None))
    base = [
        Message("c", (("c", 0, ""), i), {"key": rng.randrange(10**6)}, b"") for i in range(1000)
    ]
    rows["baseline KeyRingConfig point"] = per_call(ring.destset, base, repeat)
    return {"storage": storage, "replication": f, "us_per_destset": rows, "budget_us": BUDGET_US}


def storage_cost(repeat: int, writes: int = 20_000, held: int = 100_000) -> dict[str, float]:
    """Microseconds a storage core spends per delivered single-key put (the memory
    engine, batches of 100 as a busy process gets them): puts to 5,000 keys it holds,
    with its change log kept and without (what change feeds cost every write), and
    puts of new keys into a map of ``held`` (the benchmarks' load, keys drawn from
    2**30: a new key's place in the map and its revision, in maps bigger than the
    caches, cost about 40 % more than an overwrite).  Best of ``repeat`` fresh cores."""
    rng = random.Random(1)
    fresh = [rng.getrandbits(30) for _ in range(held + writes)]
    held_keys = [i % 5000 for i in range(writes)]
    out: dict[str, float] = {}
    runs = (
        ("put, change log kept", 100_000, held_keys, []),
        ("put, no change log", 0, held_keys, []),
        (f"put of a new key, {held:,} held", 100_000, fresh[held:], fresh[:held]),
    )
    for name, kept, keys, before in runs:
        timed, filling = _put_batches(keys, len(before)), _put_batches(before, 0)
        best = float("inf")
        for _ in range(repeat):
            core = _storage_core(kept)
            for batch in filling:
                core.deliver(batch)
            t0 = time.perf_counter()
            for batch in timed:
                core.deliver(batch)
            best = min(best, (time.perf_counter() - t0) / len(keys))
            applied = len(keys) + len(before)
            assert core.stats.applied == applied and not core.stopped, core.status()
        out[name] = best * 1e6
    return out


def _put_batches(keys: list[int], first: int) -> list[list[tuple[int, Message]]]:
    """Deliveries of a put of each of ``keys`` in batches of 100, positions from
    ``first + 1``."""
    batches = []
    for j in range(0, len(keys), 100):
        batch = []
        for i in range(j, min(j + 100, len(keys))):
            k, t = keys[i], first + i + 1
            header, op = write_header((point(k),)), ("put", ((k, "v" * 64),))
            batch.append((t, Message("client:c", (("c", 0, ""), t), header, op)))
        batches.append(batch)
    return batches


def _storage_core(kept: int) -> Any:
    """A fresh storage core on the memory engine, holding every key, its change log
    keeping ``kept`` changes."""
    from rubberband.changelog import ChangeLog
    from rubberband.keys import EVERYTHING
    from rubberband.sdk import load_ops
    from rubberband.storage import StorageCore

    engine = load_ops("storage_adapters.memory:MemoryEngine")
    core = StorageCore("storage:1", engine, changes=ChangeLog(max_changes=kept))
    core.joined({"rubberband": [1, "range", 0, [], [], [], [], [], [], [], []]})
    core.owned = EVERYTHING
    return core


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rubberband cost", description=__doc__.split("\n\n")[0])
    ap.add_argument("--storage", type=int, default=16, help="storage processes (default 16)")
    ap.add_argument("--replication", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=7, help="passes; the best counts")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="end with one JSON line")
    args = ap.parse_args(argv)
    result = measure(args.storage, args.replication, args.repeat, args.seed)
    print(f"destset cost, {args.storage} storage processes, replication {args.replication}")
    over = False
    for name, us in result["us_per_destset"].items():
        budget = BUDGET_US.get(name)
        mark = ""
        if budget is not None:
            ok = us <= budget
            over |= not ok
            mark = f"  (budget {budget:g} us: {'ok' if ok else 'OVER'})"
        print(f"  {name:<30} {us:8.2f} us{mark}")
    result["us_per_storage_write"] = storage = storage_cost(args.repeat)
    print("storage core, per delivered write (memory engine)")
    for name, us in storage.items():
        print(f"  {name:<30} {us:8.2f} us")
    if args.json:
        print(json.dumps(result))
    return 1 if over else 0


if __name__ == "__main__":
    raise SystemExit(main())
