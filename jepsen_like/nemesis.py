"""Faults injected into a real local E-Cast router group, from a seeded schedule.

* ``kill``: SIGKILL a router (the leader the clients last heard of, or a follower), then
  start a new router process under a fresh id that joins the group (routers keep no
  disk state: a router that comes back is a new member).
* ``pause``: SIGSTOP a router for longer than the routers' failure timeout, then SIGCONT
  it.  The group suspects it and moves on; a paused router that was expelled must not
  act as a member when it resumes (it stops, or is ignored).

One fault at a time, and never more than a minority of the routers down or paused, so
the group keeps a majority: faults beyond the failure model (a lost majority) test
nothing the product promises.  Every fault is healed before the run ends: paused routers
are resumed, and the run gives the group time to settle before its clients stop.
"""

from __future__ import annotations

import os
import random
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from ecast import local

LocalCluster = local.LocalCluster

KINDS = ("kill", "pause")


@dataclass
class Fault:
    kind: str
    target: str
    start: float
    end: float | None = None
    """When it was healed (a killed router's replacement started, a paused one resumed)."""
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "target": self.target, "start": round(self.start, 2),
                "end": None if self.end is None else round(self.end, 2), **self.detail}  # fmt: skip


class RouterNemesis:
    """Called by the run every quarter second; injects one fault at a time."""

    def __init__(
        self,
        kinds: tuple[str, ...],
        seed: int,
        until: float,
        *,
        first: float = 3.0,
        gap: tuple[float, float] = (2.0, 4.0),
        pause: tuple[float, float] = (3.0, 5.0),
        say: Any = print,
    ) -> None:
        unknown = [k for k in kinds if k not in KINDS]
        if unknown:
            raise ValueError(f"unknown faults {unknown}; known: {', '.join(KINDS)}")
        self.kinds = kinds
        self.rng = random.Random(seed)
        self.until = until
        """No new fault after this (seconds into the run): the rest is for settling."""
        self.gap = gap
        self.pause = pause
        self.next_at = first
        self.faults: list[Fault] = []
        self.active: Fault | None = None
        self.size = 3
        """Routers the group keeps: a router gone for good is replaced by a new one."""
        self._fresh = 0
        self.say = say

    def __call__(self, elapsed: float, cluster: LocalCluster, leader: str) -> None:
        f = self.active
        if f is not None:
            if f.kind == "pause" and elapsed >= f.detail["resume_at"]:
                self._resume(cluster, f, elapsed)
            return
        if not self.kinds or elapsed < self.next_at or elapsed >= self.until:
            return
        live = sorted(r for r, lr in cluster.routers.items() if lr.alive())
        if len(live) < self.size:
            # A paused router the group expelled stops when it resumes: a new process
            # under a fresh id takes its place, as for a kill.
            if _settled(cluster, live):
                fresh = self._join(cluster, live)
                self.say(f"{elapsed:7.2f}s  {fresh} joins ({self.size - len(live)} gone)")
            return
        if not _settled(cluster, live):
            return  # the last fault's view change is not over: wait for it
        kind = self.rng.choice(self.kinds)
        target = leader if leader in live and self.rng.random() < 0.5 else self.rng.choice(live)
        role = "leader" if target == leader else "follower"
        if kind == "kill":
            cluster.kill(target)
            fresh = self._join(cluster, [r for r in live if r != target])
            f = Fault("kill", target, elapsed, elapsed, {"role": role, "replacement": fresh})
            self.say(f"{elapsed:7.2f}s  kill {role} {target}; {fresh} joins in its place")
        else:
            hold = self.rng.uniform(*self.pause)
            os.kill(cluster.routers[target].proc.pid, signal.SIGSTOP)
            f = Fault("pause", target, elapsed, None, {"role": role, "resume_at": elapsed + hold})
            self.active = f
            self.say(f"{elapsed:7.2f}s  pause {role} {target} for {hold:.1f}s")
        self.faults.append(f)
        self.next_at = elapsed + self.rng.uniform(*self.gap)

    def _join(self, cluster: LocalCluster, live: list[str]) -> str:
        self._fresh += 1
        fresh = f"j{self._fresh}"
        cluster.start(fresh, cluster.routers[live[0]].address)
        return fresh

    def _resume(self, cluster: LocalCluster, f: Fault, elapsed: float) -> None:
        proc = cluster.routers[f.target].proc
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
        f.end = elapsed
        self.active = None
        self.next_at = max(self.next_at, elapsed + self.gap[0])
        self.say(f"{elapsed:7.2f}s  resume {f.target}")

    def heal(self, cluster: LocalCluster) -> None:
        if self.active is not None and self.active.kind == "pause":
            self._resume(cluster, self.active, self.active.detail["resume_at"])
        # A resumed router that the group expelled learns it and leaves; give it a moment.
        time.sleep(0.5)

    def report(self) -> dict[str, Any]:
        by_kind: dict[str, int] = {}
        for f in self.faults:
            by_kind[f.kind] = by_kind.get(f.kind, 0) + 1
        return {"by_kind": by_kind, "faults": [f.to_json() for f in self.faults]}


def _settled(cluster: LocalCluster, live: list[str]) -> bool:
    """Every live router is a member of one view of exactly the live routers."""
    for r in live:
        h = cluster.routers[r].health()
        if not h or h.get("status") != "ok" or sorted(h.get("members", ())) != live:
            return False
    return True
