"""Both sides of proposing a command: a router's own commands until they execute, and the
leader's clumping queue that packs waiting commands into Paxos instances (3.5.4, 3.5.7).
"""

from __future__ import annotations

from typing import Any

from ecast.core.effects import NodeId
from ecast.core.histogram import Histogram
from ecast.core.ufabcast.messages import AppCmd, Command, JoinCmd, PartCmd


class Proposer:
    """This router's own commands, kept until they execute (re-sent to each new leader).

    An application command keeps its ``(proposer, seq)`` identity for life, which is
    what lets the FIFO release drop a second copy when it is chosen twice.
    """

    __slots__ = ("born", "commit_seconds", "last_progress", "me", "pending", "reconfigs", "seq")

    def __init__(self, me: NodeId) -> None:
        self.me = me
        self.seq = 0
        self.pending: dict[int, AppCmd] = {}
        self.reconfigs: list[JoinCmd | PartCmd] = []
        """Joins and parts we asked for that have not executed (or become redundant)."""
        self.last_progress = 0.0
        self.born: dict[int, float] = {}
        """When each pending command was proposed (a batch of routed messages each)."""
        self.commit_seconds = Histogram()
        """Proposal to execution of this router's commands: the ordering latency that
        Paxos adds, leader changes and re-proposals included (operators' alert on it)."""

    def new(self, payload: Any, now: float) -> AppCmd:
        self.seq += 1
        cmd = AppCmd(self.me, self.seq, payload)
        self.pending[cmd.seq] = cmd
        self.born[cmd.seq] = now
        return cmd

    def executed(self, seq: int, now: float) -> None:
        if self.pending.pop(seq, None) is not None:
            self.last_progress = now
            born = self.born.pop(seq, None)
            if born is not None:
                self.commit_seconds.observe(now - born)

    def executed_below(self, seq: int) -> None:
        """A snapshot says every command of ours below ``seq`` executed."""
        for s in [s for s in self.pending if s < seq]:
            del self.pending[s]
            self.born.pop(s, None)

    def add_reconfig(self, cmd: JoinCmd | PartCmd) -> bool:
        """False if the same join or part is already pending."""
        for c in self.reconfigs:
            if type(c) is type(cmd) and c.router == cmd.router:
                return False
        self.reconfigs.append(cmd)
        return True

    def idle(self) -> bool:
        return not self.pending and not self.reconfigs

    def stalled(self, now: float, timeout: float) -> bool:
        """Nothing of ours executed for ``timeout`` while we wait: time to re-send."""
        if self.idle() or now - self.last_progress >= timeout:
            self.last_progress = now
            return not self.idle()
        return False

    def renumber(self) -> None:
        """Test mutation ``renumber_reproposals``: fresh identities for re-proposals."""
        renumbered: dict[int, AppCmd] = {}
        born: dict[int, float] = {}
        for c in self.pending.values():
            self.seq += 1
            renumbered[self.seq] = AppCmd(self.me, self.seq, c.payload)
            born[self.seq] = self.born.get(c.seq, self.last_progress)
        self.pending = renumbered
        self.born = born

    def outstanding(self) -> list[Command]:
        """Everything to send to a new leader, reconfigurations first, in sequence order."""
        return [*self.reconfigs, *self.pending.values()]

    def clear(self) -> None:
        self.pending.clear()
        self.born.clear()
        self.reconfigs = []


def command_key(cmd: Command) -> tuple[Any, Any]:
    """What makes two commands the same for a leader's queue: an application command's
    proposer and sequence number, a join's or part's kind and router."""
    if type(cmd) is AppCmd:
        return (cmd.proposer, cmd.seq)
    return (type(cmd).__name__, cmd.router)  # type: ignore[union-attr]


class ClumpQueue:
    """Commands waiting for the leader to put them into an instance (message clumping).

    ``ids`` remembers what this leader queued or proposed in its current tenure, so a
    command forwarded twice (a resend crossing the original) takes one instance.
    """

    __slots__ = ("cmds", "ids", "since")

    def __init__(self) -> None:
        self.cmds: list[Command] = []
        self.since: float | None = None
        self.ids: set[tuple[Any, Any]] = set()

    def __len__(self) -> int:
        return len(self.cmds)

    def add(self, cmd: Command, key: tuple[Any, Any], now: float) -> bool:
        if key in self.ids:
            return False
        self.ids.add(key)
        self.cmds.append(cmd)
        if self.since is None:
            self.since = now
        return True

    def take(self) -> list[Command]:
        """Everything waiting, to hand to another router.  The tenure's memory of what it
        proposed stays, but not of what it hands on: were those commands forwarded back
        in the same tenure (this router became the leader after all), they would be
        refused for good, and a part of a dead router never proposed (the ufabcast
        simulator, ``--seed 145 --routers 4 --commands 145 --no-clumping``)."""
        cmds, self.cmds = self.cmds, []
        self.since = None
        if self.ids:
            for cmd in cmds:
                self.ids.discard(command_key(cmd))
        return cmds

    def keep(self, cmds: list[Command], now: float) -> None:
        """What a flush could not propose yet (the active-instance limit)."""
        self.cmds = cmds
        self.since = now if cmds else None

    def executed(self, proposer: NodeId, seq: int) -> None:
        if self.ids:
            self.ids.discard((proposer, seq))

    def new_tenure(self) -> None:
        self.ids = set()

    def reset(self) -> None:
        self.cmds = []
        self.since = None
        self.ids = set()
