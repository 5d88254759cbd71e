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
# Tests plant known bugs (``ecast.core.mutations``) to show they are caught; the daemons
# they start inherit the permission.
os.environ.setdefault("ECAST_TEST_MUTATIONS", "1")
if os.environ.get("ECAST_SHARED_CORES"):
    settings.load_profile("shared-cores")


ROOT = Path(__file__).resolve().parents[1]
UPPER_LAYERS = frozenset(
    {"rubberband", "rubberband_bench", "rubberband_spark", "storage_adapters", "jepsen_like"}
)
"""The packages built on E-Cast: a test module that reaches none of them, itself or through
the helper modules of ``tests`` it imports, belongs to E-Cast's own suite."""


def _package(path: Path, root: Path) -> list[str]:
    """The package a module at ``path`` belongs to, as dotted parts from ``root``."""
    try:
        rel = path.relative_to(root)
    except ValueError:  # outside the project: its relative imports reach no helper
        return []
    return list(rel.parts[:-1])


def _files(name: str, root: Path) -> list[Path]:
    """The source files importing ``name`` runs: every package on the way (its
    ``__init__``) and the module itself."""
    parts = name.split(".")
    out = []
    for n in range(1, len(parts) + 1):
        base = root.joinpath(*parts[:n])
        out += [p for p in (base / "__init__.py", base.with_suffix(".py")) if p.is_file()]
    return out


def _reaches_above(path: Path, root: Path, seen: set[Path]) -> bool:
    if path in seen:  # an import cycle, or a module already looked at on this walk
        return False
    seen.add(path)
    tree = ast.parse(path.read_text(), str(path))
    package = _package(path, root)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package
                up = package[: len(package) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Constant) and type(node.value) is str:
            # A module run in a subprocess (``-m rubberband.tools.cli``) is reached too.
            value = node.value
            parts = value.split(".")
            if len(parts) > 1 and parts[0] in UPPER_LAYERS and all(p.isidentifier() for p in parts):
                return True
            continue
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top in UPPER_LAYERS:
                return True
            if top == "tests" and any(_reaches_above(f, root, seen) for f in _files(name, root)):
                return True
    return False


@functools.cache
def ecast_only(path: Path, root: Path = ROOT) -> bool:
    """Whether the module at ``path`` reaches nothing above E-Cast: imports none of it,
    directly or through the ``tests`` helpers it imports (relative imports and the
    packages on the way included), and names no module of it for a subprocess.  Read
    from the source: importing would run it."""
    return not _reaches_above(path.resolve(), root.resolve(), set())


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    # ``./run test ecast`` sets ECAST_TESTS_ONLY: the other test modules are not even
    # imported, so E-Cast's suite runs without the upper layers' dependencies (Spark).
    if (
        os.environ.get("ECAST_TESTS_ONLY")
        and collection_path.suffix == ".py"
        and collection_path.name.startswith("test_")
        and not ecast_only(collection_path)
    ):
        return True
    return None


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
