from __future__ import annotations

import os

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
