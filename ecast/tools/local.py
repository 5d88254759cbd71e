"""A router group of real daemons on 127.0.0.1: for the demo, the benchmark and the tests.

Each router is a separate OS process started with ``python -m ecast router``; the group is
driven only through the daemon's command line, its signals and its ``/health`` endpoint,
exactly as an operator would.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LocalRouter:
    id: str
    port: int
    metrics: int
    proc: subprocess.Popen[bytes]
    log: Path
    join: str | None = None
    extra: tuple[str, ...] = ()
    """How it was started (``LocalCluster.start``), to start it again on fresh ports."""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def health(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics}/health", timeout=1) as r:
                return dict(json.loads(r.read()))
        except Exception:
            return None

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics}/metrics", timeout=1) as r:
            return str(r.read().decode())

    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class LocalCluster:
    """Routers ``r1``, ``r2``, ... as daemons; ``args`` go to every one of them."""

    workdir: Path
    secret: str
    args: Sequence[str] = ()
    routers: dict[str, LocalRouter] = field(default_factory=dict)

    def start(self, rid: str, join: str | None = None, *extra: str) -> LocalRouter:
        return self._spawn(rid, join, extra)

    def _spawn(self, rid: str, join: str | None, extra: tuple[str, ...]) -> LocalRouter:
        port, metrics = free_port(), free_port()
        log = self.workdir / f"{rid}.log"
        cmd = [
            sys.executable,
            "-m",
            "ecast",
            "router",
            "--id",
            rid,
            "--listen",
            f"127.0.0.1:{port}",
            "--metrics",
            f"127.0.0.1:{metrics}",
            *self.args,
            *extra,
        ]
        if join:
            cmd += ["--join", join]
        env = {**os.environ, "ECAST_SECRET": self.secret}
        with log.open("wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        r = LocalRouter(rid, port, metrics, proc, log, join, extra)
        self.routers[rid] = r
        return r

    def wait_healthy(
        self, rid: str, members: int | None = None, timeout: float = 30.0
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        h = None
        while time.monotonic() < deadline:
            h = self.routers[rid].health()
            if h and h.get("status") == "ok" and (members is None or len(h["members"]) == members):
                return h
            r = self.routers[rid]
            if not r.alive():
                if not self._lost_port_race(r):
                    break
                # ``free_port`` closes its probe before the router binds, and another
                # process may take the port in between.  The router failed before it
                # joined anything, so the same id may try again on fresh ports.
                self._spawn(rid, r.join, r.extra)
            time.sleep(0.05)
        raise RuntimeError(
            f"{rid} not healthy in time: {h}\n{self.routers[rid].log.read_text()[-3000:]}"
        )

    @staticmethod
    def _lost_port_race(r: LocalRouter) -> bool:
        text = r.log.read_text(errors="replace")
        joined = "event=bootstrap" in text or "event=joining" in text
        return "address already in use" in text and not joined

    def start_group(self, n: int) -> list[LocalRouter]:
        first = self.start("r1")
        self.wait_healthy("r1")
        for i in range(2, n + 1):
            self.start(f"r{i}", first.address)
        for i in range(1, n + 1):
            self.wait_healthy(f"r{i}", members=n)
        return [self.routers[f"r{i}"] for i in range(1, n + 1)]

    def leader(self) -> str | None:
        """The first member of the view, as the live routers report it."""
        for r in self.routers.values():
            h = r.health() if r.alive() else None
            if h and h.get("status") == "ok":
                return str(h["leader"])
        return None

    def kill(self, rid: str) -> None:
        self.routers[rid].proc.send_signal(signal.SIGKILL)
        self.routers[rid].proc.wait(5)

    def terminate(self, rid: str, timeout: float = 10.0) -> int:
        self.routers[rid].proc.send_signal(signal.SIGTERM)
        return self.routers[rid].proc.wait(timeout)

    def addresses(self) -> list[str]:
        return [r.address for r in self.routers.values() if r.alive()]

    def stop_all(self) -> None:
        for r in self.routers.values():
            if r.alive():
                r.proc.kill()
                r.proc.wait(5)
