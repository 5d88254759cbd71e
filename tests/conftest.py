from __future__ import annotations

from tests import report


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
