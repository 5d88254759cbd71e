"""Configuration changes (3.2.3, 3.5.5): views, stop signs, joins and parts, snapshots.

A ``join`` or ``part`` command, once executed at instance ``i`` of view ``v``, closes
``v``: instances ``> i`` of ``v`` are void at every router even if something was chosen
in them, and view ``v + 1`` starts at ``i + 1`` with the new membership (the stop-sign
method of Lamport, Malkhi and Zhou).  Paxos state is kept per view; a router that closed
``v`` drops ``v``'s state and refuses to take part in ``v`` again, which is safe because
refusing is always safe in Paxos.  A joiner gets a snapshot of the replicated state at
the join's position from the members (the layer above adds its own state); a laggard
whose log no longer reaches back gets one the same way.  Commands of a router executed
after its own part are ignored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ecast.core import mutations
from ecast.core.effects import NodeId
from ecast.core.ufabcast.messages import (
    AppCmd,
    Installed,
    JoinCmd,
    PartCmd,
    Snapshot,
    SnapshotNeeded,
    Stopped,
    Value,
    View,
    ViewChanged,
)
from ecast.core.ufabcast.params import EXECUTE_PARTED, KEEP_VOID_INSTANCES
from ecast.core.ufabcast.retirement import Retirement

if TYPE_CHECKING:
    from ecast.core.ufabcast.core import Ufabcast


class Views:
    """One router's view of the membership, and the changes it goes through."""

    __slots__ = ("core", "retired", "snap_parts", "snapshot_sent")

    def __init__(self, core: Ufabcast) -> None:
        self.core = core
        self.retired: set[NodeId] = set()
        """Routers that parted (their commands are ignored from then on)."""
        self.snap_parts: dict[tuple[NodeId, int], tuple[Any, ...]] = {}
        """Snapshots owed, waiting for the layer above's part (``provide_snapshot``)."""
        self.snapshot_sent: dict[NodeId, float] = {}
        """When a laggard was last sent a snapshot instead of a catch-up."""

    # ------------------------------------------------------------------ views
    def install(self, view: View, fresh: bool) -> None:
        """Make ``view`` current: drop closed views' Paxos state, set up leadership."""
        c = self.core
        c.view = view
        for old in [v for v in c.acc if v < view.number]:
            del c.acc[old]
        c.stats["void_discarded"] += c.log.close_views_before(
            view.number, view.start, mutations.on(KEEP_VOID_INSTANCES)
        )
        now = c._now
        c.detector.watch(view.members, c.me, now if c._fx is not None else None)
        c.leader.new_view(view, c._acc(view.number))
        c._last_believed = c.leader.believed()
        if fresh:
            c.next_hb = now

    def apply(self, inst: int, value: Value) -> None:
        """Execute ``value`` at ``inst``: application commands in FIFO order, joins and
        parts into the next view (a stop sign closes this one after ``inst``)."""
        c = self.core
        view = c.view
        assert view is not None
        members = list(view.members)
        joined: list[NodeId] = []
        parted: list[NodeId] = []
        retired = self.retired
        execute_parted = mutations.on(EXECUTE_PARTED)
        for cmd in value:
            proposer = cmd.proposer
            if proposer not in members and not (execute_parted and proposer in retired):
                # Commands of a router executed after its own part are ignored (3.5.5).
                c.stats["ignored_parted"] += 1
                continue
            if type(cmd) is AppCmd:
                c._fifo(cmd, inst)
            elif type(cmd) is JoinCmd:
                r = cmd.router
                if r not in members and r not in retired:
                    members.append(r)
                    joined.append(r)
            elif type(cmd) is PartCmd:
                r = cmd.router
                if r in members and len(members) > 1:
                    members.remove(r)
                    retired.add(r)
                    parted.append(r)
                    if not execute_parted:
                        c.fifo.forget(r)
        if joined or parted:
            self.enter(View(view.number + 1, tuple(members), inst + 1), joined, parted, inst)

    def enter(self, view: View, joined: list[NodeId], parted: list[NodeId], tag: int) -> None:
        """A stop sign executed at ``tag``: ``view`` follows.  Joiners are owed a
        snapshot at ``tag``; if we parted, we retire."""
        c = self.core
        c.stats["view_changes"] += 1
        old = c.view
        assert old is not None
        leftover = c.leader.close_view(old.members)
        self.install(view, fresh=False)
        for j in joined:
            c.wm.reported[j] = tag
            self.owe_snapshot(j, tag)
        for r in parted:
            c.wm.reported.pop(r, None)
            c._hint_sent.pop(r, None)
            if r != c.me:
                assert c._fx is not None
                c._fx.forget.append(r)
        c._deliver(ViewChanged(view, tuple(joined), tuple(parted)))
        if c.me in parted:
            self.retire(old.members)
            return
        c.proposer.reconfigs = [r for r in c.proposer.reconfigs if not self.redundant(r)]
        # Commands that were waiting here, and our own commands that sat in now-void
        # instances, go to the leader of the new view.
        c._fwd_out.extend(leftover)
        c._resend_due = True

    def redundant(self, cmd: JoinCmd | PartCmd) -> bool:
        """A join of a member (or of a router that parted), a part of a non-member or of
        the last member: executing it would change nothing."""
        view = self.core.view
        assert view is not None
        members = view.members
        if isinstance(cmd, JoinCmd):
            return cmd.router in members or cmd.router in self.retired
        return cmd.router not in members or len(members) == 1

    def retire(self, old_members: tuple[NodeId, ...]) -> None:
        """We executed our own part: stop taking part, but do not vanish yet.

        The members that stay may still need us: our last acknowledgements and commits,
        and our executed log, may be the only record of how the old view ended (in a
        2-member view, the leaving member's vote was half the majority).  So we stop at
        once for the layer above, but keep answering catch-up and snapshot requests and
        keep announcing our final position to old and new members until a majority of
        the new view confirms (by telling us we are parted) that it executed the stop sign.
        """
        c = self.core
        c.stopped = True
        c.retirement = Retirement(old_members)
        c.stop_reason = "parted"
        c._deliver(Stopped("parted"))
        c.leader.reset()
        c.proposer.clear()
        c._fwd_out = []
        c._resend_due = False
        c.acc.clear()
        c.log.clear_pending()
        c.next_hb = c._now

    # ------------------------------------------------------------------ snapshots
    def owe_snapshot(self, to: NodeId, tag: int) -> None:
        """Ask the layer above for its state at ``tag`` (``SnapshotNeeded``), and keep
        ours to send with it."""
        c = self.core
        assert c.view is not None
        next_seq, held = c.fifo.snapshot()
        self.snap_parts[(to, tag)] = (c.view, next_seq, held, tuple(sorted(self.retired)))
        c._deliver(SnapshotNeeded(to, tag))

    def wanted(self, src: NodeId, msg: Snapshot) -> bool:
        """A snapshot replaces everything this router knows: only one it asked for counts
        (a joiner's from a member of the view it puts the joiner in; a laggard's from a
        router it asked to catch it up)."""
        c = self.core
        if not c.installed:
            wanted = (
                c._join_attempt > 0
                and src != c.me
                and src in msg.view.members
                and c.me in msg.view.members
            )
        else:
            wanted = src in c._catchup_asked
        if not wanted:
            c.stats["ignored_non_member"] += 1
        return wanted

    def install_snapshot(self, msg: Snapshot) -> None:
        """Install state at ``msg.tag``: a joiner's first state, or a laggard's jump ahead.

        Several routers send one; whichever arrives first wins and later ones at or below
        our position are ignored.  Acceptor state is kept as it is: an acceptor must never
        forget what it accepted (a leader's phase 1 may still need it), and GC collects
        it once every member has executed past it.
        """
        c = self.core
        if c.installed and msg.tag < c.log.next_exec:
            return
        if c.view is not None and msg.view.number < c.view.number:
            return
        c._catchup_asked.clear()
        if not c.installed:
            c.installed_view = msg.view
        c.installed = True
        c.log.jump_to(msg.tag)
        c.fifo.restore(msg.fifo_next, msg.held)
        self.retired = set(msg.retired)
        c.proposer.executed_below(c.fifo.released_below(c.me))
        c._fwd_out.extend(c.leader.queue.take())
        self.install(msg.view, fresh=True)
        c.proposer.reconfigs = [r for r in c.proposer.reconfigs if not self.redundant(r)]
        c._deliver(Installed(msg.tag, msg.view, msg.app_state))
        for m in msg.view.members:
            c.wm.reported.setdefault(m, -2)
        c.wm.reported.pop(c.me, None)
        c._try_execute()
        c._resend_due = True
