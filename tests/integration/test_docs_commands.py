"""The README's and docs' sequences that operate a cluster, run as written against real
daemons: the Rubberband sequence (up, status, add, expand, replace, a dry run, down),
the README's SDK snippet between them, and the ``rubberband client`` examples on
the memory and the scan engine.  Only the
paths change (the state directory, the virtual environment's ``bin``): every other word
is the documents'.  ``tests/unit/test_docs_commands.py`` checks every other command's
syntax and arguments."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ecast.tools.local import free_port
from tests.unit.test_docs_commands import ROOT, SHELLS, fenced_blocks

BIN = str(Path(sys.executable).parent)


def block(doc: str, marker: str, lang: str = "sh") -> str:
    """The one fenced block of ``doc`` in ``lang`` that contains ``marker``."""
    text = (ROOT / doc).read_text(encoding="utf-8")
    langs = SHELLS if lang == "sh" else (lang,)
    found = [b for _, b in fenced_blocks(text, langs) if marker in b]
    assert len(found) == 1, f"{doc}: {len(found)} blocks contain {marker!r}"
    return found[0]


def bash(script: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``script`` in bash, stopping at the first command that fails, each command echoed
    (``-x``) so that a failure names its line."""
    return subprocess.run(
        ["bash", "-e", "-x", "-c", script],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(cwd), "LANG": "C.UTF-8"},
    )


def split_down(seq: str) -> tuple[str, str]:
    """A block that starts a cluster: (everything before its last line, which is
    ``cluster down``; that line with the block's variable assignments before it)."""
    lines = seq.strip().splitlines()
    assert "cluster down" in lines[-1], "the sequence ends with cluster down"
    assignments = [line for line in lines if re.fullmatch(r"\w+=\S+", line.strip())]
    return "\n".join(lines[:-1]), "\n".join([*assignments, lines[-1]])


def test_the_readme_rubberband_sequence_runs_as_written(tmp_path: Path) -> None:
    state = tmp_path / "rb"
    seq = block("README.md", "cluster up").replace("/tmp/rb", str(state))
    run, down = split_down(seq.replace(".venv/bin/", f"{BIN}/"))
    try:
        out = bash(run, tmp_path)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        # The expand and the replace ran (they wait until done), the dry run changed nothing.
        status = bash(f"{BIN}/rubberband cluster status --state-dir {state}", tmp_path)
        assert status.returncode == 0, status.stderr
        assert "storage:5" in status.stdout and "storage:6" in status.stdout, status.stdout
        assert "storage:1" in status.stdout, status.stdout
        # The README's Python snippet against the same cluster, as written (top-level
        # awaits: a user's notebook or ``python -m asyncio``).
        snippet = block("README.md", "rubberband.connect", "python").replace("/tmp/rb", str(state))
        program = "import asyncio\n\nasync def main():\n" + textwrap.indent(snippet, "    ")
        program += "\nasyncio.run(main())\n"
        py = subprocess.run(
            [sys.executable, "-c", program], capture_output=True, text=True, timeout=120
        )
        assert py.returncode == 0, py.stderr[-3000:]
    finally:
        out = bash(down, tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]


@pytest.mark.parametrize("marker", ["--state-dir D put", "--state-dir T create-table"])
def test_the_client_command_examples_run_as_written(marker: str, tmp_path: Path) -> None:
    """``docs/rubberband.md``'s ``rubberband client`` examples, each block from its
    ``cluster up`` to its ``cluster down``: key-values on the memory engine, tables on
    the scan engine."""
    seq = block("docs/rubberband.md", marker)
    state = tmp_path / "state"
    run, down = split_down(re.sub(r"--state-dir [DT]\b", f"--state-dir {state}", seq))
    try:
        out = bash(run, tmp_path)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        if "create-table" in marker:
            assert "ZRH" in out.stdout and "GVA" not in out.stdout  # selected before the update
            after = f"rubberband client --state-dir {state} select tickets --where 'rloc = AB12CD'"
            check = bash(after, tmp_path)
            assert check.returncode == 0 and "GVA" in check.stdout, check.stdout + check.stderr
        else:
            assert '"one"' in out.stdout and '"n": 2' in out.stdout, out.stdout
    finally:
        out = bash(down, tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]


def test_the_readme_ecast_sequence_runs_as_written(tmp_path: Path) -> None:
    """Credentials, three routers in the background, their health and metrics, then the
    command-line tools twice as alice (fresh names her credential covers) and the chat
    example (stdin at its end at once: it joins, says who is in the room and leaves).
    The fixed ports become free ones."""
    seq = block("README.md", "credentials init").replace(".venv/bin/", f"{BIN}/")
    for fixed in ("7001", "7002", "7003", "9001"):
        seq = seq.replace(f"127.0.0.1:{fixed}", f"127.0.0.1:{free_port()}")
    # The routers run as the block's background jobs; they stop with the block.
    script = "trap 'kill $(jobs -p) 2>/dev/null; wait' EXIT\n" + seq
    script = script.replace("$ecast members", "$ecast members\n$ecast members")
    (tmp_path / "examples").symlink_to(ROOT / "examples")  # the block runs from the root
    out = bash(script, tmp_path, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert '"status": "ok"' in out.stdout or '"status":"ok"' in out.stdout, out.stdout[-2000:]
    assert "ecast_" in out.stdout  # the metrics' head
    assert out.stdout.count('"id": [["alice.') == 2, out.stdout[-2000:]  # two submitted
    assert "* joined as alice" in out.stdout, out.stdout[-2000:]
