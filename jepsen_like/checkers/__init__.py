"""The history checkers under their first name (``python -m jepsen_like.checkers``):
they are the product's, in :mod:`rubberband.checkers`, shared by the simulator, the demo
and ``jepsen_like``."""

from __future__ import annotations

from rubberband.checkers import *  # noqa: F403
from rubberband.checkers import __all__ as __all__
