"""One seeded E-Cast run: routers, application processes and a monitor under faults.

Submitters submit on a schedule and also react to what they deliver (so submissions are
causally related); receivers only deliver; a monitor process submits ``suspect`` messages
for application processes that crashed (E-Cast never suspects them itself, 4.2.3) and,
as a fault, for one that did not.  On top of the router-group nemesis of
:mod:`ecast.sim.group`, application processes crash, join, leave, and get cut off from
their router.  After the fault phase everything heals and the run continues until the
system is quiescent: every submission acknowledged, every message stable, every router
at one position.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ecast.core import mutations
from ecast.core.config import ROUTERS, BroadcastConfig, Config, KeyRingConfig
from ecast.core.effects import Effects, NodeId
from ecast.core.endpoint import Acked, Delivery, Endpoint, EndpointParams, Terminated
from ecast.core.message import Message
from ecast.core.message import fast_new as _tnew
from ecast.core.proto import Direct
from ecast.core.router import Router, RouterParams
from ecast.core.ufabcast import Ufabcast
from ecast.history import (
    Ack,
    Crash,
    Deliver,
    DeliverUnsafe,
    History,
    Resubmit,
    RouterLog,
    Submit,
    SubmitUnsafe,
    Terminate,
    check_history,
)
from ecast.sim.group import ROUTER_FAULTS, EcastGroupRun, GroupRunConfig, GroupRunResult
from ecast.sim.ufab import GRACE

APP_FAULTS = (
    "app_crash",
    "false_suspicion",
    "app_cut",
    "app_join",
    "app_part",
    "app_silent_crash",
    "handover_sequence",
    "handover_overlap",
)
ECAST_FAULTS = ROUTER_FAULTS + APP_FAULTS
ECAST_SITUATIONS = (
    "leader_crash_unstable",
    "join_during_view_change",
    "isolated_leader",
    "false_suspicion",
    "mutual_parts",
    "unsafe_untagged_accepted",
    "lease_suspect",
    "handover_sequence",
    "handover_overlap",
)


DURABLE_AFTER = 0.002
"""Under ``confirm_when_durable``, how long after arrival a process has a delivery
written down (and confirms it)."""


@dataclass
class EcastRunConfig(GroupRunConfig):
    submitters: int = 3
    receivers: int = 2
    replication: int = 0
    """0: atomic broadcast config; f >= 1: key-ring config with f successors."""
    messages: int = 300
    unsafe_fraction: float = 0.1
    react: float = 0.05
    """Chance that a submitter answers a delivered message with one of its own."""
    router: RouterParams = field(default_factory=RouterParams)
    endpoint: EndpointParams = field(default_factory=EndpointParams)
    monitor_delay: float = 0.5
    faults: tuple[str, ...] = ECAST_FAULTS
    app: Application | None = None
    """What the application processes do beyond submitting and delivering, and the config
    they run under; None: the broadcast or key-ring config by ``replication``."""


@dataclass(kw_only=True)
class EcastRunResult(GroupRunResult):
    messages: int
    delivered: int
    stable: int
    unsafe_accepted: int
    unsafe_delivered: int

    def _counts(self) -> dict[str, Any]:
        return {
            "messages": self.messages,
            "delivered": self.delivered,
            "stable": self.stable,
            "unsafe_delivered": self.unsafe_delivered,
            "unsafe_accepted": self.unsafe_accepted,
        }


class RouterHost:
    """A router in the simulator, recording what it learns (``clock`` gives the time)."""

    def __init__(self, router: Router, log: RouterLog, clock: Callable[[], float]) -> None:
        self.router = router
        self.log = log
        self.clock = clock
        router.observer = self._learned

    def _learned(self, t: int, msg: Message) -> None:
        self.log.learn(t, msg, self.clock())

    def on_messages(self, src: NodeId, msgs: tuple[Any, ...], now: float) -> Effects:
        return self.router.on_messages(src, msgs, now)

    def on_tick(self, now: float) -> Effects:
        return self.router.on_tick(now)


Reaction = Callable[["AppHost", Message, float], "tuple[Any, Any] | None"]
"""Given a delivered message, maybe answer it: return (payload, header) to submit."""

DirectSends = list[tuple[NodeId, Any]]


class Application:
    """A simulated application on E-Cast: its config and what its processes do with
    deliveries and direct messages.  The default runs E-Cast's own configs; a layer
    above (or a test) plugs in its own config and application cores, and its checks run
    with the simulator's."""

    situations: tuple[str, ...] = ()

    def __init__(self, replication: int = 0) -> None:
        self.replication = replication

    def initial_config(self) -> Config:
        if self.replication:
            return KeyRingConfig.initial(replication=self.replication)
        # Processes that never joined may send (the handover faults' light clients).
        return BroadcastConfig.initial(senders="anyone")

    def join_header(self, role: str, pid: NodeId) -> dict[str, Any]:
        return {"role": "receiver" if role == "receiver" else "client"}

    def header_for(self, payload: Any) -> Any:
        return {"key": payload} if self.replication else None

    def on_delivery(self, host: AppHost, m: Message, now: float) -> DirectSends:
        """Direct messages to send when ``host`` delivers ``m``."""
        return []

    def on_direct(self, host: AppHost, src: NodeId, payload: Any, now: float) -> DirectSends:
        """A direct message arrived; what to send back."""
        return []

    def check(self, run: EcastRun, quiescent: bool) -> list[str]:
        """The application's own guarantees, after the run (``quiescent``: liveness owed)."""
        return []


