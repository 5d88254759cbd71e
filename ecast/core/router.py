"""The E-Cast router: Algorithm 11 with everything section 3.5 adds.

Every router learns the same m-seq through ufabcast and applies it to the same replicated
state (:class:`RouterState`): the :class:`~ecast.core.mseq.MSeq`, the session table, the stable
acknowledgements still owed, per-sender unstable counts and the suspects that unstable
messages still need.  Learning is deterministic, so duplicates and gaps are resolved
identically everywhere (3.4.4: "deterministically at every router").

The leader is the oldest router in join order (3.5.2).  Only the leader forwards, tracks
confirmations and proposes stability; that state (:class:`_Lead`) is local and rebuilt by
whoever becomes leader: it sends every unstable message again, in ``t`` order per
destination, and endpoints confirm duplicates.  Any router may act as leader at any time
without breaking safety (``RouterParams.all_leaders`` tests exactly that).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ecast.core.config import Config
from ecast.core.effects import Effects, NodeId, UnexpectedMessage
from ecast.core.message import Message, MsgId, Session
from ecast.core.message import fast_new as _tnew
from ecast.core.mseq import MSeq
from ecast.core.proto import (
    Closed,
    CloseSessions,
    CloseSessionsCmd,
    Confirm,
    Congestion,
    Deliver,
    DeliverUnsafe,
    Hello,
    Leader,
    Route,
    RouteCmd,
    RouteUnsafe,
    SessionsClosed,
    Stable,
    StableCmd,
    Suspected,
)
from ecast.core.ufabcast import (
    Executed,
    Installed,
    SnapshotNeeded,
    Stopped,
    Ufabcast,
    UfabParams,
    ViewChanged,
)
from ecast.core.ufabcast.messages import UFAB_MESSAGES

ROUTER_MUTATIONS = frozenset(
    {
        "skip_learn_dedup",  # append duplicates and gaps instead of dropping them
        "route_latest_config",  # route with the latest config, not the message's prefix
        "ignore_suspects",  # keep waiting for confirmations from suspected destinations
        "join_without_sessions",  # a joining router gets no session table
    }
)
_UFAB_TYPES = frozenset(UFAB_MESSAGES)
_APP_TYPES = frozenset({Confirm, Route, RouteUnsafe, Hello, CloseSessions})
_KNOWN_TYPES = _UFAB_TYPES | _APP_TYPES


@dataclass(frozen=True, slots=True)
class RouterParams:
    ufab: UfabParams = field(default_factory=UfabParams)
    delayed_acks: bool = True
    """Buffer stable notices and piggyback them on route proposals (3.5.7)."""
    ack_delay: float = 0.010
    early_acks: bool = True
    """Acknowledge a message as soon as it is stable, before the stable notice is agreed
    (see ``Router._stable_candidate``)."""
    adaptive_acks: bool = True
    """Propose stable notices at once when ufabcast has nothing in flight to carry them and
    an acknowledgement waits for them (see ``Router._propose``)."""
    congestion_threshold: int = 1024
    congestion_interval: float = 0.25
    """Also the period at which suspects are re-applied to outstanding confirmations."""
    ack_cache: int = 1024
    """Stable acknowledgements remembered per session, for duplicates of stable messages
    (an endpoint's window never exceeds this, so older ones were surely received)."""
    unsafe_backlog: int = 4096
    """Unsafe copies are dropped for a destination this far behind on confirmations, or
    with this many messages sent to it and not yet acknowledged by its link (``backlog``).
    Unsafe messages bypass flow control; without this a flood of them grows the buffers
    of a slow destination without bound."""
    all_leaders: bool = False
    """Every router forwards and proposes stability (a test mode: safety must hold)."""
    mutations: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        unknown = set(self.mutations) - ROUTER_MUTATIONS
        if unknown:
            raise ValueError(f"unknown router mutations: {sorted(unknown)}")


class RouterState:
    """What every router holds identically after learning the same commands."""

    __slots__ = ("acks", "by_id", "closed", "departed", "mseq", "sessions", "suspects")

    def __init__(self, config: Config) -> None:
        self.mseq = MSeq(config)
        self.sessions: dict[Session, int] = {}
        """Session -> next expected sequence number."""
        self.acks: dict[Session, dict[int, tuple[int, bool]]] = {}
        """Session -> seq -> (t, delivered) of its most recent stable messages."""
        self.closed: dict[str, int] = {}
        """Namespace -> highest closed epoch (one watermark per namespace)."""
        self.by_id: dict[MsgId, int] = {}
        """Learned, unstable messages by id."""
        self.suspects: dict[NodeId, int] = {}
        """Suspected process -> t of the first message suspecting it; kept while any
        unstable message before it may still name it as a destination."""
        self.departed: dict[NodeId, int] = {}
        """Process -> t of its own part, once that part is stable.  It delivered every
        message before its part (delivery is in t order), so nobody waits for it; kept,
        like suspects, while unstable messages before it remain."""

    def unstable_per_sender(self) -> dict[NodeId, int]:
        """Unstable messages per sender (flow control, 3.5.6).

        Counted when the leader looks (every 250 ms, over at most the unstable messages)
        rather than kept up to date on every router for every message learned and made
        stable: that cost more than the look ever does.
        """
        counts: dict[NodeId, int] = {}
        stable = self.mseq.stable
        for t, msg in self.mseq.entries.items():
            if t not in stable:
                sender = msg.sender
                counts[sender] = counts.get(sender, 0) + 1
        return counts

    def snapshot(self, with_sessions: bool = True) -> dict[str, Any]:
        return {
            "mseq": self.mseq.snapshot(),
            "sessions": list(self.sessions.items()) if with_sessions else [],
            "acks": [(s, list(a.items())) for s, a in self.acks.items()] if with_sessions else [],
            "closed": list(self.closed.items()),
            "by_id": list(self.by_id.items()),
            "suspects": list(self.suspects.items()),
            "departed": list(self.departed.items()),
        }

    @classmethod
    def restore(cls, snap: dict[str, Any]) -> RouterState:
        st = cls.__new__(cls)
        st.mseq = MSeq.restore(snap["mseq"])
        st.sessions = {tuple(s): n for s, n in snap["sessions"]}
        st.acks = {tuple(s): {seq: tuple(v) for seq, v in a} for s, a in snap["acks"]}
        st.closed = dict(snap["closed"])
        st.by_id = {(tuple(sid[0]), sid[1]): t for sid, t in snap["by_id"]}
        st.suspects = dict(snap["suspects"])
        st.departed = dict(snap["departed"])
        return st


class _Lead:
    """Leader-local forwarding and stability state (not replicated, rebuilt on takeover)."""

    __slots__ = (
        "acked",
        "announced",
        "announced_upto",
        "frontier",
        "last_sent",
        "remaining",
        "routed_by",
        "waiting",
    )

    def __init__(self, frontier: int) -> None:
        self.frontier = frontier
        """Every message with ``t < frontier`` has been forwarded by this leader."""
        self.remaining: dict[int, int] = {}
        """t -> 2 * (destinations that still must confirm) + (1 if one confirmed already,
        the ack's ``delivered``).  One int per message, not a set entry more per copy."""
        self.waiting: dict[NodeId, deque[int]] = {}
        """Destination -> timestamps sent to it and not confirmed yet, in order."""
        self.last_sent: dict[NodeId, int] = {}
        self.routed_by: dict[int, set[NodeId]] = {}
        """Other processes that routed a learned, unstable message (they get the ack too)."""
        self.announced: dict[NodeId, int] = {}
        """Application process -> router view last announced to it."""
        self.announced_upto: tuple[int, int] = (-1, -1)
        """(view, number of known processes) when every known process was announced to:
        forwarding, which runs per batch, skips the scan while nothing changed."""
        self.acked: set[int] = set()
        """Stable timestamps acknowledged before their stable notice was learned."""


class Router:
    """One E-Cast router.  Give ``routers`` for a founder, ``seeds`` for a joiner."""

    def __init__(
        self,
        me: NodeId,
        config: Config,
        params: RouterParams | None = None,
        *,
        routers: list[NodeId] | tuple[NodeId, ...] | None = None,
        seeds: list[NodeId] | tuple[NodeId, ...] | None = None,
    ) -> None:
        self.me = me
        self.p = params or RouterParams()
        self._mut = self.p.mutations
        self.ufab = Ufabcast(me, self.p.ufab, members=routers, seeds=seeds)
        self.state = RouterState(config)
        self.lead: _Lead | None = None
        self.stopped = False
        self.apps: dict[NodeId, None] = {}
        """Application processes that contacted us (ordered, for announcements)."""
        self._proposed: dict[MsgId, None] = {}
        """Ids this router proposed that are not learned yet (receipt-time dedup only)."""
        self._routes: list[Message] = []
        self._stable_out: list[tuple[int, bool]] = []
        self._stable_since: float | None = None
        self._stable_waited = False
        """Some message in ``_stable_out`` is acknowledged only once its notice is learned."""
        self._closes: list[CloseSessionsCmd] = []
        self._out: dict[NodeId, list[Any]] = {}
        """Per application process, what to send this step, in order: ``(t, msg)`` to
        deliver, ``(tag, frontier, msg)`` unsafe, or a whole message object."""
        self._acks_out: dict[NodeId, list[tuple[MsgId, int | None, bool]]] = {}
        self._closed_out: dict[NodeId, list[MsgId]] = {}
        self._sorted: dict[frozenset[NodeId], tuple[NodeId, ...]] = {}
        self._next_periodic = 0.0
        self.observer: Callable[[int, Message], None] | None = None
        """Called with every message this router appends (or installs), for checkers."""
        self.backlog: Callable[[NodeId], int] | None = None
        """Messages sent to a peer and not yet acknowledged by its link (the host wires in
        ``LinkLayer.backlog``): how unsafe traffic learns that a destination lags."""
        self._now = 0.0
        self._fx: Effects | None = None
        self.stats: dict[str, int] = {
            "routed": 0,
            "learned": 0,
            "duplicates": 0,
            "gaps": 0,
            "delivered": 0,
            "stable": 0,
            "congestion_notices": 0,
            "unsafe_sent": 0,
            "unsafe_dropped": 0,
            "closed_rejects": 0,
            "takeovers": 0,
        }

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
        for src, msgs in batch:
            for m in msgs:
                if type(m) not in known:
                    raise UnexpectedMessage("router", src, type(m).__name__)
        self._begin(now)
        for src, msgs in batch:
            ufab_msgs = [m for m in msgs if type(m) in _UFAB_TYPES]
            if ufab_msgs:
                self._absorb(self.ufab.on_messages(src, ufab_msgs, now))
            if len(ufab_msgs) != len(msgs) and not self.stopped:
                self._from_app(src, [m for m in msgs if type(m) not in _UFAB_TYPES])
        return self._end()

    def on_tick(self, now: float) -> Effects:
        self._begin(now)
        self._absorb(self.ufab.on_tick(now))
        if not self.stopped and now >= self._next_periodic:
            self._next_periodic = now + self.p.congestion_interval
            self._periodic()
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
                snap = self.state.snapshot("join_without_sessions" not in self._mut)
                self._absorb(self.ufab.provide_snapshot(up.joiner, up.tag, snap, self._now))
            elif t is Installed:
                self.state = RouterState.restore(up.app_state)
                self.lead = None  # rebuilt below if we lead
                self._proposed.clear()
                if self.observer is not None:
                    for t_, m in sorted(self.state.mseq.entries.items()):
                        self.observer(t_, m)
            elif t is Stopped:
                self.stopped = True
                self.lead = None

    def _end(self) -> Effects:
        fx = self._fx
        assert fx is not None
        if not self.stopped:
            self._check_leadership()
            if self.lead is not None:
                self._forward()
            self._propose()
            self._flush_app_messages()
            if self._stable_out and self._stable_since is not None:
                fx.wake(self._stable_since + self.p.ack_delay)
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
        """Become leader: forward every unstable message again, from the stable floor."""
        self.stats["takeovers"] += 1
        self.lead = _Lead(self.state.mseq.floor)
        for p in sorted(self.state.mseq.latest.members()):  # never a set's hash order
            self.apps.setdefault(p, None)

    def _announce(self) -> None:
        lead = self.lead
        view = self.ufab.view
        assert lead is not None and view is not None
        key = (view.number, len(self.apps))  # processes are only ever added to ``apps``
        if lead.announced_upto == key:
            return
        msg = Leader(view.number, view.members)
        for p in self.apps:
            if lead.announced.get(p, -1) < view.number:
                lead.announced[p] = view.number
                self._out.setdefault(p, []).append(msg)
        lead.announced_upto = key

    # ================================================================== from endpoints
    def _from_app(self, src: NodeId, msgs: list[Any]) -> None:
        if src not in self.apps:
            self.apps[src] = None
            view = self.ufab.view
            if self.lead is None and view is not None and self.ufab.installed:
                self._out.setdefault(src, []).append(Leader(view.number, view.members))
        for msg in msgs:
            t = type(msg)
            if t is Confirm:
                self._on_confirm(src, msg.upto)
            elif t is Route:
                self._on_route(src, msg)
            elif t is RouteUnsafe:
                self._on_unsafe(src, msg)
            elif t is Hello:
                pass
            elif t is CloseSessions:
                self._closes.append(CloseSessionsCmd(src, msg.namespace, msg.epoch))

    def _on_route(self, src: NodeId, msg: Route) -> None:
        st = self.state
        lead = self.lead
        closed = st.closed
        for sub in msg.subs:
            sid = sub.id
            sess, seq = sid
            if closed.get(sess[0], -1) >= sess[1]:
                self._closed_out.setdefault(src, []).append(sid)
                continue
            t = st.by_id.get(sid)
            if t is not None:
                # Learned, not stable: never propose it again; ack it when it is stable.
                if lead is not None:
                    lead.routed_by.setdefault(t, set()).add(src)
                continue
            if seq < st.sessions.get(sess, 1):
                ack = st.acks.get(sess, {}).get(seq)
                entry = (sid, *ack) if ack is not None else (sid, None, False)
                self._acks_out.setdefault(src, []).append(entry)
                continue
            if sid in self._proposed:
                continue
            self._proposed[sid] = None
            self._routes.append(_tnew(Message, (src, sid, sub.header, sub.payload)))

    def _on_unsafe(self, src: NodeId, msg: RouteUnsafe) -> None:
        lead = self.lead
        if lead is None:
            self.stats["unsafe_dropped"] += len(msg.subs)
            return  # we sent nobody anything: no copy could ever be accepted
        st = self.state
        frontier = lead.frontier
        config = st.mseq.config_for(frontier)
        suspects = st.suspects
        limit = self.p.unsafe_backlog
        backlog = self.backlog
        lagging: dict[NodeId, bool] = {}
        for sub in msg.subs:
            m = _tnew(Message, (src, sub.id, sub.header, sub.payload))
            for d in self._sorted_dests(config.destset(m)):
                if d in suspects:
                    continue
                lags = lagging.get(d)
                if lags is None:
                    waiting = lead.waiting.get(d)
                    lags = lagging[d] = (waiting is not None and len(waiting) > limit) or (
                        backlog is not None and backlog(d) > limit
                    )
                if lags:
                    self.stats["unsafe_dropped"] += 1
                    continue
                self._out.setdefault(d, []).append((lead.last_sent.get(d), frontier, m))
                self.stats["unsafe_sent"] += 1

    def _on_confirm(self, src: NodeId, upto: int) -> None:
        lead = self.lead
        if lead is None:
            return
        q = lead.waiting.get(src)
        if not q:
            return
        remaining = lead.remaining
        while q and q[0] <= upto:
            t = q.popleft()
            r = remaining.get(t)
            if r is None:
                continue
            if r < 4:  # this was the last destination
                del remaining[t]
                self._stable_candidate(t, True)
            else:
                remaining[t] = (r - 2) | 1

    # ================================================================== learning
    def _learn_command(self, payload: Any) -> None:
        for cmd in payload:
            t = type(cmd)
            if t is RouteCmd:
                self._learn(cmd.msgs)
            elif t is StableCmd:
                self._learn_stable(cmd.entries)
            elif t is CloseSessionsCmd:
                self._learn_close(cmd)
        self._collect()

    def _learn(self, msgs: tuple[Message, ...]) -> None:
        """Append each message if it is its session's next; resolve everything else the
        same way on every router (3.4.4).  One loop for a whole command: every router
        runs it for every message."""
        st = self.state
        mseq = st.mseq
        sessions = st.sessions
        closed = st.closed
        by_id = st.by_id
        entries = mseq.entries
        configs = mseq.configs
        starts = mseq.starts
        proposed = self._proposed
        lead = self.lead
        observer = self.observer
        dedup = "skip_learn_dedup" not in self._mut
        learned = 0
        for msg in msgs:
            sender, sid, _h, _p = msg
            sess, seq = sid
            proposed.pop(sid, None)
            if closed and closed.get(sess[0], -1) >= sess[1]:
                if lead is not None:
                    self._closed_out.setdefault(sender, []).append(sid)
                continue
            nxt = sessions.get(sess, 1)
            if seq != nxt and dedup:
                if seq < nxt:
                    self.stats["duplicates"] += 1
                    if lead is not None:
                        t = by_id.get(sid)
                        if t is not None:
                            lead.routed_by.setdefault(t, set()).add(sender)
                        else:
                            ack = st.acks.get(sess, {}).get(seq)
                            entry = (sid, *ack) if ack is not None else (sid, None, False)
                            self._acks_out.setdefault(sender, []).append(entry)
                else:
                    self.stats["gaps"] += 1
                continue
            sessions[sess] = seq + 1 if seq + 1 > nxt else nxt
            # MSeq.append, written out: t is routed by the config before it.
            t = mseq.next_t
            entries[t] = msg
            mseq.next_t = t + 1
            config = configs[-1]
            after = config.apply(msg)
            if after is not config:
                starts.append(t + 1)
                configs.append(after)
            learned += 1
            by_id[sid] = t
            if observer is not None:
                observer(t, msg)
            suspected = config.suspects(msg)
            if suspected:
                for p in sorted(suspected):
                    if p not in st.suspects:
                        st.suspects[p] = t
                        if lead is not None:
                            self._drop_destination(p)
                            self._out.setdefault(p, []).append(Suspected())
        self.stats["learned"] += learned

    def _learn_stable(self, entries: tuple[tuple[int, bool], ...]) -> None:
        st = self.state
        mseq = st.mseq
        mentries = mseq.entries
        stable = mseq.stable
        floor = mseq.floor
        by_id = st.by_id
        acks = st.acks
        keep = self.p.ack_cache
        lead = self.lead
        n_stable = 0
        for t, delivered in entries:
            # MSeq.mark_stable, written out: this loop runs for every message on every router.
            if t < floor or t in stable:
                continue
            msg = mentries.get(t)
            if msg is None:
                continue
            stable.add(t)
            n_stable += 1
            sender, sid, header, _p = msg
            by_id.pop(sid, None)
            sess, seq = sid
            cache = acks.get(sess)
            if cache is None:
                cache = acks[sess] = {}
            cache[seq] = (t, delivered)
            # Keep the last ack_cache entries.  Sessions become stable in order, so
            # dropping seq - ack_cache is enough, in O(1): deleting "the first" key of a
            # dict instead re-scans every slot deleted before it on each call.
            cache.pop(seq - keep, None)
            if (
                type(header) is dict
                and header.get("kind") == "part"
                and sender in mseq.config_for(t).destset(msg)
            ):
                st.departed.setdefault(sender, t)
                self._drop_destination(sender)
            if lead is not None:
                acked = lead.acked
                if t in acked:
                    acked.discard(t)  # acknowledged when it became stable
                    if lead.routed_by:
                        self._ack_routers_of(lead, t, (sid, t, delivered), sender)
                else:
                    self._ack(lead, t, (sid, t, delivered), sender)
                lead.remaining.pop(t, None)
        self.stats["stable"] += n_stable

    def _learn_close(self, cmd: CloseSessionsCmd) -> None:
        st = self.state
        ns, epoch = cmd.namespace, cmd.epoch
        if st.closed.get(ns, -1) < epoch:
            st.closed[ns] = epoch
        for sess in [s for s in st.sessions if s[0] == ns and s[1] <= epoch]:
            del st.sessions[sess]
        for sess in [s for s in st.acks if s[0] == ns and s[1] <= epoch]:
            del st.acks[sess]
        if self.lead is not None:
            self._out.setdefault(cmd.requester, []).append(SessionsClosed(ns, epoch))

    def _collect(self) -> None:
        st = self.state
        if st.mseq.collect():
            floor = st.mseq.floor
            for gone in (st.suspects, st.departed):
                if gone:
                    for p in [p for p, t in gone.items() if t < floor]:
                        del gone[p]
                        view = self.ufab.view
                        router = view is not None and p in view.members
                        if not router and self._fx is not None:
                            # Its departure is stable and collected: nothing more is
                            # owed to it, so its resend buffers go (3.3.4; a router's
                            # own channels follow ufabcast's views instead).
                            self._fx.drop.append(p)

    # ================================================================== leader duties
    def _sorted_dests(self, dests: frozenset[NodeId]) -> tuple[NodeId, ...]:
        """Destinations in a fixed order (never a set's hash order, which varies per run)."""
        cached = self._sorted.get(dests)
        if cached is None:
            if len(self._sorted) > 4096:
                self._sorted.clear()
            cached = self._sorted[dests] = tuple(sorted(dests))
        return cached

    def _forward(self) -> None:
        """Send every learned message past the frontier to ``destset \\ suspects``, in t order."""
        lead = self.lead
        assert lead is not None
        self._announce()
        st = self.state
        mseq = st.mseq
        end = mseq.next_t
        t = max(lead.frontier, mseq.floor)
        if t >= end:
            return
        entries = mseq.entries
        stable = mseq.stable
        suspects = st.suspects
        departed = st.departed
        ignore_suspects = "ignore_suspects" in self._mut
        latest = "route_latest_config" in self._mut
        out = self._out
        waiting = lead.waiting
        last_sent = lead.last_sent
        remaining = lead.remaining
        delivered = 0
        skip_gone = bool(suspects or departed)
        # The config changes rarely: look it up again only past the next config boundary.
        starts = mseq.starts
        config = mseq.latest
        bound = -1
        while t < end:
            if t >= bound and not latest:
                i = bisect_right(starts, t)
                config = mseq.configs[i - 1]
                bound = starts[i] if i < len(starts) else end
            msg = entries.get(t)
            if msg is not None and t not in stable:
                n = 0
                for d in self._sorted_dests(config.destset(msg)):
                    if skip_gone and ((d in suspects and not ignore_suspects) or d in departed):
                        continue
                    n += 1
                    box = out.get(d)
                    if box is None:
                        box = out[d] = []
                    box.append((t, msg))
                    q = waiting.get(d)
                    if q is None:
                        q = waiting[d] = deque()
                    q.append(t)
                    last_sent[d] = t
                if n:
                    remaining[t] = 2 * n
                    delivered += n
                else:
                    self._stable_candidate(t, False)  # nobody to wait for: stable at once
            t += 1
        lead.frontier = t
        self.stats["delivered"] += delivered

    def _drop_destination(self, p: NodeId) -> None:
        """Stop waiting for ``p``'s confirmations: it is suspected or it departed."""
        lead = self.lead
        if lead is None or ("ignore_suspects" in self._mut and p not in self.state.departed):
            return
        q = lead.waiting.pop(p, None)
        if not q:
            return
        remaining = lead.remaining
        for t in q:
            r = remaining.get(t)
            if r is None:
                continue
            if r < 4:
                del remaining[t]
                self._stable_candidate(t, bool(r & 1))
            else:
                remaining[t] = r - 2

    def _stable_candidate(self, t: int, delivered: bool) -> None:
        """Every unsuspected destination has ``t``: it is stable now.

        The acknowledgement goes out at once; the stable notice is replicated afterwards,
        for garbage collection and so a new leader does not forward ``t`` again.  Safe:
        what the acknowledgement promises already holds, and a leader that takes over
        before the notice is chosen merely acknowledges again (endpoints ignore acks of
        messages no longer in their window).  This takes a consensus round off every
        message's path from submit to acknowledgement.
        """
        self._stable_out.append((t, delivered))
        if self._stable_since is None:
            self._stable_since = self._now
        lead = self.lead
        msg = self.state.mseq.entries.get(t)
        if lead is None or msg is None or not self.p.early_acks:
            self._stable_waited = True
            return
        header = msg.header
        if type(header) is dict and header.get("kind") == "part":
            # This acknowledgement lets a leaving process stop confirming, which is only
            # safe once every router knows its part is stable (``RouterState.departed``).
            self._stable_waited = True
            return
        self._ack(lead, t, (msg.id, t, delivered), msg.sender)
        lead.acked.add(t)

    def _ack(self, lead: _Lead, t: int, ack: tuple[MsgId, int, bool], sender: NodeId) -> None:
        """Acknowledge ``t`` to its sender and to every other process that routed it."""
        box = self._acks_out.get(sender)
        if box is None:
            box = self._acks_out[sender] = []
        box.append(ack)
        if lead.routed_by:
            self._ack_routers_of(lead, t, ack, sender)

    def _ack_routers_of(
        self, lead: _Lead, t: int, ack: tuple[MsgId, int, bool], sender: NodeId
    ) -> None:
        for p in sorted(lead.routed_by.pop(t, ())):
            if p != sender:
                self._acks_out.setdefault(p, []).append(ack)

    def _periodic(self) -> None:
        """Every 250 ms: re-apply suspects, and send congestion notices (3.5.6)."""
        lead = self.lead
        if lead is None:
            return
        st = self.state
        for gone in (st.suspects, st.departed):
            for p in list(gone):
                if p in lead.waiting:
                    self._drop_destination(p)
        # A destination may never confirm what became stable without it (another leader
        # collected the confirmations first): let go of stable heads, and of empty queues.
        mseq = st.mseq
        for d in list(lead.waiting):
            q = lead.waiting[d]
            while q and mseq.is_stable(q[0]):
                q.popleft()
            if not q:
                del lead.waiting[d]
        counts = self.state.unstable_per_sender()
        total = sum(counts.values())
        threshold = self.p.congestion_threshold
        if total > threshold and counts:
            # n counts the processes that have unstable messages: idle ones should not
            # shrink the fair quota of the ones that are sending (docs/decisions.md).
            quota = threshold / len(counts)
            for p, c in counts.items():
                if c > quota:
                    self._out.setdefault(p, []).append(Congestion())
                    self.stats["congestion_notices"] += 1

    # ================================================================== output
    def _propose(self) -> None:
        """One ufabcast proposal per step: new routes, plus stable notices when due."""
        cmds: list[Any] = []
        if self._routes:
            cmds.append(RouteCmd(tuple(self._routes)))
            self.stats["routed"] += len(self._routes)
            self._routes = []
        if self._stable_out:
            due = (
                not self.p.delayed_acks
                or cmds
                or self._now >= (self._stable_since or 0.0) + self.p.ack_delay
                # An idle pipeline has nothing to piggyback on: waiting would only add
                # latency (adaptive delayed acknowledgements, 3.5.7's future work).  Only
                # an acknowledgement that waits for its notice (a part, or early acks off)
                # is worth a consensus round of its own; the others went out already, and
                # a round per message would double the leader's writes at light load.
                or (self.p.adaptive_acks and self._stable_waited and self.ufab.idle())
            )
            if due:
                cmds.append(StableCmd(tuple(self._stable_out)))
                self._stable_out = []
                self._stable_since = None
                self._stable_waited = False
        if self._closes:
            cmds.extend(self._closes)
            self._closes = []
        if cmds:
            self._absorb(self.ufab.propose(tuple(cmds), self._now))
            if self.lead is not None:
                self._forward()  # a founder of one learns at once

    def _flush_app_messages(self) -> None:
        for p, acks in self._acks_out.items():
            self._out.setdefault(p, []).append(Stable(tuple(acks)))
        self._acks_out = {}
        for p, ids in self._closed_out.items():
            self.stats["closed_rejects"] += len(ids)
            self._out.setdefault(p, []).append(Closed(tuple(ids)))
        self._closed_out = {}
        if not self._out:
            return
        send = self._send
        for p, items in self._out.items():
            # Runs of deliveries and of unsafe copies become one message each, in order.
            run: list[Any] = []
            size = 0
            for item in items:
                n = len(item) if type(item) is tuple else 0
                if n != size and run:
                    send(p, Deliver(tuple(run)) if size == 2 else DeliverUnsafe(tuple(run)))
                    run = []
                size = n
                if n:
                    run.append(item)
                else:
                    send(p, item)
            if run:
                send(p, Deliver(tuple(run)) if size == 2 else DeliverUnsafe(tuple(run)))
        self._out = {}
