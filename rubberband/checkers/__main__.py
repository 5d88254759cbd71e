"""``python -m rubberband.checkers HISTORY WORKLOAD``: check a recorded history file.

WORKLOAD is a name (``list-append``, ``bank``, ``multicast``), a JSON description (see
``run``), or ``@file`` for a JSON file holding one.  Prints the report, or its JSON with
``--json``; exits 0 when valid, 1 when invalid, 2 when nothing could be checked, 3 when
the input is malformed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rubberband.checkers.history import HistoryError
from rubberband.checkers.run import check_all


def _workload(text: str) -> Any:
    if text.startswith("@"):
        text = Path(text[1:]).read_text(encoding="utf-8")
    stripped = text.strip()
    return json.loads(stripped) if stripped.startswith("{") else stripped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rubberband.checkers", description=__doc__)
    parser.add_argument("history", help="a JSON-lines history file")
    parser.add_argument("workload", help="list-append, multicast, a JSON workload, or @file.json")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    try:
        result = check_all(args.history, _workload(args.workload))
    except (HistoryError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 3
    print(result.dumps() if args.json else result.render())
    if result.valid is True:
        return 0
    return 1 if result.valid is False else 2


if __name__ == "__main__":
    sys.exit(main())
