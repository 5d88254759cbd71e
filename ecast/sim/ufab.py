"""One seeded ufabcast run: routers under load and faults, then the checkers' verdict.

The layer above ufabcast is the simplest one that exercises joins: the executed log itself
(:class:`LogApp`), handed to joiners as the snapshot's application state.

During the fault phase a workload proposes commands at random routers while the nemesis of
:mod:`ecast.sim.group` works on the group.  Then every fault heals and the run continues
until every correct router has executed every command of every correct router
(termination) and the group is quiescent, or the settle time runs out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ecast.core import mutations
from ecast.core.effects import Effects, NodeId
from ecast.core.ufabcast import (
    Executed,
    Installed,
    SnapshotNeeded,
    Stopped,
    Ufabcast,
    ViewChanged,
)
from ecast.sim.group import ROUTER_FAULTS, GroupRunConfig, GroupRunResult, RouterGroupRun
from ecast.sim.ufab_checks import (
    SAFETY_CHECKS,
    Facts,
    RouterRecord,
    check_termination,
    check_uniform_agreement,
)

FAULT_KINDS = ROUTER_FAULTS
GRACE = 3.0
"""Virtual seconds after quiescence before memory is judged (slowest injected delay + GC)."""
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
class UfabRunConfig(GroupRunConfig):
    commands: int = 300


@dataclass(kw_only=True)
class UfabRunResult(GroupRunResult):
    commands: int
    executed: int

    def _counts(self) -> dict[str, Any]:
        return {"commands": self.commands, "executed": self.executed}


class UfabRun(RouterGroupRun):
    def __init__(self, cfg: UfabRunConfig) -> None:
        super().__init__(cfg, SITUATIONS)
        self.cfg = cfg
        self.records: dict[NodeId, RouterRecord] = {}
        self.proposals: dict[str, tuple[NodeId, int]] = {}
        self._proposed = 0

    def _make_router(
        self, rid: NodeId, founders: list[NodeId] | None, seeds: list[NodeId] | None
    ) -> Ufabcast:
        core = Ufabcast(rid, self.ufab_params(), members=founders, seeds=seeds)
        rec = RouterRecord(installed=core.installed)
        self.records[rid] = rec
        self.sim.add(rid, LogApp(core, rec))
        return core

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
            self.proposals[payload] = (rid, core.proposer.seq)
            return fx

        self.sim.call(rid, go)

    # ------------------------------------------------------------------ run
    def done(self) -> bool:
        if not self.quorum_up():
            return True  # nothing more can happen
        correct = self.correct_routers()
        if not correct:
            return True
        if len({len(self.records[r].log) for r in correct}) != 1:
            return False
        have = {e[2] for e in self.records[correct[0]].log}
        correct_set = set(correct)
        if not all(
            payload in have for payload, (p, _s) in self.proposals.items() if p in correct_set
        ):
            return False
        return self.group_quiescent(correct)

    def run(self) -> UfabRunResult:
        cfg = self.cfg
        started = time.perf_counter()
        self.start_founders()
        sim = self.sim
        for _ in range(cfg.commands):
            sim.at(self.rng.uniform(0.05, cfg.fault_time), self._propose)
        self.schedule_background()
        if cfg.progress:
            t = 0.0
            while t < cfg.fault_time + cfg.settle_time:
                t += 1.0
                sim.at(t, lambda: cfg.progress(self.status_line()))  # type: ignore[misc]
        # Bounded memory is checked while the run goes, not only at the end.
        t = 1.0
        while t < cfg.fault_time + cfg.settle_time:
            sim.at(t, self._check_memory)
            t += 1.0
        sim.run(cfg.fault_time)
        self.heal_everything()
        sim.run(cfg.fault_time + cfg.settle_time, stop=self.done)
        settled = self.done()
        self._settled = True
        # Let heartbeats carry the final executed positions so GC can finish.  Frames sent
        # through a slowed node may still be in flight (up to 1.5 s) and hold back later
        # ones on the same connection, so wait that out too.
        sim.run(sim.now + GRACE)
        self._check_memory(final=True)
        return self._verdict(settled, time.perf_counter() - started)

    def status_line(self) -> str:
        number, members = self.latest_view()
        leader = self.leader() or "-"
        live = set(self.live())
        executed = {r: len(self.records[r].log) for r in members if r in live}
        down = [r for r in members if r not in live]
        return (
            f"t={self.sim.now:7.3f}s view {number} {list(members)} leader {leader} "
            f"proposed {len(self.proposals)} executed {executed}"
            + (f" down {down}" if down else "")
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
            violations.extend(self.lingering_retirees())
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
            stats=self.summed_stats([c.stats for c in self.cores.values()]),
            quorum=quorum,
        )


def run_ufabcast(cfg: UfabRunConfig) -> UfabRunResult:
    with mutations.planted(cfg.mutations):
        return UfabRun(cfg).run()
