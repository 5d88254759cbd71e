"""A scripted driver for ufabcast cores: the test decides every delivery.

Messages wait in per-link FIFO queues until the test delivers them (a link's whole queue is
one batch, like one frame); time moves only when the test ticks.  This is how the unit
tests stage exact interleavings (a stop sign chosen together with the instance after it,
a leader that crashes after one acceptor saw its proposal, ...) and then run the same
checkers as the randomized simulator over what the routers executed.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ecast.effects import Effects, NodeId
from ecast.sim.ufab import LogApp
from ecast.sim.ufab_checks import (
    SAFETY_CHECKS,
    Facts,
    RouterRecord,
    check_termination,
    check_uniform_agreement,
)
from ecast.ufabcast import Ufabcast, UfabParams


class ManualNet:
    def __init__(self, founders: list[NodeId], params: UfabParams | None = None) -> None:
        self.params = params or UfabParams()
        self.now = 0.0
        self.apps: dict[NodeId, LogApp] = {}
        self.queues: dict[tuple[NodeId, NodeId], deque[Any]] = {}
        self.crashed: set[NodeId] = set()
        self.proposals: dict[str, tuple[NodeId, int]] = {}
        self.notes: dict[str, Any] = {}
        """Observations a scenario records mid-way, for tests to assert on."""
        self.sent: list[tuple[NodeId, NodeId, Any]] = []
        """Every message any core sent, in order (for assertions about proposals)."""
        for f in founders:
            self._add(f, Ufabcast(f, self.params, members=founders))

    # ------------------------------------------------------------------ processes
    def _add(self, rid: NodeId, core: Ufabcast) -> None:
        self.apps[rid] = LogApp(core, RouterRecord(installed=core.installed))

    def core(self, rid: NodeId) -> Ufabcast:
        return self.apps[rid].core

    def record(self, rid: NodeId) -> RouterRecord:
        return self.apps[rid].rec

    def join(self, rid: NodeId, seeds: list[NodeId]) -> None:
        self._add(rid, Ufabcast(rid, self.params, seeds=seeds))
        self._apply(rid, self.apps[rid].on_tick(self.now))

    def crash(self, rid: NodeId) -> None:
        self.crashed.add(rid)
        for key in list(self.queues):
            if rid in key:
                del self.queues[key]

    # ------------------------------------------------------------------ inputs
    def propose(self, rid: NodeId, payload: str) -> None:
        app = self.apps[rid]
        self._apply(rid, app.propose(payload, self.now))
        self.proposals[payload] = (rid, app.core.my_seq)

    def leave(self, rid: NodeId) -> None:
        self._apply(rid, self.core(rid).leave(self.now))

    def tick(self, dt: float = 0.0) -> None:
        self.now += dt
        for rid, app in self.apps.items():
            if rid not in self.crashed:
                self._apply(rid, app.on_tick(self.now))

    def _apply(self, rid: NodeId, fx: Effects) -> None:
        for dst, msg in fx.send:
            if dst not in self.crashed and rid not in self.crashed:
                self.sent.append((rid, dst, msg))
                self.queues.setdefault((rid, dst), deque()).append(msg)

    # ------------------------------------------------------------------ delivery
    def pending(self, src: NodeId, dst: NodeId) -> list[Any]:
        return list(self.queues.get((src, dst), ()))

    def deliver(self, src: NodeId, dst: NodeId, count: int | None = None) -> int:
        """Deliver the first ``count`` (default: all) messages queued from src to dst."""
        q = self.queues.get((src, dst))
        if not q or dst in self.crashed:
            return 0
        n = len(q) if count is None else min(count, len(q))
        batch = tuple(q.popleft() for _ in range(n))
        self._apply(dst, self.apps[dst].on_messages(src, batch, self.now))
        return n

    def inject(self, src: NodeId, dst: NodeId, msg: Any) -> None:
        """Queue a hand-made message, as if ``src`` had sent it."""
        self.queues.setdefault((src, dst), deque()).append(msg)

    def lose(self, src: NodeId, dst: NodeId, index: int) -> Any:
        """Remove one queued message: a message that went to a router which then vanished."""
        q = self.queues[(src, dst)]
        msg = q[index]
        del q[index]
        return msg

    def replace(self, rid: NodeId, core: Ufabcast) -> None:
        """Start a new process under an old id (which the group must refuse)."""
        self._add(rid, core)
        self.crashed.discard(rid)
        self._apply(rid, self.apps[rid].on_tick(self.now))

    def drop(self, src: NodeId, dst: NodeId) -> int:
        q = self.queues.pop((src, dst), None)
        return len(q) if q else 0

    def deliver_all(
        self, rounds: int = 10_000, hold: set[tuple[NodeId, NodeId]] | None = None
    ) -> None:
        """Deliver everything (except held links) until no message is left to deliver."""
        hold = hold or set()
        for _ in range(rounds):
            links = sorted(k for k, q in self.queues.items() if q and k not in hold)
            if not links:
                return
            for src, dst in links:
                self.deliver(src, dst)
        raise AssertionError("messages kept flowing; the scenario does not quiesce")

    def settle(
        self, seconds: float, step: float = 0.05, hold: set[tuple[NodeId, NodeId]] | None = None
    ) -> None:
        """Alternate ticks and full delivery for ``seconds`` of time."""
        end = self.now + seconds
        while self.now < end:
            self.deliver_all(hold=hold)
            self.tick(step)
        self.deliver_all(hold=hold)

    # ------------------------------------------------------------------ verdict
    def executed(self, rid: NodeId) -> list[str]:
        return [e[2] for e in self.record(rid).log]

    def violations(self, liveness: bool = True) -> list[str]:
        retired: set[NodeId] = set()
        for app in self.apps.values():
            retired |= app.core.retired
        for rid, app in self.apps.items():
            app.rec.crashed = rid in self.crashed
            app.rec.stopped = app.core.stopped or rid in retired
            app.rec.installed = app.core.installed
        facts = Facts({r: a.rec for r, a in self.apps.items()}, self.proposals)
        out: list[str] = []
        for check in SAFETY_CHECKS:
            out.extend(check(facts))
        if liveness:
            out.extend(check_uniform_agreement(facts))
            out.extend(check_termination(facts))
            for rid, app in self.apps.items():
                if app.rec.correct and (app.core.pending or app.core.pending_reconfig):
                    out.append(
                        f"termination: {rid} still waits for {len(app.core.pending)} of its "
                        f"commands and {len(app.core.pending_reconfig)} reconfigurations"
                    )
        return out
