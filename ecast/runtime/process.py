"""Process-wide settings and identities for processes that run E-Cast nodes."""

from __future__ import annotations

import contextlib
import gc
import os
import time


def tune_process() -> None:
    """Settings for a process whose main work is running E-Cast nodes (daemons, workers).

    uvloop when it is installed.  And a garbage collector that runs rarely: the protocol
    allocates many short-lived tuples and small objects that do not form cycles, and with
    the default thresholds (a young collection every 700 allocations) the collector ran
    hundreds of times a second, its older collections walking every unstable message and
    Paxos log entry.  At 5,000 messages/s that took p99 latency from 15 ms to 30 ms
    (docs/benchmarks.md).  What exists at start-up (modules, classes) is frozen out of
    every collection.  Applications that embed the SDK decide for themselves.
    """
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    gc.freeze()
    gc.set_threshold(50_000, 50, 1_000)


def new_incarnation() -> int:
    """Larger for every new process of a node id (a restarted process is a new process)."""
    return time.time_ns() // 1000


def read_secret(path: str | None = None, env: str = "ECAST_SECRET") -> bytes:
    """The cluster secret from a file or an environment variable."""
    if path:
        with open(path, "rb") as f:
            secret = f.read().strip()
    else:
        secret = os.environ.get(env, "").encode()
    if not secret:
        raise SystemExit(f"no cluster secret: pass --secret-file or set {env}")
    return secret
