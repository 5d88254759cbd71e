"""The client's read batches: bundles of reads in flight, and telling the caller.

A batch (:meth:`rubberband.client.ClientCore.read_batch`) sends reads for one responder
up to a bundle to a message; the answers name the bundle and an index.  A
:class:`Bundle` keeps its reads' gathers in the order of its payload and tells the
caller of each read once, when it completes (or all of a group at once, for a
``grouped`` caller).  Sans-IO; the client core owns the bundles and their timers.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Iterable
from typing import Any

from ecast import Direct, Effects
from rubberband.gather import Gather
from rubberband.keys import is_range_set
from rubberband.messages import ISOLATION_LEVELS
from rubberband.outputs import Submit
from rubberband.proto import Answer, Answers, BasicRead, H, Whole

log = logging.getLogger("rubberband.client")


class Bundle:
    """A read bundle of a batch in flight: its reads and their gathers, in the order of
    its payload (a finished read's gather becomes None), and its E-Cast message id once
    submitted unsafe (a shed notice names it).  Its reads need no request id of their
    own: an answer names the bundle and an index."""

    __slots__ = ("deadline", "done", "gathers", "grouped", "hull", "left", "ops")

    def __init__(
        self,
        ops: list[Any],
        gathers: list[Gather],
        done: Callable[..., None],
        grouped: bool,
        deadline: float,
        hull: Any = None,
    ) -> None:
        self.ops = ops
        self.hull = hull
        """A range set that holds every read of the bundle (its header's ranges), or
        None: whoever holds it may answer for all of them (:meth:`held_by`)."""
        self.gathers: list[Gather | None] = gathers  # type: ignore[assignment]
        self.done = done
        self.grouped = grouped
        """``done`` takes a list of ``(op, gather)`` (``read_batch(grouped=True)``)."""
        self.left = len(gathers)
        self.deadline = deadline

    def take(self, i: int, timed_out: bool = False) -> tuple[Any, Gather | None]:
        """Read ``i`` is complete (answered, refused or failed) or ``timed_out``: it
        leaves the bundle; what to tell the caller about it."""
        g = self.gathers[i]
        self.gathers[i] = None
        self.left -= 1
        return self.ops[i], None if timed_out else g

    def finish_open(self, timed_out: bool = False, refused: bool = False) -> None:
        """Every read still open is done: timed out, or ``refused`` (shed)."""
        open_ = [i for i, g in enumerate(self.gathers) if g is not None]
        if refused:
            for i in open_:
                self.gathers[i].refused = True  # type: ignore[union-attr]
        self.finish_all(open_, timed_out)

    def fail(self, why: str) -> None:
        """Every read still open failed (its message was never sent): told with
        ``why`` as its gather's error."""
        for g in self.gathers:
            if g is not None:
                g.error = why
        self.finish_open()

    def finish_all(self, indices: list[int] | tuple[int, ...], timed_out: bool = False) -> None:
        """:meth:`take` each read of ``indices`` and tell the caller, once each; a
        grouped caller hears of them in one call."""
        if self.grouped:
            if indices:
                tell_group(self.done, [self.take(i, timed_out) for i in indices])
            return
        for i in indices:
            op, g = self.take(i, timed_out)
            tell(self.done, op, g)

    def rows(self, position: Any, ok: Any, rows: Iterable[Any]) -> None:
        """One responder's answers to the reads of a bundle: ``(index, covered, result,
        error)`` each, ``covered`` None for the whole read.  Most answers cover their
        read whole from the first responder; they complete it here without the general
        gathering (this loop runs once per read, and was a third of a client's time at
        saturation)."""
        b = self
        gathers = b.gathers
        ops, done = b.ops, b.done
        told: list[tuple[Any, Gather | None]] | None = [] if b.grouped else None
        n = len(gathers)
        for row in rows:
            if type(row) is not tuple or len(row) != 4:
                continue
            i = row[0]
            if type(i) is not int or not 0 <= i < n:
                continue
            g = gathers[i]
            if g is None:  # completed already (by another replica's answer)
                continue
            if (
                ok is True
                and row[3] is None
                and not g.covered
                and (row[1] is None or row[1] == g.ranges)
            ):
                g.pieces.append((g.ranges, row[2]))
                g.covered = g.ranges
                g.position = position
                # ``take(i)`` and ``tell`` written out: this runs once per read.
                gathers[i] = None
                b.left -= 1
                if told is not None:
                    told.append((ops[i], g))
                    continue
                tell(done, ops[i], g)
                continue
            try:
                g.add(row[1], row[2], row[3], position, ok)
            except (TypeError, ValueError, IndexError):  # not a range set
                continue
            if g.complete:
                if told is not None:
                    told.append(b.take(i))
                else:
                    b.finish_all((i,))
        if told:
            tell_group(done, told)

    def whole(self, position: Any, results: tuple[Any, ...]) -> None:
        """A responder's answer for every read of the bundle, each whole and without
        error (``Whole``, most answers): :meth:`rows` without a row to check per read."""
        gathers, ops, done = self.gathers, self.ops, self.done
        told: list[tuple[Any, Gather | None]] | None = [] if self.grouped else None
        for i, g in enumerate(gathers):
            if g is None:  # completed already (by another replica's answer)
                continue
            if g.covered:  # partly answered already: the general combination
                g.add(None, results[i], None, position, True)
                if not g.complete:
                    continue
            else:
                g.pieces.append((g.ranges, results[i]))
                g.covered = g.ranges
                g.position = position
            gathers[i] = None
            self.left -= 1
            if told is not None:
                told.append((ops[i], g))
            else:
                tell(done, ops[i], g)
        if told:
            tell_group(done, told)

    def held_by(self, held: Callable[[str, Any], bool], src: str) -> bool:
        """Whether ``src`` holds every open read of the bundle: the hull it was sent
        with first (one check for the usual bundle, whose reads lie in one holder's
        segments), read by read if not."""
        if self.hull is not None and held(src, self.hull):
            return True
        lo = hi = None
        for g in self.gathers:
            if g is not None:
                ranges = g.ranges
                if lo is None or ranges[0][0] < lo:
                    lo = ranges[0][0]
                if hi is None or ranges[-1][1] > hi:
                    hi = ranges[-1][1]
        if lo is None or held(src, ((lo, hi),)):
            return True
        return all(g is None or held(src, g.ranges) for g in self.gathers)

    def well_formed(self, rows: tuple[Any, ...]) -> bool:
        """Whether every row of an answer is ``(index, covered, result, error)`` with an
        index of the bundle and ``covered`` None or a range set (the codec checked only
        that ``rows`` is a tuple)."""
        n = len(self.gathers)
        for row in rows:
            if type(row) is not tuple or len(row) != 4:
                return False
            i, covered = row[0], row[1]
            if type(i) is not int or not 0 <= i < n:
                return False
            if covered is not None and not is_range_set(covered):
                return False
        return True

    def rows_held_by(
        self, held: Callable[[str, Any], bool], src: str, rows: tuple[Any, ...]
    ) -> bool:
        """Whether ``src`` holds what each row of a :meth:`well_formed` answer says it
        covers."""
        gathers = self.gathers
        for row in rows:
            g = gathers[row[0]]
            if g is not None and not held(src, g.ranges if row[1] is None else row[1]):
                return False
        return True


def tell(done: Callable[[Any, Gather | None], None], op: Any, gather: Gather | None) -> None:
    """Hand a finished read to the caller of :meth:`ClientCore.read_batch`."""
    try:
        done(op, gather)
    except Exception:  # the caller's: the other reads of the answer go on
        log.exception("event=done_failed read=%.60r", op)


def tell_group(
    done: Callable[[list[tuple[Any, Gather | None]]], None], told: list[tuple[Any, Gather | None]]
) -> None:
    """Hand reads finished together to a ``grouped`` caller of ``read_batch``."""
    try:
        done(told)
    except Exception:  # the caller's: the bundle's bookkeeping goes on
        log.exception("event=done_failed reads=%d first=%.60r", len(told), told[0][0])


BUNDLE_LIMIT = 32
"""Reads for one responder that :meth:`BatchReads.read_batch` sends as one message by
default (``rubberband.proto.bundle_header``)."""
BUNDLE_BYTES = 64 * 1024
"""A bundle's payload at most (reads with large operations go fewer to a message), far
below any router's message limit."""
BATCH_TIMER = 2
"""The client core's timer kind of a batch's message (its deadline)."""
BASIC_TIMER = 3
"""The client core's timer kind of a batch's basic reads, all due at once: one timer for
the batch, not one per read (a heap entry pushed and popped per read, and a wake-up
whenever the earliest moved, were a twentieth of a reading client's time)."""


def anyone(src: str, ranges: Any) -> bool:
    """Whom the ``trust_any_answer`` planted bug believes."""
    return True


class BatchReads:
    """The read batches of :class:`rubberband.client.ClientCore`: reads sent without
    waiting, in bundles for one responder, told to the caller as they complete, with no
    retries (the caller owns them).  A part of the client core, kept apart for size: it
    uses the core's request ids, timers, keyspace and answer checks."""

    # Set by ClientCore.__init__ (declared for the type checker).
    _bundles: dict[int, Bundle]
    batch_reads: dict[int, tuple[Gather, Any, Callable[..., None]]]
    """Reads of a batch that travel alone: ``(gather, op, done)`` by request id."""
    asked: dict[int, frozenset[str]]
    _ids: Any
    _timers: list[tuple[float, int, int]]
    _basic_groups: dict[int, list[int]]
    refused_answers: int

    def read_batch(
        self,
        ops: list[Any],
        level: str,
        done: Callable[..., None],
        now: float,
        *,
        timeout: float | None = None,
        bundle: int = BUNDLE_LIMIT,
        grouped: bool = False,
    ) -> tuple[int, Effects]:
        """Many reads at once, without retries: ``done(op, gather)`` once per read when
        its answers are all in (``gather.refused``: read it again; ``gather.error``;
        else ``self.result(gather)``), ``done(op, None)`` when it is not complete after
        ``timeout``; ``grouped``: ``done(told)`` once per group of reads finished
        together, ``told`` a list of ``(op, gather)``.  Sequential and snapshot reads
        for one responder travel up to ``bundle`` to a message.  Raises for a bad op
        before anything is sent.  Returns the number of messages."""
        core: Any = self
        if level not in ISOLATION_LEVELS:
            raise ValueError(f"isolation is one of {', '.join(ISOLATION_LEVELS)}, not {level!r}")
        gathers = core.gathers(ops)  # raises for a bad op, before sending
        fx = core._begin()
        if not all(g.ranges for g in gathers):  # reads that match nothing: told now
            nothing = [(op, g) for op, g in zip(ops, gathers, strict=True) if not g.ranges]
            if grouped:
                tell_group(done, nothing)  # type: ignore[arg-type]
            else:
                for op, g in nothing:
                    tell(done, op, g)
            ops = [op for op, g in zip(ops, gathers, strict=True) if g.ranges]
            gathers = [g for g in gathers if g.ranges]
        deadline = now + core._timeout(timeout)
        each: Callable[[Any, Gather | None], None] = (
            (lambda op, gather: done([(op, gather)])) if grouped else done
        )
        heap = self._timers
        sent = 0
        if level == "basic":
            version = core.version
            rids: list[int] = []
            try:
                for i, gather in enumerate(gathers):
                    rid = next(self._ids)
                    targets = core.basic_targets(gather, frozenset())
                    self.batch_reads[rid] = (gather, ops[i], each)
                    self.asked[rid] = frozenset(targets)
                    rids.append(rid)
                    for target, ranges in targets.items():
                        fx.send.append((target, Direct(BasicRead(rid, ops[i], ranges, version))))
                        sent += 1
            finally:  # reads registered before one raised still time out, as before
                if rids:
                    self._basic_groups[rids[0]] = rids
                    heapq.heappush(heap, (deadline, BASIC_TIMER, rids[0]))
            return sent, core._end(now)
        unsafe = level == "snapshot"
        deliver = fx.deliver
        for group, payload, header in core.read_messages(ops, gathers, bundle, BUNDLE_BYTES):
            rid = next(self._ids)
            header[H.REQUEST] = rid
            if len(group) == 1:
                i = group[0]
                self.batch_reads[rid] = (gathers[i], ops[i], each)
            else:
                self._bundles[rid] = Bundle(
                    [ops[i] for i in group],
                    [gathers[i] for i in group],
                    done,
                    grouped,
                    deadline,
                    header[H.READS],
                )
            heapq.heappush(heap, (deadline, BATCH_TIMER, rid))
            deliver.append(Submit(header, payload, rid, unsafe))
            sent += 1
        return sent, core._end(now)

    def _settle(self, rid: int, b: Bundle) -> None:
        """Forget a bundle once none of its reads is waiting."""
        if not b.left:
            self._bundles.pop(rid, None)

    def _batch_shed(self, token: Any) -> bool:
        """A shed snapshot message of a batch: its reads are refused (True: it was)."""
        b = self._bundles.pop(token, None)
        if b is not None:
            b.finish_open(refused=True)
            return True
        batch = self.batch_reads.pop(token, None)
        if batch is not None:
            gather, op, each = batch
            gather.refused = True
            tell(each, op, gather)
            return True
        return False

    def _batch_rejected(self, token: Any, why: str) -> None:
        """A batch's message E-Cast refused: each of its reads is told ``why``."""
        b = self._bundles.pop(token, None)
        if b is not None:
            b.fail(why)
        batch = self.batch_reads.pop(token, None)
        if batch is not None:
            self.asked.pop(token, None)
            batch[0].error = why
            tell(batch[2], batch[1], batch[0])

    def _batch_expired(self, rid: int) -> None:
        """A batch's message is past its deadline: its open reads are told so."""
        b = self._bundles.pop(rid, None)
        if b is not None:
            b.finish_open(timed_out=True)
            return
        batch = self.batch_reads.pop(rid, None)
        if batch is not None:
            self.asked.pop(rid, None)
            tell(batch[2], batch[1], None)

    def _bundle_answer(self, src: str, msg: Whole | Answers, recheck: bool, held: Any) -> None:
        """A responder's answers to a bundle's reads (``Whole``: every one, whole)."""
        core: Any = self
        b = self._bundles.get(msg.request)
        if b is None:
            return
        if type(msg) is Whole:
            results = msg.results
            if type(results) is not tuple or len(results) != len(b.gathers):
                return
            if not b.held_by(held, src):
                core._set_aside(src, msg, recheck)
                return
            b.whole(msg.position, results)
        else:
            if not b.well_formed(msg.rows):
                self.refused_answers += 1
                return
            if not b.rows_held_by(held, src, msg.rows):
                core._set_aside(src, msg, recheck)
                return
            b.rows(msg.position, msg.ok, msg.rows)
        self._settle(msg.request, b)

    def _batch_answer(self, src: str, a: Answer, recheck: bool, held: Any) -> None:
        """An ``Answer`` to a batch's read alone, or to a whole bundle (its refusal or
        error)."""
        core: Any = self
        rid = a.request
        batch = self.batch_reads.get(rid)
        if batch is not None:
            gather, op, each = batch
            asked = self.asked.get(rid)
            if asked is not None:
                if src not in asked:
                    self.refused_answers += 1
                    return
            elif not held(src, gather.ranges if a.covered is None else a.covered):
                core._set_aside(src, a, recheck)
                return
            gather.add(a.covered, a.result, a.error, a.position, a.ok)
            if gather.complete:
                del self.batch_reads[rid]
                self.asked.pop(rid, None)
                tell(each, op, gather)
            return
        b = self._bundles.get(rid)
        if b is not None:
            if not b.held_by(held, src):
                core._set_aside(src, a, recheck)
                return
            complete = []
            for i, g in enumerate(b.gathers):
                if g is not None:
                    g.add(a.covered, a.result, a.error, a.position, a.ok)
                    if g.complete:
                        complete.append(i)
            b.finish_all(complete)
            self._settle(rid, b)
