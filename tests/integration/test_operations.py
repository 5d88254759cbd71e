"""What an operator sees on real daemons: health, errors at start, rejoining, the shell
commands, and an interactive example that leaves cleanly on Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ecast.tools.local import LocalCluster, free_port
from tests.integration.cluster import SECRET

ROOT = Path(__file__).resolve().parents[2]


def ecast_cmd(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ecast", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "ECAST_SECRET": SECRET, **(env or {})},
    )


def test_the_shell_commands_submit_tail_list_and_suspect(tmp_path: Path) -> None:
    c = LocalCluster(tmp_path, SECRET)
    try:
        c.start_group(3)
        routers = ",".join(c.addresses())
        tail = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ecast",
                "tail",
                "--routers",
                routers,
                "--name",
                "tailer",
                "--count",
                "3",
                "--no-membership",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "ECAST_SECRET": SECRET},
        )
        time.sleep(1.5)  # joined
        out = ecast_cmd("submit", "--routers", routers, "--header", '{"key": 7}', "one", "two")
        assert out.returncode == 0, out.stderr
        acks = [json.loads(line) for line in out.stdout.splitlines()]
        assert len(acks) == 2 and all(a["delivered"] for a in acks)
        listed = ecast_cmd("members", "--routers", routers)
        assert listed.returncode == 0, listed.stderr
        assert "tailer" in json.loads(listed.stdout)["members"]
        piped = subprocess.run(
            [sys.executable, "-m", "ecast", "submit", "--routers", routers, "-"],
            input="three\n",
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "ECAST_SECRET": SECRET},
        )
        assert piped.returncode == 0, piped.stderr
        lines, _err = tail.communicate(timeout=30)
        got = [json.loads(line) for line in lines.splitlines()]
        assert [g["payload"] for g in got] == ["one", "two", "three"]
        assert got[0]["header"] == {"key": 7} and got[0]["t"] < got[1]["t"] < got[2]["t"]
        watcher = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.lease_client",
                "--routers",
                routers,
                "--name",
                "doomed",
                "--secret",
                SECRET,
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert watcher.stdout is not None and "joined" in watcher.stdout.readline()
        gone = ecast_cmd("suspect", "--routers", routers, "doomed")
        assert gone.returncode == 0 and json.loads(gone.stdout)["suspected"] == ["doomed"]
        assert watcher.wait(15) == 3  # it learned it was suspected
        bad = ecast_cmd("submit", "--routers", routers, "x", env={"ECAST_SECRET": "wrong-one"})
        assert bad.returncode == 1 and "secret" in bad.stderr and "Traceback" not in bad.stderr
    finally:
        c.stop_all()


def test_health_says_degraded_and_names_what_it_waits_for(tmp_path: Path) -> None:
    c = LocalCluster(tmp_path, SECRET, ["--client-lease", "30", "--health-unstable-age", "1"])
    try:
        c.start_group(3)
        routers = ",".join(c.addresses())
        stuck = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.lease_client",
                "--routers",
                routers,
                "--name",
                "stuck",
                "--secret",
                SECRET,
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert stuck.stdout is not None and "joined" in stuck.stdout.readline()
        stuck.send_signal(signal.SIGSTOP)  # alive to the kernel, silent to the group
        out = ecast_cmd("submit", "--routers", routers, "--timeout", "3", "waits")
        assert out.returncode == 1 and "did not come within 3 s" in out.stderr
        leader = c.routers[c.leader() or "r1"]
        deadline = time.monotonic() + 10
        h = leader.health()
        while (h is None or h["status"] != "degraded") and time.monotonic() < deadline:
            time.sleep(0.2)
            h = leader.health()
        assert h is not None and h["status"] == "degraded", h
        assert "stuck" in h["waiting_for"] and "stuck" in h["reason"]
        import urllib.error
        import urllib.request

        try:
            urllib.request.urlopen(f"http://127.0.0.1:{leader.metrics}/health", timeout=2)
            raise AssertionError("degraded health answered 200")
        except urllib.error.HTTPError as e:
            assert e.code == 503
        assert "ecast_oldest_unstable_seconds" in leader.metrics_text()
        stuck.send_signal(signal.SIGCONT)
        stuck.kill()
    finally:
        c.stop_all()


def test_health_never_names_an_unreachable_leader(tmp_path: Path) -> None:
    c = LocalCluster(tmp_path, SECRET)
    try:
        c.start_group(3)
        for rid in ("r1", "r2"):
            c.routers[rid].daemon.signal(signal.SIGSTOP)
        deadline = time.monotonic() + 10
        h = c.routers["r3"].health()
        while (h is None or h["status"] != "no-quorum") and time.monotonic() < deadline:
            time.sleep(0.2)
            h = c.routers["r3"].health()
        assert h is not None and h["status"] == "no-quorum", h
        assert h["leader"] is None and "1 of 3 routers reachable" in h["reason"]
        for rid in ("r1", "r2"):
            c.routers[rid].daemon.signal(signal.SIGCONT)
    finally:
        c.stop_all()


def test_a_removed_router_rejoins_under_a_fresh_id(tmp_path: Path) -> None:
    c = LocalCluster(tmp_path, SECRET)
    try:
        c.start_group(2)
        r3 = c.start("r3", c.routers["r1"].address, "--rejoin")
        c.wait_healthy("r3", members=3)
        r3.daemon.signal(signal.SIGSTOP)
        c.wait_healthy("r1", members=2)  # the group removed it
        r3.daemon.signal(signal.SIGCONT)
        deadline = time.monotonic() + 20
        h = None
        while time.monotonic() < deadline:
            h = c.routers["r1"].health()
            if h and "r3.1" in h["members"]:
                break
            time.sleep(0.2)
        assert h is not None and "r3.1" in h["members"] and len(h["members"]) == 3, h
        assert r3.alive() and "event=rejoining router=r3.1" in r3.log.read_text()
    finally:
        c.stop_all()


def test_a_retired_id_and_a_wrong_secret_are_refused_at_start(tmp_path: Path) -> None:
    c = LocalCluster(tmp_path, SECRET)
    try:
        c.start_group(3)
        assert c.terminate("r3") == 0  # parts: r3 is retired for good
        c.wait_healthy("r1", members=2)
        again = c.start("r3", c.routers["r1"].address)
        assert again.daemon.proc.wait(30) == 2
        assert "ids are unique for ever" in again.log.read_text()
        wrong = tmp_path / "wrong-secret"
        wrong.write_text("not-the-cluster-secret-at-all")
        wrong.chmod(0o600)
        port = free_port()
        start = time.monotonic()
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "ecast",
                "router",
                "--id",
                "r9",
                "--listen",
                f"127.0.0.1:{port}",
                "--join",
                c.routers["r1"].address,
                "--secret-file",
                str(wrong),
                "--join-timeout",
                "5",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 2 and "secret differs" in out.stderr
        assert time.monotonic() - start < 30
    finally:
        c.stop_all()


def test_ctrl_c_in_the_chat_example_parts_cleanly(tmp_path: Path) -> None:
    c = LocalCluster(tmp_path, SECRET)
    try:
        c.start_group(3)
        chat = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "examples" / "chat.py"),
                "--name",
                "carol",
                "--routers",
                ",".join(c.addresses()),
            ],
            stdin=subprocess.PIPE,  # stays open: the example waits on it
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "ECAST_SECRET": SECRET},
        )
        assert chat.stdout is not None and "joined as carol" in chat.stdout.readline()
        time.sleep(0.5)
        chat.send_signal(signal.SIGINT)
        out, _ = chat.communicate(timeout=15)
        assert chat.returncode == 0 and "leaving the room" in out
        listed = ecast_cmd("members", "--routers", ",".join(c.addresses()))
        assert "carol" not in json.loads(listed.stdout)["members"]  # it parted
    finally:
        c.stop_all()
