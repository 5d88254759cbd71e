"""The README's two commands on a machine that lacks what they need: each installs it
with apt-get when it may (root, or passwordless sudo), and otherwise stops at once with
the exact command that installs it.  A real bare container or chroot would need Docker or
debootstrap and a download of a base system on every run; this machine has neither a
container runtime nor a reason to fetch a distribution, so the missing pieces are
simulated: a ``python3`` without the venv module, a Python too old, a PATH without Java,
Chromium and the other programs the tests start, and an ``apt-get``, ``id`` and ``sudo``
that record what they were asked.  ``.ci/run`` runs the real thing on a fresh machine
(``./run test``, then ``.ci/demo``: ``./run demo`` from a fresh clone).  ``./run`` never
needs ``make``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


# Every package the tests need; ZooKeeper is checked by its jar, not on the PATH.
ALL_PACKAGES = (
    "openjdk-17-jre-headless chromium chromium-driver memcached openssl iproute2 nftables "
    "etcd-server" + ("" if Path("/usr/share/java/zookeeper.jar").exists() else " zookeeper")
)


def run(args: list[str], env: dict[str, str]) -> tuple[int, str, float]:
    t = time.monotonic()
    p = subprocess.run(
        [str(ROOT / "run"), *args], capture_output=True, text=True, timeout=60, env=env
    )
    return p.returncode, p.stdout + p.stderr, time.monotonic() - t


def bin_dir(tmp: Path, *tools: str) -> Path:
    """A PATH directory with only ``tools`` (links to this machine's)."""
    d = tmp / "bin"
    d.mkdir(exist_ok=True)
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
    v = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert code == 1 and took < 10, out
    assert f"sudo apt-get install -y python{v}-venv" in out, out
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
    assert f"sudo apt-get install -y {ALL_PACKAGES}\n" in out, out
    assert "memcached: the Memcached engine starts a server per storage process" in out

    # E-Cast's own tests need none of them but openssl.
    code, out, took = run(["test", "ecast"], env)
    assert code == 1 and took < 10, out
    assert "sudo apt-get install -y openssl\n" in out, out


def test_a_wrong_command_prints_the_usage() -> None:
    code, out, _ = run(["deploy"], dict(os.environ))
    assert code == 2 and "usage: ./run demo [-v] [demo options] | ./run test [ecast]" in out
    for args in (["test", "rubberband"], ["test", "ecast", "more"], ["test", "-v", "x"]):
        code, out, _ = run(args, dict(os.environ))
        assert code == 2 and "usage: ./run test [ecast] [-v]" in out, args


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


def script(d: Path, name: str, body: str) -> None:
    (d / name).write_text("#!/bin/sh\n" + body)
    (d / name).chmod(0o755)


def fake_machine(tmp: Path, uid: int, sudo: bool) -> dict[str, str]:
    """A PATH without the tests' programs, whose ``apt-get`` logs its arguments and
    "installs" a package by putting its program on the PATH, and a virtual environment
    whose ``python`` only logs how it was run (the suite itself is not run here)."""
    d = bin_dir(
        tmp, "dirname", "sh", "grep", "mktemp", "tail", "rm", "cat", "tee", "touch", "env", "nice"
    )
    log = tmp / "calls.log"
    programs = {
        "openjdk-17-jre-headless": ("java", "echo 'openjdk version \"17.0.9\"' >&2\n"),
        "chromium": ("chromium", ""), "chromium-driver": ("chromedriver", ""),
        "memcached": ("memcached", ""), "openssl": ("openssl", ""), "iproute2": ("ip", ""),
        "nftables": ("nft", ""), "etcd-server": ("etcd", ""), "zookeeper": ("zkServer", ""),
    }  # fmt: skip
    for package, (program, body) in programs.items():
        (tmp / "debs" / package).mkdir(parents=True)
        script(tmp / "debs" / package, program, body)
    script(
        d,
        "apt-get",
        f'echo "apt-get $*" >> {log}\n'
        f"for p do [ -d {tmp}/debs/$p ] && /bin/cp {tmp}/debs/$p/* {d}/; done; exit 0\n",
    )
    script(d, "id", f"echo {uid}\n")
    if sudo:
        script(d, "sudo", f'echo "sudo $*" >> {log}\nif [ "$1" = -n ]; then shift; fi\n"$@"\n')
    venv = tmp / "venv"
    (venv / "bin").mkdir(parents=True)
    script(venv / "bin", "python", f'echo "python $*" >> {log}\n')
    for stamp in (".installed-spark", ".installed-dev"):
        (venv / stamp).touch()
    return {"PATH": str(d), "PYTHON": sys.executable, "VENV": str(venv), "HOME": str(tmp)}


@pytest.mark.parametrize("sudo", [False, True])
def test_as_root_or_with_sudo_the_tests_install_what_they_need(tmp_path: Path, sudo: bool) -> None:
    env = fake_machine(tmp_path, uid=1000 if sudo else 0, sudo=sudo)
    code, out, _ = run(["test"], env)
    assert code == 0, out
    calls = (tmp_path / "calls.log").read_text().splitlines()
    apt = [c for c in calls if c.startswith("apt-get")]
    wanted = ALL_PACKAGES
    # One update and one install of every package, then the suite.
    assert apt == ["apt-get update -qq", f"apt-get install -y -qq {wanted}"], calls
    by_sudo = [c for c in calls if c.startswith("sudo") and "apt-get" in c]
    assert len(by_sudo) == (2 if sudo else 0), calls
    assert f"installing with apt-get: {wanted}" in out, out
    assert "chromium: the web console test drives a real browser" in out, out
    assert any(c.startswith("python -m pytest") for c in calls), calls

    # Now everything is there: nothing is installed again.
    (tmp_path / "calls.log").unlink()
    code, out, _ = run(["test"], env)
    assert code == 0 and "apt-get" not in out, out
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert not any(c.startswith("apt-get") for c in calls), calls


def test_without_root_or_sudo_it_prints_the_command_and_installs_nothing(
    tmp_path: Path,
) -> None:
    env = fake_machine(tmp_path, uid=1000, sudo=False)
    code, out, took = run(["test"], env)
    assert code == 1 and took < 10, out
    assert "sudo apt-get install -y openjdk-17-jre-headless chromium" in out, out
    calls = tmp_path / "calls.log"
    assert not calls.exists() or "apt-get" not in calls.read_text()


def test_when_apt_get_fails_it_says_so_and_stops(tmp_path: Path) -> None:
    env = fake_machine(tmp_path, uid=0, sudo=False)
    failing = 'echo "E: Unable to locate package chromium" >&2\nexit 100\n'
    script(Path(env["PATH"]), "apt-get", failing)
    code, out, _ = run(["test"], env)
    assert code == 1, out
    assert "E: Unable to locate package chromium" in out and "apt-get failed" in out, out
    assert "sudo apt-get install -y openjdk-17-jre-headless" in out, out
    calls = tmp_path / "calls.log"
    assert not calls.exists() or "pytest" not in calls.read_text()  # the suite never ran


def test_as_root_the_venv_module_is_installed_for_the_python_in_use(tmp_path: Path) -> None:
    env = fake_machine(tmp_path, uid=0, sudo=False)
    fake = tmp_path / "fake" / "ensurepip"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named ensurepip')\n")
    env["PYTHONPATH"] = str(fake.parent)
    env["VENV"] = str(tmp_path / "novenv")
    code, out, _ = run(["demo"], env)
    v = f"{sys.version_info[0]}.{sys.version_info[1]}"
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert f"apt-get install -y -qq python{v}-venv" in calls, calls
    # The fake apt-get cannot really install it: the check after says so.
    assert code == 1 and "venv module is still missing" in out, out
