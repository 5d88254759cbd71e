"""``python -m jepsen_like.checkers``: the same command as ``python -m rubberband.checkers``."""

from __future__ import annotations

from rubberband.checkers.__main__ import main

if __name__ == "__main__":
    raise SystemExit(main())
