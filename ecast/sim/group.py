"""A router group under a nemesis: what ufabcast runs and E-Cast runs share.

The nemesis crashes routers (never so many that the latest view loses its majority, and
never while a partition, a cut link, a slow node or a reconfiguration is in force),
crashes the leader at a moment with work in flight, adds routers (often two at once so a
join crosses a view change), partitions the network, isolates the leader, cuts the link
between two routers so they part each other, slows routers and drops frames.  Like an
operator, it also keeps the group at its target size.

Subclasses say how to build a router (``_make_router``) and what "the leader" means for
their layer; everything here looks only at each router's ufabcast core.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ecast.core.config import Config
from ecast.core.effects import NodeId
from ecast.core.roles import APPLICATION, ROUTER
from ecast.core.router import Router, RouterParams
from ecast.core.ufabcast import Ufabcast, UfabParams
from ecast.sim.engine import NetParams, Simulator

ROUTER_FAULTS = ("crash", "leader", "join", "partition", "isolate", "mutual", "slow", "loss")


@dataclass(kw_only=True)
class GroupRunResult:
    """What every group run reports besides its layer's own counts (``_counts``)."""

    seed: int
    violations: list[str]
    situations: dict[str, int]
    faults: list[tuple[float, str]]
    routers_started: int
    virtual_s: float
    wall_s: float
    events: int
    digest: str
    stats: dict[str, int]
    quorum: bool
    """Whether a majority of the latest view was up at the end (else liveness is not owed)."""

    def _counts(self) -> dict[str, Any]:
        return {}

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            **self._counts(),
            "violations": self.violations,
            "situations": self.situations,
            "faults": [{"t": round(t, 6), "fault": f} for t, f in self.faults],
            "routers_started": self.routers_started,
            "virtual_s": round(self.virtual_s, 3),
            "wall_s": round(self.wall_s, 3),
            "events": self.events,
            "digest": self.digest,
            "quorum": self.quorum,
            "stats": self.stats,
        }


@dataclass
class GroupRunConfig:
    seed: int
    routers: int = 3
    fault_time: float = 8.0
    """Faults and workload happen during [0, fault_time) of virtual time."""
    settle_time: float = 40.0
    """After healing, how long termination may take before it counts as violated."""
    faults: tuple[str, ...] = ROUTER_FAULTS
    fault_rate: float = 1.2
    """Mean faults per virtual second during the fault phase."""
    ufab: UfabParams = field(default_factory=UfabParams)
    net: NetParams = field(default_factory=NetParams)
    progress: Callable[[str], None] | None = None
    mutations: frozenset[str] = frozenset()
    """Bugs planted for the run (``ecast.core.mutations``), in every core of it."""


