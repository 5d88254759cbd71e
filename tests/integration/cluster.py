"""Real router daemons on 127.0.0.1 for integration tests (used through the SDK and CLI only)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SECRET = "integration-secret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RouterProc:
    id: str
    port: int
    metrics: int
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def health(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics}/health", timeout=1) as r:
                return json.loads(r.read())
        except Exception:
            return None

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics}/metrics", timeout=1) as r:
            return r.read().decode()

    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class Cluster:
    workdir: Path
    routers: dict[str, RouterProc] = field(default_factory=dict)

    def start(self, rid: str, join: str | None = None, *extra: str) -> RouterProc:
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
            *extra,
        ]
        if join:
            cmd += ["--join", join]
        env = {**os.environ, "ECAST_SECRET": SECRET}
        proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)
        r = RouterProc(rid, port, metrics, proc, log)
        self.routers[rid] = r
        return r

    def wait_healthy(
        self, rid: str, members: int | None = None, timeout: float = 15.0
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        h = None
        while time.monotonic() < deadline:
            h = self.routers[rid].health()
            if h and h.get("status") == "ok" and (members is None or len(h["members"]) == members):
                return h
            time.sleep(0.05)
        raise AssertionError(
            f"{rid} not healthy in time: {h}\n{self.routers[rid].log.read_text()[-3000:]}"
        )

    def start_group(self, n: int) -> list[RouterProc]:
        first = self.start("r1")
        self.wait_healthy("r1")
        for i in range(2, n + 1):
            self.start(f"r{i}", first.address)
        for i in range(1, n + 1):
            self.wait_healthy(f"r{i}", members=n)
        return [self.routers[f"r{i}"] for i in range(1, n + 1)]

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


class Recorder:
    """What one SDK client submitted, had acknowledged and delivered."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.name = client.name
        self.delivered: list[tuple[int, str, Any, Any]] = []  # (t, sender, id, payload)
        self.acked: dict[Any, int | None] = {}
        self.task = asyncio.create_task(self._drain())

    async def _drain(self) -> None:
        async for d in self.client.deliveries():
            if not d.unsafe:
                m = d.message
                self.delivered.append((d.t, m.sender, m.id, m.payload))

    def payloads(self) -> list[Any]:
        return [p for _t, _s, _i, p in self.delivered if p is not None]


def check_guarantees(recs: list[Recorder], correct: list[Recorder]) -> list[str]:
    """The simulator's guarantees, on what real clients delivered."""
    problems: list[str] = []
    at_t: dict[int, Any] = {}
    for r in recs:
        last = -1
        seen = set()
        for t, _sender, mid, _p in r.delivered:
            if t <= last:
                problems.append(f"total-order: {r.name} delivered t={t} after t={last}")
            last = t
            if mid in seen:
                problems.append(f"no-duplicates: {r.name} delivered {mid} twice")
            seen.add(mid)
            other = at_t.setdefault(t, mid)
            if other != mid:
                problems.append(f"prefix-agreement: t={t} is {mid} at {r.name}, {other} elsewhere")
    # Gap-free per session, at every client.
    for r in recs:
        nxt: dict[Any, int] = {}
        for _t, _sender, (session, seq), _p in r.delivered:
            want = nxt.get(session)
            if want is not None and seq != want:
                problems.append(f"gap-free: {r.name} got {session}#{seq}, expected #{want}")
            nxt[session] = seq + 1
    # Nothing acknowledged is lost: every acked message reached every correct client that
    # was a member when it was ordered.
    got = {c.name: {d[2] for d in c.delivered} for c in correct}
    for r in recs:
        for mid, t in r.acked.items():
            if t is None:
                continue
            for c in correct:
                joined = c.delivered[0][0] if c.delivered else None
                if joined is not None and t >= joined and mid not in got[c.name]:
                    problems.append(
                        f"uniform-agreement: {mid} (t={t}) acked, {c.name} never got it"
                    )
                    break
    return problems[:10]
