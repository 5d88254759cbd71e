"""``rubberband bench EXPERIMENT``: the benchmarks, one command.

Experiments are named by module path, so Rubberband imports no engine and no benchmark
code: each is a function ``f(argv)`` that prints a table and, with ``--json``, ends with
one JSON object.  ``docs/benchmarks.md`` has the figures.
"""

from __future__ import annotations

import sys

_E = "rubberband.bench.experiments:"
EXPERIMENTS = {
    "write-vs-storage": (_E + "write_vs_storage", "write throughput, 1-64 storage (Fig. 4.9)"),
    "write-vs-clients": (_E + "write_vs_clients", "write throughput and fairness (4.12)"),
    "write-vs-routers": (_E + "write_vs_routers", "write throughput, 1, 3, 5 routers (4.14)"),
    "write-vs-payload": (_E + "write_vs_payload", "write throughput, 16 B-16 KiB (4.15)"),
    "read-isolation": (_E + "read_isolation", "reads/s by snapshot share, basic reads (4.16)"),
    "latency-vs-load": (_E + "latency_vs_load", "p50/p99 to saturation, clumping on/off (4.19)"),
    "router-failover": (_E + "router_failover", "trace through leader and follower kills (4.18)"),
    "elasticity": (_E + "elasticity", "trace through stepwise expand and contract (4.17)"),
    "cost": (_E + "cost", "CPU microseconds per operation per role, and per destset"),
    "peers": ("rubberband.bench.peers:main", "the same writes against etcd, ZooKeeper, PySyncObj"),
    "spark": ("rubberband.bench.spark:main", "Spark rows per second into a fresh cluster"),
    "views": ("rubberband.bench.views:main", "base writes/s with 0-10 views, staleness, lookups"),
    "maintainer": ("rubberband.bench.maintainer:main", "a view maintainer's CPU per base change"),
    "scan-engine": (
        "storage_adapters.scan.bench:main",
        "the scan engine against SQLite and DuckDB on a Ticket-like table (2.10)",
    ),
    "log": (
        "storage_adapters.log.bench:main",
        "the durable log engine: writes/s by fsync policy, recovery s/GB, index bytes/key",
    ),
    "memcached": (
        "storage_adapters.memcached_bench:main",
        "the Memcached engine: keys/s at batch 1,000, migration MB/s, index bytes/key",
    ),
}


def main(argv: list[str] | None = None) -> int:
    from rubberband.tools.cli import dispatch

    args = sys.argv[1:] if argv is None else argv
    return dispatch(EXPERIMENTS, args, "rubberband bench", "experiment")
