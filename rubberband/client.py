"""The client core: requests in flight, and the answers routed to them (4.5).

Sans-IO.  The SDK (:mod:`rubberband.sdk`) and the simulator drive the same core: a
request (a read at one of three isolation levels, a write, a batch of either) returns
the messages that carry it in :class:`~ecast.Effects` (``Submit`` for E-Cast messages,
direct messages for basic reads and keyspace questions), and its completion comes back
as an upcall (:class:`ReadDone`, :class:`WriteDone`) from whichever input completed it:
an answer (:meth:`on_direct`), an acknowledgement (:meth:`on_acked`), a router's notice
that it shed a snapshot read (:meth:`on_shed`), or the time (:meth:`on_tick`).

What the core decides, so that every driver decides alike:

* **Whom it believes.**  Answers only from storage processes that one of the client's
  recent keyspaces says hold what they answer for (:class:`~rubberband.gather.Holders`);
  basic reads' only from the processes asked; the keyspace only from the super asked.
  An answer from a storage process no keyspace it knows names is set aside until the
  client has asked a super for the newest keyspace, then checked again.
* **Failover.**  A read is idempotent: one whose answers do not all come (a responder
  failed after the read reached it, a snapshot read lost with a leading router) is sent
  again, whole, as a new try, ``retry_after`` after it should have been answered: a
  sequential read once it is stable (every responder has it; at once if no responder
  delivered it, each having failed first), a snapshot or basic read after it was sent;
  a basic read's next try avoids the processes that did not answer.  An earlier try
  stays awaited beside the new one (a loaded cluster answers a large read in more than
  ``retry_after``, and a read that dropped each try for the next would never end): the
  first try answered whole completes the read, but parts from two tries are never one
  answer (two positions), except a basic read's, which is at no position.  Only when
  every try failed within ``answer_timeout`` does the read fail: ``Unavailable`` if the
  last try reached no responder (no holder may be left), else ``Indeterminate``.
* **Snapshot reads refused** (a responder not at the router's frontier) are tried again,
  up to ``attempts`` times, then read sequentially: also a consistent cut, and ordered.
  One left unanswered twice is read sequentially too: an unsafe message is never
  acknowledged, so a router that died under it goes unnoticed on that path.
* **Timeouts are timers**: every request has a deadline, and the core asks to be woken
  at the earliest one.

Read batches (:meth:`read_batch`) are the pipelined form for loaders and benchmarks:
their reads travel in bundles and are told to the caller's ``done`` as they complete,
without retries (the caller owns them and counts them).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ecast import Direct, Effects, NodeId
from ecast.core import mutations
from rubberband.changelog import FROM_NOW, Changed, Changes, Event, Page, Revisions, key_filter
from rubberband.config import CLIENTS, STORAGE
from rubberband.errors import (
    BadOperation,
    Indeterminate,
    Rejected,
    RubberbandError,
    Unavailable,
)
from rubberband.gather import Gather, Holders, op_name
from rubberband.keys import NOTHING, covers, is_range_set, overlaps, union
from rubberband.learning import LearnsKeyspace, Refreshed
from rubberband.messages import ISOLATION_LEVELS, Isolation, Messages
from rubberband.outputs import Submit
from rubberband.proto import (
    Answer,
    Answers,
    BasicRead,
    Described,
    H,
    Peek,
    Stale,
    Whole,
    written,
)
from rubberband.read_batches import (
    BASIC_TIMER,
    BUNDLE_BYTES,
    BUNDLE_LIMIT,
    BatchReads,
    Bundle,
    anyone,
)

__all__ = [
    "ISOLATION_LEVELS",
    "Changed",
    "Changes",
    "ClientCore",
    "Event",
    "Gather",
    "Holders",
    "Indeterminate",
    "Isolation",
    "Page",
    "ReadDone",
    "Refreshed",
    "Rejected",
    "Revisions",
    "RubberbandError",
    "Unavailable",
    "WriteDone",
    "op_name",
]

SILENT_SNAPSHOT_TRIES = 2
"""Snapshot tries left unanswered after which a read goes the sequential way."""
UNDELIVERED_RETRY = 0.1
"""Seconds before a read no responder delivered is tried again."""
MAX_EARLIER_TRIES = 8
"""Earlier tries of a read still awaited beside its current one, at most."""
NO_FAILOVER = mutations.declare(
    "no_failover", "client", "a read waits for its first try's answers until it times out"
)
FIRST_ANSWER_COMPLETES = mutations.declare(
    "first_answer_completes", "client", "a read completes with its first answer, covered or not"
)
TRUST_ANY_ANSWER = mutations.declare(
    "trust_any_answer", "client", "answers taken from any storage process, holder or not"
)


def is_client_name(name: str) -> bool:
    """Whether ``name`` is one a client may take: ``client:...``, or ``maintainer:...``
    for one that keeps views (the routers take data from no other role)."""
    return name.startswith(CLIENTS)


@dataclass(frozen=True, slots=True)
class ReadDone:
    """Upcall: read ``request`` ended with ``result``, or ``error``; ``position``: it
    reflects every write at a position up to this one and none after (a sequential
    read's own position; the position before a snapshot read's frontier; None for a
    basic read, which is at none), so a change feed from it goes on exactly after it."""

    request: int
    result: Any
    error: Exception | None = None
    position: int | None = None


@dataclass(frozen=True, slots=True)
class WriteDone:
    """Upcall: write message ``request`` is stable (and answered, if it asked), or
    ``error`` says why not."""

    request: int
    error: Exception | None = None


class _Read:
    """A read sent alone: its tries, each a request id of its own."""

    __slots__ = (
        "acked", "attempts", "deadline", "earlier", "gather", "id", "level", "lost", "op",
        "refused_once", "retry_at", "silent", "tried", "try_id", "version", "within",
    )  # fmt: skip

    def __init__(
        self, rid: int, op: Any, level: str, within: Any, deadline: float, attempts: int
    ) -> None:
        self.id = rid
        self.op = op
        self.level = level
        self.within = within
        self.deadline = deadline
        self.attempts = attempts
        self.gather: Gather | None = None
        self.try_id = -1
        self.earlier: dict[int, Gather] = {}
        """Earlier tries still awaited: their request ids and gathers, oldest first."""
        self.acked: bool | None = None
        """A sequential try: None until stable, then True."""
        self.lost = False
        """The last try was stable but delivered by no responder (each failed)."""
        self.retry_at = 0.0
        self.refused_once = False
        self.silent = 0
        """Snapshot tries that got no answer at all."""
        self.tried: frozenset[str] = frozenset()
        """A basic read: the processes asked since the keyspace last changed."""
        self.version = -1


class _Write:
    __slots__ = ("answer", "answered", "covered", "deadline", "header", "id", "op", "stable")

    def __init__(self, rid: int, op: Any, header: Any, answered: bool, deadline: float) -> None:
        self.id = rid
        self.op = op
        self.header = header
        """Its message's header: the ranges it names (``written``) are read only when a
        holder answers, and a write of one key names the key alone."""
        self.answered = answered
        self.deadline = deadline
        self.stable = False
        self.answer: Any = _NOTHING
        self.covered: Any = NOTHING
        """What the holders' answers of success cover so far: a write that reaches
        several segments of the ring is applied, and answered, segment by segment, and
        has succeeded only once every part of it has."""


_NOTHING: Any = object()
_READ, _WRITE = 0, 1  # timer kinds (a batch's: read_batches.BATCH_TIMER)


OnError = Callable[[Any, Exception], None]
"""A driver's hook for an answer whose handling raised (:meth:`ClientCore.on_directs`)."""


