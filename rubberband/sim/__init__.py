"""Rubberband in E-Cast's deterministic simulator: the shipped cores under faults,
checked (``python -m rubberband.sim``; :mod:`rubberband.sim.run` says what a run does)."""

from __future__ import annotations

from ecast.core import mutations
from rubberband.sim.run import (
    RB_FAULTS,
    SCENARIOS,
    SITUATIONS,
    SUPER,
    RbRunConfig,
    RbRunResult,
    RubberbandRun,
    run_rubberband,
)

MUTATIONS = tuple(
    sorted(
        n
        for layer in ("config", "storage", "client", "super", "views")
        for n in mutations.known(layer)
    )
)
"""The planted bugs a Rubberband run can take (``--mutation``)."""

__all__ = [
    "MUTATIONS",
    "RB_FAULTS",
    "SCENARIOS",
    "SITUATIONS",
    "SUPER",
    "RbRunConfig",
    "RbRunResult",
    "RubberbandRun",
    "run_rubberband",
]
