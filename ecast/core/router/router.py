"""The E-Cast router: Algorithm 11 with everything section 3.5 adds.

Three parts, each in its own module: ufabcast (:mod:`ecast.core.ufabcast`) agrees on
commands; :class:`~ecast.core.router.state.RouterState` is what every router learns from
them, identically; :class:`~ecast.core.router.forwarding.Forwarding` is what only the
leader does (forward, collect confirmations, acknowledge).  This class takes inputs from
routers and application processes, feeds ufabcast, learns what it executes, and leads
when it is the oldest router of its view (3.5.2).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from ecast.core import mutations
from ecast.core.config import KIND, ROUTERS, SUSPECT, WHO, Config
from ecast.core.effects import Effects, NodeId, UnexpectedMessage
from ecast.core.histogram import Histogram
from ecast.core.message import Message, MsgId, Submission
from ecast.core.message import fast_new as _tnew
from ecast.core.mseq import ConfigGuard
from ecast.core.proto import (
    CloseForbidden,
    CloseSessions,
    CloseSessionsCmd,
    Confirm,
    Detach,
    Hello,
    KeepAlive,
    Leader,
    Route,
    RouteCmd,
    RouteUnsafe,
    StableCmd,
    Suspected,
    UnsafeShed,
    Welcome,
)
from ecast.core.roles import (
    RoleOf,
    SpeaksFor,
    acts_as_router,
    everyone_is_a_router,
    may_close_sessions,
    may_use_session,
    speaks_for_anyone,
)
from ecast.core.router.forwarding import Forwarding, StableNotices
from ecast.core.router.outbox import AppOutbox
from ecast.core.router.params import (
    JOIN_WITHOUT_SESSIONS,
    NO_LEASE_EXPIRY,
    ROUTE_LATEST_CONFIG,
    SKIP_LEARN_DEDUP,
    RouterParams,
)
from ecast.core.router.state import RouterState
from ecast.core.ufabcast import (
    Executed,
    Installed,
    SnapshotNeeded,
    Stopped,
    Ufabcast,
    ViewChanged,
)
from ecast.core.ufabcast.messages import UFAB_MESSAGES

_UFAB_TYPES = frozenset(UFAB_MESSAGES)
_APP_TYPES = frozenset({Confirm, Route, RouteUnsafe, Hello, CloseSessions, Detach, KeepAlive})
_KNOWN_TYPES = _UFAB_TYPES | _APP_TYPES
__all__ = ["Router", "RouterParams"]


class Router:
    """One E-Cast router.  Give ``routers`` for a founder, ``seeds`` for a joiner.

    ``role_of(peer)`` says what the peer's credential is (``ecast.core.roles``): ufabcast
    messages are taken only from routers (the runtime proves the credentials; without a
    ``role_of`` every peer counts as one, for hosts that prove nothing).  ``speaks_for``
    says which names it covers: an application process submits in a session, or closes
    sessions, only under a namespace its credential covers (``may_use_session``); the
    router that receives the submission decides, and the others trust its proposal.
    """

    def __init__(
        self,
        me: NodeId,
        config: Config,
        params: RouterParams | None = None,
        *,
        routers: list[NodeId] | tuple[NodeId, ...] | None = None,
        seeds: list[NodeId] | tuple[NodeId, ...] | None = None,
        role_of: RoleOf | None = None,
        speaks_for: SpeaksFor | None = None,
    ) -> None:
        self.me = me
        self.role_of: RoleOf = role_of or everyone_is_a_router
        self.speaks_for: SpeaksFor = speaks_for or speaks_for_anyone
        self.p = params or RouterParams()
        self.config_class = type(config)
        """The only config class a peer's snapshot may name."""
        self.guard = ConfigGuard()
        self.ufab = Ufabcast(me, self.p.ufab, members=routers, seeds=seeds)
        # A joiner's state comes from a peer's snapshot; a founder numbers from the origin.
        self.state = RouterState(config, self.guard, self.p.expelled_memory, self.p.origin)
        self.lead: Forwarding | None = None
        self.stopped = False
        self.successor: Leader | None = None
        """Where the group is, if a router of a later view told us we were parted: the
        announcement our processes get (at once, and whenever they greet us)."""
        self.apps: dict[NodeId, None] = {}
        """Application processes that contacted us (ordered, for announcements)."""
        self.heard: dict[NodeId, float] = {}
        """Application process -> when it last sent us anything (its lease)."""
        self.leases: dict[NodeId, float] = {}
        """Application process -> the lease granted to it, when it asked for one."""
        self._lease_seq = 0
        """Sequence numbers of the suspects this router submits (its own session)."""
        self._pointed = -1
        """The view whose leader a follower last named to its processes."""
        self._learned_at: deque[tuple[int, float]] = deque()
        """``(first t, time)`` of every learned route command, while any of it is
        unstable: the age of the oldest unstable message, for health checks."""
        self.stable_seconds = Histogram()
        """Learning a route command to learning every message of it stable (all its
        destinations acknowledged): the delivery latency operators watch, per batch."""
        self._proposed: dict[MsgId, NodeId | set[NodeId]] = {}
        """Ids this router proposed and has not learned yet, with who routed them
        (receipt-time dedup: a process re-routing its own message is not proposed twice;
        another process routing the same id is, and learns the ack as a duplicate).  One
        router, the common case, is kept as its name: a set per message cost the leader
        an allocation for every message it proposed."""
        self._routes: list[Message] = []
        self._closes: list[CloseSessionsCmd] = []
        self.notices = StableNotices()
        self.outbox = AppOutbox()
        self._next_periodic = 0.0
        self.link_lag: Callable[[NodeId], int] | None = None
        """Messages sent to a peer and not yet acknowledged by its link (the host wires in
        ``Node.lag``): how unsafe traffic learns that a destination lags."""
        self._now = 0.0
        self._fx: Effects | None = None
        self.counts: dict[str, int] = {
            "routed": 0,
            "delivered": 0,
            "congestion_notices": 0,
            "unsafe_sent": 0,
            "unsafe_dropped": 0,
            "closed_rejects": 0,
            "takeovers": 0,
            "leases_expired": 0,
            "suspects_issued": 0,
            "expelled_refused": 0,
            "refused_not_router": 0,
            "forbidden_sessions": 0,
        }

    @property
    def observer(self) -> Callable[[int, Message], None] | None:
        """Called with every message this router appends (or installs), for checkers."""
        return self.state.observer

    @observer.setter
    def observer(self, fn: Callable[[int, Message], None] | None) -> None:
        self.state.observer = fn

    @property
    def stats(self) -> dict[str, int]:
        return {**self.counts, **self.state.stats, "config_errors": self.guard.errors}

    # ================================================================== inputs
    def on_message(self, src: NodeId, msg: Any, now: float) -> Effects:
        return self.on_messages(src, (msg,), now)

    def on_messages(self, src: NodeId, msgs: tuple[Any, ...] | list[Any], now: float) -> Effects:
        return self.on_batch(((src, msgs),), now)

    def on_batch(
        self, batch: tuple[tuple[NodeId, Any], ...] | list[tuple[NodeId, Any]], now: float
    ) -> Effects:
        """Messages from several senders in one step (one packet from a process that hosts
        many endpoints): forwarding, proposing and flushing run once for all of them."""
        known = _KNOWN_TYPES
        ufab = _UFAB_TYPES
        for src, msgs in batch:
            from_router: bool | None = None
            for m in msgs:
                t = type(m)
                if t not in known:
                    raise UnexpectedMessage("router", src, t.__name__)
                if t in ufab:
                    if from_router is None:
                        from_router = acts_as_router(self.role_of(src))
                    if not from_router:
                        self.counts["refused_not_router"] += 1
                        raise UnexpectedMessage(
                            "router", src, f"{t.__name__} from a peer without a router credential"
                        )
            if src[:1] == "@":
                raise UnexpectedMessage("router", src, "a message from a reserved @ name")
        self._begin(now)
        for src, msgs in batch:
            ufab_msgs = [m for m in msgs if type(m) in _UFAB_TYPES]
            if ufab_msgs:
                self._absorb(self.ufab.on_messages(src, ufab_msgs, now))
            if len(ufab_msgs) != len(msgs):
                if not self.stopped:
                    self._from_app(src, [m for m in msgs if type(m) not in _UFAB_TYPES])
                elif self.successor is not None:
                    self._send(src, self.successor)
        return self._end()

    def on_tick(self, now: float) -> Effects:
        self._begin(now)
        self._absorb(self.ufab.on_tick(now))
        if not self.stopped and now >= self._next_periodic:
            self._next_periodic = now + self.p.congestion_interval
            if self.lead is not None:
                self.lead.periodic()
                view = self.ufab.view
                # The oldest router keeps the lease book (under ``all_leaders`` the others
                # lead too, but processes talk to it).
                primary = view is not None and view.members[0] == self.me
                if primary and not mutations.on(NO_LEASE_EXPIRY):
                    self._expire_leases()
        return self._end()

    def leave(self, now: float) -> Effects:
        """Part from the router group gracefully."""
        self._begin(now)
        self._absorb(self.ufab.leave(now))
        return self._end()

    # ================================================================== introspection
    def leading(self) -> bool:
        return self.lead is not None

    def unstable(self) -> int:
        return self.state.mseq.unstable()

    def oldest_unstable_age(self, now: float) -> float:
        """Seconds since the oldest unstable message was learned (0 if none is)."""
        floor = self.state.mseq.floor
        samples = self._learned_at
        while len(samples) > 1 and samples[1][0] <= floor:
            samples.popleft()
        if not samples or self.state.mseq.unstable() == 0:
            return 0.0
        return max(0.0, now - samples[0][1])

    def _observe_stable(self) -> None:
        """Count every route command that became wholly stable (one observation each)."""
        samples = self._learned_at
        mseq = self.state.mseq
        floor = mseq.floor
        while samples:
            end = samples[1][0] if len(samples) > 1 else mseq.next_t
            if floor < end:
                return
            self.stable_seconds.observe(self._now - samples.popleft()[1])

    def waiting_for(self) -> list[NodeId]:
        """Destinations whose confirmations the leader still awaits, longest first."""
        lead = self.lead
        if lead is None:
            return []
        heads = [(q[0], d) for d, q in lead.waiting.items() if q]
        return [d for _t, d in sorted(heads)]

    def connected_apps(self, now: float) -> int:
        """Application processes heard from within their lease."""
        default = self.p.client_lease
        return sum(1 for p, h in self.heard.items() if now - h <= self.leases.get(p, default))

    def memory(self) -> dict[str, int]:
        st = self.state
        lead = self.lead
        return {
            "mseq_entries": len(st.mseq.entries),
            "configs": len(st.mseq.configs),
            "unstable": st.mseq.unstable(),
            "by_id": len(st.by_id),
            "suspects": len(st.suspects) + len(st.departed),
            "sessions": len(st.sessions),
            "ack_cache": sum(len(a) for a in st.acks.values()),
            "remaining": len(lead.remaining) if lead else 0,
            "waiting": sum(len(q) for q in lead.waiting.values()) if lead else 0,
            "routed_by": len(lead.routed_by) if lead else 0,
            "acked_early": len(lead.acked) if lead else 0,
            "proposed": len(self._proposed),
        }

    # ================================================================== call framing
    def _begin(self, now: float) -> None:
        self._now = now
        self._fx = Effects()
        if self.lead is not None:
            self.lead.at(now)

    def _absorb(self, fx: Effects) -> None:
        """Take ufabcast's effects: pass sends through, process its upcalls in order."""
        out = self._fx
        assert out is not None
        out.send.extend(fx.send)
        out.forget.extend(fx.forget)
        out.wake(fx.wake_at)
        for up in fx.deliver:
            t = type(up)
            if t is Executed:
                self._learn_command(up.payload)
            elif t is ViewChanged:
                pass  # leadership is re-evaluated at the end of every step
            elif t is SnapshotNeeded:
                snap = self.state.snapshot(not mutations.on(JOIN_WITHOUT_SESSIONS))
                self._absorb(self.ufab.provide_snapshot(up.joiner, up.tag, snap, self._now))
            elif t is Installed:
                observer, stats = self.observer, self.state.stats
                self.state = RouterState.restore(
                    up.app_state, self.config_class, self.guard, self.p.expelled_memory
                )
                self.state.observer = observer
                self.state.stats = stats  # counters never go back
                self.lead = None  # rebuilt below if we lead
                self._proposed.clear()
                if observer is not None:
                    for t_, m in sorted(self.state.mseq.entries.items()):
                        observer(t_, m)
            elif t is Stopped:
                self.stopped = True
                self.lead = None
                if up.successor is not None:
                    # Parted while away, and told so by a router of a later view: our
                    # processes may know no router of that view (the ones they were
                    # given may all have left since).  Point them there.
                    self.successor = Leader(up.successor.view, up.successor.members)
                    for p in self.apps:
                        self._send(p, self.successor)

    def _end(self) -> Effects:
        fx = self._fx
        assert fx is not None
        if not self.stopped:
            self._check_leadership()
            lead = self.lead
            if lead is not None:
                self._announce(lead)
                lead.forward(mutations.on(ROUTE_LATEST_CONFIG))
            else:
                self._point_to_leader()
            self._propose()
            self.counts["closed_rejects"] += self.outbox.flush(self._send)
            notices = self.notices
            if notices.entries and notices.since is not None:
                fx.wake(notices.since + self.p.ack_delay)
            fx.wake(self._next_periodic)
        self._fx = None
        return fx

    def _send(self, dst: NodeId, msg: Any) -> None:
        assert self._fx is not None
        self._fx.send.append((dst, msg))

    # ================================================================== leadership
    def _should_lead(self) -> bool:
        u = self.ufab
        if not u.installed or u.stopped or u.view is None:
            return False
        return self.p.all_leaders or u.view.members[0] == self.me

    def _check_leadership(self) -> None:
        if self._should_lead():
            if self.lead is None:
                self._take_over()
        elif self.lead is not None:
            self.lead = None

    def _take_over(self) -> None:
        """Become leader: forward every unstable message again, from the stable floor, and
        give every application process a full lease before it may be suspected."""
        self.counts["takeovers"] += 1
        self.lead = Forwarding(self.state, self.p, self.outbox, self.notices, self.counts)
        self.lead.at(self._now)
        st = self.state
        for p in sorted(st.mseq.latest.members()):  # never a set's hash order
            self.apps.setdefault(p, None)
        now = self._now
        for p in self.apps:
            if p not in st.expelled and not st.gone(p):
                self.heard[p] = now

    # ================================================================== leases
    def _expire_leases(self) -> None:
        """The leader suspects every process silent past its lease, in one message.

        Every destination it waits for holds a lease, even one it never heard from and
        that is no member of the latest config: a process that parted and crashed before
        confirming its own part, after the leader it talked to crashed too.  Its part
        left the members, so ``_take_over`` gave it no lease, and without one nobody
        would ever suspect it: its part would stay unstable for good."""
        now = self._now
        st = self.state
        heard = self.heard
        if self.lead is not None:
            for d in self.lead.waiting:
                if d not in heard and d not in st.expelled and not st.gone(d):
                    heard[d] = now
                    self.apps.setdefault(d, None)
        default = self.p.client_lease
        leases = self.leases
        expired = [p for p, h in heard.items() if now - h > leases.get(p, default)]
        if not expired:
            return
        for p in expired:
            del heard[p]
        self.counts["leases_expired"] += len(expired)
        who = sorted(p for p in expired if p not in st.expelled and not st.gone(p))
        if not who:
            return
        self._lease_seq += 1
        sid = ((ROUTERS, 0, self.me), self._lease_seq)
        header = {KIND: SUSPECT, WHO: who, "lease": True}
        self._routes.append(Message(ROUTERS, sid, header, None))
        self.counts["suspects_issued"] += 1

    def _point_to_leader(self) -> None:
        """A follower that installs a new view names its leader to the processes that
        talk to it.  One that moved here while this router could see no view (it was cut
        off with it) was not told, and would stay: the leader, which keeps the lease
        book, would never hear from it and would suspect it, a false suspicion after
        every partition that a client rode out on the minority side."""
        view = self.ufab.view
        if view is None or not self.ufab.installed or view.number == self._pointed:
            return
        self._pointed = view.number
        for p in self.apps:
            if not self.state.gone(p):
                self._tell_leader(p)

    def _announce(self, lead: Forwarding) -> None:
        view = self.ufab.view
        assert view is not None
        lead.announce(view.number, view.members, self.apps)

    # ================================================================== from endpoints
    def _from_app(self, src: NodeId, msgs: list[Any]) -> None:
        if src in self.state.expelled:
            # Suspected before: it must stop, never resume (the config ignores it too).
            self.counts["expelled_refused"] += 1
            self.outbox.send(src, Suspected(self.state.expelled.get(src)))
            return
        told = False
        if self.state.gone(src):
            # It left: still answered (a late confirmation, its part resent for a lost
            # acknowledgement), but it holds no lease and gets no announcements.
            pass
        elif src in self.apps:
            self.heard[src] = self._now
        else:
            self.heard[src] = self._now
            self.apps[src] = None
            self._tell_leader(src)
            told = True
        for msg in msgs:
            t = type(msg)
            if t is Confirm:
                if self.lead is not None:
                    self.lead.on_confirm(src, msg.upto)
            elif t is Route:
                self._on_route(src, msg)
            elif t is RouteUnsafe:
                lead = self.lead
                if lead is None:  # we sent nobody anything: no copy could ever be accepted
                    self.counts["unsafe_dropped"] += len(msg.subs)
                    self.outbox.send(src, UnsafeShed(tuple(s.id for s in msg.subs)))
                    if not told:  # unsafe messages go to the leader: say who it is
                        self._tell_leader(src)
                        told = True
                else:
                    subs = self._permitted(src, msg.subs)
                    if subs:
                        lead.forward_unsafe(src, subs, self.link_lag)
            elif t is Hello:
                if not told and src in self.apps:
                    self._tell_leader(src)
                    told = True
                self._grant_lease(src, msg.lease)
            elif t is KeepAlive:
                # Hearing from it renewed its lease (``heard``, above); the answer tells an
                # idle process that this router is alive.
                self.outbox.send(src, msg)
            elif t is Detach:
                self._forget_app(src)
                return
            elif t is CloseSessions:
                allowed = may_close_sessions(self.speaks_for, src, msg.namespace)
                if allowed:
                    self._closes.append(CloseSessionsCmd(src, msg.namespace, msg.epoch))
                elif allowed is not None:
                    self.counts["forbidden_sessions"] += 1
                    self.outbox.send(src, CloseForbidden(msg.namespace, msg.epoch))

    def _tell_leader(self, src: NodeId) -> None:
        """Tell an application process who leads, if not us: whenever it greets us (it
        may have moved here from a router it thought gone) or sends us what only a
        leader can forward (unsafe messages)."""
        view = self.ufab.view
        if self.lead is None and view is not None and self.ufab.installed:
            self.outbox.send(src, Leader(view.number, view.members))

    def _grant_lease(self, src: NodeId, asked: Any) -> None:
        """Answer a ``Hello``: always, since a greeting may come from a new process that
        took a name this router still holds a lease for."""
        p = self.p
        lease = p.client_lease
        if type(asked) in (int, float) and asked > 0:
            lease = min(float(asked), p.max_client_lease)
        if not self.state.gone(src):
            self.leases[src] = lease
        self.outbox.send(src, Welcome(lease, p.max_message))

    def _forget_app(self, p: NodeId) -> None:
        """``p`` left for good (detached, or its departure is collected)."""
        self.apps.pop(p, None)
        self.heard.pop(p, None)
        self.leases.pop(p, None)

    def _permitted(self, src: NodeId, subs: tuple[Submission, ...]) -> tuple[Submission, ...]:
        """The submissions ``src`` may make: those in sessions of namespaces it may use.
        The others are answered ``Forbidden`` (or dropped unanswered while the peer is
        unknown: its connection went, and its process resends after reconnecting).  One
        check per run of submissions in the same namespace, the usual whole batch."""
        speaks_for = self.speaks_for
        ns: str | None = None
        ok: bool | None = True
        kept: list[Submission] | None = None
        for i, sub in enumerate(subs):
            sess = sub.id[0]
            if sess[0] != ns:
                ns = sess[0]
                ok = may_use_session(speaks_for, src, ns)
            if ok:
                if kept is not None:
                    kept.append(sub)
                continue
            if kept is None:
                kept = list(subs[:i])
            if ok is not None:
                self.counts["forbidden_sessions"] += 1
                self.outbox.reject_forbidden(src, sub.id)
        return subs if kept is None else tuple(kept)

    def _on_route(self, src: NodeId, msg: Route) -> None:
        st = self.state
        lead = self.lead
        closed = st.closed
        proposed = self._proposed
        for sub in self._permitted(src, msg.subs):
            sid = sub.id
            sess, seq = sid
            if closed and closed.get(sess[0], -1) >= sess[1]:
                self.outbox.reject_closed(src, sid)
                continue
            t = st.by_id.get(sid)
            if t is not None:
                # Learned, not stable: never propose it again; ack it when it is stable.
                if lead is not None:
                    lead.also_routed(t, src)
                continue
            if seq < st.sessions.get(sess, 1):
                ack = st.acks.get(sess, {}).get(seq)
                self.outbox.ack(src, (sid, *ack) if ack is not None else (sid, None, False))
                continue
            routed = proposed.get(sid)
            if routed is None:
                proposed[sid] = src
            elif routed == src if type(routed) is str else src in routed:
                continue
            elif type(routed) is str:
                # Another process routes it: it learns the ack as a duplicate.
                proposed[sid] = {routed, src}
            else:
                routed.add(src)
            self._routes.append(_tnew(Message, (src, sid, sub.header, sub.payload)))

    # ================================================================== learning
    def _learn_command(self, payload: Any) -> None:
        lead = self.lead
        st = self.state
        for cmd in payload:
            t = type(cmd)
            if t is RouteCmd:
                if not st.mseq.unstable():
                    self._learned_at.clear()
                self._learned_at.append((st.mseq.next_t, self._now))
                if self._proposed:
                    proposed = self._proposed
                    for m in cmd.msgs:
                        proposed.pop(m[1], None)
                st.learn_routes(cmd.msgs, lead, not mutations.on(SKIP_LEARN_DEDUP))
            elif t is StableCmd:
                st.learn_stable(cmd.entries, self.p.ack_cache, lead)
            elif t is CloseSessionsCmd:
                st.learn_close(cmd.requester, cmd.namespace, cmd.epoch, lead)
        self._collect()

    def _collect(self) -> None:
        gone = self.state.collect()
        if self._learned_at:
            self._observe_stable()
        if gone and self._fx is not None:
            view = self.ufab.view
            for p in gone:
                self._forget_app(p)
                if view is None or p not in view.members:
                    # Its departure is stable and collected: nothing more is owed to it, so
                    # its resend buffers go (3.3.4; a router's own channels follow
                    # ufabcast's views instead).
                    self._fx.drop.append(p)

    # ================================================================== output
    def _propose(self) -> None:
        """One ufabcast proposal per step: new routes, plus stable notices when due."""
        cmds: list[Any] = []
        if self._routes:
            cmds.append(RouteCmd(tuple(self._routes)))
            self.counts["routed"] += len(self._routes)
            self._routes = []
        notices = self.notices
        if notices.entries:
            due = (
                not self.p.delayed_acks
                or cmds
                or self._now >= (notices.since or 0.0) + self.p.ack_delay
                # An idle pipeline has nothing to piggyback on: waiting would only add
                # latency (adaptive delayed acknowledgements, 3.5.7's future work).  Only
                # an acknowledgement that waits for its notice (a part, or early acks off)
                # is worth a consensus round of its own; the others went out already, and
                # a round per message would double the leader's writes at light load.
                or (self.p.adaptive_acks and notices.waited and self.ufab.idle())
            )
            if due:
                cmds.append(StableCmd(notices.take()))
        if self._closes:
            cmds.extend(self._closes)
            self._closes = []
        if cmds:
            self._absorb(self.ufab.propose(tuple(cmds), self._now))
            if self.lead is not None:
                self.lead.forward(mutations.on(ROUTE_LATEST_CONFIG))  # a founder of one