class ClientCore(BatchReads, LearnsKeyspace, Messages):
    """A Rubberband client's protocol: its keyspace, its requests, their answers."""

    def __init__(
        self,
        ops: Any,
        placement: Any = None,
        *,
        answer_timeout: float = 10.0,
        retry_after: float = 1.0,
        write_timeout: float = 30.0,
    ) -> None:
        super().__init__(ops, placement)
        self.answer_timeout = answer_timeout
        """How long a read may take in all (its tries included), and an answered write
        may wait for its answer once stable."""
        self.retry_after = retry_after
        self.write_timeout = write_timeout
        """How long a write may take to become stable (E-Cast's ack timeout)."""
        self.supers: list[NodeId] = []
        """Supers to ask for the keyspace (the driver keeps this current)."""
        self._ids = itertools.count(1)
        self._single: dict[int, _Read] = {}
        """Reads sent alone, by their current try's request id."""
        self.writes: dict[int, _Write] = {}
        self._bundles: dict[int, Bundle] = {}
        """Read bundles in flight, by request id."""
        self.batch_reads: dict[int, tuple[Gather, Any, Callable[..., None]]] = {}
        """Reads of a batch that travel alone: ``(gather, op, done)`` by request id."""
        self.asked: dict[int, frozenset[str]] = {}
        """Basic reads in flight: the storage processes asked (only they answer)."""
        self._timers: list[tuple[float, int, int]] = []
        """``(time, kind, request id)``, a heap: when a read alone is due a retry or its
        deadline (``_READ``), a write its deadline (``_WRITE``), a batch's bundle or read
        its deadline (``BATCH_TIMER``), a batch's basic reads their one deadline
        (``BASIC_TIMER``, by the first one's id).  Entries are not removed when a request
        ends early: one found stale when due is dropped."""
        self._basic_groups: dict[int, list[int]] = {}
        """The request ids of a batch's basic reads, by the first one's (its timer's)."""
        self._init_learning()
        self.refused_answers = 0
        """Answers not taken: from no storage process, from one that holds nothing of
        what it answers for, or to a request that went elsewhere."""
        self.counts = {"retries": 0, "refreshes": 0, "snapshot_refused": 0}
        self._fx = Effects()

    # ================================================================== writes
    def write(self, op: Any, now: float, timeout: float | None = None) -> tuple[int, Effects]:
        """A write; :class:`WriteDone` once it is stable and, for an operation whose
        validity depends on the data (``ops.answered(op)``, such as an append) or that
        names a view's definition, once a holder answered (a rejection is then
        ``Rejected``: :meth:`Messages.answered`)."""
        payload, header = self.write_message(op)  # raises BadOperation, before anything
        fx = self._begin()
        rid = next(self._ids)
        if _changes_nothing(header):  # (zero rows): done at once
            fx.deliver.append(WriteDone(rid, None))
            return rid, self._end(now)
        answered = self.answered(op)
        w = _Write(rid, op, header, answered, now + self._write_timeout(timeout))
        if answered:
            header[H.REQUEST] = rid
            header[H.ANSWER] = 1
        self.writes[rid] = w
        heapq.heappush(self._timers, (w.deadline, _WRITE, rid))
        fx.deliver.append(Submit(header, payload, rid))
        return rid, self._end(now)

    def write_batch(
        self,
        ops: list[Any],
        now: float,
        bundle: int = BUNDLE_LIMIT,
        timeout: float | None = None,
        alone: Callable[[Any], bool] | None = None,
    ) -> tuple[list[tuple[tuple[int, ...], int]], Effects]:
        """Many writes at once: ``(indices, request)`` for each message that carries
        some (see :meth:`Messages.writes_of`; ``alone`` as there: which writes travel
        alone, by default those whose holder must answer), each told by its own
        :class:`WriteDone`."""
        messages = self.writes_of(ops, bundle, BUNDLE_BYTES, alone)  # raises before anything
        fx = self._begin()
        out = []
        deadline = now + self._write_timeout(timeout)
        for indices, payload, header in messages:
            rid = next(self._ids)
            out.append((indices, rid))
            if _changes_nothing(header):  # done at once
                fx.deliver.append(WriteDone(rid, None))
                continue
            answered = len(indices) == 1 and self.answered(ops[indices[0]])
            if answered:
                header[H.REQUEST] = rid
                header[H.ANSWER] = 1
            self.writes[rid] = _Write(rid, ops[indices[0]], header, answered, deadline)
            heapq.heappush(self._timers, (deadline, _WRITE, rid))
            fx.deliver.append(Submit(header, payload, rid))
        return out, self._end(now)

    def _timeout(self, timeout: float | None) -> float:
        return self.answer_timeout if timeout is None else timeout

    def _write_timeout(self, timeout: float | None) -> float:
        return self.write_timeout + self.answer_timeout if timeout is None else timeout

    # ================================================================== reads alone
    def read(
        self,
        op: Any,
        level: str,
        now: float,
        *,
        within: Any = None,
        attempts: int = 5,
        timeout: float | None = None,
    ) -> tuple[int, Effects]:
        """A read at ``level``; ``within`` restricts it to part of the placement space.
        Its :class:`ReadDone` carries the result, or the error once every try failed."""
        if level not in ISOLATION_LEVELS:
            raise ValueError(f"isolation is one of {', '.join(ISOLATION_LEVELS)}, not {level!r}")
        gather = self.gather(op, within)  # raises BadOperation, before anything
        if type(op) is Changes and level != "sequential":
            raise BadOperation("a change feed is read in order (sequential), at a position")
        if type(op) is Changed and level != "basic":
            raise BadOperation("a peek at the change logs is a basic read")
        if type(op) is Revisions and level == "basic":
            raise BadOperation("revisions are read at a position: sequential or snapshot")
        self._begin()
        rid = next(self._ids)
        if not gather.ranges:  # matches nothing anywhere: answered at once
            self._fx.deliver.append(ReadDone(rid, self.result(gather), None))
            return rid, self._end(now)
        r = _Read(rid, op, level, within, now + self._timeout(timeout), attempts)
        self._try(r, now)
        return rid, self._end(now)

    def read_replica(
        self, process: NodeId, op: Any, within: Any, now: float
    ) -> tuple[int, Effects]:
        """``op`` within ``within`` answered by ``process`` alone, from its current state
        (a basic read, no failover): audits compare the holders of a range with it."""
        fx = self._begin()
        rid = next(self._ids)
        r = _Read(rid, op, "replica", within, now + self.answer_timeout, 1)
        gather = r.gather = self.gather(op, within)
        r.try_id = rid
        self._single[rid] = r
        heapq.heappush(self._timers, (r.deadline, _READ, rid))
        self.asked[rid] = frozenset((process,))
        msg = BasicRead(rid, op, gather.ranges, self.version)
        fx.send.append((process, Direct(msg)))
        return rid, self._end(now)

    def _try(self, r: _Read, now: float) -> None:
        """Send read ``r`` (again): a new try under a new request id."""
        old = r.try_id
        if old >= 0:
            self.counts["retries"] += 1
            if r.gather is not None and (r.level != "basic" or old in self.asked):
                r.earlier[old] = r.gather  # sent: its answers may still come
                if len(r.earlier) > MAX_EARLIER_TRIES:
                    oldest = next(iter(r.earlier))
                    del r.earlier[oldest]
                    self._forget(oldest)
            else:
                self._forget(old)
        tid = r.try_id = next(self._ids)
        self._single[tid] = r
        heapq.heappush(self._timers, (r.deadline, _READ, tid))
        fx = self._fx
        if r.level != "basic":
            r.gather = gather = self.gather(r.op, r.within)
            header = self.header(gather)
            header[H.REQUEST] = tid
            if type(r.op) is Changes:
                header[H.SINCE] = FROM_NOW if r.op.since is None else r.op.since
            elif type(r.op) is Revisions:
                header[H.REVISIONS] = True
            r.acked = None
            if r.level == "snapshot":
                self._retry_at(r, now + self.retry_after)
            fx.deliver.append(Submit(header, r.op, tid, unsafe=r.level == "snapshot"))
            return
        if r.gather is None or r.version != self.version:
            r.gather = self.gather(r.op, r.within)
            r.version = self.version
            r.tried = frozenset()
        try:
            targets = self.basic_targets(r.gather, r.tried)
        except Unavailable:
            # Our keyspace may be older than the cluster's: ask a super, try again then.
            self._waiting_keyspace.append(tid)
            self._retry_at(r, now + 0.5)
            self._start_refresh(now)
            return
        self.asked[tid] = frozenset(targets)
        r.tried |= frozenset(targets)
        self._retry_at(r, now + self.retry_after)
        op = r.op
        if type(op) is Changed:
            keys = key_filter(op)
            for target, ranges in targets.items():
                fx.send.append((target, Direct(Peek(tid, op.since, ranges, keys, self.version))))
            return
        for target, ranges in targets.items():
            fx.send.append((target, Direct(BasicRead(tid, op, ranges, self.version))))

    def _retry_at(self, r: _Read, at: float) -> None:
        r.retry_at = at
        heapq.heappush(self._timers, (at, _READ, r.try_id))

    def _forget(self, tid: int) -> None:
        self._single.pop(tid, None)
        self.asked.pop(tid, None)

    def _finish(
        self, r: _Read, result: Any = None, error: Exception | None = None, at: Any = None
    ) -> None:
        self._forget(r.try_id)
        for tid in r.earlier:
            self._forget(tid)
        r.earlier = {}
        r.try_id = -2
        self._fx.deliver.append(ReadDone(r.id, result, error, at))

    def _take(self, r: _Read, g: Gather) -> None:
        """Complete read ``r`` with the answers of one of its tries."""
        at = g.position if r.level == "sequential" else None
        if r.level == "snapshot" and g.position is not None:
            at = g.position - 1  # the frontier: the next position the router forwards
        try:
            self._finish(r, self.result(g), at=at)
        except Exception as e:
            self._finish(r, error=e)

    def _check_read(self, r: _Read, now: float) -> None:
        """After an answer, an ack or a tick: complete, refuse or retry read ``r``."""
        g = r.gather
        if g is None:
            return
        if g.complete or (g.pieces and mutations.on(FIRST_ANSWER_COMPLETES)):
            if r.level == "sequential" and r.acked is None:  # complete once also stable
                if now >= r.deadline:  # (the routers died first: a power cut, a cut-off)
                    self._finish(r, error=Indeterminate(f"{op_name(r.op)}: answered, but not "
                                 f"known to be ordered in {self.answer_timeout:g} s"))  # fmt: skip
                return
            if g.refused:
                if r.level == "snapshot" and r.attempts > 1:
                    r.attempts -= 1
                    r.refused_once = True
                    self.counts["snapshot_refused"] += 1
                    self._try(r, now)
                elif r.level == "snapshot":
                    # Every try was refused or shed: the responders are busy with writes
                    # (or reconfiguring).  A sequential read is a consistent cut too, and
                    # ordered: the stronger answer, at the cost of a place in the order.
                    r.level = "sequential"
                    self._try(r, now)
                elif r.level in ("basic", "replica"):
                    if r.level == "replica":
                        self._finish(r, error=Unavailable("the process does not hold all of it"))
                    else:
                        r.gather = None  # another keyspace version: start again, whole
                        self._try(r, now)
                else:
                    self._finish(r, error=Indeterminate(f"{op_name(r.op)}: refused"))
                return
            self._take(r, g)
            return
        if now >= r.deadline:
            missing = len(g.missing())
            if r.lost:
                self._finish(r, error=Unavailable(
                    f"{op_name(r.op)}: no holder is left for {missing} range(s)"
                ))  # fmt: skip
                return
            self._finish(r, error=Indeterminate(
                f"{op_name(r.op)}: no answer for {missing} range(s) in {self.answer_timeout:g} s "
                "(every replica asked failed, or none is left)"
            ))  # fmt: skip
            return
        due = r.retry_at if r.level != "sequential" or r.acked else None
        failover = r.level != "replica" and not mutations.on(NO_FAILOVER)
        if due is not None and now >= due and failover:
            if r.level == "snapshot":
                r.silent += 1
                if r.silent >= SILENT_SNAPSHOT_TRIES:
                    # Unanswered, not refused: the router it went to may be gone, and
                    # nothing tells a client so of a message that is never acknowledged.
                    # A sequential read is acknowledged (E-Cast fails over for it).
                    r.level = "sequential"
            self._try(r, now)

    # ================================================================== sheds, acknowledgements
    def on_shed(self, token: Any, now: float) -> Effects:
        """A snapshot read reached not every responder (a router no longer leading, or a
        responder too far behind, 3.5.7): refused now, to be read again, rather than
        left to time out."""
        self._begin()
        if not self._batch_shed(token):
            r = self._single.get(token)
            if r is not None and r.gather is not None and r.try_id == token:
                r.gather.refused = True
                self._check_read(r, now)
        return self._end(now)

    def on_acked(self, token: Any, delivered: bool, now: float) -> Effects:
        """A submission of ours is stable: ``delivered`` says whether any holder took it
        (False: some range of it has no holder left)."""
        return self.on_acks(((token, delivered),), now)

    def on_acks(self, acks: Iterable[tuple[Any, bool]], now: float) -> Effects:
        """:meth:`on_acked` for a batch of ``(token, delivered)``, with one set of
        effects (E-Cast hands a client its acknowledgements in batches)."""
        self._begin()
        for token, delivered in acks:
            self._acked(token, delivered, now)
        return self._end(now)

    def _acked(self, token: Any, delivered: bool, now: float) -> None:
        w = self.writes.get(token)
        if w is not None:
            if not delivered:
                self._write_done(
                    w, Unavailable(f"no holder is left for some key of {op_name(w.op)}")
                )
            else:
                w.stable = True
                if not w.answered or w.answer is not _NOTHING:
                    self._write_done(w, _write_error(w))
                elif now + self.answer_timeout < w.deadline:  # see _expired
                    w.deadline = now + self.answer_timeout
                    heapq.heappush(self._timers, (w.deadline, _WRITE, w.id))
            return
        r = self._single.get(token)
        if r is not None and r.try_id == token:
            r.acked = True
            if delivered:
                r.lost = False
                self._retry_at(r, now + self.retry_after)  # every responder has it now
                self._check_read(r, now)
            elif mutations.on(NO_FAILOVER):
                self._finish(r, error=Unavailable(f"{op_name(r.op)}: its responder failed"))
            else:
                # Every responder of this try failed before delivering it (suspected
                # since): the routers route the next try to other replicas.  Soon, not
                # at once: the suspicion may still be on its way to the order.
                r.lost = True
                self._retry_at(r, now + UNDELIVERED_RETRY)

    def on_rejected(self, token: Any, error: Exception, now: float) -> Effects:
        """E-Cast refused a submission of ours (no room, its session closed, forbidden):
        the request it carried fails with ``error``; each read of a batch's message is
        told, its gather's ``error`` saying why."""
        self._begin()
        w = self.writes.get(token)
        if w is not None:
            self._write_done(w, error)
        r = self._single.get(token)
        if r is not None and r.try_id == token:
            self._finish(r, error=error)
        self._batch_rejected(token, f"not sent: {type(error).__name__}: {error}")
        return self._end(now)

    def _write_done(self, w: _Write, error: Exception | None) -> None:
        self.writes.pop(w.id, None)
        self._fx.deliver.append(WriteDone(w.id, error))

    # ================================================================== answers
    def on_direct(self, src: NodeId, msg: Any, now: float) -> Effects:
        return self.on_directs(src, (msg,), now)

    def on_directs(
        self, src: NodeId, msgs: Iterable[Any], now: float, on_error: OnError | None = None
    ) -> Effects:
        """:meth:`on_direct` for a frame's answers from ``src``, with one set of effects
        (a loaded client gets dozens to a packet).  One whose handling raises goes to
        ``on_error`` and the rest are still taken; without it, the error propagates."""
        self._begin()
        self._now = now
        for msg in msgs:
            try:
                self._answer(src, msg)
            except Exception as e:
                if on_error is None:
                    raise
                on_error(msg, e)
        return self._end(now)

    def _answer(self, src: NodeId, msg: Any, recheck: bool = True) -> None:
        """An answer, taken only from whom it may come from (see the module docstring)."""
        t = type(msg)
        if t is Described:
            self._described(src, msg)
            return
        if src[:8] != STORAGE:
            self.refused_answers += 1
            return
        held = self.holders.holds if not mutations.on(TRUST_ANY_ANSWER) else anyone
        if t is Whole or t is Answers:
            self._bundle_answer(src, msg, recheck, held)
        elif t is Answer:
            if msg.covered is not None and not is_range_set(msg.covered):
                self.refused_answers += 1
                return
            self._on_answer(src, msg, recheck, held)
        elif t is Stale:
            r = self._single.get(msg.request)
            if r is not None and src in self.asked.get(msg.request, ()):
                # Our keyspace is older than the responder's: learn the new one from a
                # super (never from the responder), then the read goes on.
                if r.try_id == msg.request:
                    self._waiting_keyspace.append(msg.request)
                self._start_refresh(self._now)

    def _on_answer(self, src: NodeId, a: Answer, recheck: bool, held: Any) -> None:
        rid = a.request
        w = self.writes.get(rid)
        if w is not None:
            ranges = written(w.header)
            if not any(overlaps(p, ranges) for p in self.holders.parts(src)) and held is not anyone:
                self._set_aside(src, a, recheck)
            elif w.answer is _NOTHING:
                if a.error is None:  # this part applied: the others may still fail
                    w.covered = union(w.covered, a.covered or NOTHING)
                    if not covers(w.covered, ranges):
                        return
                w.answer = a.error
                if w.stable:
                    self._write_done(w, _write_error(w))
            return
        r = self._single.get(rid)
        if r is not None:
            g = r.gather if r.try_id == rid else r.earlier.get(rid)
            if g is None:
                return
            asked = self.asked.get(rid)
            if asked is not None:  # a basic read: only the processes asked answer it
                if src not in asked:
                    self.refused_answers += 1
                    return
            elif not held(src, g.ranges if a.covered is None else a.covered):
                self._set_aside(src, a, recheck)
                return
            g.add(a.covered, a.result, a.error, a.position, a.ok)
            if g is r.gather:
                self._check_read(r, self._now)
            elif g.complete and not g.refused:  # an earlier try, answered whole
                self._take(r, g)
            return
        self._batch_answer(src, a, recheck, held)

    # ================================================================== time
    def on_tick(self, now: float) -> Effects:
        self._begin()
        self._now = now
        self._refresh_tick(now)
        heap = self._timers
        while heap and heap[0][0] <= now:
            _, kind, rid = heapq.heappop(heap)
            if kind == _READ:
                r = self._single.get(rid)
                if r is not None and r.try_id == rid:
                    self._check_read(r, now)
            elif kind == _WRITE:
                w = self.writes.get(rid)
                if w is not None and now >= w.deadline:
                    self._write_done(w, _expired(w, self.answer_timeout))
            elif kind == BASIC_TIMER:
                for one in self._basic_groups.pop(rid, ()):
                    self._batch_expired(one)
            else:
                self._batch_expired(rid)
        return self._end(now)

    # ================================================================== plumbing
    def _begin(self) -> Effects:
        fx = self._fx = Effects()
        return fx

    _now = 0.0

    def _end(self, now: float) -> Effects:
        fx = self._fx
        fx.wake(self._next_wake(now))
        return fx

    def _next_wake(self, now: float) -> float | None:
        at = self._timers[0][0] if self._timers else None
        nxt = self._refresh_wake()
        return at if nxt is None else nxt if at is None else min(at, nxt)

    def in_flight(self) -> int:
        return len(self._single) + len(self.writes) + len(self._bundles) + len(self.batch_reads)


def _changes_nothing(header: dict[str, Any]) -> bool:
    """Whether a write's header names no range anywhere (an operation of zero rows)."""
    return H.KEY not in header and not header[H.WRITES]


def _expired(w: _Write, answer_timeout: float) -> Indeterminate:
    """Why write ``w`` ended at its deadline.  A stable one is ordered for sure: its
    holders apply it and answer as they would a sequential read, so it waits
    ``answer_timeout`` from then for the answer, as a read does, and not what is left
    of the acknowledgement timeout (up to 30 s more that told the caller nothing)."""
    if not w.stable:
        return Indeterminate(f"{op_name(w.op)} is not stable in time")
    return Indeterminate(
        f"{op_name(w.op)} is stable but no holder answered in {answer_timeout:g} s"
    )


def _write_error(w: _Write) -> Exception | None:
    if not w.answered or w.answer is _NOTHING or w.answer is None:
        return None
    return Rejected(w.answer)
