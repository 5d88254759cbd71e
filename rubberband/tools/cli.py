"""``rubberband``: one command, a subcommand per tool."""

from __future__ import annotations

import importlib
import subprocess
import sys

COMMANDS = {
    "storage": ("rubberband.tools.daemons:storage_main", "run a storage process"),
    "super": ("rubberband.tools.daemons:super_main", "run a super process"),
    "cluster": ("rubberband.tools.cluster:cluster_main", "a local cluster: up, status, down"),
    "admin": ("rubberband.tools.cluster:admin_main", "expand, contract, replace, rebalance"),
    "client": ("rubberband.tools.client:main", "ad-hoc reads and writes from a shell"),
    "views": ("rubberband.tools.views:main", "materialized views: create, read, maintain"),
    "demo": ("rubberband.tools.demo:main", "the main job: a cluster at work through faults"),
    "cost": ("rubberband.tools.cost:main", "microseconds the routers spend routing per message"),
    "bench": ("rubberband.tools.bench:main", "benchmarks: the dissertation's figures, peers"),
}


def dispatch(table: dict[str, tuple[str, str]], args: list[str], prog: str, what: str) -> int:
    """Run ``args[0]``'s entry of ``table`` (``module:function`` and a line of help)
    with the rest of ``args``; modules are imported only when their command runs."""
    if not args or args[0] in ("-h", "--help"):
        print(f"usage: {prog} {what.upper()} [ARGS]\n\n{what}s:")
        for name, (_, help_) in table.items():
            print(f"  {name:<17} {help_}")
        return 0 if args else 2
    entry = table.get(args[0])
    if entry is None:
        print(f"{prog}: unknown {what} {args[0]!r} (try {prog} --help)", file=sys.stderr)
        return 2
    module, _, func = entry[0].partition(":")
    return int(getattr(importlib.import_module(module), func)(args[1:]) or 0)


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``rubberband ARGS`` in a child process of this interpreter, its output captured:
    how tools, the demo, the benchmarks and the tests drive the command as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "rubberband.tools.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--version"]:
        from ecast import __version__

        print(f"rubberband {__version__}")
        return 0
    return dispatch(COMMANDS, args, "rubberband", "command")


if __name__ == "__main__":
    raise SystemExit(main())
