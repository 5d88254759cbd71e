"""``python -m jepsen_like``: fault injection against real processes, and its checkers.

python -m jepsen_like run --workload multicast --nemesis kill,pause --time 60 --seed 7
python -m jepsen_like check DIR        # the history and workload a run stored in DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    if args[0] == "run":
        from jepsen_like.runner import run

        return run(args[1:])
    if args[0] == "check":
        ap = argparse.ArgumentParser(prog="python -m jepsen_like check")
        ap.add_argument("dir", type=Path, help="the directory a run stored its report in")
        d = ap.parse_args(args[1:]).dir
        try:
            report = json.loads((d / "report.json").read_text())
        except (OSError, ValueError) as e:
            print(f"jepsen_like check: no run's report in {d}: {e}", file=sys.stderr)
            return 2
        from rubberband.checkers.__main__ import main as check

        return check([str(d / "history.jsonl"), json.dumps(report["checker"])])
    print(f"jepsen_like: unknown command {args[0]!r} (run, check)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
