"""A router's leader duties (3.5.4, 3.5.7): whom it believes leads, winning a ballot
(phase 1), packing waiting commands into instances and pipelining them (phase 2),
counting votes into commits, and stepping down.

Leadership is per view: it starts afresh in every view, where the view's first member
owns round 0 and may skip phase 1 (no lower ballot exists).  Anyone else runs phase 1
with a higher round, which fills holes with the highest accepted value or a no-op.  A
router that sees a higher ballot steps down and backs off (randomized, doubling) before
it tries again, so two routers do not duel for ever.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ecast.core import mutations
from ecast.core.effects import NodeId
from ecast.core.ufabcast.messages import (
    Accept,
    AppCmd,
    Ballot,
    Command,
    Commit,
    Prepare,
    Value,
    View,
)
from ecast.core.ufabcast.params import EXECUTE_PARTED, SKIP_PHASE1
from ecast.core.ufabcast.paxos import LOWEST, Acceptor, Tenure
from ecast.core.ufabcast.proposer import ClumpQueue, command_key

if TYPE_CHECKING:
    from ecast.core.ufabcast.core import Ufabcast

NOOP: Value = ()


class Leadership:
    """The leader side of one router's ufabcast core (state it alone owns, and the
    duties that use it); the core feeds it and it sends through the core."""

    __slots__ = (
        "accept_sent",
        "backoff",
        "backoff_until",
        "commit_dirty",
        "commit_due",
        "core",
        "hint_ballot",
        "lead",
        "max_round",
        "queue",
    )

    def __init__(self, core: Ufabcast) -> None:
        self.core = core
        self.lead: Tenure | None = None
        """Our hold on a ballot in the current view (None: we do not lead, or try to)."""
        self.hint_ballot: Ballot = LOWEST
        """The highest ballot seen in the current view: its holder is believed to lead."""
        self.max_round = 0
        self.backoff = core.p.backoff_initial
        self.backoff_until = 0.0
        self.queue = ClumpQueue()
        """Commands waiting for an instance (a leader's), clumped (3.5.7)."""
        self.commit_dirty = False
        self.commit_due: float | None = None
        """When a withheld ``Commit`` must go out alone (``UfabParams.commit_delay``)."""
        self.accept_sent = False
        """An ``Accept`` went out in this call: a pending ``Commit`` rides along."""

    # ------------------------------------------------------------------ who leads
    def active(self) -> Tenure | None:
        """Our tenure, if we hold an active ballot (phase 1 done) in the current view."""
        lead = self.lead
        view = self.core.view
        if lead is None or lead.preparing or view is None or lead.view != view.number:
            return None
        return lead

    def believed(self) -> NodeId:
        """The router we believe leads: the holder of the highest ballot seen, unless
        suspected; else the first member not suspected."""
        c = self.core
        view = c.view
        assert view is not None
        suspected = c.detector.suspected
        hint = self.hint_ballot[1]
        if hint in view.members and hint not in suspected:
            return hint
        for m in view.members:
            if m == c.me or m not in suspected:
                return m
        return c.me

    def claim(self) -> None:
        """Believe we lead, at a round above every one seen: :meth:`maybe_lead` then runs
        phase 1 (after any backoff), and a conflicting claim backs off as usual."""
        self.hint_ballot = (self.max_round + 1, self.core.me)

    def new_view(self, view: View, acc: Acceptor) -> None:
        """Leadership starts afresh in every view; its first member holds round 0."""
        me = self.core.me
        self.lead = None
        self.queue.new_tenure()
        self.backoff = self.core.p.backoff_initial
        self.backoff_until = 0.0
        self.hint_ballot = (0, view.members[0])
        if acc.promised > self.hint_ballot:
            self.hint_ballot = acc.promised
        self.max_round = self.hint_ballot[0]
        if view.members[0] == me and acc.promised <= (0, me):
            acc.promised = (0, me)
            self.lead = Tenure(view.number, (0, me), view.start, preparing=False)

    def saw_ballot(self, view: int, ballot: Ballot) -> None:
        c = self.core
        if c.view is None or view != c.view.number:
            return
        if ballot[0] > self.max_round:
            self.max_round = ballot[0]
        if ballot > self.hint_ballot:
            self.hint_ballot = ballot
            lead = self.lead
            if lead is not None and lead.ballot < ballot:
                self.step_down()

    def step_down(self) -> None:
        c = self.core
        c.stats["stepdowns"] += 1
        self.lead = None
        self.queue.new_tenure()
        delay = self.backoff * (0.5 + c._rng.random())
        self.backoff_until = c._now + delay
        self.backoff = min(self.backoff * 2, c.p.backoff_max)

    # ------------------------------------------------------------------ phase 1
    def maybe_lead(self) -> None:
        """Run phase 1 if we believe we should lead and nobody else is doing it."""
        c = self.core
        if self.lead is not None or c.view is None or not c.installed:
            return
        if self.believed() != c.me or c._now < self.backoff_until:
            return
        view = c.view
        acc = c._acc(view.number)
        rnd = max(self.max_round, acc.promised[0]) + 1
        ballot = (rnd, c.me)
        self.max_round = rnd
        self.hint_ballot = ballot
        acc.promised = ballot
        start = c.log.next_exec
        c.stats["phase1"] += 1
        if mutations.on(SKIP_PHASE1):
            self.lead = Tenure(view.number, ballot, start, preparing=False)
            return
        lead = Tenure(view.number, ballot, start, preparing=True)
        self.lead = lead
        lead.promises[c.me] = acc.accepted_from(start)
        msg = Prepare(view.number, ballot, start)
        for m in view.members:
            if m != c.me:
                c._send(m, msg)
        if len(lead.promises) >= view.majority:
            self.finish_phase1()

    def promised(self, src: NodeId, view: int, ballot: Ballot, accepted: Any) -> None:
        """A ``Promise`` from a member of the current view."""
        lead = self.lead
        v = self.core.view
        if lead is None or not lead.preparing or ballot != lead.ballot:
            return
        if v is None or view != v.number or src not in v.members:
            return
        lead.promises[src] = accepted
        if len(lead.promises) >= v.majority:
            self.finish_phase1()

    def finish_phase1(self) -> None:
        c = self.core
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
        c.stats["phase1_won"] += 1
        self.backoff = c.p.backoff_initial
        # Instances every member executed while we prepared need no second round.
        start = max(lead.first_inst, c.wm.value + 1)
        lead.first_inst = lead.next_inst = start
        lead.committed = start - 1
        hi = max(merged, default=start - 1)
        # Re-propose the highest accepted value of every open instance; holes get no-ops.
        for inst in range(start, hi + 1):
            have = merged.get(inst)
            self.propose(have[1] if have is not None else NOOP)

    # ------------------------------------------------------------------ phase 2
    def enqueue(self, cmd: Command) -> None:
        """A command for an instance of ours (once per tenure)."""
        c = self.core
        if cmd.proposer in c.retired and not mutations.on(EXECUTE_PARTED):
            return  # it would be ignored when executed; do not spend an instance on it
        if type(cmd) is AppCmd:
            if cmd.seq < c.fifo.released_below(cmd.proposer):
                return  # already executed here
        elif c.views.redundant(cmd):  # type: ignore[arg-type]
            return
        self.queue.add(cmd, command_key(cmd), c._now)

    def flush(self) -> None:
        """Propose what waits, once a clump is due (3.5.7): enough commands, a pipeline
        with room, a join or part (never held), or the clump delay passed.  Never more
        than ``max_active`` instances beyond the watermark, but a part always goes."""
        lead = self.active()
        if lead is None or not self.queue:
            return
        c = self.core
        p = c.p
        q = self.queue.cmds
        since = self.queue.since
        urgent = any(type(cmd) is not AppCmd for cmd in q)
        due = (
            urgent
            or len(q) >= p.clump_trigger
            or lead.next_inst - 1 - lead.committed < p.pipeline_depth
            or (since is not None and c._now >= since + p.clump_delay)
        )
        if not due:
            return
        limit = c.wm.value + p.max_active
        while q:
            if lead.next_inst > limit:
                c.stats["limit_blocked"] += 1
                reconfigs = [cmd for cmd in q if type(cmd) is not AppCmd]
                if reconfigs:  # a part is always proposed at once (3.5.6)
                    self.propose(tuple(reconfigs))
                    q = [cmd for cmd in q if type(cmd) is AppCmd]
                break
            batch = q[: p.max_batch]
            q = q[p.max_batch :]
            self.propose(tuple(batch))
        self.queue.keep(q, c._now)

    def propose(self, value: Value) -> None:
        """Phase 2 for the next instance: accept it ourselves, send it to the others."""
        c = self.core
        lead = self.lead
        view = c.view
        assert lead is not None and view is not None
        inst = lead.next_inst
        lead.next_inst = inst + 1
        c.stats["instances"] += 1
        acc = c._acc(view.number)
        acc.accepted[inst] = (lead.ballot, value)
        lead.progress.acked[c.me] = inst
        msg = Accept(view.number, lead.ballot, inst, value)
        self.accept_sent = True
        me = c.me
        for m in view.members:
            if m != me:
                c._send(m, msg)
        if view.majority == 1:
            self.update_commit()

    def voted(self, src: NodeId, view: int, ballot: Ballot, upto: int) -> None:
        """An ``Accepted`` for our ballot: a vote for every instance up to ``upto``."""
        lead = self.active()
        if lead is None or view != lead.view or ballot != lead.ballot:
            return
        if lead.progress.ack(src, upto):
            self.update_commit()

    def update_commit(self) -> None:
        """Instances a majority accepted are chosen: learn them, announce them."""
        c = self.core
        lead = self.lead
        view = c.view
        assert lead is not None and view is not None
        chosen = lead.progress.chosen(view.members, view.majority, lead.first_inst - 1)
        if chosen <= lead.committed:
            return
        acc = c._acc(view.number)
        log = c.log
        for inst in range(lead.committed + 1, chosen + 1):
            entry = acc.accepted.get(inst)
            if entry is not None:
                log.decide(view.number, inst, entry[1], view.number)
        lead.committed = chosen
        self.commit_dirty = True
        c._try_execute()

    def send_commit(self) -> None:
        """Send the pending ``Commit`` now if an ``Accept`` carries it, or it is due."""
        c = self.core
        lead = self.lead
        if lead is None or c.view is None or c.stopped:
            self.commit_dirty = False
            self.commit_due = None
            return
        if not self.accept_sent and c.p.commit_delay > 0:
            if self.commit_due is None:
                self.commit_due = c._now + c.p.commit_delay
            if c._now < self.commit_due:
                return
        self.commit_dirty = False
        self.commit_due = None
        msg = Commit(lead.view, lead.ballot, lead.first_inst, lead.committed, c.wm.value)
        for m in c.view.members:
            if m != c.me:
                c._send(m, msg)

    def close_view(self, old_members: tuple[NodeId, ...]) -> list[Command]:
        """The view ends: its last ``Commit`` goes out before leadership is gone; the
        commands waiting here are handed back (for the next view's leader)."""
        leftover = self.queue.take()
        lead = self.lead
        c = self.core
        if self.commit_dirty and lead is not None:
            final = Commit(lead.view, lead.ballot, lead.first_inst, lead.committed, c.wm.value)
            for m in old_members:
                if m != c.me:
                    c._send(m, final)
            self.commit_dirty = False
            self.commit_due = None
        return leftover

    def next_wake(self, wake: float, now: float) -> float:
        """The earliest of ``wake`` and what leadership waits for."""
        if self.commit_due is not None:
            wake = min(wake, self.commit_due)
        since = self.queue.since
        if since is not None and self.queue and self.active() is not None:
            wake = min(wake, since + self.core.p.clump_delay)
        if self.lead is None and self.backoff_until > now and self.believed() == self.core.me:
            wake = min(wake, self.backoff_until)
        return wake

    def reset(self) -> None:
        """We no longer take part (retired or stopped)."""
        self.lead = None
        self.queue.reset()
