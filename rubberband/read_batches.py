"""The client's read batches: bundles of reads in flight, and telling the caller.

A batch (:meth:`rubberband.client.ClientCore.read_batch`) sends reads for one responder
up to a bundle to a message; the answers name the bundle and an index.  A
:class:`Bundle` keeps its reads' gathers in the order of its payload and tells the
caller of each read once, when it completes (or all of a group at once, for a
``grouped`` caller).  Sans-IO; the client core owns the bundles and their timers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from rubberband.gather import Gather
from rubberband.keys import is_range_set

log = logging.getLogger("rubberband.client")


class Bundle:
    """A read bundle of a batch in flight: its reads and their gathers, in the order of
    its payload (a finished read's gather becomes None), and its E-Cast message id once
    submitted unsafe (a shed notice names it).  Its reads need no request id of their
    own: an answer names the bundle and an index."""

    __slots__ = ("deadline", "done", "gathers", "grouped", "left", "ops")

    def __init__(
        self,
        ops: list[Any],
        gathers: list[Gather],
        done: Callable[..., None],
        grouped: bool,
        deadline: float,
    ) -> None:
        self.ops = ops
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

    def held_by(self, held: Callable[[str, Any], bool], src: str) -> bool:
        """Whether ``src`` holds every open read of the bundle: its hull first (one check
        for the usual bundle, whose reads lie in one holder's segments), read by read if
        not."""
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