class RouterGroupRun:
    situations: dict[str, int]

    def __init__(self, cfg: GroupRunConfig, situations: tuple[str, ...]) -> None:
        self.gcfg = cfg
        self.sim = Simulator(cfg.seed, replace(cfg.net))
        self.rng = self.sim.rng
        self.cores: dict[NodeId, Ufabcast] = {}
        """Every router's ufabcast core, crashed and parted ones included."""
        self.faults: list[tuple[float, str]] = []
        self.situations = dict.fromkeys(situations, 0)
        self.violations: list[str] = []
        self._next_id = 0
        self._join_requested_view: dict[NodeId, int] = {}
        self._disrupted = 0  # partitions, cuts and slow nodes in force
        self._settled = False

    # ------------------------------------------------------------------ to override
    def _make_router(
        self, rid: NodeId, founders: list[NodeId] | None, seeds: list[NodeId] | None
    ) -> Ufabcast:
        """Create a router, add it to the simulator, return its ufabcast core."""
        raise NotImplementedError

    def leader(self) -> NodeId | None:
        """The router leading the latest view (a stale leader of an older view does not count)."""
        latest = self.latest_view()[0]
        for r in self.live():
            core = self.cores[r]
            if core.is_leader() and core.view is not None and core.view.number == latest:
                return r
        return None

    def in_flight(self, rid: NodeId) -> int:
        """Work the leader holds that a crash would put at risk."""
        return self.cores[rid].in_flight()

    leader_crash_situation = "leader_crash_in_flight"

    # ------------------------------------------------------------------ setup
    def _new_id(self) -> NodeId:
        self._next_id += 1
        return f"r{self._next_id}"

    def ufab_params(self) -> UfabParams:
        return replace(self.gcfg.ufab, seed=self.gcfg.seed)

    def start_founders(self) -> list[NodeId]:
        founders = [self._new_id() for _ in range(self.gcfg.routers)]
        for rid in founders:
            self.cores[rid] = self._make_router(rid, founders, None)
        return founders

    def _add_joiner(self, seeds: list[NodeId], why: str) -> None:
        rid = self._new_id()
        self._join_requested_view[rid] = self.latest_view()[0]
        self.cores[rid] = self._make_router(rid, None, seeds)
        self._note(f"{why} {rid} via {seeds[0]}")

    def schedule_background(self) -> None:
        """Faults, replenishment and join tracking over the whole run."""
        cfg = self.gcfg
        t = 0.5
        while cfg.faults:
            t += self.rng.expovariate(cfg.fault_rate)
            if t >= cfg.fault_time - 0.5:
                break
            self.sim.at(t, self._fault)
        t = 0.1
        while t < cfg.fault_time + cfg.settle_time:
            self.sim.at(t, self._track_joins)
            t += 0.1
        t = 1.5
        while t < cfg.fault_time + cfg.settle_time:
            self.sim.at(t, self._replenish)
            t += 1.0

    def _track_joins(self) -> None:
        for rid in list(self._join_requested_view):
            installed = self.cores[rid].installed_view
            if installed is not None:
                asked = self._join_requested_view.pop(rid)
                if installed.number - 1 > asked:
                    self.situations["join_during_view_change"] += 1

    # ------------------------------------------------------------------ state queries
    def live(self) -> list[NodeId]:
        return [
            r
            for r, c in self.cores.items()
            if self.sim.nodes[r].alive and not c.stopped and c.installed
        ]

    def latest_view(self) -> tuple[int, tuple[NodeId, ...]]:
        """The newest view any router reached (crashed and parted ones included)."""
        best: tuple[int, tuple[NodeId, ...]] = (-1, ())
        for c in self.cores.values():
            v = c.view
            if v is not None and v.number > best[0]:
                best = (v.number, v.members)
        return best

    def parted_by_group(self) -> set[NodeId]:
        """Routers some router executed a part for (faulty by 3.3.4, even if still running)."""
        out: set[NodeId] = set()
        for c in self.cores.values():
            out |= c.retired
        return out

    def correct_routers(self) -> list[NodeId]:
        parted = self.parted_by_group()
        return [
            r
            for r, c in self.cores.items()
            if self.sim.nodes[r].alive and not c.stopped and r not in parted
        ]

    def lingering_retirees(self) -> list[str]:
        """Routers still retiring although an up member of the latest view hears them
        (it is in their audience) and would release them: after the settle time there
        must be none.  A jepsen_like run found one that waited for ever on confirmations
        from members that had left in the meantime."""
        number, members = self.latest_view()
        up = set(self._up(members))
        out = []
        for r, c in self.cores.items():
            if not self.sim.nodes[r].alive or c.retirement is None or c.view is None:
                continue
            hears = up & set(c.retirement.audience(c.view.members, r))
            if hears:
                out.append(
                    f"retirement: {r} still retires (left for view {c.view.number}) though"
                    f" {sorted(hears)} of view {number} could release it"
                )
        return out[:5]

    def _up(self, members: tuple[NodeId, ...]) -> list[NodeId]:
        """The ones of ``members`` that are alive and not stopped."""
        return [m for m in members if self.sim.nodes[m].alive and not self.cores[m].stopped]

    def quorum_up(self) -> bool:
        """A majority of the latest view is alive and not parted (liveness's premise)."""
        _n, members = self.latest_view()
        return len(self._up(members)) >= len(members) // 2 + 1

    def group_quiescent(self, correct: list[NodeId]) -> bool:
        """One position, one view, nothing pending, no crashed or parted member left."""
        cores = [self.cores[r] for r in correct]
        if any(not c.installed or not c.proposer.idle() for c in cores):
            return False
        if len({(c.executed, c.view) for c in cores}) != 1:
            return False
        view = cores[0].view
        assert view is not None
        return all(m in set(correct) for m in view.members)

    def reconfig_in_flight(self) -> bool:
        live = self.live()
        latest = self.latest_view()[0]
        if any(self.cores[r].view.number != latest for r in live):  # type: ignore[union-attr]
            return True
        joining = any(
            self.sim.nodes[r].alive and not c.installed and not c.stopped
            for r, c in self.cores.items()
        )
        return joining or any(self.cores[r].proposer.reconfigs for r in live)

    def _may_lose(self, victim: NodeId) -> bool:
        """Crashing ``victim`` keeps a majority of the latest view alive."""
        if self._disrupted or self.reconfig_in_flight():
            return False
        _n, members = self.latest_view()
        live = set(self.live())
        up = [m for m in members if m in live and m != victim]
        return len(up) >= len(members) // 2 + 1

    # ------------------------------------------------------------------ nemesis
    def _note(self, what: str) -> None:
        self.faults.append((self.sim.now, what))
        if self.gcfg.progress:
            self.gcfg.progress(f"t={self.sim.now:7.3f}s fault {what}")

    def _fault(self) -> None:
        kinds = self.gcfg.faults
        kind = kinds[self.rng.randrange(len(kinds))]
        getattr(self, f"_fault_{kind}")()

    def _fault_crash(self) -> None:
        live = self.live()
        if not live:
            return
        victim = live[self.rng.randrange(len(live))]
        if self._may_lose(victim):
            self.sim.crash(victim)
            self._note(f"crash {victim}")

    def _fault_leader(self) -> None:
        """Crash the leader, waiting (a little) for a moment with work in flight."""
        leader = self.leader()
        if leader is None or not self._may_lose(leader):
            return
        deadline = self.sim.now + 0.3

        def attempt() -> None:
            if not self.sim.nodes[leader].alive or not self._may_lose(leader):
                return
            busy = self.in_flight(leader)
            if busy > 0 or self.sim.now >= deadline:
                if busy > 0 and self.leader() == leader:
                    self.situations[self.leader_crash_situation] += 1
                self.sim.crash(leader)
                self._note(f"crash leader {leader} in_flight={busy}")
            else:
                self.sim.at(self.sim.now + 0.0005, attempt)

        attempt()

    def _fault_join(self) -> None:
        live = self.live()
        if not live or len(self.cores) >= self.gcfg.routers + 6:
            return
        seeds = live[:]
        self.rng.shuffle(seeds)
        self._add_joiner(seeds[:3], "join")
        if self.rng.random() < 0.5:
            # A second joiner right behind the first: its join crosses a view change.
            self.sim.at(self.sim.now + self.rng.uniform(0.0, 0.01), self._fault_join)

    def _fault_partition(self) -> None:
        live = self.live()
        if len(live) < 2:
            return
        order = live[:]
        self.rng.shuffle(order)
        k = self.rng.randrange(1, len(order))
        a, b = order[:k], order[k:]
        self.sim.partition(a, b)
        dur = self.rng.uniform(0.2, 2.5)
        self._note(f"partition {a}|{b} for {dur:.2f}s")
        self._disrupt(dur, self._heal)

    def _fault_isolate(self) -> None:
        leader = self.leader()
        if leader is None:
            return
        others = [n for n in self.sim.nodes if n != leader]
        self.sim.partition([leader], others)
        self.situations["isolated_leader"] += 1
        dur = self.rng.uniform(1.3, 2.5)
        self._note(f"isolate leader {leader} for {dur:.2f}s")
        self._disrupt(dur, self._heal)

    def _fault_mutual(self) -> None:
        live = self.live()
        _n, members = self.latest_view()
        pair = [m for m in members if m in live]
        if len(pair) < 3:
            return
        self.rng.shuffle(pair)
        a, b = pair[0], pair[1]
        self.sim.cut(a, b)
        dur = self.rng.uniform(1.4, 2.2)
        self._note(f"cut {a}-{b} for {dur:.2f}s")
        end = self.sim.now + dur

        def probe() -> None:
            ca, cb = self.cores[a], self.cores[b]
            a_parts_b = any(c.router == b for c in ca.proposer.reconfigs)
            b_parts_a = any(c.router == a for c in cb.proposer.reconfigs)
            if a_parts_b and b_parts_a:
                self.situations["mutual_parts"] += 1
                return
            if self.sim.now < end:
                self.sim.at(self.sim.now + 0.01, probe)

        self.sim.at(self.sim.now + 0.9, probe)
        self._disrupt(dur, self._heal)

    def _fault_slow(self) -> None:
        live = self.live()
        if not live:
            return
        victim = live[self.rng.randrange(len(live))]
        extra = self.rng.choice((0.05, 0.2, 0.4, 1.5))
        dur = self.rng.uniform(0.5, 2.5)
        self.sim.set_slow(victim, extra)
        self._note(f"slow {victim} +{extra}s for {dur:.2f}s")
        before = {r: c.stats["limit_blocked"] for r, c in self.cores.items()}

        def restore() -> None:
            self.sim.set_slow(victim, 0.0)
            if "behind_active_limit" in self.situations and any(
                c.stats["limit_blocked"] > before.get(r, 0) for r, c in self.cores.items()
            ):
                self.situations["behind_active_limit"] += 1

        self._disrupt(dur, restore)

    def _fault_loss(self) -> None:
        loss = self.rng.choice((0.01, 0.05, 0.2))
        dur = self.rng.uniform(0.3, 2.0)
        self.sim.set_loss(loss)
        self._note(f"loss {loss} for {dur:.2f}s")
        self.sim.at(self.sim.now + dur, lambda: self.sim.set_loss(0.0))

    def _heal(self) -> None:
        self.sim.heal()

    def _disrupt(self, duration: float, end: Callable[[], None]) -> None:
        """Count a disruption until ``end`` runs; crashes wait until none is in force."""
        self._disrupted += 1

        def finish() -> None:
            self._disrupted -= 1
            end()

        self.sim.at(self.sim.now + duration, finish)

    def _replenish(self) -> None:
        """Keep the group at its target size by adding routers (as operators would)."""
        if self._settled:
            return
        _n, members = self.latest_view()
        live = set(self.live())
        up = [m for m in members if m in live]
        for c in self.cores.values():
            if not c.installed and not c.stopped and up:
                c.set_seeds(up)  # a joiner whose seeds all left is pointed at live ones
        joining = sum(
            1
            for r, c in self.cores.items()
            if self.sim.nodes[r].alive and not c.installed and not c.stopped
        )
        if len(up) + joining < self.gcfg.routers and len(self.cores) < self.gcfg.routers + 8:
            seeds = up[:3] or sorted(live)[:3]
            if seeds:
                self._add_joiner(seeds, "replenish")

    def heal_everything(self) -> None:
        self.sim.heal()
        self.sim.set_loss(0.0)
        for node in self.sim.nodes.values():
            node.slow = 0.0
        self._note("heal all")

    def summed_stats(self, stats: list[dict[str, int]]) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in stats:
            for k, v in s.items():
                out[k] = out.get(k, 0) + v
        out["frames"] = self.sim.frames
        out["frames_lost"] = self.sim.frames_lost
        return out

    def describe(self) -> dict[str, Any]:
        return {"routers_started": len(self.cores), "virtual_s": self.sim.now}


