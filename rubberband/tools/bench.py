"""``rubberband bench EXPERIMENT``: the benchmarks, one command.

Experiments are named by module path, so Rubberband imports no engine: each is a
module's ``main(argv)`` that prints a table and, with ``--json``, ends with one JSON
object.
"""

from __future__ import annotations

import importlib
import sys

EXPERIMENTS = {
    "scan-engine": (
        "storage_adapters.scan.bench:main",
        "the scan engine against SQLite and DuckDB on a Ticket-like table (2.10)",
    ),
    "memcached": (
        "storage_adapters.memcached_bench:main",
        "the Memcached engine: keys/s at batch 1,000, migration MB/s, index bytes/key",
    ),
}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print("usage: rubberband bench EXPERIMENT [ARGS] [--json]\n\nexperiments:")
        for name, (_, what) in EXPERIMENTS.items():
            print(f"  {name:<12} {what}")
        return 0 if args else 2
    entry = EXPERIMENTS.get(args[0])
    if entry is None:
        known = ", ".join(EXPERIMENTS)
        print(f"rubberband bench: unknown experiment {args[0]!r} ({known})", file=sys.stderr)
        return 2
    module, _, func = entry[0].partition(":")
    return int(getattr(importlib.import_module(module), func)(args[1:]) or 0)
