"""Scripted drivers: the test decides every delivery.

Messages wait in per-link FIFO queues until the test delivers them (a link's whole queue is
one batch, like one frame); time moves only when the test ticks.  This is how the unit
tests stage exact interleavings (a stop sign chosen together with the instance after it,
a leader that crashes after one acceptor saw its proposal, a leader change after the last
message, ...) and then run the same checkers as the randomized simulator.

:class:`ManualNet` hosts bare ufabcast routers; :class:`EcastNet` hosts E-Cast routers and
application endpoints.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from ecast.core.config import KIND, BroadcastConfig, Config
from ecast.core.effects import Effects, NodeId, carry_out
from ecast.core.endpoint import Endpoint, EndpointParams
from ecast.core.roles import APPLICATION, ROUTER
from ecast.core.router import Router, RouterParams
from ecast.core.ufabcast import Ufabcast, UfabParams
from ecast.history import Crash, Deliver, History, check_history
from ecast.sim.ecast_run import AppHost, RouterHost
from ecast.sim.ufab import LogApp
from ecast.sim.ufab_checks import (
    SAFETY_CHECKS,
    Facts,
    RouterRecord,
    check_termination,
    check_uniform_agreement,
)


class ScriptedNet:
    """Per-link FIFO queues and a clock, both under the test's control."""

    def __init__(self) -> None:
        self.now = 0.0
        self.nodes: dict[NodeId, Any] = {}
        self.queues: dict[tuple[NodeId, NodeId], deque[Any]] = {}
        self.crashed: set[NodeId] = set()
        self.notes: dict[str, Any] = {}
        """Observations a scenario records mid-way, for tests to assert on."""
        self.sent: list[tuple[NodeId, NodeId, Any]] = []
        """Every message any node sent, in order."""
        self.dropped: list[tuple[NodeId, NodeId]] = []
        """``(node, peer)``: a node let its link buffers for ``peer`` go (``Effects.drop``)."""

    def add(self, node_id: NodeId, node: Any, tick: bool = True) -> None:
        self.nodes[node_id] = node
        self.crashed.discard(node_id)
        if tick:
            self._apply(node_id, node.on_tick(self.now))

    def call(self, node_id: NodeId, fn: Callable[[Any, float], Effects]) -> None:
        self._apply(node_id, fn(self.nodes[node_id], self.now))

    def crash(self, node_id: NodeId) -> None:
        self.crashed.add(node_id)
        for key in list(self.queues):
            if node_id in key:
                del self.queues[key]

    def tick(self, dt: float = 0.0) -> None:
        self.now += dt
        for nid, node in self.nodes.items():
            if nid not in self.crashed:
                self._apply(nid, node.on_tick(self.now))

    def _apply(self, nid: NodeId, fx: Effects) -> None:
        carry_out(fx, _ScriptedLinks(self, nid))

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
        self._apply(dst, self.nodes[dst].on_messages(src, batch, self.now))
        return n

    def inject(self, src: NodeId, dst: NodeId, msg: Any) -> None:
        """Queue a hand-made message, as if ``src`` had sent it."""
        self.queues.setdefault((src, dst), deque()).append(msg)

    def lose(self, src: NodeId, dst: NodeId, index: int) -> Any:
        """Remove one queued message: a message that went to a process which then vanished."""
        q = self.queues[(src, dst)]
        msg = q[index]
        del q[index]
        return msg

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


class _ScriptedLinks:
    """A node's links in a scripted net: sends wait in the test's per-link queues."""

    __slots__ = ("net", "nid")

    def __init__(self, net: ScriptedNet, nid: NodeId) -> None:
        self.net = net
        self.nid = nid

    def send(self, dst: NodeId, msg: Any) -> None:
        net = self.net
        if dst not in net.crashed and self.nid not in net.crashed:
            net.sent.append((self.nid, dst, msg))
            net.queues.setdefault((self.nid, dst), deque()).append(msg)

    def forget(self, peer: NodeId) -> None:
        pass  # scripted queues keep no per-peer state

    def drop(self, peer: NodeId) -> None:
        self.net.dropped.append((self.nid, peer))


