"""The application endpoint: Algorithm 10 with flow control, leader tracking and unsafe
messages (3.4.3, 3.5.2, 3.5.6, 3.5.7).

An endpoint submits messages in a session, keeps unstable ones in a send window bounded
by a congestion window, delivers in ``t`` order exactly once, confirms every delivery it
receives (duplicates included, or stability would stall), and follows the router
succession order.  Upcalls, in order: :class:`Delivery`, :class:`Acked`, :class:`Rejected`,
:class:`LeaderChanged`, ``SessionsClosed``, ``CloseForbidden`` and ``Welcome`` (the
router's messages themselves), :class:`Terminated`.

Two sessions per process:

* the *data* session, which the application may choose and hand from one process to
  another (a retried Spark task resubmits the same session and sequence numbers), and
  whose window the congestion window bounds;
* the *control* session ``("@" + name, incarnation, "")``, for this process's own join, part and
  suspect messages.  It is never bounded by the congestion window, so a suspect or a
  part gets through whatever the data window holds (a full data window may wait for
  exactly the suspect that is stuck behind it), and it never takes a data sequence
  number (a process that reuses a data session still joins).

The endpoint keeps its lease with the routers alive: every message to its router counts,
and an idle endpoint sends a ``KeepAlive`` every third of its lease.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from ecast.core import mutations
from ecast.core.config import JOIN, KIND, PART, SUSPECT, WHO
from ecast.core.effects import Effects, NodeId, UnexpectedMessage
from ecast.core.message import Message, MsgId, Session, Submission
from ecast.core.message import fast_new as _tnew
from ecast.core.mutations import declare
from ecast.core.proto import (
    ROUTER_TO_ENDPOINT,
    CloseForbidden,
    CloseSessions,
    Confirm,
    Congestion,
    Deliver,
    DeliverUnsafe,
    Detach,
    Forbidden,
    Hello,
    KeepAlive,
    Leader,
    RejectedClosed,
    Route,
    RouteUnsafe,
    SessionsClosed,
    Stable,
    Suspected,
    UnsafeShed,
    Welcome,
)
from ecast.core.roles import RoleOf, acts_as_router, everyone_is_a_router

_E = "endpoint"
NO_WINDOW_RESEND = declare(
    "no_window_resend", _E, "keep the window to itself when the leader changes"
)
NO_DUPLICATE_CONFIRM = declare("no_duplicate_confirm", _E, "confirm only deliveries that were new")
UNSAFE_ADVANCES_T_MAX = declare(
    "unsafe_advances_t_max", _E, "let an accepted unsafe message move t_max"
)


_FROM_ROUTERS = frozenset(ROUTER_TO_ENDPOINT)


class EndpointClosed(RuntimeError):
    """Submitting after ``close()`` or after termination."""


@dataclass(frozen=True, slots=True)
class EndpointParams:
    initial_window: int = 1
    max_window: int = 1024
    window_growth: float = 0.5
    """The congestion window doubles this often (3.5.6)."""
    slow_start: bool = True
    """Until the first congestion notice, the window also doubles each time a whole
    window's worth of messages became stable (once per round trip, as in TCP's slow
    start).  Growing only every ``window_growth`` took a client five seconds to reach a
    window of 1,024 from 1; per round trip it takes a few tens of milliseconds.  After a
    notice, only the periodic doubling of 3.5.6 remains, so the routers' notices (every
    250 ms) still outpace the growth (docs/decisions.md)."""
    max_route: int = 256
    """Submissions per ``Route``; the rest leave in the following steps (the endpoint asks
    to be woken at once).  A closed-loop client that gets 512 acknowledgements in one
    packet would otherwise send the next 512 as one batch, and the whole pipeline moves in
    two waves, one process busy at a time (docs/decisions.md)."""
    progress_timeout: float = 2.0
    """With messages in the window and no progress for this long, try the next router in
    succession order (an isolated leader never learns that it was parted)."""
    lease: float = 0.0
    """The lease this process asks the routers for, in seconds (0: the routers' default;
    they cap it at their maximum).  Silent for longer than its lease, a process is
    suspected (``ecast router --client-lease``)."""
    confirm_when_durable: bool = False
    """Confirm deliveries only up to where the application says they are durable
    (:meth:`Endpoint.durable`), not as they arrive: a message becomes stable, and its
    sender acknowledged, only once every destination has it on disk.  Our own join and
    part are confirmed at once (they carry nothing to keep; our join waits for its own
    stability before the application runs, and at our part we are leaving)."""

    def __post_init__(self) -> None:
        if not 1 <= self.initial_window <= self.max_window:
            raise ValueError("need 1 <= initial_window <= max_window")
        if self.max_route < 1:
            raise ValueError("max_route must be positive")


class Delivery(NamedTuple):
    """One delivered message (a NamedTuple: built once per delivery, so it must be cheap)."""

    t: int
    """Index in the m-seq; for an unsafe message, the tag it carried (-1: never sent)."""
    message: Message
    unsafe: bool = False
    accepted: bool = True
    """For unsafe messages: whether it fit the delivery stream (tag equal to ``t_max``)."""
    frontier: int | None = None
    """For unsafe messages: the router's forwarding position whose config routed it."""

    @property
    def kind(self) -> str | None:
        """``join``, ``part`` or ``suspect`` for membership messages (whose payload is
        None, or the members for a process's own join), None for data messages."""
        return self.message.kind


