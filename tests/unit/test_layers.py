"""The layers show in the folders, and the imports keep to them.

- ``ecast/core`` (sans-IO cores) imports no asyncio, sockets, threads or clocks, and
  nothing of ``ecast`` outside ``ecast/core``;
- ``ecast/wire`` imports only ``ecast/core`` and ``ecast/wire``;
- ``ecast/runtime`` imports no tools, simulator or SDK;
- ``ecast`` imports nothing above it (Rubberband, the storage adapters, jepsen_like);
- the layers above import only what ``ecast/__init__.py`` exports, and Rubberband imports
  no storage adapter but the engine protocol.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import ecast

ROOT = Path(__file__).resolve().parents[2]
BANNED_IN_CORES = {"asyncio", "socket", "threading", "time", "selectors", "ssl", "subprocess"}
ABOVE = ("rubberband", "storage_adapters", "jepsen_like", "rubberband_spark", "rubberband_bench")


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


@pytest.mark.parametrize("layer", ABOVE)
def test_the_layers_above_use_only_the_public_api(layer: str) -> None:
    exported = set(ecast.__all__)

    def rule(module: str, names: list[str]) -> str | None:
        if module == "ecast":
            hidden = [n for n in names if n not in exported]
            return f"imports {hidden} which ecast does not export" if hidden else None
        if module.startswith("ecast."):
            return f"imports {module}: use what ecast/__init__.py exports"
        return None

    assert violations(layer, rule) == []


def test_rubberband_imports_no_engine_and_engines_only_the_protocol() -> None:
    def rubberband_rule(module: str, names: list[str]) -> str | None:
        if module.startswith("storage_adapters") and module != "storage_adapters.base":
            return f"rubberband imports the engine {module}"
        return None

    def adapter_rule(module: str, names: list[str]) -> str | None:
        if module.startswith(("rubberband", "ecast", "jepsen_like")):
            return f"an engine imports {module} (only the protocol, storage_adapters.base)"
        return None

    assert violations("rubberband", rubberband_rule) == []
    engines = [
        v
        for v in violations("storage_adapters", adapter_rule)
        if not v.startswith(
            "storage_adapters/base.py"  # the protocol itself shares Rubberband's keys
        )
    ]
    assert engines == []


def test_the_rule_itself_catches_a_violation(tmp_path: Path) -> None:
    f = ROOT / "ecast" / "core" / "_probe_for_layer_test.py"
    f.write_text("import asyncio\nfrom ecast.runtime import Runtime\n")
    try:

        def rule(module: str, names: list[str]) -> str | None:
            return "bad" if module in ("asyncio", "ecast.runtime") else None

        assert len(violations("ecast/core", rule)) == 2
    finally:
        f.unlink()