class AppHost:
    """An application process: an endpoint, its behaviour, and the history it records
    (``events``, its list in the run's :class:`~ecast.history.History`)."""

    def __init__(
        self,
        pid: NodeId,
        ep: Endpoint,
        events: list[Any],
        role: str = "member",
        react: Reaction | None = None,
        app: Application | None = None,
        auto_durable: bool = False,
    ) -> None:
        self.pid = pid
        self.ep = ep
        self.auto_durable = auto_durable and ep.p.confirm_when_durable
        """Write deliveries down ``DURABLE_AFTER`` after they arrive, and say so (the
        randomized runs; scripted tests call ``durable`` themselves)."""
        self.events = events
        self.role = role
        self.crashed = False
        self.react = react
        self.app = app
        self.received: list[tuple[NodeId, Any]] = []
        """Direct messages this process received, in order."""
        self.sent: dict[int, tuple[Any, Any]] = {}
        """Data sequence number -> (payload, header) submitted (what a successor resends)."""

    def on_messages(self, src: NodeId, msgs: tuple[Any, ...], now: float) -> Effects:
        if any(type(m) is Direct for m in msgs):
            # Direct messages are the application's; the rest is E-Cast's (as the SDK does).
            replies: DirectSends = []
            for m in msgs:
                if type(m) is Direct:
                    self.received.append((src, m.payload))
                    if self.app is not None and self.ep.terminated is None:
                        replies.extend(self.app.on_direct(self, src, m.payload, now))
            rest = [m for m in msgs if type(m) is not Direct]
            fx = self.ep.on_messages(src, rest, now) if rest else Effects()
            fx.send.extend((dst, Direct(p)) for dst, p in replies)
            return self._absorb(fx, now)
        return self._absorb(self.ep.on_messages(src, msgs, now), now)

    def on_tick(self, now: float) -> Effects:
        fx = self.ep.on_tick(now)
        ep = self.ep
        if self.auto_durable and ep.t_max > ep.durable_t:
            fx.extend(ep.durable(ep.t_max, now))  # written down a tick after arrival
        return self._absorb(fx, now)

    def accepts_work(self) -> bool:
        return self.ep.terminated is None and not self.ep.closing

    def submit(self, payload: Any, header: Any, now: float) -> Effects:
        sid, fx = self.ep.submit(payload, header, now)
        self.events.append(Submit(sid, now))
        self.sent[sid[1]] = (payload, header)
        return self._absorb(fx, now)

    def resubmit(self, items: list[tuple[Any, Any]], now: float) -> Effects:
        """Submit again, in this process's own session (handed over from another), what
        its previous owner submitted at the same sequence numbers, byte for byte."""
        ids, fx = self.ep.submit_many(items, now)
        self.events.extend(Resubmit(sid, now) for sid in ids)
        return self._absorb(fx, now)

    def record_submission(self, sid: Any, fx: Effects, now: float) -> Effects:
        """For joins, parts and suspicions submitted straight through the endpoint."""
        if sid is not None:
            self.events.append(Submit(sid, now))
        return self._absorb(fx, now)

    def submit_unsafe(self, payload: Any, header: Any, now: float) -> Effects:
        fx = self.ep.submit_unsafe(payload, header, now)
        self.events.append(SubmitUnsafe((self.ep.unsafe_session, self.ep.next_unsafe - 1), now))
        return self._absorb(fx, now)

    def _absorb(self, fx: Effects, now: float) -> Effects:
        events = self.events
        for up in fx.deliver:
            t = type(up)
            if t is Delivery:
                if self.auto_durable:
                    fx.wake(now + DURABLE_AFTER)
                m = up.message
                if up.unsafe:
                    events.append(
                        _tnew(
                            DeliverUnsafe,
                            (up.t, up.frontier, m.id, up.accepted, now, m[0], m.header, m.payload),
                        )
                    )
                else:
                    events.append(_tnew(Deliver, (up.t, m.id, now, m[0], m.header, m.payload)))
                    if self.app is not None and self.ep.terminated is None:
                        fx.send.extend(
                            (dst, Direct(p)) for dst, p in self.app.on_delivery(self, m, now)
                        )
                    if self.react is not None and self.accepts_work() and m.sender != self.pid:
                        answer = self.react(self, m, now)
                        if answer is not None:
                            more = self.submit(answer[0], answer[1], now)
                            fx.send.extend(more.send)
                            fx.wake(more.wake_at)
            elif t is Acked:
                events.append(_tnew(Ack, (up.id, up.t, up.delivered, now)))
            elif t is Terminated:
                events.append(Terminate(up.reason, now, up.at))
        return fx


