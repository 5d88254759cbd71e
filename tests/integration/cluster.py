"""Real router daemons on 127.0.0.1 for integration tests (used through the SDK and CLI only)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ecast.tools.local import LocalCluster, LocalRouter

SECRET = "integration-5f1c0a9e7b3d42c68e0f9a1b2c3d4e5f"


RouterProc = LocalRouter


def Cluster(workdir: Path) -> LocalCluster:
    return LocalCluster(workdir, SECRET)


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
                # Membership messages carry no application payload (a process's own join
                # carries the members it joined).
                payload = m.payload if d.kind is None else None
                self.delivered.append((d.t, m.sender, m.id, payload))

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
