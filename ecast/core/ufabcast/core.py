"""ufabcast: uniform FIFO atomic broadcast among routers (dissertation 3.5.4, 3.5.5).

A reconfigurable, wait-free Multi-Paxos.  "Wait-free" in the dissertation's sense: the
leader pipelines phase-2 messages over FIFO channels and never waits between them.  The
class is a sans-IO core: inputs are messages, proposals and ticks with the current time;
outputs are :class:`~ecast.core.effects.Effects`.

How the pieces fit (each is spelled out where it is implemented):

* **Views and stop signs.**  A ``join`` or ``part`` command, once executed at instance
  ``i`` of view ``v``, closes ``v``: instances ``> i`` of ``v`` are void at every router even
  if something was chosen in them, and view ``v + 1`` starts at ``i + 1`` with the new
  membership (the stop-sign method of Lamport, Malkhi and Zhou, 3.2.3).  Paxos state is
  kept per view; a router that has closed ``v`` drops ``v``'s state and refuses to take part
  in ``v`` again, which is safe because refusing is always safe in Paxos.
* **Ballots.**  ``(round, router)``.  The first member of a view owns round 0 and may skip
  phase 1 (no lower ballot exists).  Anyone else runs phase 1 with a higher round, which
  fills holes with the highest accepted value or a no-op.
* **Learning.**  Acceptors acknowledge ranges to the ballot's holder; the holder announces
  ``Commit(lo..hi)``.  Learners take the value of the committed ballot from the ``Accept``
  they saw (FIFO guarantees it arrived first) and fetch anything else from a peer's
  executed log (catch-up).
* **FIFO per proposer.**  Each command keeps ``(proposer, seq)`` for life.  Executed
  commands pass through a reorder buffer that releases them in sequence order and drops
  second copies; it is a pure function of the executed sequence and survives views.
* **Membership.**  Heartbeats every 250 ms carry the highest executed instance; the minimum
  over the view is the GC watermark.  Under load a follower's ``Accepted`` carries it too
  and the leader's ``Commit`` carries the watermark back, so the log is collected a round
  trip after every member executed it instead of up to two heartbeats later.  A member
  silent for the failure timeout is proposed ``part``.  Commands of a router executed
  after its own ``part`` are ignored.
* **Admission.**  The layer above lets only routers' credentials reach this class
  (``Router.role_of``); here, ``Prepare``, ``Accept``, ``Commit``, ``Accepted`` and ``Nack``
  of the current view count only from its members (a later view's members are not known
  yet, so those are taken from any router), catch-up requests and replies only from
  members (or parted members), and a ``Snapshot`` only when this router asked for one:
  a joiner from a member of the view the snapshot puts it in, a laggard from the router
  it asked to catch up.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable
from typing import Any

from ecast.core import mutations
from ecast.core.effects import Effects, NodeId
from ecast.core.ufabcast.catchup import CatchUp
from ecast.core.ufabcast.detector import FailureDetector
from ecast.core.ufabcast.fifo import FifoRelease
from ecast.core.ufabcast.gc import Watermark, prune
from ecast.core.ufabcast.leader import Leadership
from ecast.core.ufabcast.log import Log
from ecast.core.ufabcast.messages import (
    Accept,
    Accepted,
    AppCmd,
    Ballot,
    CatchUpReply,
    CatchUpRequest,
    Command,
    Commit,
    Executed,
    Forward,
    Heartbeat,
    JoinCmd,
    JoinRequest,
    Nack,
    PartCmd,
    Parted,
    Prepare,
    Promise,
    Snapshot,
    Stopped,
    View,
)
from ecast.core.ufabcast.params import NO_FIFO_DEDUP, RENUMBER_REPROPOSALS, UfabParams
from ecast.core.ufabcast.paxos import Acceptor, Tenure
from ecast.core.ufabcast.progress import first_voters
from ecast.core.ufabcast.proposer import ClumpQueue, Proposer
from ecast.core.ufabcast.retirement import Retirement
from ecast.core.ufabcast.views import Views

_INF = float("inf")
MAX_OUTSIDERS = 8
"""Routers outside its view that a router remembers having greeted it."""


class Ufabcast:
    """One router's ufabcast endpoint.

    Create it either with ``members`` (a founding router of view 0) or with ``seeds``
    (a router joining a running group through any of them).  Drive it with
    :meth:`on_message`, :meth:`on_tick`, :meth:`propose`, :meth:`leave` and
    :meth:`provide_snapshot`; each returns :class:`Effects` whose ``deliver`` list holds
    upcalls in order: ``Executed``, ``ViewChanged``, ``SnapshotNeeded``, ``Installed``,
    ``Stopped``.
    """

    def __init__(
        self,
        me: NodeId,
        params: UfabParams | None = None,
        *,
        members: list[NodeId] | tuple[NodeId, ...] | None = None,
        seeds: list[NodeId] | tuple[NodeId, ...] | None = None,
    ) -> None:
        if (members is None) == (seeds is None):
            raise ValueError("give exactly one of members (founder) or seeds (joiner)")
        self.me = me
        self.p = params or UfabParams()
        self._rng = random.Random(zlib.crc32(me.encode()) ^ self.p.seed)
        self.stopped = False
        """No longer a participant: executes, proposes and accepts nothing."""
        self.retirement: Retirement | None = None
        """Set once we executed our own part and still serve the log to the new view."""
        self.stop_reason = ""
        # -- replicated state machine
        self.view: View | None = None
        self.installed = False
        self.installed_view: View | None = None
        """For a joiner: the view its first snapshot put it in."""
        self.log = Log()
        self.wm = Watermark()
        self.fifo = FifoRelease()
        # -- Paxos, per view
        self.acc: dict[int, Acceptor] = {}
        self.leader = Leadership(self)
        self.views = Views(self)
        self.proposer = Proposer(me)
        # -- failure detection, heartbeats, catch-up
        self.detector = FailureDetector()
        self.catchup = CatchUp()
        self.next_hb = 0.0
        self._hint_sent: dict[NodeId, float] = {}
        self._outsiders: dict[NodeId, None] = {}
        """Routers outside our view that asked us to let them join (the latest few): the
        routers we ask where the group is while we hear no majority of our view."""
        # -- joining
        self.seeds = tuple(seeds or ())
        self._join_attempt = 0
        self._join_at = 0.0
        self._catchup_asked: dict[NodeId, None] = {}
        """Routers we asked to catch us up since our last snapshot: the only ones whose
        ``Snapshot`` an installed router takes (the answer to a request its log could not
        serve).  Bounded by the view's members and the routers they replaced."""
        # -- per call
        self._fx: Effects | None = None
        self._now = 0.0
        self._fwd_out: list[Command] = []
        self._acks_out: dict[tuple[NodeId, int, Ballot], int] = {}
        self._nacks_out: dict[NodeId, tuple[int, Ballot]] = {}
        self._gc_due = False
        """A follower reported progress in an ``Accepted``: collect before returning."""
        self._votes_due = _INF
        """When held votes must go out (``UfabParams.vote_delay``); infinite if none."""
        self._resend_due = False
        self._last_believed: NodeId | None = None
        self.stats: dict[str, int] = {
            "proposed": 0,
            "instances": 0,
            "phase1": 0,
            "phase1_won": 0,
            "stepdowns": 0,
            "view_changes": 0,
            "catchups": 0,
            "limit_blocked": 0,
            "relayed": 0,
            "leadership_claimed": 0,
            "resends": 0,
            "void_discarded": 0,
            "stalls_excused": 0,
            "duplicates_dropped": 0,
            "ignored_parted": 0,
            "ignored_non_member": 0,
        }
        self._handlers: dict[type, Callable[[NodeId, Any], None]] = {
            Forward: self._on_forward,
            Prepare: self._on_prepare,
            Promise: self._on_promise,
            Accept: self._on_accept,
            Accepted: self._on_accepted,
            Nack: self._on_nack,
            Commit: self._on_commit,
            Heartbeat: self._on_heartbeat,
            CatchUpRequest: self._on_catchup_request,
            CatchUpReply: self._on_catchup_reply,
            JoinRequest: self._on_join_request,
            Snapshot: self._on_snapshot,
            Parted: self._on_parted,
        }
        if members is not None:
            if not members or len(set(members)) != len(members):
                raise ValueError("members must be non-empty and distinct")
            if me not in members:
                raise ValueError("a founder must be one of the members")
            self.installed = True
            self.views.install(View(0, tuple(members), 0), fresh=True)

    # ================================================================== public inputs
    def propose(self, payload: Any, now: float) -> Effects:
        """Broadcast ``payload``; it will be executed by every router in one total order."""
        self._begin(now)
        if not self.stopped:
            cmd = self.proposer.new(payload, now)
            self.stats["proposed"] += 1
            if self.installed:
                self._route(cmd)
        return self._end()

    def leave(self, now: float) -> Effects:
        """Part gracefully: propose our own ``part``; we stop once it executes."""
        self._begin(now)
        if self.installed and not self.stopped:
            self._submit_reconfig(PartCmd(self.me, self.me))
        return self._end()

    def on_message(self, src: NodeId, msg: Any, now: float) -> Effects:
        return self.on_messages(src, (msg,), now)

    def on_messages(self, src: NodeId, msgs: tuple[Any, ...] | list[Any], now: float) -> Effects:
        """Handle a batch from one peer (one frame): one set of effects for all of it.

        Acknowledgements, commits and forwards produced by the batch leave as one message
        each, which is where batching pays (Python's cost is per message).
        """
        self._begin(now)
        if self.retiring:
            for msg in msgs:
                if not self.retiring:
                    break  # the batch's first confirmation stopped it: the rest is moot
                self._retiring_message(src, msg)
        elif not self.stopped:
            self.detector.heard(src, now)
            handlers = self._handlers
            for msg in msgs:
                if self.stopped:
                    break
                handler = handlers.get(type(msg))
                if handler is None:
                    raise TypeError(f"ufabcast: unknown message type {type(msg).__name__}")
                handler(src, msg)
        return self._end()

    def on_tick(self, now: float) -> Effects:
        self._begin(now)
        if self.retiring:
            self._retiring_tick()
        elif not self.stopped:
            if not self.installed:
                self._join_tick()
            else:
                self._detect_failures()
                if now >= self.next_hb:
                    self._send_heartbeats()
                    self._collect_garbage()
                self._stall_resend()
                self._maybe_catch_up()
        return self._end()

    def provide_snapshot(self, joiner: NodeId, tag: int, app_state: Any, now: float) -> Effects:
        """Answer a ``SnapshotNeeded`` upcall with the layer above's state at ``tag``."""
        self._begin(now)
        part = self.views.snap_parts.pop((joiner, tag), None)
        if part is not None and (self.retiring or not self.stopped):
            view, fifo_next, held, retired = part
            self._send(joiner, Snapshot(tag, view, fifo_next, held, retired, app_state))
        return self._end()

    def set_seeds(self, seeds: list[NodeId] | tuple[NodeId, ...]) -> None:
        """Replace the routers a joiner asks (e.g. after re-reading its configuration)."""
        self.seeds = tuple(seeds)

    # ================================================================== introspection
    @property
    def retiring(self) -> bool:
        """Stopped after our own part, but still serving the log to the new view."""
        return self.retirement is not None

    @property
    def finished(self) -> bool:
        """Stopped and owing nobody anything: the process may exit."""
        return self.stopped and not self.retiring

    @property
    def watermark(self) -> int:
        """Every member has executed up to here: all Paxos state at or below is collected."""
        return self.wm.value

    @property
    def held(self) -> dict[NodeId, dict[int, AppCmd]]:
        """Commands executed ahead of a gap in their proposer's sequence (FIFO release)."""
        return self.fifo.held

    @property
    def executed(self) -> int:
        return self.log.next_exec - 1

    @property
    def next_exec(self) -> int:
        return self.log.next_exec

    @property
    def retired(self) -> set[NodeId]:
        """Routers that parted (their commands are ignored from then on)."""
        return self.views.retired

    @property
    def lead(self) -> Tenure | None:
        return self.leader.lead

    @property
    def queue(self) -> ClumpQueue:
        return self.leader.queue

    def is_leader(self) -> bool:
        """True while this router holds an active ballot in its current view."""
        return self.leader.active() is not None

    def idle(self) -> bool:
        """Nothing queued and nothing proposed that is not known chosen."""
        return not self.leader.queue and not self._fwd_out and self.in_flight() == 0

    def in_flight(self) -> int:
        """Instances this router proposed as leader that are not known chosen yet."""
        lead = self.leader.active()
        return 0 if lead is None else lead.next_inst - 1 - lead.committed

    def believed_leader(self) -> NodeId | None:
        return self.leader.believed() if self.installed and not self.stopped else None

    def gc_violations(self) -> list[str]:
        """State held for instances at or below the collected watermark (should be none)."""
        w = self.wm.value
        bad: list[str] = []
        if any(i <= w for i in self.log.entries):
            bad.append("log")
        for v, acc in self.acc.items():
            if any(i <= w for i in acc.accepted) or any(i <= w for i in acc.seen):
                bad.append(f"acceptor[{v}]")
        for v, d in self.log.decided.items():
            if any(i <= w for i in d):
                bad.append(f"decided[{v}]")
        return bad

    def memory(self) -> dict[str, int]:
        return {
            "log": len(self.log.entries),
            "accepted": sum(len(a.accepted) + len(a.seen) for a in self.acc.values()),
            "decided": sum(len(d) for d in self.log.decided.values()),
            "held": self.fifo.held_count(),
            "pending": len(self.proposer.pending) + len(self.proposer.reconfigs),
            "queue": len(self.leader.queue),
            "views": len(self.acc),
        }

    # ================================================================== call framing
    def _begin(self, now: float) -> None:
        self._now = now
        self._fx = Effects()
        self.leader.accept_sent = False

    def _end(self) -> Effects:
        fx = self._fx
        assert fx is not None
        leader = self.leader
        if not self.stopped and self.installed:
            leader.maybe_lead()
            believed = leader.believed()
            if believed != self._last_believed:
                self._last_believed = believed
                self._on_leader_change()
            if self._resend_due:
                self._resend_pending()
            leader.flush()
            if self._gc_due:
                self._gc_due = False
                self._collect_garbage()
            if self._fwd_out:
                cmds, self._fwd_out = self._fwd_out, []
                target = leader.believed()
                if target == self.me:
                    for c in cmds:
                        leader.enqueue(c)
                    leader.flush()
                else:
                    self._send(target, Forward(tuple(cmds), 1))
        if self._acks_out:
            self._send_votes()
        if self._nacks_out:
            for dst, (view, promised) in self._nacks_out.items():
                self._send(dst, Nack(view, promised))
            self._nacks_out = {}
        if leader.commit_dirty:
            leader.send_commit()
        if self.retiring:
            fx.wake(max(self.next_hb, self._now))
        elif not self.stopped:
            fx.wake(self._next_wake())
        self._fx = None
        return fx

    def _send_votes(self) -> None:
        """Send ``Accepted`` now if this router is one of the votes the leader waits for,
        else once ``vote_delay`` has passed (see ``UfabParams.vote_delay``)."""
        held: dict[tuple[NodeId, int, Ballot], int] = {}
        for key, upto in self._acks_out.items():
            leader, view, ballot = key
            if self._now < self._votes_due and not self._prompt_voter(leader, view):
                held[key] = upto
                continue
            self._send(leader, Accepted(view, ballot, upto, self.log.next_exec - 1))
        self._acks_out = held
        if not held:
            self._votes_due = _INF
        elif self._votes_due == _INF:
            self._votes_due = self._now + self.p.vote_delay

    def _prompt_voter(self, leader: NodeId, view_number: int) -> bool:
        view = self.view
        if (
            self.p.vote_delay <= 0
            or view is None
            or view.number != view_number
            or self.retiring
            or not self.installed
        ):
            return True
        return self.me in first_voters(view.members, leader, view.majority)

    def _send(self, dst: NodeId, msg: Any) -> None:
        assert self._fx is not None
        self._fx.send.append((dst, msg))

    def _deliver(self, upcall: Any) -> None:
        assert self._fx is not None
        self._fx.deliver.append(upcall)

    def _next_wake(self) -> float | None:
        now = self._now
        if not self.installed:
            return max(self._join_at, now)
        wake = self.leader.next_wake(self.next_hb, now)
        if self._acks_out:
            wake = min(wake, self._votes_due)
        deadline = self.detector.next_deadline(self.p.failure_timeout)
        if deadline is not None:
            wake = min(wake, deadline)
        return max(wake, now)

    # ================================================================== retiring
    def _retiring_message(self, src: NodeId, msg: Any) -> None:
        t = type(msg)
        if t is CatchUpRequest:
            self._on_catchup_request(src, msg)
        elif t is Parted:
            view = self.view
            assert view is not None and self.retirement is not None
            if self.retirement.confirm(src, msg.view, view):
                self._stop("parted")
        elif t is Heartbeat:
            self.wm.report(src, msg.executed)

    def _retiring_tick(self) -> None:
        if self._now < self.next_hb:
            return
        view = self.view
        assert view is not None
        self.next_hb = self._now + self.p.heartbeat_interval
        assert self.retirement is not None
        msg = Heartbeat(view.number, self.log.next_exec - 1)
        for m in self.retirement.audience(view.members, self.me):
            self._send(m, msg)

    def _stop(self, reason: str, successor: Parted | None = None) -> None:
        was_stopped = self.stopped
        self.stopped = True
        self.retirement = None
        self.stop_reason = self.stop_reason or reason
        if not was_stopped:
            self._deliver(Stopped(reason, successor))
        # A stopped router owes nobody anything: let the runtime drop every channel.
        assert self._fx is not None
        peers = (
            self.detector.watched()
            | set(self.wm.reported)
            | set(self.view.members if self.view else ())
        )
        peers.discard(self.me)
        self._fx.forget.extend(sorted(peers))
        self.acc.clear()
        self.log = Log()
        self.leader.reset()
        self.proposer.clear()
        self._fwd_out = []
        self.views.snap_parts.clear()
        self._resend_due = False

    # ================================================================== execution
    def _try_execute(self) -> None:
        log = self.log
        while not self.stopped and self.installed:
            assert self.view is not None
            value = log.next_chosen(self.view.number)
            if value is None:
                return
            inst = log.next_exec
            log.executed_at(inst, self.view.number, value)
            self.views.apply(inst, value)

    def _fifo(self, cmd: AppCmd, inst: int) -> None:
        if cmd.seq < self.fifo.released_below(cmd.proposer):
            self.stats["duplicates_dropped"] += 1
        for c in self.fifo.admit(cmd, mutations.on(NO_FIFO_DEDUP)) or ():
            self._release(c, inst)

    def _release(self, cmd: AppCmd, inst: int) -> None:
        self._deliver(Executed(cmd.proposer, cmd.seq, cmd.payload, inst))
        self.leader.queue.executed(cmd.proposer, cmd.seq)
        if cmd.proposer == self.me:
            self.proposer.executed(cmd.seq, self._now)

    # ================================================================== proposing
    def _route(self, cmd: Command) -> None:
        if self.leader.active() is not None:
            self.leader.enqueue(cmd)
        else:
            self._fwd_out.append(cmd)

    def _submit_reconfig(self, cmd: JoinCmd | PartCmd) -> None:
        if self.views.redundant(cmd):
            return
        if self.proposer.add_reconfig(cmd):
            self._route(cmd)

    def _resend_pending(self) -> None:
        """Send every command of ours not yet executed to the leader, in sequence order.

        Called at most once per input (``_resend_due``); our commands already waiting in
        ``_fwd_out`` are replaced, not doubled, so the Forward stays in FIFO order.
        """
        self._resend_due = False
        if self.proposer.idle():
            return
        self.stats["resends"] += 1
        me = self.me
        self._fwd_out = [c for c in self._fwd_out if c.proposer != me]
        if mutations.on(RENUMBER_REPROPOSALS):
            self.proposer.renumber()
        self._fwd_out.extend(self.proposer.outstanding())

    def _on_leader_change(self) -> None:
        """The router we send commands to changed: hand over what we hold, re-send ours."""
        if self.leader.active() is None and self.leader.queue:
            self._fwd_out.extend(self.leader.queue.take())
        self._resend_due = True

    # ================================================================== message handlers
    def _acc(self, view: int) -> Acceptor:
        acc = self.acc.get(view)
        if acc is None:
            acc = Acceptor()
            self.acc[view] = acc
        return acc

    def _closed(self, src: NodeId, view: int) -> bool:
        """True if ``view`` is older than ours; point the sender at the present."""
        if self.view is not None and view < self.view.number:
            self._hint_peer(src)
            return True
        return False

    def _outsider(self, src: NodeId, view: int) -> bool:
        """True (and counted) if ``view`` is our current view and ``src`` is not one of its
        members: only members vote, lead and commit in a view."""
        v = self.view
        if v is not None and view == v.number and src not in v.members:
            self.stats["ignored_non_member"] += 1
            return True
        return False

    def _hint_peer(self, src: NodeId) -> None:
        """Tell a lagging or parted router where the group is (rate-limited)."""
        last = self._hint_sent.get(src)
        if last is not None and self._now - last < self.p.heartbeat_interval:
            return
        self._hint_sent[src] = self._now
        view = self.view
        if src in self.views.retired:
            self._send(src, Parted(view.number, view.members) if view else Parted(0, ()))
        elif view is not None:
            self._send(src, Heartbeat(view.number, self.log.next_exec - 1))

    def _on_forward(self, src: NodeId, msg: Forward) -> None:
        if not self.installed:
            return
        leader = self.leader
        if leader.active() is not None:
            for c in msg.cmds:
                leader.enqueue(c)
            return
        target = leader.believed()
        if target == src:
            # The router we believe leads sends us its commands: it believes we lead, and
            # neither would ever run phase 1 (each heard a different ballot last, or its
            # holder's suspicion sent each to another member).  We take over.
            self.stats["leadership_claimed"] += 1
            leader.claim()
            target = self.me
        if target == self.me:
            for c in msg.cmds:
                leader.enqueue(c)  # we are about to lead; keep them for then
        elif msg.ttl > 0:
            self.stats["relayed"] += 1
            self._send(target, Forward(msg.cmds, msg.ttl - 1))

    def _on_prepare(self, src: NodeId, msg: Prepare) -> None:
        if self._closed(src, msg.view) or self._outsider(src, msg.view):
            return
        acc = self._acc(msg.view)
        if msg.ballot >= acc.promised:
            acc.promised = msg.ballot
            self.leader.saw_ballot(msg.view, msg.ballot)
            entries = acc.accepted_from(msg.start)
            self._send(src, Promise(msg.view, msg.ballot, msg.start, entries))
        else:
            self._nacks_out[src] = (msg.view, acc.promised)

    def _on_promise(self, src: NodeId, msg: Promise) -> None:
        self.leader.promised(src, msg.view, msg.ballot, msg.accepted)

    def _on_accept(self, src: NodeId, msg: Accept) -> None:
        if self._closed(src, msg.view) or self._outsider(src, msg.view):
            return
        if self.installed and msg.instance <= self.wm.value:
            return
        acc = self._acc(msg.view)
        if msg.ballot >= acc.promised:
            if msg.ballot > acc.promised:
                acc.promised = msg.ballot
                self.leader.saw_ballot(msg.view, msg.ballot)
            acc.accepted[msg.instance] = (msg.ballot, msg.value)
            key = (msg.ballot[1], msg.view, msg.ballot)
            if self._acks_out.get(key, -1) < msg.instance:
                self._acks_out[key] = msg.instance
            view = self.view
            if (
                view is not None
                and view.number == msg.view
                and view.majority == 2
                and msg.ballot[1] in view.members
                and self.me in view.members
            ):
                # The holder accepted before sending and we just did: two votes are a
                # majority of a 2- or 3-member view, so the value is chosen.  Learning it
                # here saves a message delay, and it is what lets the survivor of a
                # 2-member view finish the view when the other member parts itself and
                # takes its Commit messages with it.
                self.log.decide(msg.view, msg.instance, msg.value, view.number)
                self._try_execute()
        else:
            seen = acc.seen.get(msg.instance)
            if seen is None or seen[0] < msg.ballot:
                acc.seen[msg.instance] = (msg.ballot, msg.value)
            self._nacks_out[src] = (msg.view, acc.promised)

    def _on_accepted(self, src: NodeId, msg: Accepted) -> None:
        if self._outsider(src, msg.view):
            return
        view = self.view
        if view is not None and src in view.members and self.wm.report(src, msg.executed):
            self._gc_due = True
        self.leader.voted(src, msg.view, msg.ballot, msg.upto)

    def _on_nack(self, src: NodeId, msg: Nack) -> None:
        if self._outsider(src, msg.view):
            return
        leader = self.leader
        lead = leader.lead
        if lead is not None and msg.view == lead.view and msg.promised > lead.ballot:
            leader.saw_ballot(msg.view, msg.promised)
            if leader.lead is lead:  # a ballot from an earlier view number cannot preempt
                leader.step_down()

    def _on_commit(self, src: NodeId, msg: Commit) -> None:
        if self._closed(src, msg.view) or self._outsider(src, msg.view):
            return
        current = self.view is not None and msg.view == self.view.number
        floor = self.log.next_exec if current and self.installed else 0
        if self.log.learn_commit(msg, self.acc.get(msg.view), floor):
            self.catchup.missing_from = src
        self._try_execute()
        if current and self.installed and msg.collected > self.wm.value:
            # Every member executed up to ``collected``, this one included (its own report
            # is part of the minimum), so nothing up to there can be asked of it again.
            self._collect_to(min(msg.collected, self.log.next_exec - 1))

    def _on_heartbeat(self, src: NodeId, msg: Heartbeat) -> None:
        if src in self.views.retired:
            self._hint_peer(src)
            return
        self.wm.report(src, msg.executed)
        if self.view is not None and msg.view < self.view.number:
            self._hint_peer(src)

    def _on_catchup_request(self, src: NodeId, msg: CatchUpRequest) -> None:
        if src in self.views.retired:
            self._hint_peer(src)
            return
        if not self.installed:
            return
        if self.view is not None and src not in self.view.members:
            # The log, and the snapshot it may lead to (every session and message), is
            # for the group's members; a joiner asks with a JoinRequest.
            self.stats["ignored_non_member"] += 1
            return
        if not self.log.reaches(msg.start, self.wm.value):
            # Our log no longer reaches back that far (every member we knew had executed
            # it, but the requester missed it, e.g. because the routers that still held it
            # were parted).  Transfer state instead, as for a joiner.
            sent = self.views.snapshot_sent
            last = sent.get(src)
            if last is not None and self._now - last < 4 * self.p.heartbeat_interval:
                return
            sent[src] = self._now
            self.views.owe_snapshot(src, self.log.next_exec - 1)
            return
        entries = self.log.serve(msg.start, self.p.catchup_batch)
        if entries:
            self._send(src, CatchUpReply(tuple(entries)))

    def _on_catchup_reply(self, src: NodeId, msg: CatchUpReply) -> None:
        view = self.view
        if (
            not self.installed
            or view is None
            or (src not in view.members and src not in self.views.retired)
        ):
            self.stats["ignored_non_member"] += 1
            return
        self.stats["catchups"] += 1
        self.log.learn_entries(msg.entries, view.number)
        before = self.log.next_exec
        self._try_execute()
        if (
            self.installed
            and len(msg.entries) >= self.p.catchup_batch
            and self.log.next_exec > before
            and not self.stopped
        ):
            self._ask_catch_up(src)

    def _on_join_request(self, src: NodeId, msg: JoinRequest) -> None:
        if not self.installed or self.view is None:
            return
        if src in self.views.retired:
            self._hint_peer(src)
        elif src in self.view.members:
            # Already joined (an earlier snapshot may have been lost): send a fresh one.
            self.views.owe_snapshot(src, self.log.next_exec - 1)
        else:
            outsiders = self._outsiders
            outsiders.pop(src, None)
            outsiders[src] = None
            if len(outsiders) > MAX_OUTSIDERS:
                del outsiders[next(iter(outsiders))]
            self._submit_reconfig(JoinCmd(self.me, src))

    def _on_snapshot(self, src: NodeId, msg: Snapshot) -> None:
        if self.views.wanted(src, msg):
            self.views.install_snapshot(msg)

    def _on_parted(self, src: NodeId, msg: Parted) -> None:
        view = self.view
        later = msg.members and (view is None or msg.view > view.number)
        self._stop("parted", msg if later else None)

    # ================================================================== timers
    def _join_tick(self) -> None:
        if self._now < self._join_at or not self.seeds:
            return
        seed = self.seeds[self._join_attempt % len(self.seeds)]
        self._join_attempt += 1
        self._join_at = self._now + self.p.join_retry
        self._send(seed, JoinRequest())

    def _detect_failures(self) -> None:
        view = self.view
        assert view is not None
        p = self.p
        detector = self.detector
        detector.detect(view.members, self.me, self._now, p.failure_timeout, p.heartbeat_interval)
        self.stats["stalls_excused"] = detector.stalls_excused
        if detector.suspected:
            fresh = min(2 * p.heartbeat_interval, p.failure_timeout)
            for m in detector.to_part(view.members, self.me, self._now, fresh, view.majority):
                self._submit_reconfig(PartCmd(self.me, m))

    def _send_heartbeats(self) -> None:
        view = self.view
        assert view is not None
        self.next_hb = self._now + self.p.heartbeat_interval
        msg = Heartbeat(view.number, self.log.next_exec - 1)
        for m in view.members:
            if m != self.me:
                self._send(m, msg)
        if self._outsiders and not self.detector.hears_majority(
            view.members, self.me, self._now, self.p.failure_timeout, view.majority
        ):
            # Cut off from our view, or its members all left: we may have been parted
            # while away, and then none of them will ever tell us.  A router outside the
            # view that asked us to let it join may be in the group now; if the group
            # parted us it answers ``Parted`` with where the group is (``_hint_peer``).
            retired = self.views.retired
            for m in self._outsiders:
                if m not in view.members and m not in retired:
                    self._send(m, msg)

    def _collect_garbage(self) -> None:
        """Forget instances every member has executed (3.5.5)."""
        view = self.view
        assert view is not None
        w = self.wm.candidate(view.members, self.me, self.log.next_exec - 1)
        if w is not None:
            self._collect_to(w)

    def _collect_to(self, w: int) -> None:
        view = self.view
        assert view is not None
        old = self.wm.value
        if w <= old:
            return
        self.log.collect(w, old)
        acc = self.acc.get(view.number)
        if acc is not None:
            prune(acc.accepted, w, old)
            prune(acc.seen, w, old)
        self.wm.value = w

    def _stall_resend(self) -> None:
        if self.proposer.stalled(self._now, self.p.resend_timeout):
            self._resend_due = True

    def _maybe_catch_up(self) -> None:
        best = self.catchup.whom_to_ask(
            self._now, self.log.next_exec - 1, self.wm.reported, self.me, self.p.heartbeat_interval
        )
        if best is not None:
            self._ask_catch_up(best)

    def _ask_catch_up(self, peer: NodeId) -> None:
        self._catchup_asked[peer] = None
        self._send(peer, CatchUpRequest(self.log.next_exec))
