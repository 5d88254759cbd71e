"""What every router holds identically after learning the same commands (3.4.4).

Routers learn the m-seq through ufabcast and apply it to this replicated state: the
:class:`~ecast.core.mseq.MSeq`, the session table, the stable acknowledgements still owed,
and the suspects that unstable messages still need.  Learning is deterministic, so
duplicates and gaps are resolved identically everywhere ("deterministically at every
router").  What only the leader does with what is learned (acknowledging, forwarding,
dropping destinations) it hears through :class:`LearnListener`; the state itself never
sends anything.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

from ecast.core.config import KIND, PART, Config
from ecast.core.effects import NodeId
from ecast.core.message import Message, MsgId, Session
from ecast.core.mseq import ConfigGuard, MSeq


class LearnListener(Protocol):
    """The leader's side of learning: the events it acts on."""

    def learned_duplicate(self, sender: NodeId, sid: MsgId, t: int | None, ack: Any) -> None:
        """``sender`` routed ``sid`` again: learned at ``t`` (not stable yet), or stable
        long ago with ``ack`` (None if even that was forgotten)."""

    def learned_closed(self, sender: NodeId, sid: MsgId) -> None: ...

    def learned_suspect(self, p: NodeId, t: int) -> None: ...

    def learned_stable(self, run: list[tuple[int, MsgId, bool, NodeId]]) -> None:
        """``(t, id, delivered, sender)`` of messages that became stable, in ``t`` order."""

    def learned_departure(self, p: NodeId) -> None: ...

    def learned_close(self, requester: NodeId, namespace: str, epoch: int) -> None: ...


