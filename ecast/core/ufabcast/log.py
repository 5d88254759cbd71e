"""The log as one router knows it (3.5.4): values learned chosen, the executed log, and
the execution cursor.

A chosen value waits in ``decided`` (by view, then instance) until this router executes
it: a ``Commit`` or a catch-up may run ahead of execution, and may even name a view this
router has not reached.  Once a view closes, what it still holds undecided is void (the
stop sign, 3.2.3) and goes.  Executed entries, ``(view, value)`` by instance, are served
to laggards (catch-up) until every member executed past them and GC collects them.
"""

from __future__ import annotations

from collections.abc import Iterable

from ecast.core.ufabcast.gc import prune
from ecast.core.ufabcast.messages import Ballot, Commit, Value
from ecast.core.ufabcast.paxos import Acceptor


class Log:
    __slots__ = ("commit_seen", "decided", "entries", "floor", "next_exec")

    def __init__(self) -> None:
        self.next_exec = 0
        """The next instance to execute."""
        self.entries: dict[int, tuple[int, Value]] = {}
        """Executed instances not collected yet: ``(view, value)``."""
        self.floor = -1
        """The executed log starts above this (a snapshot replaced what lies below)."""
        self.decided: dict[int, dict[int, Value]] = {}
        """View -> instance -> the value learned chosen there, not executed yet."""
        self.commit_seen: dict[int, tuple[Ballot, int]] = {}
        """View -> the latest ``Commit`` taken in it: its ballot and upper bound, so a
        repeated range is not walked again."""

    @property
    def executed(self) -> int:
        return self.next_exec - 1

    def decide(self, view: int, inst: int, value: Value, current: int | None) -> None:
        """``value`` is chosen at ``inst`` of ``view`` (``current``: this router's view)."""
        if view == current and inst < self.next_exec:
            return
        # Paxos makes the chosen value unique, so keeping the first one changes nothing in
        # a correct run; it matters only for the keep_void_instances mutation.
        self.decided.setdefault(view, {}).setdefault(inst, value)

    def next_chosen(self, view: int) -> Value | None:
        """The value to execute next in ``view`` if it is known chosen (taken out)."""
        d = self.decided.get(view)
        if not d:
            return None
        return d.pop(self.next_exec, None)

    def executed_at(self, inst: int, view: int, value: Value) -> None:
        self.entries[inst] = (view, value)
        self.next_exec = inst + 1

    def close_views_before(self, view: int, start: int, carry: bool) -> int:
        """Views before ``view`` are closed: their undecided values are void.  Returns
        how many went.  ``carry`` (the keep_void_instances mutation) moves those at or
        after ``start`` into ``view`` instead, the bug the stop sign prevents."""
        dropped = 0
        for old in [v for v in self.decided if v < view]:
            dropped += len(self.decided[old])
            if carry:
                carried = self.decided.setdefault(view, {})
                for i, val in self.decided[old].items():
                    if i >= start:
                        carried.setdefault(i, val)
            del self.decided[old]
        for old in [v for v in self.commit_seen if v < view]:
            del self.commit_seen[old]
        return dropped

    def learn_commit(self, msg: Commit, acc: Acceptor | None, floor: int) -> bool:
        """``Commit(lo..hi)`` at its ballot: each instance's value is the one an
        ``Accept`` at a ballot at least as high carried (FIFO: it came first), from this
        router's acceptor.  Instances below ``floor`` (executed already) are skipped.
        True if some value was not there (a catch-up fetches it)."""
        view = msg.view
        lo = max(msg.lo, floor)
        seen = self.commit_seen.get(view)
        if seen is not None and seen[0] == msg.ballot:
            lo = max(lo, seen[1] + 1)
        missing = False
        if lo <= msg.hi:
            d = self.decided.setdefault(view, {})
            for inst in range(lo, msg.hi + 1):
                if inst in d:
                    continue
                value = acc.value_for(inst, msg.ballot) if acc is not None else None
                if value is None:
                    missing = True
                    continue
                d[inst] = value
        if seen is None or seen[0] != msg.ballot or seen[1] < msg.hi:
            self.commit_seen[view] = (msg.ballot, msg.hi)
        return missing

    def learn_entries(self, entries: Iterable[tuple[int, int, Value]], current: int | None) -> None:
        """Executed entries from a peer's log (catch-up): what lies ahead of us."""
        for inst, view, value in entries:
            if current is not None and (
                view < current or (view == current and inst < self.next_exec)
            ):
                continue
            self.decided.setdefault(view, {})[inst] = value

    def serve(self, start: int, limit: int) -> list[tuple[int, int, Value]]:
        """Up to ``limit`` executed entries from ``start`` on, contiguous."""
        out = []
        end = min(self.next_exec, start + limit)
        entries = self.entries
        inst = start
        while inst < end:
            e = entries.get(inst)
            if e is None:
                break
            out.append((inst, e[0], e[1]))
            inst += 1
        return out

    def reaches(self, start: int, watermark: int) -> bool:
        """Whether the executed log still holds ``start`` (else a snapshot must do)."""
        return start > max(watermark, self.floor)

    def jump_to(self, tag: int) -> None:
        """A snapshot at ``tag`` replaced everything up to it."""
        self.next_exec = tag + 1
        self.floor = tag
        prune(self.entries, tag, -1)
        for d in self.decided.values():
            for inst in [i for i in d if i <= tag]:
                del d[inst]

    def collect(self, upto: int, old: int) -> None:
        """GC: every member executed up to ``upto`` (``old``: the previous watermark)."""
        prune(self.entries, upto, old)
        for d in self.decided.values():
            prune(d, upto, old)

    def clear_pending(self) -> None:
        """Nothing more will execute here (retired or stopped)."""
        self.decided.clear()
