"""The simulated nemesis of a Rubberband run: random reconfigurations and crashes of
storage processes (routers' faults are E-Cast's nemesis), the operator's repairs, and
the fixed fault scenarios (:data:`rubberband.sim.run.SCENARIOS`).

A part of :class:`rubberband.sim.run.RubberbandRun`, kept apart for size: it uses the
run's simulator, processes and admin requests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ecast import NodeId
from rubberband.sim.checks import Planned, coming_ring, in_segment, lost_in
from rubberband.storage import StorageCore

if TYPE_CHECKING:
    from rubberband.config import RubberbandConfig


class Nemesis:
    """Faults and scenarios (a mixin of :class:`~rubberband.sim.run.RubberbandRun`)."""

    cfg: Any
    sim: Any
    rng: Any
    procs: dict[NodeId, Any]
    workloads: dict[NodeId, Any]
    situations: dict[str, int]
    planned: list[Planned]
    _stuck_checks: int = 0
    _watch_until = -1.0

    if TYPE_CHECKING:  # the run's, which this part uses

        def _config(self) -> RubberbandConfig | None: ...
        def _admin(self, op: tuple[Any, ...], again: Any = None, force: bool = False) -> None: ...
        def _super(self) -> Any: ...
        def add_storage(self) -> NodeId: ...
        def _note(self, what: str) -> None: ...
        def _fault_leader(self) -> None: ...

    def _ring_healthy(self, c: RubberbandConfig) -> bool:
        """Every holder alive, a member and complete: the nemesis reconfigures and
        crashes only then.  Reconfiguring around a holder that died unnoticed, or that is
        incomplete, hands its ranges on with fewer complete copies than f; compounding
        that is the correlated failure of f holders that no replication survives."""
        return all(
            self.sim.nodes[p].alive and p in c.storage() and p not in c.incomplete
            for p in c.keyspace.processes
        )

    def _busy_clients(self) -> bool:
        return any(w.busy for w in self.workloads.values())

    def _fault_expand(self) -> None:
        c = self._config()
        if c is None or self.sim.now >= self.cfg.fault_time or not self._ring_healthy(c):
            return
        standby = sorted(p for p in c.standby() if self.sim.nodes[p].alive)
        if not standby:
            self.add_storage()
            self.sim.at(self.sim.now + 0.1, self._fault_expand)
            return
        at = self.rng.randrange(0, 10_000)
        if self._busy_clients():
            self.situations["expand_under_load"] += 1
        self._note(f"expand {standby[0]} at {at}")
        self._admin(("expand", standby[0], at))
        if self.rng.random() < 0.4 and len(standby) > 1:
            # A second one at once: planned from the same version, so one is stale.
            at2 = self.rng.randrange(0, 10_000)
            self._note(f"expand {standby[1]} at {at2} right behind")
            self._admin(("expand", standby[1], at2))

    def _fault_contract(self) -> None:
        c = self._config()
        if c is None or len(c.keyspace) <= c.f + 1 or not self._ring_healthy(c):
            return
        victim = c.keyspace.processes[self.rng.randrange(len(c.keyspace))]
        self._note(f"contract {victim}")
        self._admin(("contract", victim))

    def _fault_replace(self) -> None:
        c = self._config()
        if c is None or not len(c.keyspace) or self.sim.now >= self.cfg.fault_time:
            return
        if not self._ring_healthy(c):
            return
        standby = sorted(p for p in c.standby() if self.sim.nodes[p].alive)
        if not standby:
            self.add_storage()
            self.sim.at(self.sim.now + 0.1, self._fault_replace)
            return
        victim = c.keyspace.processes[self.rng.randrange(len(c.keyspace))]
        self._note(f"replace {victim} with {standby[0]}")
        self._admin(("replace", victim, standby[0]))

    def _fault_rebalance(self) -> None:
        c = self._config()
        if c is None or len(c.keyspace) < 2 or not self._ring_healthy(c):
            return
        i = self.rng.randrange(len(c.keyspace))
        ids = c.keyspace.ids
        lo = ids[i - 1][1] if i > 0 and len(ids[i - 1]) == 2 else -1000
        hi = ids[i + 1][1] if i + 1 < len(ids) and len(ids[i + 1]) == 2 else 20_000
        if type(lo) is not int or type(hi) is not int or hi - lo < 3:
            return
        at = self.rng.randrange(lo + 1, hi)
        self._note(f"rebalance {c.keyspace.processes[i]} to {at}")
        self._admin(("rebalance", c.keyspace.processes[i], at))

    def _fault_crash(self) -> None:
        if self.rng.random() < 0.5:
            super()._fault_crash()
        else:
            self._crash_storage()

    def _crash_storage(self) -> None:
        """Crash a storage process, a source of a migration if there is one; never the
        last holders of a range."""
        c = self._config()
        if c is None or self.sim.now < 1.5:
            return  # not while the initial keyspace is being built
        alive = [p for p in c.keyspace.processes if p in c.storage() and self.sim.nodes[p].alive]
        if len(alive) <= c.f:
            return
        if any(
            not self.sim.nodes[p].alive or p not in c.storage() or p in c.incomplete
            for p in c.keyspace.processes
        ):
            return  # one failure at a time: the last one is not repaired yet
        # A holder that is dead, suspected, incomplete or still receiving does not hold
        # all its data, and a crash also breaks whoever receives from the victim (and
        # from them, in turn: the flood of 4.4.2).  f such holders of one range and the
        # range is gone, the one loss Rubberband does not promise to survive: never.
        weak = {p for p in c.keyspace.processes if self._storage(p).incoming}
        weak |= {p for p in c.keyspace.processes if self._storage(p).incomplete}
        self.planned = [p for p in self.planned if p.version > c.version or p.version in c.pending]
        ks = c.keyspace
        # Keyspace messages planned from this version, sent and not applied yet: the
        # ring each will make (its copies' receivers holders there without the data).
        coming = [
            (ring, planned)
            for planned in self.planned
            if planned.version == c.version + 1 and (ring := coming_ring(ks, planned)) is not None
        ]

        def flood(victim: NodeId, planned: list[Planned]) -> set[NodeId]:
            hit = set(weak)
            todo = [victim]
            while todo:
                p = todo.pop()
                if p in hit and p != victim:
                    continue
                hit.add(p)
                core = self._storage(p)
                todo += [o.dst for o in core.outgoing.values()]
                todo += [q.action[2] for q in core.queue if q.action and q.action[0] == "send"]
                todo += [dst for plan in planned for src, dst in plan.edges if src == p]
            return hit

        def safe(victim: NodeId, ahead: bool = True) -> bool:
            hit = flood(victim, self.planned)
            if any(
                sum(1 for h in ks.holders_of_segment(i) if h in hit) >= c.f for i in range(len(ks))
            ):
                return False
            if not ahead or not coming:
                return True
            # (a coming message's copies are counted range by range in its own ring)
            now = flood(victim, [p for p in self.planned if p.version <= c.version])
            return all(not lost_in(ring, planned, now) for ring, planned in coming)

        spared = [p for p in alive if not safe(p)]
        if coming and any(safe(p, ahead=False) for p in spared):
            self.situations["crash_spared_for_planned_copy"] += 1
        alive = [p for p in alive if p not in spared]
        if not alive:
            return
        sending = [p for p in alive if self._storage(p).outgoing]
        pool = sending if sending and self.rng.random() < 0.7 else alive
        victim = pool[self.rng.randrange(len(pool))]
        if self._storage(victim).outgoing:
            self.situations["source_crash_mid_migration"] += 1
        self.sim.crash(victim)
        self._note(f"crash storage {victim}")
        if self.cfg.auto_repair:
            # The super repairs; an operator only keeps a standby process ready for it.
            self._keep_a_standby(c)
            return
        self.sim.at(self.sim.now + self.cfg.suspect_after + 0.5, lambda: self._repair(victim))

    # ------------------------------------------------------------------ scenarios
    def _scenario_replica_crash(self) -> None:
        """Crash the ring member that the most reads in flight wait for."""
        c = self._config()
        if c is None:
            return
        ring = [p for p in c.keyspace.processes if self.sim.nodes[p].alive]
        victim = max(ring, key=lambda p: (self._reads_waiting_for(p), p))
        self.situations["replica_crash_mid_read"] = self._reads_waiting_for(victim)
        self._crash(victim)

    def _reads_waiting_for(self, p: NodeId) -> int:
        """Reads in flight whose answers a process owes (by the holders it would answer
        for): how many a crash of it leaves waiting."""
        owned = self._storage(p).owned
        return sum(
            1
            for w in self.workloads.values()
            if w.op is not None and w.op.kind in ("read", "scan") and in_segment(w.op.key, owned)
        )

    def _scenario_leader_crash(self) -> None:
        self._fault_leader()

    def _scenario_crash_mid_migration(self) -> None:
        """Wait (a little) for a copy under way, then crash its source."""
        c = self._config()
        sending = [
            p
            for p in (c.keyspace.processes if c is not None else ())
            if self.sim.nodes[p].alive and self._storage(p).outgoing
        ]
        if not sending:
            if self.sim.now < 6.0:
                self.sim.at(self.sim.now + 0.005, self._scenario_crash_mid_migration)
            return
        self.situations["source_crash_mid_migration"] += 1
        self._crash(sending[0])

    def _scenario_super_crash_mid_repair(self) -> None:
        """Crash a holder; once the coordinating super has a repair in flight, crash it."""
        c = self._config()
        if c is None:
            return
        victim = c.keyspace.processes[self.rng.randrange(len(c.keyspace))]
        self._crash(victim)

        def mid_repair() -> None:
            sup = self._super()
            if sup is None or sup.super is None:
                return
            if sup.super.reconfigurations.requests or (sup.super.config or c).pending:
                self.situations["super_crash_mid_repair"] = 1
                self.sim.crash(sup.pid)
                self._note(f"crash super {sup.pid} mid-repair")
            elif self.sim.now < 7.0:
                self.sim.at(self.sim.now + 0.002, mid_repair)

        mid_repair()

    def _crash(self, victim: NodeId) -> None:
        self.sim.crash(victim)
        self._note(f"crash storage {victim}")
        c = self._config()
        if self.cfg.auto_repair:
            if c is not None:
                self._keep_a_standby(c)
            return
        self.sim.at(self.sim.now + self.cfg.suspect_after + 0.5, lambda: self._repair(victim))

    def _keep_a_standby(self, c: RubberbandConfig) -> None:
        """Start a storage process unless a live standby is left for the super's repair:
        one that no keyspace message sent and not yet applied puts on the ring (an
        expand, or a replace, takes one).  Without ``keep_standby``, only once the super
        has nothing it can do without one (:meth:`_standby_when_stuck`)."""
        if not self.cfg.keep_standby:
            watching = self._watch_until >= self.sim.now
            self._watch_until = self.sim.now + 10.0
            if not watching:
                self._stuck_checks = 0
                self.sim.at(self.sim.now + self.cfg.suspect_after, self._standby_when_stuck)
            return
        taken = {
            planned.op[1] if planned.op[0] == "expand" else planned.op[2]
            for planned in self.planned
            if planned.version > c.version
            and isinstance(planned.op, list | tuple)
            and len(planned.op) >= 3
            and planned.op[0] in ("expand", "replace")
        }
        if not any(self.sim.nodes[p].alive and p not in taken for p in c.standby()):
            self.add_storage()

    def _standby_when_stuck(self) -> None:
        """As an operator paged by a super that cannot repair: broken holders on the ring
        (failed, or incomplete), no live standby, and no repair the super will plan
        (``SuperCore.repairs``), at three looks 0.2 s apart: start a standby.  Contracting
        is the super's own way out, and it has none when two of fewer than ``f + 2`` ring
        members are broken: then only a new process repairs them."""
        if self.sim.now > self._watch_until:
            return  # 10 s after the last crash: long repaired, or never will be
        self.sim.at(self.sim.now + 0.2, self._standby_when_stuck)
        c = self._config()
        sup = self._super()
        if c is None or sup is None or sup.super is None:
            return
        ring = c.keyspace.processes
        broken = [p for p in ring if p in c.incomplete or p not in c.storage()]
        spare = any(self.sim.nodes[p].alive for p in c.standby())
        if not broken or spare or sup.super.repairs() or sup.super.reconfigurations.requests:
            self._stuck_checks = 0
        else:
            self._stuck_checks += 1
            if self._stuck_checks >= 3:
                self._stuck_checks = 0
                self._note(f"operator starts a standby: the super cannot repair {broken}")
                self.add_storage()

    def _storage(self, pid: NodeId) -> StorageCore:
        core = self.procs[pid].storage
        assert core is not None
        return core

    def _repair(self, victim: NodeId) -> None:
        """As an operator: replace a suspected or incomplete process from standby."""
        c = self._config()
        if c is None or victim not in c.keyspace:
            return
        if victim in c.storage() and victim not in c.incomplete:
            self.sim.at(self.sim.now + 0.3, lambda: self._repair(victim))
            return
        standby = sorted(p for p in c.standby() if self.sim.nodes[p].alive)
        if not standby:
            self.add_storage()
            self.sim.at(self.sim.now + 0.2, lambda: self._repair(victim))
            return
        self._note(f"replace suspected {victim} with {standby[0]}")
        # A repair goes on even if data is lost (the operator's choice; the checkers then
        # say what was lost).
        self._admin(("replace", victim, standby[0]), lambda: self._repair(victim), force=True)

    def _repair_incomplete(self) -> None:
        """Replace every holder that is suspected, dead or incomplete (after the faults,
        as an operator would; with ``auto_repair`` the super must have done it)."""
        c = self._config()
        if c is None or self.cfg.auto_repair:
            return
        for p in c.keyspace.processes:
            if p not in c.storage() or p in c.incomplete or not self.sim.nodes[p].alive:
                self._repair(p)