class RouterState:
    __slots__ = (
        "acks",
        "by_id",
        "closed",
        "departed",
        "expelled",
        "expelled_memory",
        "left",
        "mseq",
        "observer",
        "sessions",
        "stats",
        "suspects",
    )

    def __init__(
        self,
        config: Config,
        guard: ConfigGuard | None = None,
        expelled_memory: int = 65536,
        origin: int = 0,
    ) -> None:
        self.mseq = MSeq(config, guard, origin)
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
        self.expelled: OrderedDict[NodeId, int | None] = OrderedDict()
        """Processes ever suspected, the latest ``expelled_memory`` of them, with the t of
        their first suspect: long after that suspect is collected, one that comes back
        is told where it was declared faulty, and never resumes."""
        self.left: OrderedDict[NodeId, None] = OrderedDict()
        """Processes whose own part was stable, the latest ``expelled_memory`` of them.
        A departed id never comes back (the configs refuse it), so long after its
        ``departed`` record is collected no router keeps a lease for it: one that still
        talks (a late confirmation, its part resent for a lost acknowledgement) is
        answered, never suspected."""
        self.expelled_memory = expelled_memory
        self.observer: Callable[[int, Message], None] | None = None
        """Called with every message appended (or installed), for checkers."""
        self.stats = {"learned": 0, "duplicates": 0, "gaps": 0, "stable": 0}

    # ------------------------------------------------------------------ learning
    def learn_routes(
        self, msgs: tuple[Message, ...], listener: LearnListener | None, dedup: bool = True
    ) -> None:
        """Append each message that is its session's next; resolve every other one the
        same way on every router.  One loop for a whole command: every router runs it
        for every message."""
        sessions = self.sessions
        closed = self.closed
        fresh: list[Message] = []
        ids: list[MsgId] = []
        late: list[tuple[Message, bool]] = []
        for msg in msgs:
            sender, sid, _h, _p = msg
            sess, seq = sid
            if closed and closed.get(sess[0], -1) >= sess[1]:
                if listener is not None:
                    listener.learned_closed(sender, sid)
                continue
            nxt = sessions.get(sess, 1)
            if seq != nxt and dedup:
                late.append((msg, seq < nxt))
                continue
            sessions[sess] = seq + 1 if seq + 1 > nxt else nxt
            fresh.append(msg)
            ids.append(sid)
        if fresh:
            found: list[tuple[int, frozenset[NodeId]]] = []
            first = self.mseq.extend(fresh, found)
            self.by_id.update(zip(ids, range(first, first + len(ids)), strict=True))
            self.stats["learned"] += len(fresh)
            if self.observer is not None:
                for i, msg in enumerate(fresh):
                    self.observer(first + i, msg)
        # After the appends: a duplicate of a message learned in this same command finds it.
        for msg, duplicate in late:
            self._out_of_turn(msg, duplicate, listener)
        if not fresh:
            return
        for t, who in found:
            for p in sorted(who):
                self._expel(p, t)
                if p not in self.suspects:
                    self.suspects[p] = t
                    if listener is not None:
                        listener.learned_suspect(p, t)

    def _expel(self, p: NodeId, t: int) -> None:
        self._remember(self.expelled, p, self.expelled.get(p, t))

    def _remember(self, names: OrderedDict[NodeId, Any], p: NodeId, value: Any = None) -> None:
        names[p] = value
        names.move_to_end(p)
        while len(names) > self.expelled_memory:
            names.popitem(last=False)

    def _out_of_turn(self, msg: Message, duplicate: bool, listener: LearnListener | None) -> None:
        if not duplicate:
            self.stats["gaps"] += 1
            return
        self.stats["duplicates"] += 1
        if listener is None:
            return
        sid = msg.id
        t = self.by_id.get(sid)
        ack = None if t is not None else self.acks.get(sid[0], {}).get(sid[1])
        listener.learned_duplicate(msg.sender, sid, t, ack)

    def learn_stable(
        self, entries: tuple[tuple[int, bool], ...], ack_cache: int, listener: LearnListener | None
    ) -> None:
        mseq = self.mseq
        newly = mseq.mark_stable_many(entries)
        if not newly:
            return
        by_id_pop = self.by_id.pop
        acks = self.acks
        # The listener (the leader) hears of them in runs, one call each (a call per
        # message cost more); a departure ends a run, so it hears everything in the same
        # order.  Followers build no run: this loop runs for every message on every router.
        run: list[tuple[int, MsgId, bool, NodeId]] | None = [] if listener is not None else None
        last: Session | None = None
        cache: dict[int, tuple[int, bool]] = {}
        for t, delivered, msg in newly:
            sender, sid, header, _p = msg
            by_id_pop(sid, None)
            sess, seq = sid
            if sess != last:  # a batch holds runs of one session's messages
                last = sess
                got = acks.get(sess)
                if got is None:
                    got = acks[sess] = {}
                cache = got
            cache[seq] = (t, delivered)
            # Keep the last ack_cache entries.  Sessions become stable in order, so
            # dropping seq - ack_cache is enough, in O(1): deleting "the first" key of a
            # dict instead re-scans every slot deleted before it on each call.
            cache.pop(seq - ack_cache, None)
            if type(header) is dict and header.get(KIND) == PART and sender in mseq.destset(t, msg):
                self.departed.setdefault(sender, t)
                self._remember(self.left, sender)
                if run is not None:
                    if run:
                        listener.learned_stable(run)  # type: ignore[union-attr]
                        run = []
                    listener.learned_departure(sender)  # type: ignore[union-attr]
            if run is not None:
                run.append((t, sid, delivered, sender))
        if run:
            listener.learned_stable(run)  # type: ignore[union-attr]
        self.stats["stable"] += len(newly)

    def learn_close(
        self, requester: NodeId, namespace: str, epoch: int, listener: LearnListener | None
    ) -> None:
        if self.closed.get(namespace, -1) < epoch:
            self.closed[namespace] = epoch
        for sess in [s for s in self.sessions if s[0] == namespace and s[1] <= epoch]:
            del self.sessions[sess]
        for sess in [s for s in self.acks if s[0] == namespace and s[1] <= epoch]:
            del self.acks[sess]
        if listener is not None:
            listener.learned_close(requester, namespace, epoch)

    def is_closed(self, sess: Session) -> bool:
        return self.closed.get(sess[0], -1) >= sess[1]

    def collect(self) -> list[NodeId]:
        """Drop the stable prefix; return the departed and suspected processes whose
        departure is now collected too (nothing more is owed to them)."""
        if not self.mseq.collect():
            return []
        floor = self.mseq.floor
        gone_for_good: list[NodeId] = []
        for gone in (self.suspects, self.departed):
            if gone:
                for p in [p for p, t in gone.items() if t < floor]:
                    del gone[p]
                    gone_for_good.append(p)
        return gone_for_good

    # ------------------------------------------------------------------ flow control
    def unstable_per_sender(self) -> dict[NodeId, int]:
        """Unstable messages per sender (flow control, 3.5.6).

        Counted when the leader looks (every 250 ms, over at most the unstable messages)
        rather than kept up to date on every router for every message learned and made
        stable: that cost more than the look ever does.
        """
        counts: dict[NodeId, int] = {}
        for _t, msg in self.mseq.unstable_items():
            sender = msg.sender
            counts[sender] = counts.get(sender, 0) + 1
        return counts

    def gone(self, p: NodeId) -> bool:
        """Suspected, or departed with a stable part (even long ago): nobody waits for
        it any more, and no lease is kept for it."""
        return p in self.suspects or p in self.departed or p in self.left

    # ------------------------------------------------------------------ snapshots
    def snapshot(self, with_sessions: bool = True) -> dict[str, Any]:
        return {
            "mseq": self.mseq.snapshot(),
            "sessions": list(self.sessions.items()) if with_sessions else [],
            "acks": [(s, list(a.items())) for s, a in self.acks.items()] if with_sessions else [],
            "closed": list(self.closed.items()),
            "by_id": list(self.by_id.items()),
            "suspects": list(self.suspects.items()),
            "departed": list(self.departed.items()),
            "expelled": list(self.expelled.items()),
            "left": list(self.left),
        }

    @classmethod
    def restore(
        cls,
        snap: dict[str, Any],
        config_class: type | None,
        guard: ConfigGuard,
        expelled_memory: int = 65536,
    ) -> RouterState:
        st = cls.__new__(cls)
        st.mseq = MSeq.restore(snap["mseq"], config_class)
        st.mseq.guard = guard
        st.sessions = {tuple(s): n for s, n in snap["sessions"]}
        st.acks = {tuple(s): {seq: tuple(v) for seq, v in a} for s, a in snap["acks"]}
        st.closed = dict(snap["closed"])
        st.by_id = {(tuple(sid[0]), sid[1]): t for sid, t in snap["by_id"]}
        st.suspects = dict(snap["suspects"])
        st.departed = dict(snap["departed"])
        st.expelled = OrderedDict((p, t) for p, t in snap.get("expelled", ()))
        st.left = OrderedDict.fromkeys(snap.get("left", ()))
        st.expelled_memory = expelled_memory
        st.observer = None
        st.stats = {"learned": 0, "duplicates": 0, "gaps": 0, "stable": 0}
        return st
