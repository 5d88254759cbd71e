"""The leader's duties: forwarding, confirmations, stability, acknowledgements (3.4.4, 3.5).

Only the leader (the oldest router in join order, 3.5.2) forwards, tracks confirmations
and proposes stability.  Its state is local, never replicated, and rebuilt by whoever
becomes leader: a new leader forwards every unstable message again, in ``t`` order per
destination, and endpoints confirm duplicates.  Any router may act as leader at any time
without breaking safety (``RouterParams.all_leaders`` tests exactly that).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from typing import Any

from ecast.core import mutations
from ecast.core.config import JOIN, KIND, PART, ROUTERS
from ecast.core.effects import NodeId
from ecast.core.message import Message, MsgId, Submission
from ecast.core.message import fast_new as _tnew
from ecast.core.proto import Congestion, Leader, SessionsClosed, Suspected, UnsafeShed
from ecast.core.router.outbox import Ack, AppOutbox
from ecast.core.router.params import IGNORE_SUSPECTS, RouterParams
from ecast.core.router.state import RouterState


class StableNotices:
    """``(t, delivered)`` of messages found stable, waiting to be proposed (3.5.7).

    Owned by the router, not the leader's state: notices found just before a leader
    steps down are still worth proposing.
    """

    __slots__ = ("entries", "since", "waited")

    def __init__(self) -> None:
        self.entries: list[tuple[int, bool]] = []
        self.since: float | None = None
        self.waited = False
        """Some entry is acknowledged only once its notice is learned."""

    def take(self) -> tuple[tuple[int, bool], ...]:
        out = tuple(self.entries)
        self.entries = []
        self.since = None
        self.waited = False
        return out


class Forwarding:
    """Leader-local forwarding and stability state of one router (not replicated)."""

    __slots__ = (
        "_dest_order",
        "_drop_suspects",
        "_now",
        "acked",
        "announced",
        "announced_upto",
        "frontier",
        "last_sent",
        "notices",
        "outbox",
        "p",
        "remaining",
        "routed_by",
        "state",
        "stats",
        "waiting",
    )

    def __init__(
        self,
        state: RouterState,
        params: RouterParams,
        outbox: AppOutbox,
        notices: StableNotices,
        stats: dict[str, int],
    ) -> None:
        self.state = state
        self.p = params
        self.outbox = outbox
        self.notices = notices
        self.stats = stats
        self._drop_suspects = not mutations.on(IGNORE_SUSPECTS)
        self._dest_order: dict[frozenset[NodeId], tuple[NodeId, ...]] = {}
        self._now = 0.0
        self.frontier = state.mseq.floor
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

    def at(self, now: float) -> None:
        self._now = now

    # ================================================================== forwarding
    def ordered(self, dests: frozenset[NodeId]) -> tuple[NodeId, ...]:
        """Destinations in a fixed order (never a set's hash order, which varies per run)."""
        cached = self._dest_order.get(dests)
        if cached is None:
            if len(self._dest_order) > 4096:
                self._dest_order.clear()
            cached = self._dest_order[dests] = tuple(sorted(dests))
        return cached

    def announce(self, view: int, succession: tuple[NodeId, ...], apps: dict[NodeId, None]) -> None:
        key = (view, len(apps))  # processes are only ever added to ``apps``
        if self.announced_upto == key:
            return
        msg = Leader(view, succession)
        for p in apps:
            if self.announced.get(p, -1) < view:
                self.announced[p] = view
                self.outbox.send(p, msg)
        self.announced_upto = key

    def forward(self, route_latest: bool = False) -> None:
        """Send every learned message past the frontier to ``destset \\ suspects``, in t order."""
        st = self.state
        mseq = st.mseq
        end = mseq.next_t
        t = max(self.frontier, mseq.floor)
        if t >= end:
            return
        entries = mseq.entries
        stable = mseq.stable
        suspects = st.suspects
        departed = st.departed
        drop_suspects = self._drop_suspects
        outbox = self.outbox
        runs = outbox.runs
        guard = mseq.guard
        order = self._dest_order
        waiting = self.waiting
        last_sent = self.last_sent
        remaining = self.remaining
        delivered = 0
        skip_gone = bool(suspects or departed)
        # The config changes rarely: look it up again only past the next config boundary.
        starts = mseq.starts
        config = mseq.latest
        bound = -1
        while t < end:
            if t >= bound and not route_latest:
                i = bisect_right(starts, t)
                config = mseq.configs[i - 1]
                bound = starts[i] if i < len(starts) else end
            msg = entries.get(t)
            if msg is None:
                t += 1
                continue
            # This loop runs for every message: the guard's and the outbox's common cases
            # are written out (a call each per message and destination cost more).
            try:
                dests = config.destset(msg)
            except Exception:
                dests = guard.destset(config, msg)  # fails again, and is reported
            if t in stable:
                # Every destination has it; a new leader still counts it as "sent", so
                # that its unsafe tags (3.5.7) match what each destination delivered.
                for d in dests:
                    if d not in suspects and d not in departed and last_sent.get(d, -1) < t:
                        last_sent[d] = t
            else:
                n = 0
                ds = order.get(dests)
                if ds is None:
                    ds = self.ordered(dests)
                for d in ds:
                    if skip_gone and ((d in suspects and drop_suspects) or d in departed):
                        continue
                    n += 1
                    run = runs.get(d)
                    if run is None:
                        outbox.deliver(d, t, msg)
                    else:
                        run.append((t, msg))
                    q = waiting.get(d)
                    if q is None:
                        q = waiting[d] = deque()
                    q.append(t)
                    last_sent[d] = t
                h = msg[2]
                if type(h) is dict and h.get(KIND) == JOIN and last_sent.get(msg[0]) == t:
                    self._welcome_joiner(t, msg)
                if n:
                    remaining[t] = 2 * n
                    delivered += n
                else:
                    self.stable_candidate(t, False)  # nobody to wait for: stable at once
            t += 1
        self.frontier = t
        self.stats["delivered"] += delivered

    def _welcome_joiner(self, t: int, msg: Message) -> None:
        """A joiner's own copy of its join carries the config's view just after it
        (``joiner_state``: the members, for a ``Membership`` config), so the process
        knows whom it joined without asking (``Client.members``)."""
        after = self.state.mseq.config_for(t + 1)
        state_of = getattr(after, "joiner_state", None)
        if state_of is None:
            return
        try:
            state = state_of()
        except Exception:
            return  # a config bug costs the joiner its view, not the group its order
        self.outbox.replace_delivery(msg[0], t, msg._replace(payload=state))

    def forward_unsafe(
        self, src: NodeId, subs: tuple[Submission, ...], link_lag: Callable[[NodeId], int] | None
    ) -> None:
        """Unsafe copies (3.5.7): routed with the config at the frontier, tagged with the
        last ``t`` this leader sent each destination; no agreement, no acknowledgement.

        The tag is None for a destination this leader has sent nothing since it took over
        and that no message from the stable floor on was meant for: every message before
        the frontier meant for it is stable (so it delivered them), and the destination
        accepts the copy if it delivered nothing at or beyond the frontier.  Without
        this, a destination that gets no new safe traffic after a leader change would
        reject every unsafe copy for good.

        The frontier used is at least the stable floor: where several routers lead at
        once (``all_leaders``), another leader's copies may make messages stable and
        collected before this one forwarded them, leaving its own frontier below the
        floor, where the configs are collected too (``config_for`` would give the wrong
        one).  Everything below the floor is stable, so a destination that delivered a
        collected message meant for it has ``t_max`` past its tag and rejects the copy."""
        st = self.state
        mseq = st.mseq
        frontier = max(self.frontier, mseq.floor)
        config = mseq.config_for(frontier)
        destset = mseq.guard.destset
        suspects = st.suspects
        limit = self.p.unsafe_lag_limit
        lagging: dict[NodeId, bool] = {}
        shed: list[MsgId] = []
        for sub in subs:
            m = _tnew(Message, (src, sub.id, sub.header, sub.payload))
            dropped = False
            for d in self.ordered(destset(config, m)):
                if d in suspects:
                    continue
                lags = lagging.get(d)
                if lags is None:
                    waiting = self.waiting.get(d)
                    lags = lagging[d] = (waiting is not None and len(waiting) > limit) or (
                        link_lag is not None and link_lag(d) > limit
                    )
                if lags:
                    self.stats["unsafe_dropped"] += 1
                    dropped = True
                    continue
                self.outbox.deliver_unsafe(d, self.last_sent.get(d), frontier, m)
                self.stats["unsafe_sent"] += 1
            if dropped:
                shed.append(sub.id)
        if shed:
            # The sender learns at once, not by a timeout: a Rubberband snapshot read
            # retries at once, or reads in order instead.
            self.outbox.send(src, UnsafeShed(tuple(shed)))

    # ================================================================== confirmations
    def on_confirm(self, src: NodeId, upto: int) -> None:
        q = self.waiting.get(src)
        if not q:
            return
        remaining = self.remaining
        done = []
        while q and q[0] <= upto:
            t = q.popleft()
            r = remaining.get(t)
            if r is None:
                continue
            if r < 4:  # this was the last destination
                del remaining[t]
                done.append(t)
            else:
                remaining[t] = (r - 2) | 1
        if done:
            self.stable_candidates(done, True)

    def drop_destination(self, p: NodeId) -> None:
        """Stop waiting for ``p``'s confirmations: it is suspected or it departed."""
        if not self._drop_suspects and p not in self.state.departed:
            return
        q = self.waiting.pop(p, None)
        if not q:
            return
        remaining = self.remaining
        for t in q:
            r = remaining.get(t)
            if r is None:
                continue
            if r < 4:
                del remaining[t]
                self.stable_candidate(t, bool(r & 1))
            else:
                remaining[t] = r - 2

    def stable_candidate(self, t: int, delivered: bool) -> None:
        """Every unsuspected destination has ``t``: it is stable now."""
        self.stable_candidates((t,), delivered)

    def stable_candidates(self, ts: list[int] | tuple[int, ...], delivered: bool) -> None:
        """Every unsuspected destination has each of ``ts``: they are stable now.

        The acknowledgement goes out at once; the stable notice is replicated afterwards,
        for garbage collection and so a new leader does not forward ``t`` again.  Safe:
        what the acknowledgement promises already holds, and a leader that takes over
        before the notice is chosen merely acknowledges again (endpoints ignore acks of
        messages no longer in their window).  This takes a consensus round off every
        message's path from submit to acknowledgement.

        One call per confirmation, not per message: this runs for every message the
        leader forwards, so ``StableNotices.add`` and ``AppOutbox.ack`` are written out.
        """
        if not ts:
            return
        entries = self.state.mseq.entries
        early = self.p.early_acks
        notices = self.notices
        note = notices.entries.append
        if notices.since is None:
            notices.since = self._now
        acks = self.outbox.acks
        acked = self.acked
        for t in ts:
            note((t, delivered))
            msg = entries.get(t)
            if msg is None or not early:
                notices.waited = True
                continue
            header = msg[2]
            if type(header) is dict and header.get(KIND) == PART:
                # This acknowledgement lets a leaving process stop confirming, which is
                # only safe once every router knows its part is stable
                # (``RouterState.departed``): it waits for the notice to be learned.
                notices.waited = True
                continue
            sender = msg[0]
            ack = (msg[1], t, delivered)
            if sender != ROUTERS:  # the routers' own messages need no acknowledgement
                box = acks.get(sender)
                if box is None:
                    acks[sender] = [ack]
                else:
                    box.append(ack)
            if self.routed_by:
                self.ack_other_routers(t, ack, sender)
            acked.add(t)

    def ack(self, t: int, ack: Ack, sender: NodeId) -> None:
        """Acknowledge ``t`` to its sender and to every other process that routed it."""
        if sender != ROUTERS:  # the routers' own messages need no acknowledgement
            self.outbox.ack(sender, ack)
        if self.routed_by:
            self.ack_other_routers(t, ack, sender)

    def ack_other_routers(self, t: int, ack: Ack, sender: NodeId) -> None:
        for p in sorted(self.routed_by.pop(t, ())):
            if p != sender:
                self.outbox.ack(p, ack)

    def also_routed(self, t: int, p: NodeId) -> None:
        """``p`` routed the learned, unstable message at ``t`` too: it gets the ack."""
        self.routed_by.setdefault(t, set()).add(p)

    # ================================================================== periodic
    def periodic(self) -> None:
        """Every 250 ms: re-apply suspects, and send congestion notices (3.5.6)."""
        st = self.state
        for gone in (st.suspects, st.departed):
            for p in list(gone):
                if p in self.waiting:
                    self.drop_destination(p)
        # A destination may never confirm what became stable without it (another leader
        # collected the confirmations first): let go of stable heads, and of empty queues.
        mseq = st.mseq
        for d in list(self.waiting):
            q = self.waiting[d]
            while q and mseq.is_stable(q[0]):
                q.popleft()
            if not q:
                del self.waiting[d]
        counts = st.unstable_per_sender()
        total = sum(counts.values())
        threshold = self.p.congestion_threshold
        if total > threshold and counts:
            # n counts the processes that have unstable messages: idle ones should not
            # shrink the fair quota of the ones that are sending (docs/decisions.md).
            quota = threshold / len(counts)
            for p, c in counts.items():
                if c > quota:
                    self.outbox.send(p, Congestion())
                    self.stats["congestion_notices"] += 1

    # ================================================================== learning events
    # (``ecast.core.router.state.LearnListener``)
    def learned_duplicate(self, sender: NodeId, sid: MsgId, t: int | None, ack: Any) -> None:
        if t is not None:
            self.also_routed(t, sender)
        else:
            self.outbox.ack(sender, (sid, *ack) if ack is not None else (sid, None, False))

    def learned_closed(self, sender: NodeId, sid: MsgId) -> None:
        self.outbox.reject_closed(sender, sid)

    def learned_suspect(self, p: NodeId, t: int) -> None:
        self.drop_destination(p)
        self.outbox.send(p, Suspected(t))

    def learned_stable(self, run: list[tuple[int, MsgId, bool, NodeId]]) -> None:
        acked = self.acked
        remaining = self.remaining
        for t, sid, delivered, sender in run:
            if t in acked:
                acked.discard(t)  # acknowledged when it became stable
                if self.routed_by:
                    self.ack_other_routers(t, (sid, t, delivered), sender)
            else:
                self.ack(t, (sid, t, delivered), sender)
            remaining.pop(t, None)

    def learned_departure(self, p: NodeId) -> None:
        self.drop_destination(p)

    def learned_close(self, requester: NodeId, namespace: str, epoch: int) -> None:
        self.outbox.send(requester, SessionsClosed(namespace, epoch))
