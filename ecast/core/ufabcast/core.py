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
    Installed,
    JoinCmd,
    JoinRequest,
    Nack,
    PartCmd,
    Parted,
    Prepare,
    Promise,
    Snapshot,
    SnapshotNeeded,
    Stopped,
    Value,
    View,
    ViewChanged,
)
from ecast.core.ufabcast.params import (
    EXECUTE_PARTED,
    KEEP_VOID_INSTANCES,
    NO_FIFO_DEDUP,
    RENUMBER_REPROPOSALS,
    SKIP_PHASE1,
    UfabParams,
)
from ecast.core.ufabcast.paxos import LOWEST, Acceptor, Tenure
from ecast.core.ufabcast.proposer import ClumpQueue, Proposer
from ecast.core.ufabcast.retirement import Retirement

_INF = float("inf")
NOOP: Value = ()


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
        self.next_exec = 0
        self.log: dict[int, tuple[int, Value]] = {}
        self.log_floor = -1
        """Our executed log starts above this (a snapshot replaced what lies below)."""
        self.wm = Watermark()
        self.fifo = FifoRelease()
        self.retired: set[NodeId] = set()
        # -- Paxos, per view
        self.acc: dict[int, Acceptor] = {}
        self.decided: dict[int, dict[int, Value]] = {}
        self._commit_seen: dict[int, tuple[Ballot, int]] = {}
        self.lead: Tenure | None = None
        self.hint_ballot: Ballot = LOWEST
        self.max_round = 0
        self.backoff = self.p.backoff_initial
        self.backoff_until = 0.0
        self.queue = ClumpQueue()
        self.proposer = Proposer(me)
        # -- failure detection, heartbeats, catch-up
        self.detector = FailureDetector()
        self.catchup = CatchUp()
        self.next_hb = 0.0
        self._hint_sent: dict[NodeId, float] = {}
        # -- joining
        self.seeds = tuple(seeds or ())
        self._join_attempt = 0
        self._join_at = 0.0
        self._snap_parts: dict[tuple[NodeId, int], tuple[Any, ...]] = {}
        self._snapshot_sent: dict[NodeId, float] = {}
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
        self._commit_dirty = False
        self._gc_due = False
        """A follower reported progress in an ``Accepted``: collect before returning."""
        self._votes_due = _INF
        """When held votes must go out (``UfabParams.vote_delay``); infinite if none."""
        self._commit_due: float | None = None
        """When a withheld ``Commit`` must go out alone (``UfabParams.commit_delay``)."""
        self._accept_sent = False
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
            self._install_view(View(0, tuple(members), 0), fresh=True)

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
        each, which is where batching pays (STYLE.md section 4).
        """
        self._begin(now)
        if self.retiring:
            for msg in msgs:
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
        part = self._snap_parts.pop((joiner, tag), None)
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
        return self.next_exec - 1

    def is_leader(self) -> bool:
        """True while this router holds an active ballot in its current view."""
        return self._active_lead() is not None

    def idle(self) -> bool:
        """Nothing queued and nothing proposed that is not known chosen."""
        return not self.queue and not self._fwd_out and self.in_flight() == 0

    def in_flight(self) -> int:
        """Instances this router proposed as leader that are not known chosen yet."""
        lead = self._active_lead()
        return 0 if lead is None else lead.next_inst - 1 - lead.committed

    def believed_leader(self) -> NodeId | None:
        return self._believed_leader() if self.installed and not self.stopped else None

    def gc_violations(self) -> list[str]:
        """State held for instances at or below the collected watermark (should be none)."""
        w = self.wm.value
        bad: list[str] = []
        if any(i <= w for i in self.log):
            bad.append("log")
        for v, acc in self.acc.items():
            if any(i <= w for i in acc.accepted) or any(i <= w for i in acc.seen):
                bad.append(f"acceptor[{v}]")
        for v, d in self.decided.items():
            if any(i <= w for i in d):
                bad.append(f"decided[{v}]")
        return bad

    def memory(self) -> dict[str, int]:
        return {
            "log": len(self.log),
            "accepted": sum(len(a.accepted) + len(a.seen) for a in self.acc.values()),
            "decided": sum(len(d) for d in self.decided.values()),
            "held": self.fifo.held_count(),
            "pending": len(self.proposer.pending) + len(self.proposer.reconfigs),
            "queue": len(self.queue),
            "views": len(self.acc),
        }

    # ================================================================== call framing
    def _begin(self, now: float) -> None:
        self._now = now
        self._fx = Effects()
        self._accept_sent = False

    def _end(self) -> Effects:
        fx = self._fx
        assert fx is not None
        if not self.stopped and self.installed:
            self._maybe_lead()
            believed = self._believed_leader()
            if believed != self._last_believed:
                self._last_believed = believed
                self._on_leader_change()
            if self._resend_due:
                self._resend_pending()
            self._flush_queue()
            if self._gc_due:
                self._gc_due = False
                self._collect_garbage()
            if self._fwd_out:
                cmds, self._fwd_out = self._fwd_out, []
                target = self._believed_leader()
                if target == self.me:
                    for c in cmds:
                        self._enqueue(c)
                    self._flush_queue()
                else:
                    self._send(target, Forward(tuple(cmds), 1))
        if self._acks_out:
            self._send_votes()
        if self._nacks_out:
            for dst, (view, promised) in self._nacks_out.items():
                self._send(dst, Nack(view, promised))
            self._nacks_out = {}
        if self._commit_dirty:
            self._send_commit()
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
            self._send(leader, Accepted(view, ballot, upto, self.next_exec - 1))
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
        need = view.majority - (1 if leader in view.members else 0)
        voters = [m for m in view.members if m != leader]
        return self.me in voters[:need]

    def _send_commit(self) -> None:
        """Send the pending ``Commit`` now if an ``Accept`` carries it, or it is due."""
        lead = self.lead
        if lead is None or self.view is None or self.stopped:
            self._commit_dirty = False
            self._commit_due = None
            return
        if not self._accept_sent and self.p.commit_delay > 0:
            if self._commit_due is None:
                self._commit_due = self._now + self.p.commit_delay
            if self._now < self._commit_due:
                return
        self._commit_dirty = False
        self._commit_due = None
        msg = Commit(lead.view, lead.ballot, lead.first_inst, lead.committed, self.wm.value)
        for m in self.view.members:
            if m != self.me:
                self._send(m, msg)

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
        wake = self.next_hb
        if self._commit_due is not None:
            wake = min(wake, self._commit_due)
        if self._acks_out:
            wake = min(wake, self._votes_due)
        since = self.queue.since
        if since is not None and self.queue and self._active_lead() is not None:
            wake = min(wake, since + self.p.clump_delay)
        if self.lead is None and self._believed_leader() == self.me and self.backoff_until > now:
            wake = min(wake, self.backoff_until)
        deadline = self.detector.next_deadline(self.p.failure_timeout)
        if deadline is not None:
            wake = min(wake, deadline)
        return max(wake, now)

    # ================================================================== views
    def _install_view(self, view: View, fresh: bool) -> None:
        """Make ``view`` current: drop closed views' Paxos state, set up leadership."""
        self.view = view
        for old in [v for v in self.acc if v < view.number]:
            del self.acc[old]
        for old in [v for v in self.decided if v < view.number]:
            self.stats["void_discarded"] += len(self.decided[old])
            if mutations.on(KEEP_VOID_INSTANCES):
                carried = self.decided.setdefault(view.number, {})
                for i, val in self.decided[old].items():
                    if i >= view.start:
                        carried.setdefault(i, val)
            del self.decided[old]
        for old in [v for v in self._commit_seen if v < view.number]:
            del self._commit_seen[old]
        now = self._now
        self.detector.watch(view.members, self.me, now if self._fx is not None else None)
        # Leadership starts afresh in every view.
        self.lead = None
        self.queue.new_tenure()
        self.backoff = self.p.backoff_initial
        self.backoff_until = 0.0
        self.hint_ballot = (0, view.members[0])
        acc = self._acc(view.number)
        if acc.promised > self.hint_ballot:
            self.hint_ballot = acc.promised
        self.max_round = self.hint_ballot[0]
        if view.members[0] == self.me and acc.promised <= (0, self.me):
            acc.promised = (0, self.me)
            self.lead = Tenure(view.number, (0, self.me), view.start, preparing=False)
        self._last_believed = self._believed_leader()
        if fresh:
            self.next_hb = now

    def _enter_view(self, view: View, joined: list[NodeId], parted: list[NodeId], tag: int) -> None:
        self.stats["view_changes"] += 1
        leftover = self.queue.take()
        old = self.view
        assert old is not None
        if self._commit_dirty and self.lead is not None:
            # The old view's last Commit must go out before its leadership is gone.
            lead = self.lead
            final = Commit(lead.view, lead.ballot, lead.first_inst, lead.committed, self.wm.value)
            for m in old.members:
                if m != self.me:
                    self._send(m, final)
            self._commit_dirty = False
            self._commit_due = None
        self._install_view(view, fresh=False)
        for j in joined:
            self.wm.reported[j] = tag
            self._snap_parts[(j, tag)] = self._core_snapshot()
            self._deliver(SnapshotNeeded(j, tag))
        for r in parted:
            self.wm.reported.pop(r, None)
            self._hint_sent.pop(r, None)
            if r != self.me:
                assert self._fx is not None
                self._fx.forget.append(r)
        self._deliver(ViewChanged(view, tuple(joined), tuple(parted)))
        if self.me in parted:
            self._retire(old.members)
            return
        self.proposer.reconfigs = [c for c in self.proposer.reconfigs if not self._redundant(c)]
        # Commands that were waiting here, and our own commands that sat in now-void
        # instances, go to the leader of the new view.
        self._fwd_out.extend(leftover)
        self._resend_due = True

    def _core_snapshot(self) -> tuple[Any, ...]:
        assert self.view is not None
        next_seq, held = self.fifo.snapshot()
        return (self.view, next_seq, held, tuple(sorted(self.retired)))

    def _retire(self, old_members: tuple[NodeId, ...]) -> None:
        """We executed our own part: stop taking part, but do not vanish yet.

        The members that stay may still need us: our last acknowledgements and commits,
        and our executed log, may be the only record of how the old view ended (in a
        2-member view, the leaving member's vote was half the majority).  So we stop at
        once for the layer above, but keep answering catch-up and snapshot requests and
        keep announcing our final position to old and new members until a majority of
        the new view confirms (by telling us we are parted) that it executed the stop sign.
        """
        self.stopped = True
        self.retirement = Retirement(old_members)
        self.stop_reason = "parted"
        self._deliver(Stopped("parted"))
        self.lead = None
        self.queue.reset()
        self.proposer.clear()
        self._fwd_out = []
        self._resend_due = False
        self.acc.clear()
        self.decided.clear()
        self.next_hb = self._now

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
        msg = Heartbeat(view.number, self.next_exec - 1)
        for m in self.retirement.audience(view.members, self.me):
            self._send(m, msg)

    def _stop(self, reason: str) -> None:
        was_stopped = self.stopped
        self.stopped = True
        self.retirement = None
        self.stop_reason = self.stop_reason or reason
        if not was_stopped:
            self._deliver(Stopped(reason))
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
        self.decided.clear()
        self.log.clear()
        self.queue.reset()
        self.proposer.clear()
        self.lead = None
        self._fwd_out = []
        self._snap_parts.clear()
        self._resend_due = False

    def _redundant(self, cmd: JoinCmd | PartCmd) -> bool:
        assert self.view is not None
        members = self.view.members
        if isinstance(cmd, JoinCmd):
            return cmd.router in members or cmd.router in self.retired
        return cmd.router not in members or len(members) == 1

    # ================================================================== execution
    def _decide(self, view: int, inst: int, value: Value) -> None:
        if self.view is not None and view == self.view.number and inst < self.next_exec:
            return
        # Paxos makes the chosen value unique, so keeping the first one changes nothing in
        # a correct run; it matters only for the keep_void_instances mutation.
        self.decided.setdefault(view, {}).setdefault(inst, value)

    def _try_execute(self) -> None:
        while not self.stopped and self.installed:
            assert self.view is not None
            d = self.decided.get(self.view.number)
            if not d:
                return
            value = d.pop(self.next_exec, None)
            if value is None:
                return
            self._execute(self.next_exec, value)

    def _execute(self, inst: int, value: Value) -> None:
        view = self.view
        assert view is not None
        self.log[inst] = (view.number, value)
        self.next_exec = inst + 1
        members = list(view.members)
        joined: list[NodeId] = []
        parted: list[NodeId] = []
        execute_parted = mutations.on(EXECUTE_PARTED)
        for cmd in value:
            proposer = cmd.proposer
            if proposer not in members and not (execute_parted and proposer in self.retired):
                # Commands of a router executed after its own part are ignored (3.5.5).
                self.stats["ignored_parted"] += 1
                continue
            if type(cmd) is AppCmd:
                self._fifo(cmd, inst)
            elif type(cmd) is JoinCmd:
                r = cmd.router
                if r not in members and r not in self.retired:
                    members.append(r)
                    joined.append(r)
            elif type(cmd) is PartCmd:
                r = cmd.router
                if r in members and len(members) > 1:
                    members.remove(r)
                    self.retired.add(r)
                    parted.append(r)
                    if not execute_parted:
                        self.fifo.forget(r)
        if joined or parted:
            self._enter_view(View(view.number + 1, tuple(members), inst + 1), joined, parted, inst)

    def _fifo(self, cmd: AppCmd, inst: int) -> None:
        if cmd.seq < self.fifo.released_below(cmd.proposer):
            self.stats["duplicates_dropped"] += 1
        for c in self.fifo.admit(cmd, mutations.on(NO_FIFO_DEDUP)) or ():
            self._release(c, inst)

    def _release(self, cmd: AppCmd, inst: int) -> None:
        self._deliver(Executed(cmd.proposer, cmd.seq, cmd.payload, inst))
        self.queue.executed(cmd.proposer, cmd.seq)
        if cmd.proposer == self.me:
            self.proposer.executed(cmd.seq, self._now)

    # ================================================================== proposing
    def _route(self, cmd: Command) -> None:
        if self._active_lead() is not None:
            self._enqueue(cmd)
        else:
            self._fwd_out.append(cmd)

    def _submit_reconfig(self, cmd: JoinCmd | PartCmd) -> None:
        if self._redundant(cmd):
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
        if self._active_lead() is None and self.queue:
            self._fwd_out.extend(self.queue.take())
        self._resend_due = True

    def _enqueue(self, cmd: Command) -> None:
        if cmd.proposer in self.retired and not mutations.on(EXECUTE_PARTED):
            return  # it would be ignored when executed; do not spend an instance on it
        if type(cmd) is AppCmd:
            if cmd.seq < self.fifo.released_below(cmd.proposer):
                return  # already executed here
            key: tuple[Any, Any] = (cmd.proposer, cmd.seq)
        else:
            if self._redundant(cmd):  # type: ignore[arg-type]
                return
            key = (type(cmd).__name__, cmd.router)  # type: ignore[union-attr]
        self.queue.add(cmd, key, self._now)  # once per tenure

    def _flush_queue(self) -> None:
        lead = self._active_lead()
        if lead is None or not self.queue:
            return
        q = self.queue.cmds
        since = self.queue.since
        urgent = any(type(c) is not AppCmd for c in q)
        due = (
            urgent
            or len(q) >= self.p.clump_trigger
            or lead.next_inst - 1 - lead.committed < self.p.pipeline_depth
            or (since is not None and self._now >= since + self.p.clump_delay)
        )
        if not due:
            return
        limit = self.wm.value + self.p.max_active
        while q:
            if lead.next_inst > limit:
                self.stats["limit_blocked"] += 1
                reconfigs = [c for c in q if type(c) is not AppCmd]
                if reconfigs:  # a part is always proposed at once (3.5.6)
                    self._propose_value(tuple(reconfigs))
                    q = [c for c in q if type(c) is AppCmd]
                break
            batch = q[: self.p.max_batch]
            q = q[self.p.max_batch :]
            self._propose_value(tuple(batch))
        self.queue.keep(q, self._now)

    def _propose_value(self, value: Value) -> None:
        lead = self.lead
        view = self.view
        assert lead is not None and view is not None
        inst = lead.next_inst
        lead.next_inst = inst + 1
        self.stats["instances"] += 1
        acc = self._acc(view.number)
        acc.accepted[inst] = (lead.ballot, value)
        lead.acked[self.me] = inst
        msg = Accept(view.number, lead.ballot, inst, value)
        self._accept_sent = True
        for m in view.members:
            if m != self.me:
                self._send(m, msg)
        if view.majority == 1:
            self._update_commit()

    # ================================================================== leadership
    def _active_lead(self) -> Tenure | None:
        lead = self.lead
        if lead is None or lead.preparing or self.view is None or lead.view != self.view.number:
            return None
        return lead

    def _believed_leader(self) -> NodeId:
        view = self.view
        assert view is not None
        hint = self.hint_ballot[1]
        if hint in view.members and hint not in self.detector.suspected:
            return hint
        for m in view.members:
            if m == self.me or m not in self.detector.suspected:
                return m
        return self.me

    def _saw_ballot(self, view: int, ballot: Ballot) -> None:
        if self.view is None or view != self.view.number:
            return
        if ballot[0] > self.max_round:
            self.max_round = ballot[0]
        if ballot > self.hint_ballot:
            self.hint_ballot = ballot
            lead = self.lead
            if lead is not None and lead.ballot < ballot:
                self._step_down()

    def _step_down(self) -> None:
        self.stats["stepdowns"] += 1
        self.lead = None
        self.queue.new_tenure()
        delay = self.backoff * (0.5 + self._rng.random())
        self.backoff_until = self._now + delay
        self.backoff = min(self.backoff * 2, self.p.backoff_max)

    def _maybe_lead(self) -> None:
        """Run phase 1 if we believe we should lead and nobody else is doing it."""
        if self.lead is not None or self.view is None or not self.installed:
            return
        if self._believed_leader() != self.me or self._now < self.backoff_until:
            return
        view = self.view
        acc = self._acc(view.number)
        rnd = max(self.max_round, acc.promised[0]) + 1
        ballot = (rnd, self.me)
        self.max_round = rnd
        self.hint_ballot = ballot
        acc.promised = ballot
        start = self.next_exec
        self.stats["phase1"] += 1
        if mutations.on(SKIP_PHASE1):
            self.lead = Tenure(view.number, ballot, start, preparing=False)
            return
        lead = Tenure(view.number, ballot, start, preparing=True)
        self.lead = lead
        lead.promises[self.me] = acc.accepted_from(start)
        msg = Prepare(view.number, ballot, start)
        for m in view.members:
            if m != self.me:
                self._send(m, msg)
        if len(lead.promises) >= view.majority:
            self._finish_phase1()

    def _finish_phase1(self) -> None:
        lead = self.lead
        assert lead is not None
        merged: dict[int, tuple[Ballot, Value]] = {}
        for entries in lead.promises.values():
            for inst, ballot, value in entries:
                have = merged.get(inst)
                if have is None or ballot > have[0]:
                    merged[inst] = (ballot, value)
        lead.preparing = False
        lead.promises = {}
        self.stats["phase1_won"] += 1
        self.backoff = self.p.backoff_initial
        # Instances every member executed while we prepared need no second round.
        start = max(lead.first_inst, self.wm.value + 1)
        lead.first_inst = lead.next_inst = start
        lead.committed = start - 1
        hi = max(merged, default=start - 1)
        # Re-propose the highest accepted value of every open instance; holes get no-ops.
        for inst in range(start, hi + 1):
            have = merged.get(inst)
            self._propose_value(have[1] if have is not None else NOOP)

    def _update_commit(self) -> None:
        lead = self.lead
        view = self.view
        assert lead is not None and view is not None
        floor = lead.first_inst - 1
        acks = sorted((lead.acked.get(m, floor) for m in view.members), reverse=True)
        chosen = acks[view.majority - 1]
        if chosen <= lead.committed:
            return
        acc = self._acc(view.number)
        for inst in range(lead.committed + 1, chosen + 1):
            entry = acc.accepted.get(inst)
            if entry is not None:
                self._decide(view.number, inst, entry[1])
        lead.committed = chosen
        self._commit_dirty = True
        self._try_execute()

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
        if src in self.retired:
            self._send(src, Parted(self.view.number if self.view is not None else 0))
        elif self.view is not None:
            self._send(src, Heartbeat(self.view.number, self.next_exec - 1))

    def _on_forward(self, src: NodeId, msg: Forward) -> None:
        if not self.installed:
            return
        if self._active_lead() is not None:
            for c in msg.cmds:
                self._enqueue(c)
            return
        target = self._believed_leader()
        if target == self.me:
            for c in msg.cmds:
                self._enqueue(c)  # we are about to lead; keep them for then
        elif msg.ttl > 0 and target != src:
            self.stats["relayed"] += 1
            self._send(target, Forward(msg.cmds, msg.ttl - 1))

    def _on_prepare(self, src: NodeId, msg: Prepare) -> None:
        if self._closed(src, msg.view) or self._outsider(src, msg.view):
            return
        acc = self._acc(msg.view)
        if msg.ballot >= acc.promised:
            acc.promised = msg.ballot
            self._saw_ballot(msg.view, msg.ballot)
            entries = acc.accepted_from(msg.start)
            self._send(src, Promise(msg.view, msg.ballot, msg.start, entries))
        else:
            self._nacks_out[src] = (msg.view, acc.promised)

    def _on_promise(self, src: NodeId, msg: Promise) -> None:
        lead = self.lead
        if lead is None or not lead.preparing or msg.ballot != lead.ballot:
            return
        if self.view is None or msg.view != self.view.number or src not in self.view.members:
            return
        lead.promises[src] = msg.accepted
        if len(lead.promises) >= self.view.majority:
            self._finish_phase1()

    def _on_accept(self, src: NodeId, msg: Accept) -> None:
        if self._closed(src, msg.view) or self._outsider(src, msg.view):
            return
        if self.installed and msg.instance <= self.wm.value:
            return
        acc = self._acc(msg.view)
        if msg.ballot >= acc.promised:
            if msg.ballot > acc.promised:
                acc.promised = msg.ballot
                self._saw_ballot(msg.view, msg.ballot)
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
                self._decide(msg.view, msg.instance, msg.value)
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
        lead = self._active_lead()
        if lead is None or msg.view != lead.view or msg.ballot != lead.ballot:
            return
        if msg.upto > lead.acked.get(src, -1):
            lead.acked[src] = msg.upto
            self._update_commit()

    def _on_nack(self, src: NodeId, msg: Nack) -> None:
        if self._outsider(src, msg.view):
            return
        lead = self.lead
        if lead is not None and msg.view == lead.view and msg.promised > lead.ballot:
            self._saw_ballot(msg.view, msg.promised)
            if self.lead is lead:  # a ballot from an earlier view number cannot preempt
                self._step_down()

    def _on_commit(self, src: NodeId, msg: Commit) -> None:
        if self._closed(src, msg.view) or self._outsider(src, msg.view):
            return
        view = msg.view
        current = self.view is not None and view == self.view.number
        lo = msg.lo
        seen = self._commit_seen.get(view)
        if seen is not None and seen[0] == msg.ballot:
            lo = max(lo, seen[1] + 1)
        if current and self.installed:
            lo = max(lo, self.next_exec)
        if lo <= msg.hi:
            acc = self.acc.get(view)
            d = self.decided.setdefault(view, {})
            for inst in range(lo, msg.hi + 1):
                if inst in d:
                    continue
                value = acc.value_for(inst, msg.ballot) if acc is not None else None
                if value is None:
                    self.catchup.missing_from = src
                    continue
                d[inst] = value
        if seen is None or seen[0] != msg.ballot or seen[1] < msg.hi:
            self._commit_seen[view] = (msg.ballot, msg.hi)
        self._try_execute()
        if current and self.installed and msg.collected > self.wm.value:
            # Every member executed up to ``collected``, this one included (its own report
            # is part of the minimum), so nothing up to there can be asked of it again.
            self._collect_to(min(msg.collected, self.next_exec - 1))

    def _on_heartbeat(self, src: NodeId, msg: Heartbeat) -> None:
        if src in self.retired:
            self._hint_peer(src)
            return
        self.wm.report(src, msg.executed)
        if self.view is not None and msg.view < self.view.number:
            self._hint_peer(src)

    def _on_catchup_request(self, src: NodeId, msg: CatchUpRequest) -> None:
        if src in self.retired:
            self._hint_peer(src)
            return
        if not self.installed:
            return
        if self.view is not None and src not in self.view.members:
            # The log, and the snapshot it may lead to (every session and message), is
            # for the group's members; a joiner asks with a JoinRequest.
            self.stats["ignored_non_member"] += 1
            return
        if msg.start <= max(self.wm.value, self.log_floor):
            # Our log no longer reaches back that far (every member we knew had executed
            # it, but the requester missed it, e.g. because the routers that still held it
            # were parted).  Transfer state instead, as for a joiner.
            last = self._snapshot_sent.get(src)
            if last is not None and self._now - last < 4 * self.p.heartbeat_interval:
                return
            self._snapshot_sent[src] = self._now
            tag = self.next_exec - 1
            self._snap_parts[(src, tag)] = self._core_snapshot()
            self._deliver(SnapshotNeeded(src, tag))
            return
        entries = []
        inst = msg.start
        end = min(self.next_exec, inst + self.p.catchup_batch)
        log = self.log
        while inst < end:
            e = log.get(inst)
            if e is None:
                break
            entries.append((inst, e[0], e[1]))
            inst += 1
        if entries:
            self._send(src, CatchUpReply(tuple(entries)))

    def _on_catchup_reply(self, src: NodeId, msg: CatchUpReply) -> None:
        view = self.view
        if (
            not self.installed
            or view is None
            or (src not in view.members and src not in self.retired)
        ):
            self.stats["ignored_non_member"] += 1
            return
        self.stats["catchups"] += 1
        for inst, view, value in msg.entries:
            if self.installed:
                assert self.view is not None
                if view < self.view.number or (view == self.view.number and inst < self.next_exec):
                    continue
            self.decided.setdefault(view, {})[inst] = value
        before = self.next_exec
        self._try_execute()
        if (
            self.installed
            and len(msg.entries) >= self.p.catchup_batch
            and self.next_exec > before
            and not self.stopped
        ):
            self._ask_catch_up(src)

    def _on_join_request(self, src: NodeId, msg: JoinRequest) -> None:
        if not self.installed or self.view is None:
            return
        if src in self.retired:
            self._hint_peer(src)
        elif src in self.view.members:
            # Already joined (an earlier snapshot may have been lost): send a fresh one.
            tag = self.next_exec - 1
            self._snap_parts[(src, tag)] = self._core_snapshot()
            self._deliver(SnapshotNeeded(src, tag))
        else:
            self._submit_reconfig(JoinCmd(self.me, src))

    def _on_snapshot(self, src: NodeId, msg: Snapshot) -> None:
        """Install state at ``msg.tag``: a joiner's first state, or a laggard's jump ahead.

        Several routers send one; whichever arrives first wins and later ones at or below
        our position are ignored.  Acceptor state is kept as it is: an acceptor must never
        forget what it accepted (a leader's phase 1 may still need it), and GC collects
        it once every member has executed past it.
        """
        if not self._snapshot_wanted(src, msg):
            return
        if self.installed and msg.tag < self.next_exec:
            return
        if self.view is not None and msg.view.number < self.view.number:
            return
        self._catchup_asked.clear()
        if not self.installed:
            self.installed_view = msg.view
        self.installed = True
        self.next_exec = msg.tag + 1
        self.log_floor = msg.tag
        prune(self.log, msg.tag, -1)
        self.fifo.restore(msg.fifo_next, msg.held)
        self.retired = set(msg.retired)
        for v in list(self.decided):
            d = self.decided[v]
            for inst in [i for i in d if i <= msg.tag]:
                del d[inst]
        mine_done = self.fifo.released_below(self.me)
        self.proposer.executed_below(mine_done)
        leftover = self.queue.take()
        self._fwd_out.extend(leftover)
        self._install_view(msg.view, fresh=True)
        self.proposer.reconfigs = [c for c in self.proposer.reconfigs if not self._redundant(c)]
        self._deliver(Installed(msg.tag, msg.view, msg.app_state))
        for m in msg.view.members:
            self.wm.reported.setdefault(m, -2)
        self.wm.reported.pop(self.me, None)
        self._try_execute()
        self._resend_due = True

    def _snapshot_wanted(self, src: NodeId, msg: Snapshot) -> bool:
        """A snapshot replaces everything this router knows: only one it asked for counts."""
        if not self.installed:
            wanted = (
                self._join_attempt > 0
                and src != self.me
                and src in msg.view.members
                and self.me in msg.view.members
            )
        else:
            wanted = src in self._catchup_asked
        if not wanted:
            self.stats["ignored_non_member"] += 1
        return wanted

    def _on_parted(self, src: NodeId, msg: Parted) -> None:
        self._stop("parted")

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
        for m in self.detector.detect(
            view.members, self.me, self._now, p.failure_timeout, p.heartbeat_interval
        ):
            self._submit_reconfig(PartCmd(self.me, m))
        self.stats["stalls_excused"] = self.detector.stalls_excused

    def _send_heartbeats(self) -> None:
        view = self.view
        assert view is not None
        self.next_hb = self._now + self.p.heartbeat_interval
        msg = Heartbeat(view.number, self.next_exec - 1)
        for m in view.members:
            if m != self.me:
                self._send(m, msg)

    def _collect_garbage(self) -> None:
        """Forget instances every member has executed (3.5.5)."""
        view = self.view
        assert view is not None
        w = self.wm.candidate(view.members, self.me, self.next_exec - 1)
        if w is not None:
            self._collect_to(w)

    def _collect_to(self, w: int) -> None:
        view = self.view
        assert view is not None
        old = self.wm.value
        if w <= old:
            return
        prune(self.log, w, old)
        acc = self.acc.get(view.number)
        if acc is not None:
            prune(acc.accepted, w, old)
            prune(acc.seen, w, old)
        for d in self.decided.values():
            prune(d, w, old)
        self.wm.value = w

    def _stall_resend(self) -> None:
        if self.proposer.stalled(self._now, self.p.resend_timeout):
            self._resend_due = True

    def _maybe_catch_up(self) -> None:
        best = self.catchup.whom_to_ask(
            self._now, self.next_exec - 1, self.wm.reported, self.me, self.p.heartbeat_interval
        )
        if best is not None:
            self._ask_catch_up(best)

    def _ask_catch_up(self, peer: NodeId) -> None:
        self._catchup_asked[peer] = None
        self._send(peer, CatchUpRequest(self.next_exec))
