"""``python -m rubberband``: the ``rubberband`` command."""

from rubberband.tools.cli import main

raise SystemExit(main())
