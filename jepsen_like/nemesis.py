"""Faults injected into a real local E-Cast router group, from a seeded schedule.

* ``kill``: SIGKILL a router (the leader the clients last heard of, or a follower), then
  start a new router process under a fresh id that joins the group (routers keep no
  disk state: a router that comes back is a new member).
* ``pause``: SIGSTOP a router for longer than the routers' failure timeout, then SIGCONT
  it.  The group suspects it and moves on; a paused router that was expelled must not
  act as a member when it resumes (it stops, or is ignored).
* ``partition`` (network namespaces, :mod:`jepsen_like.net`): the leader isolated from
  everyone, a follower isolated, a split of the routers into a minority and a majority
  with the clients and receivers spread over both sides, or one client or receiver
  process cut off from every router, for 2 to 4 s; at most 3.5 s for an application cut
  off alone and 3 s for one on a split's minority side (which must find the majority's
  new leader after the heal): less than the client lease, so application processes are
  not suspected; isolated routers are.
* ``pause-app``: SIGSTOP a client or the receivers' process past the client lease (6 to
  8 s against the default 5 s), then SIGCONT it.  The routers expire its lease and the
  group suspects it; when it resumes it must learn that it was declared faulty and never
  act under that name again (the workers go on as new processes under fresh names, and
  the checkers hold the suspected ones to the guarantees of faulty processes).
* ``stall``: one router sends nothing for 0.5 to 0.9 s while it goes on receiving (its
  outgoing packets dropped): shorter than the routers' failure timeout, so it is not
  expelled, but a stalled leader goes on proposing what clients send it while nobody
  hears of it.  Clients whose progress timeout is shorter than the stall resend through
  another router, which proposes the same messages again: the race that routers'
  deduplication at learning time resolves.
* ``slow``: one router's link limited to 1 Mbit/s for 3 to 5 s.
* ``loss``: one router loses 5 to 25 % of its packets each way for 3 to 5 s.
* ``reconfigure``: a router joins (the group grows to 4), or one of 4 parts gracefully
  (SIGTERM), leader or follower.

One fault at a time, and never more than a minority of the routers down, paused or cut
off, so the group keeps a majority: faults beyond the failure model (a lost majority)
test nothing the product promises.  Every fault is healed before the run ends, and the
run gives the group time to settle before its clients stop.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from ecast import local
from jepsen_like.net import Net

LocalCluster = local.LocalCluster

KINDS = (
    "kill", "pause", "pause-app", "partition", "stall", "slow", "loss", "reconfigure",
    "power-cut",
)  # fmt: skip
NET_KINDS = frozenset({"partition", "stall", "slow", "loss"})
"""Faults that need network namespaces."""


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
        net: Net | None = None,
        apps: tuple[str, ...] = (),
        first: float = 3.0,
        gap: tuple[float, float] = (2.0, 4.0),
        pause: tuple[float, float] = (3.0, 5.0),
        say: Any = print,
    ) -> None:
        unknown = [k for k in kinds if k not in KINDS]
        if unknown:
            raise ValueError(f"unknown faults {unknown}; known: {', '.join(KINDS)}")
        if net is None and NET_KINDS & set(kinds):
            raise ValueError(f"{', '.join(sorted(NET_KINDS & set(kinds)))} need network namespaces")
        self.kinds = kinds
        self.rng = random.Random(seed)
        self.until = until
        """No new fault after this (seconds into the run): the rest is for settling."""
        self.net = net
        self.apps = apps
        """Application processes with namespaces of their own (clients, receivers)."""
        self.app_pids: dict[str, int] = {}
        """Application processes by name, for ``pause-app`` (see :meth:`attach`)."""
        self.gap = gap
        self.pause = pause
        self.next_at = first
        self.faults: list[Fault] = []
        self.active: Fault | None = None
        self.size = 3
        """Routers the group keeps: a router gone for good is replaced by a new one."""
        self._fresh = 0
        self.say = say
        self._unsettled_since: float | None = None
        self._said_after = 0.0
        self.wall0: float | None = None
        """The wall-clock time the run's clock started (its first call), for reports."""

    def __call__(self, elapsed: float, cluster: LocalCluster, leader: str) -> None:
        if self.wall0 is None:
            self.wall0 = time.time() - elapsed
        f = self.active
        if f is not None:
            if elapsed >= f.detail["heal_at"]:
                self._heal(cluster, f, elapsed)
            return
        if not self.kinds or elapsed < self.next_at or elapsed >= self.until:
            return
        live = sorted(r for r, lr in cluster.routers.items() if lr.alive())
        if len(live) < self.size:
            # A paused or isolated router the group expelled stops when it is back: a
            # new process under a fresh id takes its place, as for a kill.
            if self._settled(elapsed, cluster, live):
                fresh = self._join(cluster, live)
                self.say(f"{elapsed:7.2f}s  {fresh} joins ({self.size - len(live)} gone)")
            return
        if not self._settled(elapsed, cluster, live):
            return  # the last fault's view change is not over: wait for it
        kind = self.rng.choice(self.kinds)
        if kind == "pause-app" and not self.app_pids:
            return  # no application process to pause yet
        target = leader if leader in live and self.rng.random() < 0.5 else self.rng.choice(live)
        role = "leader" if target == leader else "follower"
        f = getattr(self, f"_{kind.replace('-', '_')}")(elapsed, cluster, live, target, role)
        self.faults.append(f)
        if f.end is None:
            self.active = f
        self.next_at = elapsed + self.rng.uniform(*self.gap)

    def _settled(self, elapsed: float, cluster: LocalCluster, live: list[str]) -> bool:
        """Whether the next fault may come; says every 5 s why it may not, so a run that
        stops injecting shows what it waits for."""
        why = _unsettled(cluster, live)
        if why is None:
            self._unsettled_since = None
            return True
        if self._unsettled_since is None:
            self._unsettled_since, self._said_after = elapsed, 0.0
        waited = elapsed - self._unsettled_since
        if waited >= self._said_after + 5.0:
            self._said_after = waited
            self.say(f"{elapsed:7.2f}s  waiting {waited:.0f}s to settle: {why}")
        return False

    # ------------------------------------------------------------------ faults
    def _kill(self, elapsed: float, cluster: LocalCluster, live: list[str], target: str,
              role: str) -> Fault:  # fmt: skip
        cluster.kill(target)
        fresh = self._join(cluster, [r for r in live if r != target])
        self.say(f"{elapsed:7.2f}s  kill {role} {target}; {fresh} joins in its place")
        return Fault("kill", target, elapsed, elapsed, {"role": role, "replacement": fresh})

    def _pause(self, elapsed: float, cluster: LocalCluster, live: list[str], target: str,
               role: str) -> Fault:  # fmt: skip
        hold = self.rng.uniform(*self.pause)
        os.kill(cluster.routers[target].proc.pid, signal.SIGSTOP)
        self.say(f"{elapsed:7.2f}s  pause {role} {target} for {hold:.1f}s")
        return Fault("pause", target, elapsed, None, {"role": role, "heal_at": elapsed + hold})

    def _pause_app(self, elapsed: float, cluster: LocalCluster, live: list[str], target: str,
                   role: str) -> Fault:  # fmt: skip
        app = self.rng.choice(sorted(self.app_pids))
        hold = self.rng.uniform(6.0, 8.0)  # past the routers' default 5 s client lease
        os.kill(self.app_pids[app], signal.SIGSTOP)
        self.say(f"{elapsed:7.2f}s  pause application {app} for {hold:.1f}s (past its lease)")
        detail = {"role": "application", "heal_at": elapsed + hold}
        return Fault("pause-app", app, elapsed, None, detail)

    def _partition(self, elapsed: float, cluster: LocalCluster, live: list[str], target: str,
                   role: str) -> Fault:  # fmt: skip
        assert self.net is not None
        hold = self.rng.uniform(2.0, 4.0)
        others = [r for r in live if r != target]
        variants = ["isolated", "split"] + (["app-cut"] if self.apps else [])
        variant = self.rng.choice(variants)
        if variant == "isolated":
            # The leader (or a follower) alone: cut from every router and application.
            side_a, side_b = [target], [*others, *self.apps]
            what = f"{role} {target} isolated"
        elif variant == "split":
            # A minority side (the target) and a majority side, each with some of the
            # clients and receivers: those with the minority stall until the heal.
            apps = list(self.apps)
            self.rng.shuffle(apps)
            k = self.rng.randint(0, len(apps))
            side_a, side_b = [target, *apps[:k]], [*others, *apps[k:]]
            if k:
                # Applications cut off from the majority, which may be electing a new
                # leader they must then find: well below the client lease, so they are
                # not suspected (a 3.9 s split left a client under a loaded machine 1.1 s
                # to reach the new leader, and its lease ran out).
                hold = min(hold, 3.0)
            what = f"split {'+'.join(side_a)} | {'+'.join(side_b)}"
        else:
            app = self.rng.choice(self.apps)
            hold = min(hold, 3.5)  # below the client lease: cut off, not suspected
            side_a, side_b = [app], list(live)
            target, role = app, "application"
            what = f"{app} cut off from the routers"
        self.net.cut(side_a, side_b)
        self.say(f"{elapsed:7.2f}s  partition: {what} for {hold:.1f}s")
        detail = {"role": role, "variant": variant, "sides": [side_a, side_b],
                  "heal_at": elapsed + hold}  # fmt: skip
        return Fault("partition", target, elapsed, None, detail)

    def _stall(self, elapsed: float, cluster: LocalCluster, live: list[str], target: str,
               role: str) -> Fault:  # fmt: skip
        assert self.net is not None
        hold = self.rng.uniform(0.5, 0.9)
        self.net.stall(target)
        self.say(f"{elapsed:7.2f}s  stall: {role} {target} sends nothing for {hold:.2f}s")
        return Fault("stall", target, elapsed, None, {"role": role, "heal_at": elapsed + hold})

    def _slow(self, elapsed: float, cluster: LocalCluster, live: list[str], target: str,
              role: str) -> Fault:  # fmt: skip
        assert self.net is not None
        hold = self.rng.uniform(3.0, 5.0)
        self.net.slow(target, 1000)
        self.say(f"{elapsed:7.2f}s  slow link: {role} {target} at 1 Mbit/s for {hold:.1f}s")
        detail = {"role": role, "kbit": 1000, "heal_at": elapsed + hold}
        return Fault("slow", target, elapsed, None, detail)

    def _loss(self, elapsed: float, cluster: LocalCluster, live: list[str], target: str,
              role: str) -> Fault:  # fmt: skip
        assert self.net is not None
        hold = self.rng.uniform(3.0, 5.0)
        pct = self.rng.randint(5, 25)
        self.net.loss(target, pct)
        self.say(f"{elapsed:7.2f}s  packet loss: {role} {target} {pct}% for {hold:.1f}s")
        detail = {"role": role, "percent": pct, "heal_at": elapsed + hold}
        return Fault("loss", target, elapsed, None, detail)

    def _reconfigure(self, elapsed: float, cluster: LocalCluster, live: list[str],
                     target: str, role: str) -> Fault:  # fmt: skip
        if self.size == 3:
            self.size = 4
            fresh = self._join(cluster, live)
            self.say(f"{elapsed:7.2f}s  reconfigure: {fresh} joins (4 routers)")
            return Fault("reconfigure", fresh, elapsed, elapsed, {"change": "join"})
        self.size = 3
        cluster.routers[target].daemon.signal(signal.SIGTERM)
        self.say(f"{elapsed:7.2f}s  reconfigure: {role} {target} parts (3 routers)")
        return Fault("reconfigure", target, elapsed, elapsed, {"change": "part", "role": role})

    # ------------------------------------------------------------------ healing
    def _join(self, cluster: LocalCluster, live: list[str]) -> str:
        self._fresh += 1
        fresh = f"j{self._fresh}"
        if self.net is not None:
            cluster.state.set_places({fresh: self.net.add(fresh)})
        cluster.start(fresh, cluster.routers[live[0]].address)
        return fresh

    def attach(self, apps: dict[str, int]) -> None:
        """The run's application processes (name to pid), once they have started."""
        self.app_pids = dict(apps)

    def _heal(self, cluster: LocalCluster, f: Fault, elapsed: float) -> None:
        if f.kind == "pause-app":
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.app_pids[f.target], signal.SIGCONT)
        elif f.kind == "pause":
            proc = cluster.routers[f.target].proc
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
        elif self.net is not None:
            self.net.heal()
        f.end = elapsed
        self.active = None
        self.next_at = max(self.next_at, elapsed + self.gap[0])
        self.say(f"{elapsed:7.2f}s  heal {f.kind} of {f.target}")

    def heal(self, cluster: LocalCluster) -> None:
        if self.active is not None:
            self._heal(cluster, self.active, self.active.detail["heal_at"])
        # A router the group expelled learns it when it is back, and leaves.
        time.sleep(0.5)

    def report(self) -> dict[str, Any]:
        by_kind: dict[str, int] = {}
        for f in self.faults:
            by_kind[f.kind] = by_kind.get(f.kind, 0) + 1
        return {"by_kind": by_kind, "faults": [f.to_json() for f in self.faults]}


def _unsettled(cluster: LocalCluster, live: list[str]) -> str | None:
    """Why the group is not settled, or None when every live router is a member of one
    view of exactly the live routers and says it is healthy."""
    for r in live:
        h = cluster.routers[r].health()
        if not h:
            return f"{r} does not answer /health"
        if h.get("status") != "ok":
            return f"{r} says {h.get('status')}: {h.get('reason', '')}".rstrip(": ")
        if sorted(h.get("members", ())) != live:
            return f"{r} has members {h.get('members')}, the live routers are {live}"
    return None
