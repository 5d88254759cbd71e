"""The commands run as modules too, and say one version: the package's."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["ecast", "rubberband"])
def test_each_command_runs_as_a_module_and_prints_the_package_version(module: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", module, "--version"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [module, importlib.metadata.version("ecast-rubberband")]
    helped = subprocess.run(
        [sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=60
    )
    assert helped.returncode == 0 and module in helped.stdout, helped.stderr