class ManualNet(ScriptedNet):
    """Bare ufabcast routers, each with an executed log on top (:class:`LogApp`)."""

    def __init__(self, founders: list[NodeId], params: UfabParams | None = None) -> None:
        super().__init__()
        self.params = params or UfabParams()
        self.proposals: dict[str, tuple[NodeId, int]] = {}
        for f in founders:
            self._add(f, Ufabcast(f, self.params, members=founders), tick=False)

    @property
    def apps(self) -> dict[NodeId, LogApp]:
        return self.nodes

    def _add(self, rid: NodeId, core: Ufabcast, tick: bool = True) -> None:
        self.add(rid, LogApp(core, RouterRecord(installed=core.installed)), tick)

    def core(self, rid: NodeId) -> Ufabcast:
        return self.nodes[rid].core

    def record(self, rid: NodeId) -> RouterRecord:
        return self.nodes[rid].rec

    def join(self, rid: NodeId, seeds: list[NodeId]) -> None:
        self._add(rid, Ufabcast(rid, self.params, seeds=seeds))

    def replace(self, rid: NodeId, core: Ufabcast) -> None:
        """Start a new process under an old id (which the group must refuse)."""
        self._add(rid, core)

    def propose(self, rid: NodeId, payload: str) -> None:
        app = self.nodes[rid]
        self._apply(rid, app.propose(payload, self.now))
        self.proposals[payload] = (rid, app.core.proposer.seq)

    def leave(self, rid: NodeId) -> None:
        self._apply(rid, self.core(rid).leave(self.now))

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
                mine = app.core.proposer
                if app.rec.correct and not mine.idle():
                    out.append(
                        f"termination: {rid} still waits for {len(mine.pending)} of its "
                        f"commands and {len(mine.reconfigs)} reconfigurations"
                    )
        return out


class EcastNet(ScriptedNet):
    """E-Cast routers and application endpoints, recorded in a history (``history``) for
    the E-Cast checkers."""

    def __init__(
        self,
        routers: list[NodeId],
        config: Config | None = None,
        router_params: RouterParams | None = None,
        endpoint_params: EndpointParams | None = None,
    ) -> None:
        super().__init__()
        self.config = config or BroadcastConfig.initial()
        self.router_params = router_params or RouterParams()
        self.endpoint_params = endpoint_params or EndpointParams()
        self.founders = list(routers)
        self.history = History()
        self.credentials: dict[NodeId, tuple[str, ...]] = {}
        """Names each application process may use besides its own (``speaks_for``)."""
        for r in routers:
            self.add_router(r, routers=routers)

    def add_router(
        self,
        rid: NodeId,
        routers: list[NodeId] | None = None,
        seeds: list[NodeId] | None = None,
    ) -> Router:
        router = Router(
            rid,
            self.config,
            self.router_params,
            routers=routers,
            seeds=seeds,
            role_of=self.role_of,
            speaks_for=self.speaks_for,
        )
        self.add(rid, RouterHost(router, self.history.router(rid), lambda: self.now))
        return router

    def role_of(self, peer: NodeId) -> str:
        """As the runtime's credentials would say: routers are routers, the rest apps."""
        return ROUTER if peer in self.history.routers else APPLICATION

    def speaks_for(self, peer: NodeId, name: str) -> bool:
        """As per-process credentials would say: each covers its process's own name, and
        the names in ``credentials`` besides."""
        return name == peer or name in self.credentials.get(peer, ())

    def add_app(
        self,
        pid: NodeId,
        role: str = "member",
        join: bool = True,
        routers: list[NodeId] | None = None,
    ) -> Endpoint:
        """A process given ``routers`` to talk to (the founders by default)."""
        ep = Endpoint(pid, routers or self.founders, self.endpoint_params, role_of=self.role_of)
        self.add(pid, AppHost(pid, ep, self.history.log(pid), role))
        if join:
            self.call(pid, lambda h, now: h.record_submission(*h.ep.join(now, role=role), now))
        return ep

    def router(self, rid: NodeId) -> Router:
        return self.nodes[rid].router

    def endpoint(self, pid: NodeId) -> Endpoint:
        return self.nodes[pid].ep

    def submit(self, pid: NodeId, payload: Any, header: Any = None) -> None:
        self.call(pid, lambda h, now: h.submit(payload, header, now))

    def submit_unsafe(self, pid: NodeId, payload: Any, header: Any = None) -> None:
        self.call(pid, lambda h, now: h.submit_unsafe(payload, header, now))

    def close(self, pid: NodeId) -> None:
        self.call(pid, lambda h, now: h.record_submission(*h.ep.close(now), now))

    def suspect(self, pid: NodeId, who: list[NodeId]) -> None:
        self.call(pid, lambda h, now: h.record_submission(*h.ep.suspect(who, now), now))

    def crash(self, node_id: NodeId) -> None:
        super().crash(node_id)
        if node_id in self.history.processes:
            self.history.log(node_id).append(Crash(self.now))

    def delivered(self, pid: NodeId) -> list[Any]:
        """Payloads ``pid`` delivered (safe deliveries, in order; None for membership
        messages)."""
        return [
            None if type(e.header) is dict and KIND in e.header else e.payload
            for e in self.history.of_kind(pid, Deliver)
        ]

    def violations(self, liveness: bool = True) -> list[str]:
        out = check_history(self.history, self.config, liveness=liveness).messages()
        if liveness:
            # Quiescence: once the script settles, a live router holds nothing unstable.
            for rid in self.history.routers:
                if rid in self.crashed or rid not in self.nodes:
                    continue
                r = self.router(rid)
                if r.ufab.installed and not r.ufab.stopped and r.unstable():
                    out.append(f"quiescence: router {rid} holds {r.unstable()} unstable messages")
        return out