class EcastGroupRun(RouterGroupRun):
    """A router group of whole E-Cast routers (ufabcast and forwarding), for runs with
    application processes: E-Cast's own simulator and the simulators of the layers above
    (Rubberband) build on it.  The leader is the router forwarding for the latest view;
    what a crash puts at risk is its unstable messages; roles are as the runtime's
    credentials would say (routers are routers, everyone else an application)."""

    def __init__(self, cfg: GroupRunConfig, situations: tuple[str, ...]) -> None:
        super().__init__(cfg, situations)
        self.routers: dict[NodeId, Router] = {}
        self.credentials: dict[NodeId, tuple[str, ...]] = {}
        """Names each application process may use besides its own (``speaks_for``)."""

    def add_router(
        self,
        rid: NodeId,
        founders: list[NodeId] | None,
        seeds: list[NodeId] | None,
        config: Config,
        params: RouterParams,
        host: Callable[[Router], Any] | None = None,
    ) -> Ufabcast:
        """Create a router, add it (or ``host(router)``, a wrapper that records what it
        learns) to the simulator, wire its link lag as the TCP runtime does; return its
        ufabcast core (what ``_make_router`` returns)."""
        router = Router(
            rid,
            config,
            params,
            routers=founders,
            seeds=seeds,
            role_of=self.role_of,
            speaks_for=self.speaks_for,
        )
        self.routers[rid] = router
        node = self.sim.add(rid, router if host is None else host(router))
        router.link_lag = node.link.unacked_messages
        return router.ufab

    def role_of(self, peer: NodeId) -> str:
        return ROUTER if peer in self.routers else APPLICATION

    def speaks_for(self, peer: NodeId, name: str) -> bool:
        """As per-process credentials would say: each process's covers its own name, and
        the names it was given besides (``credentials``: a process that takes over
        another's session holds a credential covering it, as Spark's tasks share one)."""
        return name == peer or name in self.credentials.get(peer, ())

    def leader(self) -> NodeId | None:
        latest = self.latest_view()[0]
        for r in self.live():
            view = self.routers[r].ufab.view
            if self.routers[r].leading() and view is not None and view.number == latest:
                return r
        return None

    def in_flight(self, rid: NodeId) -> int:
        return self.routers[rid].unstable()
