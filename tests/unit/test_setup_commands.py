"""The README's two commands on a machine that lacks what they need: each stops at once
with the exact command that installs it.  A real bare container or chroot would need
Docker or debootstrap and a download of a base system on every run; this machine has
neither a container runtime nor a reason to fetch a distribution, so the missing pieces
are simulated: a ``python3`` without the venv module, a Python too old, and a PATH
without Java, Chromium and the other programs the tests start.  ``./run`` never needs
``make``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(args: list[str], env: dict[str, str]) -> tuple[int, str, float]:
    t = time.monotonic()
    p = subprocess.run(
        [str(ROOT / "run"), *args], capture_output=True, text=True, timeout=60, env=env
    )
    return p.returncode, p.stdout + p.stderr, time.monotonic() - t


def bin_dir(tmp: Path, *tools: str) -> Path:
    """A PATH directory with only ``tools`` (links to this machine's)."""
    d = tmp / "bin"
    d.mkdir()
    for t in tools:
        for base in ("/usr/bin", "/bin", "/usr/sbin", "/sbin"):
            if Path(base, t).exists():
                (d / t).symlink_to(Path(base, t))
                break
    return d


@pytest.mark.exclusive  # how fast it fails is part of the check
def test_without_the_venv_module_it_says_which_package(tmp_path: Path) -> None:
    fake = tmp_path / "fake" / "ensurepip"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named ensurepip')\n")
    env = {
        "PATH": str(bin_dir(tmp_path, "dirname", "sh")),
        "PYTHON": sys.executable,
        "PYTHONPATH": str(fake.parent),
        "VENV": str(tmp_path / "venv"),
    }
    code, out, took = run(["demo"], env)
    assert code == 1 and took < 10, out
    assert "sudo apt-get install -y python3-venv" in out, out
    assert not (tmp_path / "venv").exists()


def test_an_old_python_is_refused_with_the_command_for_a_new_one(tmp_path: Path) -> None:
    shim = tmp_path / "python3"
    shim.write_text(
        "#!/bin/sh\n"
        'case "$*" in *version_info*) exit 1;; -V) echo "Python 3.9.2"; exit 0;; esac\n'
        "exit 3\n"
    )
    shim.chmod(0o755)
    env = {"PATH": str(bin_dir(tmp_path, "dirname", "sh")), "PYTHON": str(shim),
           "VENV": str(tmp_path / "venv")}  # fmt: skip
    code, out, _ = run(["test"], env)
    assert code == 1 and "Python 3.11 or later is needed" in out and "3.9.2" in out, out
    assert "sudo apt-get install -y python3.11 python3.11-venv" in out


def test_the_tests_name_every_missing_program_in_one_command(tmp_path: Path) -> None:
    env = {
        "PATH": str(bin_dir(tmp_path, "dirname", "sh", "grep")),
        "PYTHON": sys.executable,
        "VENV": str(ROOT / ".venv") if (ROOT / ".venv").exists() else str(Path(sys.prefix)),
    }
    code, out, took = run(["test"], env)
    assert code == 1 and took < 10, out
    assert (
        "sudo apt-get install -y openjdk-17-jre-headless chromium chromium-driver memcached "
        "openssl iproute2 nftables" in out
    ), out

    # E-Cast's own tests need none of them but openssl.
    code, out, took = run(["test", "ecast"], env)
    assert code == 1 and took < 10, out
    assert "sudo apt-get install -y openssl\n" in out, out


def test_a_wrong_command_prints_the_usage() -> None:
    code, out, _ = run(["deploy"], dict(os.environ))
    assert code == 2 and "usage: ./run demo | ./run test [ecast]" in out
    for args in (["test", "rubberband"], ["test", "ecast", "more"]):
        code, out, _ = run(args, dict(os.environ))
        assert code == 2 and "usage: ./run test [ecast]" in out, args


def test_ecast_s_own_tests_are_those_that_import_nothing_above_it(tmp_path: Path) -> None:
    from tests.conftest import ecast_only

    tests = ROOT / "tests"
    assert ecast_only(tests / "unit" / "test_ufabcast.py")
    assert ecast_only(tests / "integration" / "test_sdk.py")
    assert not ecast_only(tests / "unit" / "test_rubberband_config.py")
    # Runs ``rubberband.tools.cli`` in subprocesses: it reaches Rubberband.
    assert not ecast_only(tests / "unit" / "test_deploy.py")

    # A project of its own: through helpers of ``tests`` (absolute, relative, the packages
    # on the way), around an import cycle, and only then.
    def module(rel: str, text: str) -> Path:
        path = tmp_path.joinpath(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    module("tests/__init__.py", "")
    module("tests/h/__init__.py", "")
    module("tests/h/model.py", "import ecast\nfrom rubberband.sdk import connect\n")
    module("tests/h/plain.py", "import ecast\n")
    module("tests/a.py", "from tests import b\nimport ecast\n")
    module("tests/b.py", "import tests.a\n")
    module("tests/up/__init__.py", "import storage_adapters.memory\n")
    module("tests/up/leaf.py", "x = 1\n")
    cases = {
        "tests/unit/test_1.py": ("import ecast\nfrom tests.h.model import Model\n", False),
        "tests/unit/test_2.py": ("from ..h import model\n", False),
        "tests/h/test_3.py": ("from .model import Model\n", False),
        "tests/h/test_4.py": ("from . import plain\nfrom tests import report\n", True),
        "tests/unit/test_5.py": ("import tests.a\n", True),  # a cycle, and nothing above
        "tests/unit/test_6.py": ("import tests.up.leaf\n", False),  # the package's init
        "tests/unit/test_7.py": ('CMD = ["-m", "jepsen_like.runner"]\n', False),
        "tests/unit/test_8.py": ('TEXT = "see rubberband. Or storage_adapters."\n', True),
    }
    for rel, (text, expected) in cases.items():
        assert ecast_only(module(rel, text), tmp_path) is expected, rel
