from __future__ import annotations

import ast
import functools
import os
from pathlib import Path

import pytest
from hypothesis import settings

from tests import report

# ``./run test`` runs the unit and simulation tests at the lowest priority beside the real
# daemons' tests, on the cycles those leave idle: a property's example can then wait
# seconds for a core, so the per-example deadline (wall clock) would measure the
# neighbours, not the example.  Everything that asserts a wall-clock bound is marked
# ``exclusive`` and runs alone afterwards.
settings.register_profile("shared-cores", deadline=None)
if os.environ.get("ECAST_SHARED_CORES"):
    settings.load_profile("shared-cores")


ROOT = Path(__file__).resolve().parents[1]
UPPER_LAYERS = frozenset(
    {"rubberband", "rubberband_bench", "rubberband_spark", "storage_adapters", "jepsen_like"}
)
"""The packages built on E-Cast: a test module that reaches none of them, itself or through
the helper modules of ``tests`` it imports, belongs to E-Cast's own suite."""


@functools.cache
def ecast_only(path: Path) -> bool:
    """Whether the module at ``path`` imports nothing above E-Cast, following its imports
    of ``tests.*`` helpers (read from the source: importing would run it)."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] in UPPER_LAYERS:
                return False
            if name.split(".")[0] == "tests":
                helper = ROOT.joinpath(*name.split("."))
                for candidate in (helper.with_suffix(".py"), helper / "__init__.py"):
                    if candidate.is_file() and not ecast_only(candidate):
                        return False
    return True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # ``./run test ecast`` (``-m ecast``) runs E-Cast's own suite: the tests of the
    # layers above need their packages, engines, Spark and a browser, and take most of
    # the full suite's time.
    for item in items:
        if ecast_only(Path(str(item.path))):
            item.add_marker(pytest.mark.ecast)


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # type: ignore[no-untyped-def]
    tr = terminalreporter
    if not report.SCHEDULES and not report.MUTANTS:
        return
    tr.section("what the simulation tests proved")
    for layer, n in report.SCHEDULES.items():
        tr.line(f"{layer}: {n} randomized schedules ran")
        reached = report.SITUATIONS.get(layer, {})
        for situation, count in sorted(reached.items()):
            tr.line(f"  fault situation {situation}: reached in {count} schedules")
        checkers = report.CHECKERS_PASSED.get(layer)
        if checkers:
            tr.line(f"  checkers run on every schedule: {', '.join(checkers)}")
    if report.MUTANTS:
        tr.line("planted bugs:")
        for mutant, how in sorted(report.MUTANTS.items()):
            tr.line(f"  {mutant}: caught by {'; '.join(how)}")
