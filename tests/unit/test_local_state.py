"""A local cluster's state directory: what every tool over it recorded stays recorded."""

from __future__ import annotations

import platform
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ecast import local

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_a_second_state_dir_over_a_cluster_keeps_the_clusters_records(tmp_path: Path) -> None:
    """A test or tool that starts one more process in a cluster's directory must not make
    ``cluster down`` forget the processes the cluster started (they leaked)."""
    first = local.StateDir(tmp_path)
    second = local.StateDir(tmp_path)
    started = [first.start("router1", SLEEP), first.start("storage1", SLEEP)]
    started.append(second.start("storage5", SLEEP))
    try:
        recorded = local.StateDir.recorded(tmp_path)
        assert set(recorded) == {"router1", "storage1", "storage5"}
        assert {recorded[d.name]["pid"] for d in started} == {d.pid for d in started}
    finally:
        for d in started:
            d.proc.kill()
            d.proc.wait()


def test_free_ports_are_never_handed_out_twice_while_claimed() -> None:
    """A cluster picks its ports before its daemons bind them; two clusters side by side
    drew the same one.  200 random picks among ~22,000 ports repeat one more often than
    not; claimed picks never do, in this process or another."""
    ports = [local.free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    other = subprocess.run(
        [sys.executable, "-c", "from ecast import local; print(local.free_port())"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert int(other.stdout) not in ports


def test_a_processes_kernel_state_says_what_it_waits_on() -> None:
    """What a SIGKILLed process that is slow to go is doing: its state and wait channel
    (and nothing but a clear note for a process that is gone)."""
    from ecast.tools.local import kernel_state

    child = subprocess.Popen(SLEEP)
    try:
        for _ in range(100):
            if "stat='S'" in kernel_state(child.pid):
                break
            time.sleep(0.02)
        assert "stat='S'" in kernel_state(child.pid) and "wchan=" in kernel_state(child.pid)
    finally:
        child.kill()
        child.wait()
    assert "FileNotFoundError" in kernel_state(child.pid)


_SYS_EXIT = {"x86_64": 60, "aarch64": 93}.get(platform.machine())
"""``exit(2)`` (the calling thread's, not the process's) on the machines this runs on."""


@pytest.mark.skipif(_SYS_EXIT is None, reason="thread exit syscall number unknown here")
def test_a_process_whose_main_thread_is_a_zombie_runs_while_another_thread_does() -> None:
    """The main thread gone first (a zombie), another still running: the process still
    holds its files, so it still runs; once that thread ends, it does not."""
    code = (
        "import ctypes, threading, time\n"
        "threading.Thread(target=time.sleep, args=(1.5,)).start()\n"
        f"ctypes.CDLL(None).syscall({_SYS_EXIT}, 0)\n"  # only the main thread exits
    )
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 10
        while "stat='Z'" not in local.kernel_state(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "stat='Z'" in local.kernel_state(child.pid), local.kernel_state(child.pid)
        assert local.running(child.pid), "a zombie main thread with a live thread runs"
        while local.running(child.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not local.running(child.pid), "every thread ended: the process runs no more"
    finally:
        child.kill()
        child.wait()
