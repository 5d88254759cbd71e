"""The layers show in the folders, and the imports keep to them.

- ``ecast/core`` (sans-IO cores) imports no asyncio, sockets, threads or clocks, and
  nothing of ``ecast`` outside ``ecast/core``;
- ``ecast/wire`` imports only ``ecast/core`` and ``ecast/wire``;
- ``ecast/runtime`` imports no tools, simulator or SDK;
- ``ecast`` imports nothing above it (Rubberband, the storage adapters, jepsen_like);
- the layers above import only what ``ecast/__init__.py`` exports (and the registry of
  planted bugs, ``ecast.core.mutations``, which every layer's cores consult);
- Rubberband imports no storage adapter; an engine imports of the project only the
  engine protocol, ``rubberband.engine`` (which carries the key algebra it needs);
- Rubberband's drivers (the daemons' hosts, the SDK, the simulator) make no protocol
  decision: they import the cores, the driver, the typed messages and the errors, never
  the protocol's internals (keys, placement, gathering, bundles, migration, the config's
  header builders) or its wire constants, and define none of their own.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import ecast

ROOT = Path(__file__).resolve().parents[2]
BANNED_IN_CORES = {"asyncio", "socket", "threading", "time", "selectors", "ssl", "subprocess"}
ABOVE = ("rubberband", "storage_adapters", "jepsen_like", "rubberband_spark")


def imports(path: Path) -> list[tuple[str, list[str], int]]:
    """``(module, names, line)`` of every import in a file (relative ones resolved)."""
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                out.append((alias.name, [], node.lineno))
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = path.relative_to(ROOT).with_suffix("").parts[: -node.level]
                module = ".".join([*base, module] if module else base)
            out.append((module, [a.name for a in node.names], node.lineno))
    return out


def files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def violations(folder: str, rule) -> list[str]:  # type: ignore[no-untyped-def]
    out = []
    for f in files(folder):
        for module, names, line in imports(f):
            problem = rule(module, names)
            if problem:
                out.append(f"{f.relative_to(ROOT)}:{line}: {problem}")
    return out


def test_cores_are_sans_io_and_self_contained() -> None:
    def rule(module: str, names: list[str]) -> str | None:
        top = module.split(".")[0]
        if top in BANNED_IN_CORES:
            return f"a core imports {module}"
        if module.startswith("ecast") and not module.startswith("ecast.core"):
            return f"a core imports {module}, above its layer"
        return None

    assert violations("ecast/core", rule) == []


def test_the_wire_format_sits_on_the_cores_only() -> None:
    def rule(module: str, names: list[str]) -> str | None:
        if module.startswith("ecast") and not module.startswith(("ecast.core", "ecast.wire")):
            return f"the wire layer imports {module}"
        return None

    assert violations("ecast/wire", rule) == []


def test_the_runtime_knows_no_tools_simulator_or_sdk() -> None:
    def rule(module: str, names: list[str]) -> str | None:
        if module.startswith(("ecast.tools", "ecast.sim", "ecast.sdk", "ecast.history")):
            return f"the runtime imports {module}"
        return None

    assert violations("ecast/runtime", rule) == []


def test_ecast_imports_nothing_above_it() -> None:
    def rule(module: str, names: list[str]) -> str | None:
        if module.split(".")[0] in ABOVE:
            return f"ecast imports {module}"
        return None

    assert violations("ecast", rule) == []


SHARED_INTERNALS = {"ecast.core.mutations"}
"""Not API, and shared on purpose: one registry of planted bugs for every layer's cores
(tests plant them; a daemon refuses to unless ``ECAST_TEST_MUTATIONS=1``)."""


@pytest.mark.parametrize("layer", ABOVE)
def test_the_layers_above_use_only_the_public_api(layer: str) -> None:
    exported = set(ecast.__all__)

    def rule(module: str, names: list[str]) -> str | None:
        if module == "ecast":
            hidden = [n for n in names if n not in exported]
            return f"imports {hidden} which ecast does not export" if hidden else None
        if module == "ecast.core" and names == ["mutations"]:
            return None  # ``from ecast.core import mutations``
        if module.startswith("ecast.") and module not in SHARED_INTERNALS:
            return f"imports {module}: use what ecast/__init__.py exports"
        return None

    assert violations(layer, rule) == []


def test_rubberband_imports_no_engine_and_engines_only_the_protocol() -> None:
    def rubberband_rule(module: str, names: list[str]) -> str | None:
        if module.startswith("storage_adapters"):
            return f"rubberband imports the engine {module}"
        return None

    def adapter_rule(module: str, names: list[str]) -> str | None:
        if (
            module.startswith(("rubberband", "ecast", "jepsen_like"))
            and module != "rubberband.engine"
        ):
            return f"an engine imports {module} (only the protocol, rubberband.engine)"
        return None

    assert violations("rubberband", rubberband_rule) == []
    assert violations("storage_adapters", adapter_rule) == []


DRIVERS = (
    "rubberband/host.py",
    "rubberband/sdk.py",
    "rubberband/sim/process.py",
    "rubberband/sim/run.py",
    "rubberband/sim/workload.py",
    "rubberband/sim/__main__.py",
    "rubberband/sim/nemesis.py",
)
"""The simulator's checks (``rubberband/sim/checks.py``) read the protocol to judge it,
as the checkers do; they drive nothing."""
DRIVER_IMPORTS = {
    "rubberband.storage", "rubberband.super", "rubberband.client", "rubberband.supervision",
    "rubberband.driver", "rubberband.outputs", "rubberband.proto", "rubberband.errors",
    "rubberband.gather",  # the Gather a read batch's caller is handed (its result)
    "rubberband.checkers", "rubberband.sim", "rubberband.engine", "rubberband.sdk",
    "rubberband.views",  # a library over the SDK's calls (the SDK offers its calls)
}  # fmt: skip
"""What a driver may import of Rubberband: the cores and their upcalls, the driver, the
typed messages, the errors; the simulator also its own modules, the checkers, the engine
protocol (it builds engines) and the SDK's ``load_ops``."""
DRIVER_CONSTANTS = {"BUNDLE_LIMIT", "INTAKE_BATCH"}
"""Constants a driver may take from a core: defaults of its own signatures."""
WIRING = {
    ("rubberband.config", "RubberbandConfig"),
    ("rubberband.changelog", "ChangeLog"),
    ("rubberband.holds", "Holds"),
    ("rubberband.holds", "HOLD_AT"),
}
"""A driver may name the config class it hands the routers (the simulator starts them),
and the parts it builds a storage core with (its change log and holds, sized as a
daemon's flags size them)."""


