"""Every shell command in ``README.md`` and ``docs/`` is one a user can paste: each block
is valid shell, and each call of one of the project's commands (``ecast``,
``rubberband``, ``python -m ...``, the examples, ``./run``) is accepted by that command's
own argument parser.  The blocks run in bash for real (variables, loops, redirections)
with the project's commands replaced by stand-ins that only record their arguments; the
arguments are then parsed in this process, stopping right after the parse.  The
sequences that operate a cluster also run for real against real daemons
(``tests/integration/test_docs_commands.py``)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import re
import runpy
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHELLS = ("sh", "bash", "shell")
OURS = ("ecast", "rubberband", "python", "python3", "run")
"""Commands whose arguments are checked; a block runs them as stand-ins."""
FOREIGN = ("curl", "pip", "apt-get", "kubectl", "docker", "systemctl", "journalctl")
"""Other programs the docs call: stand-ins that do nothing (they need a network, root or
a running cluster); anything else must exist on this machine."""
MODULES = ("ecast", "rubberband", "jepsen_like", "storage_adapters")


def fenced_blocks(text: str, langs: tuple[str, ...]) -> Iterator[tuple[int, str]]:
    """The fenced blocks of a Markdown text in one of ``langs``, with the line each
    starts on."""
    for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
        if m.group(1) in langs:
            yield text.count("\n", 0, m.start()) + 2, m.group(2)


def shell_blocks(text: str) -> Iterator[tuple[int, str]]:
    return fenced_blocks(text, SHELLS)


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


HELP_EPILOGS = ("rubberband.tools.client",)
"""Modules whose docstring's shell block is a command's ``--help`` epilog."""


def _epilogs() -> list[tuple[str, str]]:
    found = []
    for name in HELP_EPILOGS:
        doc = importlib.import_module(name).__doc__ or ""
        found += [(f"{name} --help:{line}", b) for line, b in shell_blocks(doc)]
    return found


BLOCKS = [
    (f"{doc.relative_to(ROOT)}:{line}", block)
    for doc in documents()
    for line, block in shell_blocks(doc.read_text(encoding="utf-8"))
] + _epilogs()


def test_the_docs_have_shell_blocks_to_check() -> None:
    """The extraction itself: the README's two set-up commands and the Rubberband
    sequence are among the blocks (a change of fence style would skip them silently)."""
    assert len(BLOCKS) >= 20
    readme = "\n".join(b for where, b in BLOCKS if where.startswith("README.md"))
    assert "./run demo" in readme and "./run test" in readme
    assert "cluster up" in readme and "admin --state-dir /tmp/rb expand" in readme


@pytest.mark.parametrize(("where", "block"), BLOCKS, ids=[w for w, _ in BLOCKS])
def test_every_shell_block_is_valid_shell(where: str, block: str) -> None:
    out = subprocess.run(["bash", "-n"], input=block, capture_output=True, text=True)
    assert out.returncode == 0, f"{where}: not valid shell:\n{out.stderr}"


def record_calls(block: str, tmp: Path) -> list[list[str]]:
    """Run ``block`` in bash in ``tmp`` with stand-ins for the project's commands (on the
    path and as ``.venv/bin/*`` and ``./run``); the argument lists they were called with."""
    log = tmp / "calls"
    log.mkdir()
    bin_ = tmp / "bin"
    venv = tmp / ".venv" / "bin"
    for d in (bin_, venv):
        d.mkdir(parents=True)
    recorder = (
        '#!/bin/sh\nf="$(mktemp -p "$DOCS_CALLS")"\nprintf "%s\\0" "$(basename "$0")" "$@" > "$f"\n'
    )
    for name in (*OURS, *FOREIGN):
        for d in (bin_, venv):
            stub = d / name
            stub.write_text(recorder if name in OURS else "#!/bin/sh\nexit 0\n")
            stub.chmod(0o755)
    (tmp / "run").symlink_to(bin_ / "run")
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "DOCS_CALLS": str(log)}
    out = subprocess.run(
        ["bash", "-e", "-c", block], cwd=tmp, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, f"the block failed in bash:\n{out.stderr}"
    by_time = sorted(log.iterdir(), key=lambda f: f.stat().st_mtime_ns)
    calls = [f.read_bytes().split(b"\0")[:-1] for f in by_time]
    return [[a.decode() for a in c] for c in calls]


class _Parsed(Exception):
    """Raised once the outermost argument parse of a command succeeded."""


@contextlib.contextmanager
def stop_after_parsing() -> Iterator[None]:
    """Make any ``argparse`` parser raise ``_Parsed`` when its outermost parse succeeds
    (sub-parsers parse inside it), so that a command checks its arguments and does
    nothing else."""
    names = (
        "parse_args",
        "parse_known_args",
        "parse_intermixed_args",
        "parse_known_intermixed_args",
    )
    originals = {n: getattr(argparse.ArgumentParser, n) for n in names}
    depth = [0]

    def wrap(original: Any) -> Any:
        def parse(self: argparse.ArgumentParser, *a: Any, **k: Any) -> Any:
            depth[0] += 1
            try:
                result = original(self, *a, **k)
            finally:
                depth[0] -= 1
            if depth[0] == 0:
                raise _Parsed
            return result

        return parse

    for n, original in originals.items():
        setattr(argparse.ArgumentParser, n, wrap(original))
    try:
        yield
    finally:
        for n, original in originals.items():
            setattr(argparse.ArgumentParser, n, original)


def check_call(argv: list[str]) -> str | None:
    """Why ``argv`` (one recorded call) would be refused, or ``None`` if its command's
    parser accepts it."""
    name, args = argv[0], argv[1:]
    if name == "run":
        return None if args[:1] in (["demo"], ["test"]) else f"./run {args}: unknown"
    target: Any
    if name in ("ecast", "rubberband"):
        module = importlib.import_module(f"{name}.tools.cli")
        target = lambda: module.main(args)  # noqa: E731
    elif args[:1] == ["-m"]:
        mod = args[1]
        if mod.split(".")[0] not in MODULES:
            return None  # venv, pip: the interpreter's own
        sys_argv = [mod, *args[2:]]
        target = lambda: runpy.run_module(mod, run_name="__main__", alter_sys=True)  # noqa: E731
    elif args[:1] == ["-c"]:
        return None
    elif args and args[0].endswith(".py"):
        path = ROOT / args[0]
        if not path.exists():
            return f"{args[0]}: no such file"
        sys_argv = [str(path), *args[1:]]
        target = lambda: runpy.run_path(str(path), run_name="__main__")  # noqa: E731
    else:
        return f"{argv}: not a call this test knows how to check"
    saved = sys.argv
    err = io.StringIO()
    try:
        if name not in ("ecast", "rubberband"):
            sys.argv = sys_argv
        with (
            stop_after_parsing(),
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(err),
        ):
            target()
    except _Parsed:
        return None
    except SystemExit as e:
        return None if e.code in (0, None) else f"exit {e.code}: {err.getvalue()[-600:]}"
    finally:
        sys.argv = saved
    return None


@pytest.mark.parametrize(("where", "block"), BLOCKS, ids=[w for w, _ in BLOCKS])
def test_every_command_in_the_docs_is_accepted_as_written(
    where: str, block: str, tmp_path: Path
) -> None:
    refused = [
        f"{' '.join(argv)}\n    {why}"
        for argv in record_calls(block, tmp_path)
        if (why := check_call(argv)) is not None
    ]
    assert not refused, f"{where}: commands refused as written:\n  " + "\n  ".join(refused)