class EcastRun(EcastGroupRun):
    leader_crash_situation = "leader_crash_unstable"

    def __init__(self, cfg: EcastRunConfig) -> None:
        super().__init__(cfg, ECAST_SITUATIONS)
        self.cfg = cfg
        self.app = cfg.app or Application(cfg.replication)
        for situation in self.app.situations:
            self.situations.setdefault(situation, 0)
        self.initial: Config = self.app.initial_config()
        self.apps: dict[NodeId, AppHost] = {}
        self.history = History()
        """What every application process observed and every router learned."""
        self.founders: list[NodeId] = []
        self._submitted = 0
        self._unsafe = 0
        self._next_app = 0
        self._false_suspects: set[NodeId] = set()
        self._probes_until = 0.0
        self._handovers = 0
        self._silent: set[NodeId] = set()
        """Processes crashed without a monitor's suspect (leases must catch them)."""

    # ------------------------------------------------------------------ routers
    def _make_router(
        self, rid: NodeId, founders: list[NodeId] | None, seeds: list[NodeId] | None
    ) -> Ufabcast:
        params = replace(self.cfg.router, ufab=self.ufab_params())
        log = self.history.router(rid)
        return self.add_router(
            rid,
            founders,
            seeds,
            self.initial,
            params,
            lambda router: RouterHost(router, log, lambda: self.sim.now),
        )

    def header_for(self, payload: Any) -> Any:
        return self.app.header_for(payload)

    def _add_app(self, role: str) -> NodeId:
        self._next_app += 1
        prefix = {"submitter": "s", "receiver": "d", "monitor": "mon"}[role]
        pid = f"{prefix}{self._next_app}"
        routers = [r for r in self.live()] or self.founders
        ep = Endpoint(pid, routers, self.cfg.endpoint, role_of=self.role_of)
        react = self._react if role == "submitter" and self.cfg.react > 0 else None
        host = AppHost(pid, ep, self.history.log(pid), role, react, self.app, auto_durable=True)
        self.apps[pid] = host
        self.sim.add(pid, host)
        header = self.app.join_header(role, pid)
        self.sim.call(pid, lambda h, now: h.record_submission(*h.ep.join(now, **header), now))
        return pid

    def _react(self, host: AppHost, m: Message, now: float) -> tuple[Any, Any] | None:
        """Submitters answer some deliveries, so submissions depend causally on others."""
        if m.kind is None and self.rng.random() < self.cfg.react:
            return f"re:{m.payload}", self.header_for(m.payload)
        return None

    def _app_alive(self, pid: NodeId) -> bool:
        return self.sim.nodes[pid].alive and self.apps[pid].ep.terminated is None

    def _apps(self, role: str | None = None) -> list[NodeId]:
        return [
            p
            for p, h in self.apps.items()
            if (role is None or h.role == role) and self._app_alive(p)
        ]

    def _submit(self, unsafe: bool = False) -> None:
        live = [
            p
            for p in self._apps("submitter")
            if self.apps[p].ep.joined_at is not None and self.apps[p].accepts_work()
        ]
        if not live:
            if self.sim.now < self.cfg.fault_time:
                # Nobody has joined yet (or every submitter is gone for now): try again.
                self.sim.at(self.sim.now + 0.05, lambda: self._submit(unsafe))
            return
        pid = live[self.rng.randrange(len(live))]
        if unsafe:
            self._unsafe += 1
            payload = f"u{self._unsafe}"
            header = self.header_for(payload)
            self.sim.call(pid, lambda h, now: h.submit_unsafe(payload, header, now))
            return
        self._submitted += 1
        payload = f"m{self._submitted}"
        self.sim.call(pid, lambda h, now: h.submit(payload, self.header_for(payload), now))

    def _monitor_suspect(self, pids: list[NodeId]) -> None:
        monitors = self._apps("monitor")
        if not monitors:
            return

        self.sim.call(
            monitors[0], lambda h, now: h.record_submission(*h.ep.suspect(pids, now), now)
        )

    # ------------------------------------------------------------------ application faults
    def _crash_app(self, pid: NodeId) -> None:
        self.sim.crash(pid)
        host = self.apps[pid]
        host.crashed = True
        host.events.append(Crash(self.sim.now))

    def _fault_app_crash(self) -> None:
        crashed = sum(1 for h in self.apps.values() if h.crashed)
        candidates = [p for p in self._apps() if self.apps[p].role != "monitor"]
        if crashed >= 3 or len(candidates) < 3:
            return
        victim = candidates[self.rng.randrange(len(candidates))]
        self._crash_app(victim)
        self._note(f"crash app {victim}")
        self.sim.at(self.sim.now + self.cfg.monitor_delay, lambda: self._monitor_suspect([victim]))

    def _fault_app_silent_crash(self) -> None:
        """A process dies and nobody suspects it: only its lease running out (the leader's
        suspect) lets the messages it was to confirm become stable."""
        crashed = sum(1 for h in self.apps.values() if h.crashed)
        candidates = [p for p in self._apps() if self.apps[p].role != "monitor"]
        if crashed >= 3 or len(candidates) < 3:
            return
        victim = candidates[self.rng.randrange(len(candidates))]
        self._crash_app(victim)
        self._silent.add(victim)
        self._note(f"crash app {victim} silently")

    def _fault_handover_sequence(self) -> None:
        self._handover(overlap=False)

    def _fault_handover_overlap(self) -> None:
        self._handover(overlap=True)

    def _handover(self, overlap: bool) -> None:
        """A new process takes over a submitter's session, as a retried Spark task does:
        it resubmits the same sequence numbers with the same contents, after its owner
        crashed (``overlap=False``) or while its owner is still at work (``True``).  The
        routers must keep one copy of each, and acknowledge both processes."""
        if self.cfg.replication or self._handovers >= 2:
            return  # the key-ring config ignores processes that never joined
        candidates = [
            p
            for p in self._apps("submitter")
            if self.apps[p].ep.joined_at is not None and self.apps[p].sent
        ]
        if not candidates:
            return
        self._handovers += 1
        old = candidates[self.rng.randrange(len(candidates))]
        host = self.apps[old]
        items = [host.sent[seq] for seq in sorted(host.sent)]
        if not overlap:
            self._crash_app(old)
            self.sim.at(self.sim.now + self.cfg.monitor_delay, lambda: self._monitor_suspect([old]))
        self._next_app += 1
        pid = f"h{self._next_app}"
        routers = [r for r in self.live()] or self.founders
        ep = Endpoint(pid, routers, self.cfg.endpoint, session=host.ep.session)
        self.credentials[pid] = (host.ep.session[0],)  # as Spark's tasks share one
        new = AppHost(pid, ep, self.history.log(pid), "handover", None, self.app)
        self.apps[pid] = new
        self.sim.add(pid, new)
        kind = "overlap" if overlap else "sequence"
        self._note(f"handover ({kind}) of {old}'s session to {pid}, {len(items)} messages")
        self.situations[f"handover_{kind}"] += 1
        self.sim.call(pid, lambda h, now: h.resubmit(items, now))

    def _fault_false_suspicion(self) -> None:
        candidates = [p for p in self._apps() if self.apps[p].role != "monitor"]
        if len(candidates) < 3 or len(self._false_suspects) >= 2:
            return
        victim = candidates[self.rng.randrange(len(candidates))]
        self._false_suspects.add(victim)
        self._note(f"suspect live app {victim}")
        self._monitor_suspect([victim])

    def _fault_app_cut(self) -> None:
        candidates = self._apps()
        leader = self.leader()
        if not candidates or leader is None:
            return
        victim = candidates[self.rng.randrange(len(candidates))]
        self.sim.cut(victim, leader)
        dur = self.rng.uniform(1.0, 3.0)
        self._note(f"cut app {victim} from leader {leader} for {dur:.2f}s")
        self._disrupt(dur, self._heal)

    def _fault_app_join(self) -> None:
        if len(self.apps) < self.cfg.submitters + self.cfg.receivers + 5:
            role = "submitter" if self.rng.random() < 0.5 else "receiver"
            pid = self._add_app(role)
            self._note(f"app join {pid}")

    def _replenish(self) -> None:
        super()._replenish()
        live = self.live()
        for host in self.apps.values():
            if live and not set(host.ep.succession) & set(live):
                host.ep.add_routers(live)  # as an SDK re-reading its router list would

    def _fault_app_part(self) -> None:
        candidates = [
            p
            for p in self._apps()
            if self.apps[p].role != "monitor" and self.apps[p].accepts_work()
        ]
        if len(candidates) < 3:
            return
        victim = candidates[self.rng.randrange(len(candidates))]
        self._note(f"app part {victim}")
        self.sim.call(victim, lambda h, now: h.record_submission(*h.ep.close(now), now))

    # ------------------------------------------------------------------ run
    def correct_apps(self) -> list[NodeId]:
        return [p for p in self.apps if self._app_alive(p)]

    def done(self) -> bool:
        if not self.quorum_up():
            return True
        if self.sim.now < self._probes_until + 0.2:
            return False
        correct = self.correct_routers()
        if not correct or not self.group_quiescent(correct):
            return False
        if any(self.routers[r].unstable() for r in correct):
            return False
        for p in self.correct_apps():
            ep = self.apps[p].ep
            joins = self.apps[p].role != "handover"  # a light client never joins
            if ep.window or ep.queued or ep.control or (joins and ep.joined_at is None):
                return False
        # A process that died without anyone suspecting it is not done with until its
        # lease ran out and the routers suspected it (else that suspect comes later).
        # (A process that never joined is owed nothing, and may never be suspected.)
        expelled = self.routers[correct[0]].state.expelled
        return all(
            p in expelled
            for p, h in self.apps.items()
            if h.crashed and h.role != "handover" and h.ep.joined_at is not None
        )

    def run(self) -> EcastRunResult:
        cfg = self.cfg
        started = time.perf_counter()
        self.founders = self.start_founders()
        self._add_app("monitor")
        for _ in range(cfg.submitters):
            self._add_app("submitter")
        for _ in range(cfg.receivers):
            self._add_app("receiver")
        sim = self.sim
        # Traffic stops before the faults do: some faults then hit an idle system, where a
        # leader change leaves nothing new to deliver (duplicates must be confirmed).
        last = 0.8 * cfg.fault_time
        for _ in range(cfg.messages):
            sim.at(self.rng.uniform(0.3, last), self._submit)
        for _ in range(int(cfg.messages * cfg.unsafe_fraction)):
            sim.at(self.rng.uniform(0.3, last), lambda: self._submit(unsafe=True))
        # Unsafe probes after the faults healed and the traffic ended: often the first
        # thing a leader elected during the quiet end of the fault phase forwards.
        self._probes_until = cfg.fault_time + 3.0
        for at in (0.5, 1.5, 3.0):
            sim.at(cfg.fault_time + at, lambda: self._submit(unsafe=True))
        self.schedule_background()
        if cfg.progress:
            t = 0.0
            while t < cfg.fault_time + cfg.settle_time:
                t += 1.0
                sim.at(t, lambda: cfg.progress(self.status_line()))  # type: ignore[misc]
        sim.run(cfg.fault_time)
        self.heal_everything()
        sim.run(cfg.fault_time + cfg.settle_time, stop=self.done)
        settled = self.done()
        self._settled = True
        sim.run(sim.now + GRACE)
        return self._verdict(settled, time.perf_counter() - started)

    def status_line(self) -> str:
        number, members = self.latest_view()
        leader = self.leader() or "-"
        acked = sum(1 for h in self.apps.values() for e in h.events if type(e) is Ack)
        unstable = {r: self.routers[r].unstable() for r in members if r in set(self.live())}
        return (
            f"t={self.sim.now:7.3f}s view {number} {list(members)} leader {leader} "
            f"submitted {self._submitted} acked {acked} unstable {unstable}"
        )

    def _verdict(self, settled: bool, wall: float) -> EcastRunResult:
        quorum = self.quorum_up()
        verdict = check_history(self.history, self.initial, liveness=quorum)
        ref = verdict.reference
        violations = verdict.messages()
        if quorum:
            if not settled:
                violations.append("termination: the run did not quiesce within the settle time")
            violations.extend(self._memory_violations())
            violations.extend(self.lingering_retirees())
        violations.extend(self.app.check(self, quorum and settled))
        for p in self._false_suspects:
            if p in ref.suspected and self.apps[p].ep.terminated == "suspected":
                self.situations["false_suspicion"] += 1
        lease_suspects = {
            p
            for m in ref.messages.values()
            if m.sender == ROUTERS
            for p in (m.header.get("who", ()) if type(m.header) is dict else ())
        }
        self.situations["lease_suspect"] += len(self._silent & lease_suspects)
        events = [e for h in self.apps.values() for e in h.events]
        delivered = sum(1 for e in events if type(e) is Deliver)
        acked = sum(1 for e in events if type(e) is Ack)
        uns = [e for e in events if type(e) is DeliverUnsafe]
        # An unsafe copy from a leader that had sent its destination nothing since it took
        # over (no tag), accepted: the case a leader change would otherwise starve.
        self.situations["unsafe_untagged_accepted"] += sum(
            1 for e in uns if e.tag < 0 and e.accepted
        )
        stats = self.summed_stats(
            [self.routers[r].stats for r in self.routers] + [c.stats for c in self.cores.values()]
        )
        return EcastRunResult(
            seed=self.cfg.seed,
            messages=self._submitted,
            delivered=delivered,
            stable=acked,
            unsafe_accepted=sum(1 for e in uns if e.accepted),
            unsafe_delivered=len(uns),
            violations=violations,
            situations=dict(self.situations),
            faults=self.faults,
            routers_started=len(self.routers),
            virtual_s=self.sim.now,
            wall_s=wall,
            events=self.sim.events,
            digest=self.sim.digest(),
            stats=stats,
            quorum=quorum,
        )

    def _memory_violations(self) -> list[str]:
        """After quiescence, routers hold no per-message state for stable messages."""
        out = []
        for r in self.correct_routers():
            mem = self.routers[r].memory()
            held = {
                k: v
                for k, v in mem.items()
                if k
                in (
                    "mseq_entries",
                    "unstable",
                    "by_id",
                    "suspects",
                    "remaining",
                    "waiting",
                    "routed_by",
                    "proposed",
                )
                and v
            }
            if held or mem["configs"] != 1:
                out.append(f"bounded-memory: quiescent router {r} still holds {held or mem}")
        return out[:5]


def run_ecast(cfg: EcastRunConfig) -> EcastRunResult:
    with mutations.planted(cfg.mutations):
        return EcastRun(cfg).run()
