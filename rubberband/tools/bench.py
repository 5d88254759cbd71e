"""``rubberband bench EXPERIMENT``: the benchmarks, one command.

Experiments are named by module path, so Rubberband imports no engine: each is a
module's ``main(argv)`` that prints a table and, with ``--json``, ends with one JSON
object.
"""

from __future__ import annotations

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
    from rubberband.tools.cli import dispatch

    args = sys.argv[1:] if argv is None else argv
    return dispatch(EXPERIMENTS, args, "rubberband bench", "experiment")
