"""What the suite proved, collected by the tests and printed at the end of the run."""

from __future__ import annotations

from collections import Counter

SCHEDULES: Counter[str] = Counter()
"""Randomized schedules run, per layer."""
SITUATIONS: dict[str, Counter[str]] = {}
"""Per layer: fault situation -> schedules that reached it."""
CHECKERS_PASSED: dict[str, list[str]] = {}
"""Per layer: the checkers that ran on every schedule."""
MUTANTS: dict[str, list[str]] = {}
"""Planted bug -> how the suite caught it."""
