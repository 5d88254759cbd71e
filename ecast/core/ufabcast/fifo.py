"""FIFO release per proposer: the last step of ufabcast's execution (3.5.4).

Each application command keeps ``(proposer, seq)`` for life, so a command proposed again
after a leader or view change may be chosen in two instances.  Executed commands pass
through this reorder buffer, which releases each proposer's commands in sequence order
and drops second copies.  It is a pure function of the executed sequence, so every
router releases the same commands in the same order, and it survives view changes
(it travels in snapshots).
"""

from __future__ import annotations

from ecast.core.effects import NodeId
from ecast.core.ufabcast.messages import AppCmd


class FifoRelease:
    __slots__ = ("held", "next_seq")

    def __init__(self) -> None:
        self.next_seq: dict[NodeId, int] = {}
        """Proposer -> the sequence number it releases next."""
        self.held: dict[NodeId, dict[int, AppCmd]] = {}
        """Proposer -> commands executed ahead of a gap, by sequence number."""

    def released_below(self, proposer: NodeId) -> int:
        """Every command of ``proposer`` below this was released (a duplicate if seen again)."""
        return self.next_seq.get(proposer, 1)

    def admit(self, cmd: AppCmd, release_duplicates: bool = False) -> list[AppCmd] | None:
        """The commands ``cmd``'s execution releases, in order; None for a second copy
        (or the copy itself, under the test mutation ``no_fifo_dedup``)."""
        p = cmd.proposer
        nxt = self.next_seq.get(p, 1)
        if cmd.seq < nxt:
            return [cmd] if release_duplicates else None
        if cmd.seq > nxt:
            self.held.setdefault(p, {})[cmd.seq] = cmd
            return []
        out = [cmd]
        nxt += 1
        held = self.held.get(p)
        if held:
            while True:
                c = held.pop(nxt, None)
                if c is None:
                    break
                out.append(c)
                nxt += 1
            if not held:
                del self.held[p]
        self.next_seq[p] = nxt
        return out

    def forget(self, proposer: NodeId) -> None:
        """A parted router's commands are ignored from now on (3.5.5)."""
        self.held.pop(proposer, None)
        self.next_seq.pop(proposer, None)

    def snapshot(self) -> tuple[tuple[tuple[NodeId, int], ...], tuple[AppCmd, ...]]:
        held = tuple(c for p in sorted(self.held) for _, c in sorted(self.held[p].items()))
        return tuple(sorted(self.next_seq.items())), held

    def restore(self, next_seq: tuple[tuple[NodeId, int], ...], held: tuple[AppCmd, ...]) -> None:
        self.next_seq = dict(next_seq)
        self.held = {}
        for c in held:
            self.held.setdefault(c.proposer, {})[c.seq] = c

    def held_count(self) -> int:
        return sum(len(h) for h in self.held.values())