class Acked(NamedTuple):
    """A submission became stable: every unsuspected destination delivered it (the SDK
    hands it to applications as ``ecast.Ack``)."""

    id: MsgId
    t: int | None
    """Timestamp in the m-seq (None for a duplicate of a message collected long ago)."""
    delivered: bool
    """False if nobody was a destination (an ignored message, 4.4.1)."""


@dataclass(frozen=True, slots=True)
class Rejected:
    id: MsgId
    reason: str
    """``closed`` (its session was closed) or ``forbidden`` (this process's credential
    does not cover the session's namespace)."""


@dataclass(frozen=True, slots=True)
class LeaderChanged:
    view: int
    succession: tuple[NodeId, ...]


@dataclass(frozen=True, slots=True)
class Shed:
    """Unsafe messages of ours that will not reach every destination (``UnsafeShed``)."""

    ids: tuple[MsgId, ...]


@dataclass(frozen=True, slots=True)
class Terminated:
    reason: str
    """``closed`` (own part delivered) or ``suspected`` (declared faulty)."""
    at: int | None = None
    """Suspected: the position of the suspect message, if the router still knew it."""


class Endpoint:
    """One application process's side of E-Cast.

    It takes routers' messages only from peers whose credential, as ``role_of`` tells, is
    a router's: an application process cannot deliver to it, ack for it, redirect it or
    declare it faulty.  What steers the endpoint itself (``Leader``, which redirects it,
    and ``Suspected``, which stops it) counts only from routers it knows: those it was
    given, then every router of a succession order a known router announced.  (Routers
    it does not know yet may still forward to it: every router acting as leader at once
    does, and a new router's forwards can overtake the announcement that names it.)
    """

    def __init__(
        self,
        me: NodeId,
        routers: list[NodeId] | tuple[NodeId, ...],
        params: EndpointParams | None = None,
        session: Session | None = None,
        incarnation: int = 0,
        role_of: RoleOf | None = None,
    ) -> None:
        if not routers:
            raise ValueError("an endpoint needs at least one router to talk to")
        self.me = me
        self.role_of: RoleOf = role_of or everyone_is_a_router
        self.known_routers: set[NodeId] = set(routers)
        self._stalled: dict[NodeId, int] = {}
        """Times we left each router for want of progress since we last made progress or
        heard from it: a router that says one we left twice leads does not send us back
        there (:meth:`_on_leader`; once is a leader's hiccup, and going back is right)."""
        self.ignored_unknown_router = 0
        """``Leader`` and ``Suspected`` messages from routers this endpoint does not know."""
        self.p = params or EndpointParams()
        self.session: Session = session or (me, incarnation, "")
        """Per process by default, like the control session: a new process under an old
        name must not have its first messages taken for the old one's (acknowledged as
        duplicates and never delivered).  Handing a session over is explicit."""
        self.control_session: Session = ("@" + me, incarnation, "")
        """Per process, not per name: a later process under a retired name sends a join
        the routers have not seen (and the config refuses), not a duplicate of the old."""
        self.unsafe_session: Session = (self.session[0], self.session[1], self.session[2] + "~u")
        self.next_seq = 1
        self.next_control = 1
        self.next_unsafe = 1
        self.window: dict[int, Submission] = {}
        """Submitted, unstable data messages by sequence number (the send window W)."""
        self.control: dict[int, tuple[Submission, int]] = {}
        """Unstable control messages (join, part, suspect), outside the congestion window,
        each with the data sequence number it was submitted before: a process's messages
        are ordered as it submitted them (causal order, 3.3), across both sessions."""
        self.queued: deque[Submission] = deque()
        """Submitted, not yet admitted by the congestion window."""
        self.closing_sessions: dict[tuple[str, int], None] = {}
        """``close_sessions`` requests not answered yet (re-sent to every new router)."""
        self.cwnd = self.p.initial_window
        self._slow_start = self.p.slow_start
        self._acked_round = 0
        """Messages that became stable since the window last doubled (slow start)."""
        self.t_max = -1
        self.view = -1
        self.succession: tuple[NodeId, ...] = tuple(routers)
        self.unreachable: frozenset[NodeId] = frozenset()
        """Routers the runtime has no connection to (``routers_unreachable``)."""
        self.target = routers[0]
        self.joined_at: int | None = None
        self.terminated: str | None = None
        self.suspected_at: int | None = None
        """Where the history declared this process faulty, when a router told it."""
        self.closing = False
        self.lingering = False
        """Closed for the application, but still confirming until our part is stable: a
        leader that takes over in between re-sends the part, and only our confirmation
        lets it become stable (docs/decisions.md)."""
        self.lease = self.p.lease
        """The lease the routers granted (the request until they answer)."""
        self._keepalive = (self.lease or 3.0) / 3
        self.max_message: int | None = None
        """The largest message (payload and header) the routers accept, once welcomed."""
        self._started = False
        self._next_growth = 0.0
        self._last_progress = 0.0
        self._last_sent = 0.0
        self._last_probe = 0.0
        self._now = 0.0
        self._fx: Effects | None = None
        self._routes: list[Submission] = []
        self._unsafe: list[Submission] = []
        self._confirms: dict[NodeId, int] = {}
        self._held: dict[NodeId, int] = {}
        """Under ``confirm_when_durable``: per router, the newest delivery it sent us
        that is not durable yet (confirmed once :meth:`durable` reaches it)."""
        self.durable_t = -1
        """Under ``confirm_when_durable``: every delivery up to here is durable."""
        self._part_id: MsgId | None = None
        self._join_id: MsgId | None = None
        self._heard_target = 0.0
        """When our router last sent us anything (it answers keep-alives)."""
        self.stats = {
            "delivered": 0,
            "duplicates": 0,
            "unsafe_accepted": 0,
            "unsafe_rejected": 0,
            "unsafe_shed": 0,
            "beyond_succession": 0,  # switches to a router the succession does not name
        }

    # ================================================================== application API
    def submit(self, payload: Any, header: Any = None, now: float = 0.0) -> tuple[MsgId, Effects]:
        """Queue a message; it enters the window as the congestion window allows."""
        self._begin(now)
        sid = self._new_submissions([(payload, header)])[0]
        return sid, self._end()

    def submit_many(
        self, items: list[tuple[Any, Any]], now: float = 0.0
    ) -> tuple[list[MsgId], Effects]:
        """Queue many ``(payload, header)`` messages in one step (one Route per step)."""
        self._begin(now)
        ids = self._new_submissions(items)
        return ids, self._end()

    def join(self, now: float, **header: Any) -> tuple[MsgId, Effects]:
        """Submit this process's join (application membership is what the history says)."""
        self._begin(now)
        sid = self._new_control({KIND: JOIN, **header})
        self._join_id = sid
        return sid, self._end()

    def suspect(self, who: list[NodeId], now: float) -> tuple[MsgId, Effects]:
        """Declare processes faulty (members' suspects count; the config decides)."""
        self._begin(now)
        sid = self._new_control({KIND: SUSPECT, WHO: sorted(who)})
        return sid, self._end()

    def close(self, now: float) -> tuple[MsgId | None, Effects]:
        """Submit our part; keep confirming until it is delivered, then terminate."""
        self._begin(now)
        if not self.closing and self.terminated is None:
            self._part_id = self._new_control({KIND: PART})
            self.closing = True
        return self._part_id, self._end()

    def detach(self, now: float) -> Effects:
        """Leave without a part (a process that never joined): the routers drop what they
        keep for us at once instead of when our lease runs out."""
        self._begin(now)
        if self.terminated is None:
            self._send(self.target, Detach())
            self._terminate("detached")
        return self._end()

    def submit_unsafe(self, payload: Any, header: Any = None, now: float = 0.0) -> Effects:
        """Forward without agreement; never confirmed, acknowledged or kept (3.5.7)."""
        return self.submit_unsafe_many([(payload, header)], now)

    def submit_unsafe_many(self, items: list[tuple[Any, Any]], now: float = 0.0) -> Effects:
        """Many unsafe ``(payload, header)`` messages in one step (one RouteUnsafe)."""
        return self.submit_unsafe_numbered(items, now)[1]

    def submit_unsafe_numbered(
        self, items: list[tuple[Any, Any]], now: float = 0.0
    ) -> tuple[list[MsgId], Effects]:
        """``submit_unsafe_many``, and the ids given: a ``Shed`` upcall names them."""
        self._begin(now)
        ids: list[MsgId] = []
        if self.terminated is None:
            session = self.unsafe_session
            n = self.next_unsafe
            ids = [(session, n + i) for i in range(len(items))]
            self._unsafe.extend(
                _tnew(Submission, (sid, header, payload))
                for sid, (payload, header) in zip(ids, items, strict=True)
            )
            self.next_unsafe = n + len(items)
        return ids, self._end()

    def close_sessions(self, namespace: str, epoch: int, now: float) -> Effects:
        """Close every session of ``namespace`` up to ``epoch`` (in total order); the
        ``SessionsClosed`` reply comes as an upcall.  Re-sent until it comes."""
        self._begin(now)
        if self.terminated is None:
            self.closing_sessions[(namespace, epoch)] = None
            self._send(self.target, CloseSessions(namespace, epoch))
            self._last_progress = now
        return self._end()

    def add_routers(self, routers: list[NodeId] | tuple[NodeId, ...]) -> None:
        """More routers to try when the known ones stop answering (a re-read router list);
        the progress timeout cycles through them until an announcement says who leads."""
        known = set(self.succession)
        extra = tuple(r for r in routers if r not in known)
        if extra:
            self.succession = self.succession + extra
        self.known_routers.update(routers)

    def routers_unreachable(self, routers: Iterable[NodeId], now: float) -> Effects:
        """The runtime has no connection to ``routers`` (it lost them and cannot dial
        them again).  If ours is one, move to the next now: waiting for the progress
        timeout cost every client of a killed leader two seconds without progress, since
        the new leader does not know light clients that never spoke to it."""
        self._begin(now)
        self.unreachable = frozenset(routers)
        if self.terminated is None and self.target in self.unreachable:
            nxt = self._next_router()
            if nxt != self.target:
                self._switch(nxt)
        return self._end()

    def durable(self, upto: int, now: float) -> Effects:
        """Every delivery up to ``upto`` is durable at the application: confirm it
        (``confirm_when_durable``; otherwise deliveries are confirmed as they arrive)."""
        self._begin(now)
        if upto > self.durable_t:
            self.durable_t = upto
            for src, top in list(self._held.items()):
                if min(top, upto) > self._confirms.get(src, -1):
                    self._confirms[src] = min(top, upto)
                if top <= upto:
                    del self._held[src]
        return self._end()

    def waiting(self) -> bool:
        """Whether anything we sent still waits for the routers (progress is owed)."""
        return bool(self.window or self.control or self.closing_sessions)

    # ================================================================== inputs
    def on_message(self, src: NodeId, msg: Any, now: float) -> Effects:
        return self.on_messages(src, (msg,), now)

    def on_messages(self, src: NodeId, msgs: tuple[Any, ...] | list[Any], now: float) -> Effects:
        # Validate the whole batch before anything changes: refusing it halfway would
        # keep the confirmations of deliveries that never reached the application.
        known = _FROM_ROUTERS
        for msg in msgs:
            if type(msg) not in known:
                raise UnexpectedMessage("endpoint", src, type(msg).__name__)
        if msgs and not acts_as_router(self.role_of(src)):
            raise UnexpectedMessage(
                "endpoint", src, f"{type(msgs[0]).__name__} from a peer without a router credential"
            )
        steering = src in self.known_routers
        self._begin(now)
        if src == self.target:
            self._heard_target = now
            if self._stalled:
                self._stalled.pop(src, None)
        elif (
            self.succession
            and src == self.succession[0]
            and self.terminated is None
            and src not in self._stalled
        ):
            # The leader is back in reach after we moved on from it (its deliveries, acks
            # or keep-alive answers come straight from it): talk to it again.  Its lease
            # book is the one that counts.  Not if we left it for want of progress and
            # made none since: a router parted while away may lead its old view for
            # ever, answering keep-alives and deciding nothing, and pulled its process
            # back after every move.
            self._switch(src)
            self._heard_target = now
        for msg in msgs:
            if self.terminated is not None and not self.lingering:
                break
            t = type(msg)
            if t is Deliver:
                self._on_deliver(src, msg)
            elif t is DeliverUnsafe:
                self._on_unsafe(msg)
            elif t is Stable:
                self._on_stable(msg)
            elif t is Leader:
                if steering:
                    self._on_leader(msg)
                else:
                    self.ignored_unknown_router += 1
            elif t is Congestion:
                self.cwnd = max(1, self.cwnd // 2)
                self._slow_start = False
            elif t is RejectedClosed:
                self._on_rejected(msg.ids, "closed")
            elif t is Forbidden:
                self._on_rejected(msg.ids, "forbidden")
            elif t is SessionsClosed:
                self._on_sessions_closed(msg)
            elif t is CloseForbidden:
                self._on_close_forbidden(msg)
            elif t is UnsafeShed:
                ours = tuple(i for i in msg.ids if i[0] == self.unsafe_session)
                if ours:
                    self.stats["unsafe_shed"] += len(ours)
                    self._deliver(Shed(ours))
            elif t is Welcome:
                self.lease = msg.lease
                self.max_message = msg.max_message
                self._keepalive = max(0.05, msg.lease / 3)
                self._deliver(msg)  # the upcall is the greeting itself
            elif t is Suspected:
                if steering:
                    self._terminate("suspected", msg.t)
                else:
                    self.ignored_unknown_router += 1
        return self._end()

    def on_tick(self, now: float) -> Effects:
        self._begin(now)
        if self.terminated is None or self.lingering:
            if now >= self._next_growth:
                self._next_growth = now + self.p.window_growth
                self.cwnd = min(self.p.max_window, self.cwnd * 2)
                self._admit()
            if self.waiting() and now - self._last_progress > self.p.progress_timeout:
                self._left_stalled()
                self._switch(self._next_router())
            elif (
                now - self._heard_target > self.p.progress_timeout + self._keepalive
                and now - self._last_progress > self.p.progress_timeout
            ):
                # Idle, and our router has not answered a keep-alive: it may be gone, and a
                # new leader does not know a process that never joined.  Try the next.
                self._left_stalled()
                self._switch(self._next_router())
        return self._end()

    # ================================================================== handlers
    def _on_deliver(self, src: NodeId, msg: Deliver) -> None:
        fx = self._fx
        assert fx is not None
        out = fx.deliver
        me = self.me
        control = self.control_session
        t_max = self.t_max
        top = -1
        fresh = 0
        dups = 0
        parted = False
        own = -1  # our own join: confirmed at once (our join waits for its stability)
        for t, m in msg.items:
            if t > top:
                top = t
            if t <= t_max:
                dups += 1
                if t == self.joined_at:
                    own = t  # our join again: its confirmation was lost
                continue
            fresh += 1
            t_max = t
            out.append(_tnew(Delivery, (t, m, False, True, None)))
            if m[0] == me and m[1][0] == control:
                if m.id == self._join_id:
                    self.joined_at = own = t
                elif m.id == self._part_id:
                    parted = True  # our own part: confirm it, then we are done
                    break
        self.t_max = t_max
        stats = self.stats
        stats["delivered"] += fresh
        stats["duplicates"] += dups
        self._progressed()
        if fresh or not mutations.on(NO_DUPLICATE_CONFIRM):
            upto = top
            if self.p.confirm_when_durable and not parted and top > self.durable_t:
                self._held[src] = max(self._held.get(src, -1), top)
                upto = max(self.durable_t, own)  # the rest once the application has it
            if upto > self._confirms.get(src, -1):
                self._confirms[src] = upto
        if parted:
            self._terminate("closed")
            self.lingering = True

    def _on_unsafe(self, msg: DeliverUnsafe) -> None:
        for tag, frontier, m in msg.items:
            # A None tag: the leader sent us nothing since it took over, and everything
            # before its frontier meant for us is stable (``Forwarding.forward_unsafe``).
            accepted = tag == self.t_max if tag is not None else self.t_max < frontier
            self.stats["unsafe_accepted" if accepted else "unsafe_rejected"] += 1
            self._deliver(Delivery(tag if tag is not None else -1, m, True, accepted, frontier))
            if accepted and mutations.on(UNSAFE_ADVANCES_T_MAX):
                self.t_max = max(self.t_max, frontier)

    def _on_stable(self, msg: Stable) -> None:
        fx = self._fx
        assert fx is not None
        out = fx.deliver
        session = self.session
        window = self.window
        acked = 0
        for ack in msg.acks:
            sid = ack[0]
            if sid[0] == session:
                if window.pop(sid[1], None) is not None:
                    acked += 1
                    out.append(_tnew(Acked, ack))
            elif sid[0] == self.control_session and self.control.pop(sid[1], None) is not None:
                out.append(_tnew(Acked, ack))
                self._progressed()
                if sid == self._part_id:
                    self.lingering = False  # nobody will wait for us any more
        if acked:
            self._progressed()
            if self._slow_start:
                self._acked_round += acked
                if self._acked_round >= self.cwnd:
                    self._acked_round = 0
                    self.cwnd = min(self.p.max_window, self.cwnd * 2)
            self._admit()

    def _on_rejected(self, ids: tuple[MsgId, ...], reason: str) -> None:
        freed = False
        for sid in ids:
            if sid[0] == self.session and self.window.pop(sid[1], None) is not None:
                self._deliver(Rejected(sid, reason))
                freed = True
        if freed:
            self._admit()  # a refused message frees its window slot as an ack does

    def _on_close_forbidden(self, msg: CloseForbidden) -> None:
        if self.closing_sessions.pop((msg.namespace, msg.epoch), 0) is not None:
            return  # not asked (any more)
        self._deliver(msg)  # the upcall is the refusal itself

    def _on_sessions_closed(self, msg: SessionsClosed) -> None:
        done = [k for k in self.closing_sessions if k[0] == msg.namespace and k[1] <= msg.epoch]
        for k in done:
            del self.closing_sessions[k]
        self._progressed()
        self._deliver(msg)  # the upcall is the reply itself

    def _on_leader(self, msg: Leader) -> None:
        if msg.view < self.view:
            return  # an older announcement
        if msg.view == self.view:
            # Nothing new, unless we drifted from the leader of this view (we took it for
            # gone, and the router we moved to says it leads still): back to it.
            lead = msg.succession[0] if msg.succession else None
            if (
                lead is not None
                and self.succession[:1] == (lead,)
                and lead != self.target
                and lead not in self.unreachable  # we left it because it is gone
                and self._stalled.get(lead, 0) < 2  # or it made no progress, twice
            ):
                self._switch(lead)
            return
        self.view = msg.view
        self.succession = msg.succession
        self.known_routers.update(msg.succession)
        self._deliver(LeaderChanged(msg.view, msg.succession))
        if msg.succession and msg.succession[0] != self.target:
            self._switch(msg.succession[0])

    # ================================================================== internals
    def _begin(self, now: float) -> None:
        self._now = now
        self._fx = Effects()
        if not self._started:
            self._started = True
            self._last_progress = now
            self._heard_target = now
            self._next_growth = now + self.p.window_growth
            self._send(self.target, Hello(self.p.lease))

    def _end(self) -> Effects:
        fx = self._fx
        assert fx is not None
        now = self._now
        if self.terminated is None or self.lingering:
            if self._confirms:
                for r, upto in self._confirms.items():
                    self._send(r, Confirm(upto))
                self._confirms = {}
            routes = self._routes
            if routes:
                cap = self.p.max_route
                if len(routes) > cap:
                    self._send(self.target, Route(tuple(routes[:cap])))
                    self._routes = routes[cap:]
                    fx.wake(now)  # the next part in the next step, not this packet
                else:
                    self._send(self.target, Route(tuple(routes)))
                    self._routes = []
            if self._unsafe:
                self._send(self.target, RouteUnsafe(tuple(self._unsafe)))
                self._unsafe = []
            ka = self._keepalive
            # A keep-alive when we sent nothing for a while (our lease), or when our router
            # said nothing for a while although we send: unsafe messages get no answer, so
            # a process that sends only those would take a live router for gone.
            quiet = not fx.send and now - self._last_sent >= ka
            probe = now - self._heard_target >= ka and now - self._last_probe >= ka
            if fx.send:
                self._last_sent = now
            if quiet or probe:
                self._send(self.target, KeepAlive())  # our lease, kept alive
                leader = self.succession[0] if self.succession else self.target
                if leader != self.target:
                    self._send(leader, KeepAlive())  # the leader keeps the lease book
                self._last_sent = self._last_probe = now
            wake = min(
                self._next_growth,
                self._last_sent + ka,
                max(self._heard_target, self._last_probe) + ka,
                self._heard_target + self.p.progress_timeout + self._keepalive + 1e-6,
            )
            if self.waiting():
                wake = min(wake, self._last_progress + self.p.progress_timeout + 1e-6)
            fx.wake(max(wake, now))
        self._fx = None
        return fx

    def _send(self, dst: NodeId, msg: Any) -> None:
        assert self._fx is not None
        self._fx.send.append((dst, msg))

    def _deliver(self, upcall: Any) -> None:
        assert self._fx is not None
        self._fx.deliver.append(upcall)

    def _check_open(self) -> None:
        if self.terminated is not None:
            raise EndpointClosed(f"{self.me} terminated ({self.terminated})")
        if self.closing:
            raise EndpointClosed(f"{self.me} is closing: its part is the last message")

    def _new_submissions(self, items: list[tuple[Any, Any]]) -> list[MsgId]:
        """Number ``(payload, header)`` items and admit them in one step: a client's cost
        is per message, so no call per message here."""
        self._check_open()
        session = self.session
        first = self.next_seq
        self.next_seq = first + len(items)
        ids = [(session, seq) for seq in range(first, self.next_seq)]
        self.queued.extend(
            [_tnew(Submission, (sid, h, p)) for sid, (p, h) in zip(ids, items, strict=True)]
        )
        self._admit()
        return ids

    def _new_control(self, header: dict[str, Any]) -> MsgId:
        """A control message: numbered in the control session, sent at once.  Data
        submitted before it and still queued goes first, past the congestion window: it
        precedes the control message causally, and the control message must not wait."""
        self._check_open()
        sid = (self.control_session, self.next_control)
        self.next_control += 1
        sub = Submission(sid, header, None)
        if not self.waiting():
            self._last_progress = self._now  # the progress clock starts with work
        while self.queued:
            data = self.queued.popleft()
            self.window[data.id[1]] = data
            self._routes.append(data)
        self.control[sid[1]] = (sub, self.next_seq)
        self._routes.append(sub)
        return sid

    def _admit(self) -> None:
        """Move queued submissions into the window while the congestion window allows."""
        queued = self.queued
        room = self.cwnd - len(self.window)
        if not queued or room <= 0 or self.terminated is not None:
            return
        if not self.waiting():
            self._last_progress = self._now  # the progress clock starts with work
        window = self.window
        routes = self._routes
        for _ in range(min(room, len(queued))):
            sub = queued.popleft()
            window[sub.id[1]] = sub
            routes.append(sub)

    def _next_router(self) -> NodeId:
        """The router after ours in succession order, skipping any we cannot reach; after
        the last of the succession, every other router we ever knew (the list we started
        with, earlier announcements).  A router removed from the group while it was
        partitioned or slow may live on in its old view, never told it is out (the
        routers that knew have stopped since): it announces that view's succession, and a
        process that took it cycled among the old members for ever, though its own list
        named members of the current view (the simulator: ``--seed 5341`` with half the
        messages unsafe and 2.5 faults a second)."""
        others = tuple(sorted(self.known_routers.difference(self.succession)))
        order = (self.succession + others) or (self.target,)
        start = order.index(self.target) + 1 if self.target in order else 0
        for i in range(len(order)):
            r = order[(start + i) % len(order)]
            if r not in self.unreachable:
                break
        else:
            r = order[start % len(order)]
        if r in others:
            self.stats["beyond_succession"] += 1
        return r

    def _left_stalled(self) -> None:
        self._stalled[self.target] = self._stalled.get(self.target, 0) + 1

    def _progressed(self) -> None:
        """A delivery, an acknowledgement or a closed session came: our router works."""
        self._last_progress = self._now
        if self._stalled:
            self._stalled.clear()

    def _switch(self, router: NodeId) -> None:
        """Talk to ``router`` from now on; it gets the whole window again (3.4.3), control
        messages first, and every unanswered session close."""
        self.target = router
        self._last_progress = self._now
        self._heard_target = self._now
        self._send(router, Hello(self.p.lease))
        for ns, epoch in self.closing_sessions:
            self._send(router, CloseSessions(ns, epoch))
        if mutations.on(NO_WINDOW_RESEND):
            return
        self._routes = self._unstable_in_order()

    def _unstable_in_order(self) -> list[Submission]:
        """Every unstable submission, data and control, in the order they were made."""
        data = list(self.window.values())  # admitted in sequence order
        out: list[Submission] = []
        i = 0
        for sub, before in self.control.values():
            while i < len(data) and data[i].id[1] < before:
                out.append(data[i])
                i += 1
            out.append(sub)
        out.extend(data[i:])
        return out

    def _terminate(self, reason: str, at: int | None = None) -> None:
        self.terminated = reason
        self.suspected_at = at
        self._deliver(Terminated(reason, at))
