"""One seeded ufabcast run: routers under load and faults, then the checkers' verdict.

The layer above ufabcast is the simplest one that exercises joins: the executed log itself
(:class:`LogApp`), handed to joiners as the snapshot's application state.

A run has two phases.  During the fault phase a workload proposes commands at random
routers while a nemesis crashes routers (never so many that the latest view loses its
majority), adds routers, partitions the network, isolates the leader, cuts the link
between two routers so they part each other, slows routers down and drops frames.  Then
every fault heals and the run continues until every correct router has executed every
command of every correct router (termination) or the settle time runs out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ecast.effects import Effects, NodeId
from ecast.sim.engine import NetParams, Simulator
from ecast.sim.ufab_checks import (
    SAFETY_CHECKS,
    Facts,
    RouterRecord,
    check_termination,
    check_uniform_agreement,
)
from ecast.ufabcast import (
    Executed,
    Installed,
    SnapshotNeeded,
    Stopped,
    Ufabcast,
    UfabParams,
    ViewChanged,
)

FAULT_KINDS = ("crash", "leader", "join", "partition", "isolate", "mutual", "slow", "loss")
SITUATIONS = (
    "leader_crash_in_flight",
    "join_during_view_change",
    "isolated_leader",
    "mutual_parts",
    "behind_active_limit",
)


class LogApp:
    """ufabcast plus an executed log; answers snapshot requests with the log."""

    def __init__(self, core: Ufabcast, record: RouterRecord) -> None:
        self.core = core
        self.rec = record

    def on_messages(self, src: NodeId, msgs: tuple[Any, ...], now: float) -> Effects:
        return self._absorb(self.core.on_messages(src, msgs, now), now)

    def on_tick(self, now: float) -> Effects:
        return self._absorb(self.core.on_tick(now), now)

    def propose(self, payload: Any, now: float) -> Effects:
        return self._absorb(self.core.propose(payload, now), now)

    def _absorb(self, fx: Effects, now: float) -> Effects:
        rec = self.rec
        for up in fx.deliver:
            t = type(up)
            if t is Executed:
                rec.log.append((up.proposer, up.seq, up.payload))
            elif t is ViewChanged:
                for p in up.parted:
                    rec.parted_at.setdefault(p, len(rec.log))
            elif t is SnapshotNeeded:
                state = (tuple(rec.log), tuple(sorted(rec.parted_at.items())))
                more = self.core.provide_snapshot(up.joiner, up.tag, state, now)
                fx.send.extend(more.send)
            elif t is Installed:
                log, parted = up.app_state
                if rec.log and list(log[: len(rec.log)]) != rec.log:
                    rec.jump_conflicts += 1  # a state transfer that contradicts our past
                rec.log = list(log)
                rec.parted_at = dict(parted)
                rec.installed = True
            elif t is Stopped:
                rec.stopped = True
        return fx


@dataclass
class UfabRunConfig:
    seed: int
    routers: int = 3
    commands: int = 300
    fault_time: float = 8.0
    """Faults and proposals happen during [0, fault_time) of virtual time."""
    settle_time: float = 40.0
    """After healing, how long termination may take before it counts as violated."""
    faults: tuple[str, ...] = FAULT_KINDS
    fault_rate: float = 1.2
    """Mean faults per virtual second during the fault phase."""
    params: UfabParams = field(default_factory=UfabParams)
    net: NetParams = field(default_factory=NetParams)
    progress: Callable[[str], None] | None = None


@dataclass
class UfabRunResult:
    seed: int
    commands: int
    executed: int
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

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "commands": self.commands,
            "executed": self.executed,
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


class UfabRun:
    def __init__(self, cfg: UfabRunConfig) -> None:
        self.cfg = cfg
        self.sim = Simulator(cfg.seed, replace(cfg.net))
        self.rng = self.sim.rng
        self.records: dict[NodeId, RouterRecord] = {}
        self.cores: dict[NodeId, Ufabcast] = {}
        self.proposals: dict[str, tuple[NodeId, int]] = {}
        self.faults: list[tuple[float, str]] = []
        self.situations = dict.fromkeys(SITUATIONS, 0)
        self.violations: list[str] = []
        self._next_id = 0
        self._join_requested_view: dict[NodeId, int] = {}
        self._proposed = 0
        self._disrupted = 0  # partitions, cuts and slow nodes in force
        self._settled = False
        self.sim.observer = self._observe

    # ------------------------------------------------------------------ setup
    def _new_id(self) -> NodeId:
        self._next_id += 1
        return f"r{self._next_id}"

    def _start_router(self, rid: NodeId, core: Ufabcast) -> None:
        rec = RouterRecord(installed=core.installed)
        self.records[rid] = rec
        self.cores[rid] = core
        self.sim.add(rid, LogApp(core, rec))

    def _params(self, rid: NodeId) -> UfabParams:
        return replace(self.cfg.params, seed=self.cfg.seed)

    def _observe(self, node: NodeId, now: float, upcalls: list[Any]) -> None:
        for up in upcalls:
            if type(up) is ViewChanged and up.joined:
                for j in up.joined:
                    asked = self._join_requested_view.pop(j, None)
                    if asked is not None and up.view.number - 1 > asked:
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

    def leader(self) -> NodeId | None:
        """The router leading the latest view (a stale leader of an older view does not count)."""
        latest = self.latest_view()[0]
        for r in self.live():
            core = self.cores[r]
            if core.is_leader() and core.view is not None and core.view.number == latest:
                return r
        return None

    def reconfig_in_flight(self) -> bool:
        live = self.live()
        latest = self.latest_view()[0]
        if any(self.cores[r].view.number != latest for r in live):  # type: ignore[union-attr]
            return True
        joining = any(
            self.sim.nodes[r].alive and not c.installed and not c.stopped
            for r, c in self.cores.items()
        )
        return joining or any(self.cores[r].pending_reconfig for r in live)

    def _may_lose(self, victim: NodeId) -> bool:
        """Crashing ``victim`` keeps a majority of the latest view alive, with a margin."""
        if self._disrupted or self.reconfig_in_flight():
            return False
        _n, members = self.latest_view()
        live = set(self.live())
        up = [m for m in members if m in live and m != victim]
        return len(up) >= len(members) // 2 + 1

    # ------------------------------------------------------------------ workload
    def _propose(self) -> None:
        live = self.live()
        if not live or self._proposed >= self.cfg.commands:
            return
        rid = live[self.rng.randrange(len(live))]
        self._proposed += 1
        payload = f"c{self._proposed}"
        core = self.cores[rid]

        def go(app: LogApp, now: float) -> Effects:
            fx = app.propose(payload, now)
            self.proposals[payload] = (rid, core.my_seq)
            return fx

        self.sim.call(rid, go)

    # ------------------------------------------------------------------ nemesis
    def _note(self, what: str) -> None:
        self.faults.append((self.sim.now, what))
        if self.cfg.progress:
            self.cfg.progress(f"t={self.sim.now:7.3f}s fault {what}")

    def _fault(self) -> None:
        kinds = self.cfg.faults
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
        """Crash the leader, waiting (a little) for a moment with instances in flight."""
        leader = self.leader()
        if leader is None or not self._may_lose(leader):
            return
        deadline = self.sim.now + 0.3

        def attempt() -> None:
            if not self.sim.nodes[leader].alive or not self._may_lose(leader):
                return
            core = self.cores[leader]
            if core.in_flight() > 0 or self.sim.now >= deadline:
                if core.in_flight() > 0 and core.is_leader():
                    self.situations["leader_crash_in_flight"] += 1
                self.sim.crash(leader)
                self._note(f"crash leader {leader} in_flight={core.in_flight()}")
            else:
                self.sim.at(self.sim.now + 0.0005, attempt)

        attempt()

    def _fault_join(self) -> None:
        live = self.live()
        if not live or len(self.cores) >= self.cfg.routers + 6:
            return
        rid = self._new_id()
        seeds = live[:]
        self.rng.shuffle(seeds)
        core = Ufabcast(rid, self._params(rid), seeds=seeds[:3])
        self._join_requested_view[rid] = self.latest_view()[0]
        self._start_router(rid, core)
        self._note(f"join {rid} via {seeds[0]}")
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
        others = [r for r in self.cores if r != leader]
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
            a_parts_b = any(c.router == b for c in ca.pending_reconfig)
            b_parts_a = any(c.router == a for c in cb.pending_reconfig)
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
            if any(c.stats["limit_blocked"] > before.get(r, 0) for r, c in self.cores.items()):
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

    def quorum_up(self) -> bool:
        """A majority of the latest view is alive and not parted (termination's premise)."""
        _n, members = self.latest_view()
        up = [m for m in members if self.sim.nodes[m].alive and not self.cores[m].stopped]
        return len(up) >= len(members) // 2 + 1

    def _replenish(self) -> None:
        """Keep the group at its target size by adding routers (as operators would)."""
        if self._settled:
            return
        members_up = [m for m in self.latest_view()[1] if m in set(self.live())]
        for _r, c in self.cores.items():
            if not c.installed and not c.stopped and members_up:
                c.set_seeds(members_up)
        _n, members = self.latest_view()
        live = set(self.live())
        up = [m for m in members if m in live]
        joining = sum(
            1
            for r, c in self.cores.items()
            if self.sim.nodes[r].alive and not c.installed and not c.stopped
        )
        if len(up) + joining < self.cfg.routers and len(self.cores) < self.cfg.routers + 8:
            rid = self._new_id()
            seeds = up[:3] or sorted(live)[:3]
            if seeds:
                self._join_requested_view[rid] = _n
                self._start_router(rid, Ufabcast(rid, self._params(rid), seeds=seeds))
                self._note(f"replenish {rid} via {seeds[0]}")

    # ------------------------------------------------------------------ run
    def done(self) -> bool:
        if not self.quorum_up():
            return True  # nothing more can happen
        parted = self.parted_by_group()
        correct = [
            r
            for r, c in self.cores.items()
            if self.sim.nodes[r].alive and not c.stopped and r not in parted
        ]
        if not correct:
            return True
        lengths = set()
        for r in correct:
            c = self.cores[r]
            if not c.installed or c.pending or c.pending_reconfig:
                return False
            lengths.add(len(self.records[r].log))
        if len(lengths) != 1:
            return False
        have = {e[2] for e in self.records[correct[0]].log}
        correct_set = set(correct)
        if not all(
            payload in have for payload, (p, _s) in self.proposals.items() if p in correct_set
        ):
            return False
        # Quiescent at the Paxos level too: one position, one view, and no crashed or
        # parted member left for the failure detector to remove.
        positions = {(self.cores[r].executed, self.cores[r].view) for r in correct}
        if len(positions) != 1:
            return False
        view = self.cores[correct[0]].view
        assert view is not None
        return all(m in correct_set for m in view.members)

    def run(self) -> UfabRunResult:
        cfg = self.cfg
        started = time.perf_counter()
        founders = [self._new_id() for _ in range(cfg.routers)]
        for rid in founders:
            self._start_router(rid, Ufabcast(rid, self._params(rid), members=founders))
        sim = self.sim
        rng = self.rng
        # Workload: proposals spread over the fault phase.
        for _ in range(cfg.commands):
            sim.at(rng.uniform(0.05, cfg.fault_time), self._propose)
        # Nemesis: Poisson-ish fault arrivals.
        t = 0.5
        while cfg.faults:
            t += rng.expovariate(cfg.fault_rate)
            if t >= cfg.fault_time - 0.5:
                break
            sim.at(t, self._fault)
        if cfg.progress:
            t = 0.0
            while t < cfg.fault_time + cfg.settle_time:
                t += 1.0
                sim.at(t, lambda: cfg.progress(self.status_line()))  # type: ignore[misc]
        # Bounded memory is checked while the run goes, not only at the end.
        t = 1.0
        while t < cfg.fault_time + cfg.settle_time:
            sim.at(t, self._check_memory)
            sim.at(t + 0.5, self._replenish)
            t += 1.0
        sim.run(cfg.fault_time)
        sim.heal()
        sim.set_loss(0.0)
        for node in sim.nodes.values():
            node.slow = 0.0
        self._note("heal all")
        sim.run(cfg.fault_time + cfg.settle_time, stop=self.done)
        settled = self.done()
        self._settled = True
        # Let heartbeats carry the final executed positions so GC can finish.
        sim.run(sim.now + 4 * cfg.params.heartbeat_interval + 0.1)
        self._check_memory(final=True)
        return self._verdict(settled, time.perf_counter() - started)

    def status_line(self) -> str:
        number, members = self.latest_view()
        leader = self.leader() or "-"
        live = set(self.live())
        executed = {r: len(self.records[r].log) for r in members if r in live}
        lagging = [r for r in members if r not in live]
        return (
            f"t={self.sim.now:7.3f}s view {number} {list(members)} leader {leader} "
            f"proposed {len(self.proposals)} executed {executed}"
            + (f" down {lagging}" if lagging else "")
        )

    def _check_memory(self, final: bool = False) -> None:
        parted = self.parted_by_group() if final else set()
        for r in self.live():
            if r in parted:
                continue  # parted but not yet told: it is not correct any more
            core = self.cores[r]
            bad = core.gc_violations()
            if bad:
                self.violations.append(
                    f"bounded-memory: {r} holds state at or below watermark {core.watermark}: {bad}"
                )
            if final and self.quorum_up() and core.watermark != core.executed:
                self.violations.append(
                    f"bounded-memory: {r} quiescent but collected only up to "
                    f"{core.watermark} of {core.executed}"
                )

    def parted_by_group(self) -> set[NodeId]:
        """Routers some router executed a part for (faulty by 3.3.4, even if still running)."""
        out: set[NodeId] = set()
        for c in self.cores.values():
            out |= c.retired
        return out

    def _verdict(self, settled: bool, wall: float) -> UfabRunResult:
        parted = self.parted_by_group()
        for r, rec in self.records.items():
            rec.crashed = not self.sim.nodes[r].alive
            rec.stopped = self.cores[r].stopped or r in parted
            rec.installed = self.cores[r].installed
        facts = Facts(self.records, self.proposals)
        violations = list(dict.fromkeys(self.violations))[:10]
        for check in SAFETY_CHECKS:
            violations.extend(check(facts))
        quorum = self.quorum_up()
        if quorum:
            # Liveness is owed only while a majority of the latest view is up (3.5.4).
            violations.extend(check_uniform_agreement(facts))
            term = check_termination(facts)
            if not settled and not term:
                term = ["termination: the run did not quiesce within the settle time"]
            violations.extend(term)
        stats: dict[str, int] = {}
        for core in self.cores.values():
            for k, v in core.stats.items():
                stats[k] = stats.get(k, 0) + v
        stats["frames"] = self.sim.frames
        stats["frames_lost"] = self.sim.frames_lost
        executed = max((len(rec.log) for rec in self.records.values()), default=0)
        return UfabRunResult(
            seed=self.cfg.seed,
            commands=len(self.proposals),
            executed=executed,
            violations=violations,
            situations=dict(self.situations),
            faults=self.faults,
            routers_started=len(self.cores),
            virtual_s=self.sim.now,
            wall_s=wall,
            events=self.sim.events,
            digest=self.sim.digest(),
            stats=stats,
            quorum=quorum,
        )


def run_ufabcast(cfg: UfabRunConfig) -> UfabRunResult:
    return UfabRun(cfg).run()
