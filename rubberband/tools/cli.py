"""``rubberband``: one command, a subcommand per tool."""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "storage": ("rubberband.tools.daemons:storage_main", "run a storage process"),
    "super": ("rubberband.tools.daemons:super_main", "run a super process"),
    "cluster": ("rubberband.tools.cluster:cluster_main", "a local cluster: up, status, down"),
    "admin": ("rubberband.tools.cluster:admin_main", "expand, contract, replace, rebalance"),
    "cost": ("rubberband.tools.cost:main", "microseconds the routers spend routing per message"),
    "bench": ("rubberband.tools.bench:main", "benchmarks: scan-engine, memcached"),
}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print("usage: rubberband COMMAND [ARGS]\n\ncommands:")
        for name, (_, what) in COMMANDS.items():
            print(f"  {name:<10} {what}")
        return 0 if args else 2
    entry = COMMANDS.get(args[0])
    if entry is None:
        print(f"rubberband: unknown command {args[0]!r} (try rubberband --help)", file=sys.stderr)
        return 2
    module, _, func = entry[0].partition(":")
    return int(getattr(importlib.import_module(module), func)(args[1:]) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
