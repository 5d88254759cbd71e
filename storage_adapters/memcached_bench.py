"""Benchmark: the Memcached engine as one storage process drives it.

    rubberband bench memcached --json

* **writes / reads**: ``put`` and ``get`` operations of ``--batch`` keys (1,000) each,
  applied the way a storage process applies a delivered batch (the engine on its
  worker thread, values of ``--value-bytes``), against the engine's own memcached:
  keys per second.
* **migration**: a range of ``--migrate-mb`` MB (1,024) sent from one engine to another
  (a send cursor drained in chunks of ``--chunk-kb``, each chunk through msgpack as on
  the wire, received by a second engine with its own memcached): MB per second of
  values moved.
* **index memory**: the bytes per key the ordered key index costs in the storage
  process (measured with ``tracemalloc`` over ``--index-keys`` keys): memcached holds
  the values, the process holds the order.

The last line of output is one JSON object (``--json``: nothing else goes to stdout).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
import tracemalloc
from typing import Any

import msgpack

from rubberband.engine import EVERYTHING, encode_key
from storage_adapters.memcached import MemcachedEngine


def _put(keys: range, value: bytes) -> Any:
    return ("put", tuple((k, value) for k in keys))


def writes_and_reads(keys: int, batch: int, value_bytes: int) -> dict[str, float]:
    e = MemcachedEngine(memory_mb=max(256, keys * (value_bytes + 200) // (1 << 20) * 2))
    try:
        value = os.urandom(value_bytes)
        ops = [_put(range(i, min(i + batch, keys)), value) for i in range(0, keys, batch)]
        t0 = time.perf_counter()
        for op in ops:
            e.apply([(op, EVERYTHING)])
        wrote = time.perf_counter() - t0
        gets = [("get", tuple(range(i, min(i + batch, keys)))) for i in range(0, keys, batch)]
        t0 = time.perf_counter()
        found = 0
        for op in gets:
            found += len(e.apply([(op, EVERYTHING)])[0])
        read = time.perf_counter() - t0
        assert found == keys, (found, keys)
        return {"writes_per_s": round(keys / wrote), "reads_per_s": round(keys / read)}
    finally:
        e.close()


def migration(megabytes: int, chunk_kb: int, value_bytes: int) -> dict[str, float]:
    """Send every key below the middle of a range holding ``megabytes`` of values."""
    n = megabytes * (1 << 20) // value_bytes
    mem = megabytes * 2 + 256
    src, dst = MemcachedEngine(memory_mb=mem), MemcachedEngine(memory_mb=mem)
    try:
        value = os.urandom(value_bytes)
        for i in range(0, n, 1000):
            src.apply([(_put(range(i, min(i + 1000, n)), value), EVERYTHING)])
        moving = ((encode_key(0), encode_key(n)),)
        t0 = time.perf_counter()
        cursor = src.open_send(moving)
        chunks = sent = 0
        while (chunk := cursor.next_chunk(chunk_kb * 1024)) is not None:
            wire = msgpack.packb(chunk, use_bin_type=True)
            sent += len(wire)
            dst.receive(msgpack.unpackb(wire, raw=False), moving)
            chunks += 1
        cursor.close()
        took = time.perf_counter() - t0
        t0 = time.perf_counter()
        src.delete(moving)
        deleted = time.perf_counter() - t0
        assert dst.stats()["items"] == n and src.stats()["items"] == 0
        return {
            "keys": n,
            "mb": round(n * value_bytes / (1 << 20)),
            "seconds": round(took, 2),
            "mb_per_s": round(n * value_bytes / (1 << 20) / took, 1),
            "chunks": chunks,
            "wire_mb": round(sent / (1 << 20)),
            "delete_s": round(deleted, 2),
        }
    finally:
        src.close()
        dst.close()


def index_bytes_per_key(keys: int) -> dict[str, float]:
    e = MemcachedEngine(memory_mb=256)
    try:
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.take_snapshot()
        for i in range(0, keys, 1000):
            e.apply([(_put(range(i, min(i + 1000, keys)), b"x"), EVERYTHING)])
        gc.collect()
        grown = tracemalloc.take_snapshot()
        tracemalloc.stop()
        stats = grown.compare_to(base, "filename")
        total = sum(s.size_diff for s in stats)
        return {"int_keys": keys, "bytes_per_key": round(total / keys)}
    finally:
        e.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rubberband bench memcached", description=__doc__)
    ap.add_argument("--keys", type=int, default=200_000, help="keys written and read")
    ap.add_argument("--batch", type=int, default=1000, help="keys per operation")
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--migrate-mb", type=int, default=1024)
    ap.add_argument("--migrate-value-bytes", type=int, default=4096)
    ap.add_argument("--chunk-kb", type=int, default=1024)
    ap.add_argument("--index-keys", type=int, default=100_000)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    say = (lambda *_: None) if a.json else print
    out: dict[str, Any] = {
        "machine": f"{platform.machine()} {os.cpu_count()} cores, Python {sys.version.split()[0]}",
        "batch": a.batch,
        "value_bytes": a.value_bytes,
    }
    say(f"writes and reads: {a.keys} keys, {a.batch} per operation, {a.value_bytes}-byte values")
    out.update(writes_and_reads(a.keys, a.batch, a.value_bytes))
    say(f"  {out['writes_per_s']:>10,} keys written/s  {out['reads_per_s']:>10,} keys read/s")
    say(f"migration: {a.migrate_mb} MB of {a.migrate_value_bytes}-byte values")
    out["migration"] = migration(a.migrate_mb, a.chunk_kb, a.migrate_value_bytes)
    m = out["migration"]
    say(f"  {m['mb_per_s']} MB/s ({m['seconds']} s, {m['chunks']} chunks)")
    out["index"] = index_bytes_per_key(a.index_keys)
    say(f"index: {out['index']['bytes_per_key']} bytes per key in the storage process")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