def driver_problems(path: Path, source: str) -> list[str]:
    """What in a driver's ``source`` makes a protocol decision: an import of the
    protocol's internals or of a wire constant, or a wire constant of its own (a short
    string constant at module level: the tags the untyped wire was made of)."""
    out = []
    tree = ast.parse(source, str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rubberband"):
            module = node.module or ""
            for alias in node.names:
                name = alias.name
                if (module, name) in WIRING:
                    continue
                if module.split(".")[:2] != ["rubberband", "sim"] and not any(
                    module == m or module.startswith(m + ".") for m in DRIVER_IMPORTS
                ):
                    out.append(
                        f"{path}:{node.lineno}: imports {module}.{name}, a protocol internal"
                    )
                elif (
                    name.isupper()
                    and name not in DRIVER_CONSTANTS
                    and not module.startswith("rubberband.sim")
                ):
                    out.append(f"{path}:{node.lineno}: imports the wire constant {module}.{name}")
                elif name.endswith("_header"):
                    out.append(f"{path}:{node.lineno}: builds headers ({module}.{name})")
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            value = node.value.value
            for target in node.targets:
                if (
                    isinstance(target, ast.Name)
                    and target.id.isupper()
                    and isinstance(value, str)
                    and len(value) <= 12
                    and ":" not in value  # a process's name
                ):
                    out.append(
                        f"{path}:{node.lineno}: defines the wire tag {target.id} = {value!r}"
                    )
    return out


def test_rubberband_drivers_make_no_protocol_decision() -> None:
    found = []
    for d in DRIVERS:
        found += driver_problems(Path(d), (ROOT / d).read_text())
    assert found == []


def test_the_driver_rule_catches_what_the_untyped_wire_did() -> None:
    """As ``rubberband/host.py``, ``sdk.py`` and ``sim.py`` were before the typed protocol:
    they shared wire tags and read the keys themselves."""
    before = (
        "from rubberband.storage import ABORT, CHUNK, PULL, StorageCore\n"
        "from rubberband.host import CONFIG, DESCRIBE\n"
        "from rubberband.keys import NOTHING, describe, difference\n"
        "from rubberband.config import RubberbandConfig, vote_header\n"
        'PING = "ping"\n'
    )
    problems = driver_problems(Path("rubberband/host.py"), before)
    assert len(problems) == 10, problems


def test_the_rule_itself_catches_a_violation(tmp_path: Path) -> None:
    f = ROOT / "ecast" / "core" / "_probe_for_layer_test.py"
    f.write_text("import asyncio\nfrom ecast.runtime import Runtime\n")
    try:

        def rule(module: str, names: list[str]) -> str | None:
            return "bad" if module in ("asyncio", "ecast.runtime") else None

        assert len(violations("ecast/core", rule)) == 2
    finally:
        f.unlink()


def test_rubberband_keeps_its_files_functions_and_classes_small() -> None:
    """At most 800 lines a file, 80 a function, 500 a class, in ``rubberband/`` (a
    decision paragraph in docs/decisions.md would have to say why one is bigger: none
    is)."""
    found = []
    for f in files("rubberband"):
        source = f.read_text()
        where = f.relative_to(ROOT)
        if source.count("\n") > 800:
            found.append(f"{where}: {source.count(chr(10))} lines")
        for node in ast.walk(ast.parse(source, str(f))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            size = (node.end_lineno or node.lineno) - node.lineno + 1
            if not isinstance(node, ast.ClassDef) and size > 80:
                found.append(f"{where}:{node.lineno}: function {node.name}, {size} lines")
            elif isinstance(node, ast.ClassDef) and size > 500:
                found.append(f"{where}:{node.lineno}: class {node.name}, {size} lines")
    assert found == []
