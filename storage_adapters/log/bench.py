"""Benchmark: the durable log engine as one storage process drives it.

    rubberband bench log --json

* **writes**: batches of ``--batch`` one-key ``put`` operations (the way a storage
  process applies a batch of delivered writes, one group commit per batch), values of
  ``--value-bytes``, under ``fsync=always`` and ``fsync=interval``: writes per second,
  syncs per second.
* **recovery**: a log of ``--gb`` gigabytes (``--keys`` keys overwritten round-robin, so
  compaction runs as it would), then the time to open it again from its checkpoint
  (a clean close) and from the log alone (the checkpoints removed: a redo of every
  record), in seconds and seconds per GB.
* **index memory**: bytes per key of the in-memory index (``tracemalloc``).

The last line of output is one JSON object (``--json``: nothing else goes to stdout).
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import shutil
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from rubberband.engine import encode_key
from storage_adapters.log import LogEngine


def _batch(start: int, n: int, keys: int, value: bytes, t: int) -> list[Any]:
    out = []
    for i in range(start, start + n):
        k = i % keys
        ek = encode_key(k)
        out.append((("put", ((k, value),)), ((ek, (*ek, 0)),), t))
    return out


def writes(d: Path, fsync: str, batch: int, value: bytes, seconds: float) -> dict[str, Any]:
    e = LogEngine(path=str(d), fsync=fsync)  # type: ignore[arg-type]
    done = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        e.apply(_batch(done, batch, 1_000_000, value, done))
        done += batch
    took = time.perf_counter() - t0
    syncs = e.stats()["syncs"]
    e.close()
    return {"fsync": fsync, "writes_per_s": round(done / took), "syncs_per_s": round(syncs / took)}


def recovery(d: Path, gb: float, keys: int, value: bytes, say: Any) -> dict[str, Any]:
    e = LogEngine(path=str(d), fsync="interval", fsync_interval=1.0)
    target = int(gb * (1 << 30))
    written = i = 0
    while written < target:
        e.apply(_batch(i, 1000, keys, value, i))
        i += 1000
        written = e._log.appended
    stats = e.stats()
    e.close()  # a checkpoint
    say(f"log of {written / (1 << 30):.2f} GB written ({i:,} writes), "
        f"{stats['bytes'] / (1 << 30):.2f} GB on disk after compaction")  # fmt: skip
    t0 = time.perf_counter()
    e = LogEngine(path=str(d))
    from_checkpoint = time.perf_counter() - t0
    on_disk = e.stats()["bytes"]
    n = len(e._data)
    e.close(checkpoint=False)
    for c in d.glob("ckpt-*.idx"):
        c.unlink()
    t0 = time.perf_counter()
    e = LogEngine(path=str(d))
    from_log = time.perf_counter() - t0
    assert len(e._data) == n
    e.close()
    size = on_disk / (1 << 30)
    return {
        "log_gb": round(size, 2),
        "keys": n,
        "open_from_checkpoint_s": round(from_checkpoint, 2),
        "open_from_log_s": round(from_log, 2),
        "from_checkpoint_s_per_gb": round(from_checkpoint / size, 2),
        "from_log_s_per_gb": round(from_log / size, 2),
    }


def index_bytes(d: Path, keys: int) -> float:
    e = LogEngine(path=str(d), fsync="interval", fsync_interval=1.0)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(0, keys, 1000):
        e.apply(_batch(i, 1000, keys, b"v", i))
    e._data._cache.clear()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    e.close()
    return round((after - before) / keys, 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rubberband bench log", description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=256, help="writes per group commit")
    ap.add_argument("--value-bytes", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=5.0, help="per fsync policy")
    ap.add_argument("--gb", type=float, default=1.0, help="log size for the recovery")
    ap.add_argument("--keys", type=int, default=1_000_000, help="keys of the recovery log")
    ap.add_argument("--index-keys", type=int, default=200_000)
    ap.add_argument("--dir", default=None, help="where the logs go (a real disk)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)

    def say(text: str) -> None:
        if not a.json:
            print(text, flush=True)

    base = Path(tempfile.mkdtemp(prefix="rb-logbench-", dir=a.dir))
    value = b"x" * a.value_bytes
    out: dict[str, Any] = {"machine": platform.machine(), "python": platform.python_version()}
    try:
        out["writes"] = []
        for fsync in ("always", "interval"):
            r = writes(base / f"w-{fsync}", fsync, a.batch, value, a.seconds)
            out["writes"].append(r)
            say(f"writes, fsync={fsync}: {r['writes_per_s']:,}/s, {r['syncs_per_s']:,} syncs/s")
        out["recovery"] = recovery(base / "r", a.gb, a.keys, value, say)
        say(f"recovery: {out['recovery']}")
        out["index_bytes_per_key"] = index_bytes(base / "i", a.index_keys)
        say(f"index: {out['index_bytes_per_key']} bytes per key")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
