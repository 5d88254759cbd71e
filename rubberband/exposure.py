"""Whether a planned reconfiguration puts data at the mercy of one failure.

Storage processes that are not told to wait move on at once (dissertation 4.4.2): a
holder told to delete a range deletes it when the keyspace message is delivered, before
the range's new holders have received it.  The optimizer (``rubberband.optimizer``)
picks the instruction list that least risks loss *within* the plan, but a plan is made
while earlier ones may still copy data: a receiver of an unfinished reconfiguration does
not hold its range until its copy is complete, and the failure of that copy's source
breaks it.  A plan that deletes the one complete holder besides such a receiver makes a
single failure lose the range, where without the plan the deleted holder would have
kept it (the simulator, seed 698 with five storage processes and automatic repair: a
contraction re-planned after a source crashed, unsuspected yet, took that source for
its copies; the victim deleted at once; both receivers broke, and no complete holder of
a range was left).

:func:`exposure` simulates every single failure, range by range, with and without the
plan, along the copies in flight and the plan's own, and reports the first failure that
would lose a range only because the plan runs before the copies in flight are done.
``SuperCore.plan`` then raises :class:`~rubberband.errors.MustWait` unless forced: a
request waits, planned again as the configuration moves, until its timeout
(:func:`why_wait`).  The same judgement breaks the rank's ties (:func:`judge`).  A
repair never waits: a repair is planned only when every receiver still waited for is
incomplete, and copies to an incomplete receiver never finish, so none is waited for
(its lacks already say what it does not hold).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from rubberband.keys import MAX_EKEY, MIN_EKEY, EKey, RangeSet, contains, describe, normalize
from rubberband.optimizer import Copy, Instruction, Plan, optimize
from rubberband.placement import Keyspace

InFlight = tuple[tuple[str, str, RangeSet], ...]
"""Copies of unfinished reconfigurations: (source, receiver, ranges)."""


def exposure(
    old: Keyspace,
    new: Keyspace,
    instructions: Iterable[Instruction],
    suspected: frozenset[str],
    partial: Mapping[str, RangeSet],
    in_flight: InFlight,
    *,
    settled: bool = True,
) -> tuple[str | None, RangeSet] | None:
    """The first process (None: no failure at all, then in old-ring, new-ring, then
    copy-source order) whose failure alone, with the plan (``old`` -> ``new`` by
    ``instructions``), leaves ranges with no complete holder that would keep one without
    the plan, and would keep one under the plan once the copies in flight were done; and
    those ranges.  None when there is none.

    The last condition (dropped with ``settled=False``) keeps to what waiting cures:
    moving a range always risks it between the deletes and the copies' end (with
    ``f = 1`` the receiver's failure loses it), a risk the optimizer's rank weighs and
    the dissertation accepts.

    ``suspected`` processes hold nothing (a source of a copy in flight that is off the
    ring and no longer a member belongs there), but those in ``partial`` (incomplete,
    with what each lacks) hold the rest whole, as the optimizer sees them."""
    copies = tuple((i.src, i.dst, i.ranges) for i in instructions if isinstance(i, Copy))
    if not len(old) or not len(new):
        return None
    atoms = _atoms(old, new, copies, in_flight, partial)
    nodes: list[str | None] = [None, *old.processes]
    for p in (*new.processes, *(src for src, _, _ in in_flight)):
        if p not in nodes:
            nodes.append(p)  # a contracted or replaced process still sends its copies
    for failed in nodes:
        if failed in suspected:
            continue
        view = _Holding(suspected, partial, in_flight, failed)
        done = _Holding(suspected, partial, (), failed) if settled else None
        lost = [
            (lo, hi)
            for lo, hi in atoms
            if view.held_before(old, lo)
            and not view.held_after(old, new, lo, copies)
            and (done is None or done.held_after(old, new, lo, copies))
        ]
        if lost:
            return failed, normalize(lost)
    return None


def judge(
    old: Keyspace,
    new: Keyspace,
    suspected: frozenset[str],
    partial: Mapping[str, RangeSet],
    in_flight: InFlight,
) -> Callable[[tuple[Instruction, ...]], bool]:
    """For ``optimize(..., safe=...)``: whether an instruction list loses no range on
    any single failure that would not lose it without the plan, counting the copies in
    flight.  The rank floods whole processes and ties plans this tells apart: with two
    replicas, a rebalance whose two candidate sources both still received other ranges
    ranked them alike, and took the one whose failure lost the moved range (the
    simulator, seed 440 with automatic repair)."""

    def safe(instructions: tuple[Instruction, ...]) -> bool:
        return (
            exposure(old, new, instructions, suspected, partial, in_flight, settled=False) is None
        )

    return safe


def why_wait(
    old: Keyspace,
    new: Keyspace,
    plan: Plan,
    suspected: frozenset[str],
    gone: frozenset[str],
    partial: Mapping[str, RangeSet],
    in_flight: InFlight,
    stuck: frozenset[str],
) -> str | None:
    """Why ``plan`` (the optimizer's, with ``suspected``) must wait for the copies in
    flight (none to an incomplete receiver: those never finish); None when it need not.
    ``gone``: sources of those copies that are no longer members; ``stuck``: incomplete
    receivers, still receiving when the others are done.

    Two ways waiting cures: the plan loses a range on one failure only while the copies
    are in flight (:func:`exposure`); or it does so at all, and only because the holders
    still receiving were passed over as sources (the busy rule), while the plan made
    once they are done would not (the simulator, seed 450 with two replicas and
    automatic repair)."""
    if not in_flight:
        return None
    dead = suspected | gone
    exposed = exposure(old, new, plan.instructions, dead, partial, in_flight)
    if exposed:
        return _lost(exposed, "under this plan (and not without it, nor once they are done)")
    exposed = exposure(old, new, plan.instructions, dead, partial, in_flight, settled=False)
    if exposed is None:
        return None
    safe = judge(old, new, dead, partial, ())
    later = optimize(old, new, suspected, partial=partial, busy=stuck, safe=safe)
    if later.instructions == plan.instructions:
        return None
    if not safe(later.instructions):
        return None
    return _lost(
        exposed,
        "under this plan, whose sources pass over holders still receiving; the plan "
        "made once they are done runs no such risk",
    )


def _lost(exposed: tuple[str | None, RangeSet], why: str) -> str:
    failed, ranges = exposed
    who = "no further failure" if failed is None else f"the failure of {failed} alone"
    return (
        f"while copies of an unfinished reconfiguration are in flight, {who} would leave "
        f"{describe(ranges)} with no complete holder {why}: wait for them, or force"
    )


class _Holding:
    """Who holds a key whole when ``failed`` fails now."""

    def __init__(
        self,
        suspected: frozenset[str],
        partial: Mapping[str, RangeSet],
        in_flight: InFlight,
        failed: str | None,
    ) -> None:
        self.suspected, self.partial, self.failed = suspected, partial, failed
        self.feeds: dict[str, list[tuple[str, RangeSet]]] = {}
        for src, dst, ranges in in_flight:
            if dst not in partial:  # it said what it lacks: the rest it holds whole
                self.feeds.setdefault(dst, []).append((src, ranges))

    def held_before(self, old: Keyspace, key: EKey) -> bool:
        return any(self.holds(q, key, ()) for q in _holders(old, key))

    def held_after(
        self, old: Keyspace, new: Keyspace, key: EKey, copies: tuple[tuple[str, str, RangeSet], ...]
    ) -> bool:
        """A new holder that held ``key`` before keeps it; any other has it only through
        the plan's copy (an incomplete one gets none: it gains the range without data)."""
        before = _holders(old, key)
        for q in _holders(new, key):
            if q in before:
                if self.holds(q, key, ()):
                    return True
            elif (
                q != self.failed
                and q not in self.suspected
                and any(
                    self.holds(s, key, ()) for s, d, rs in copies if d == q and contains(rs, key)
                )
            ):
                return True
        return False

    def holds(self, q: str, key: EKey, seen: tuple[str, ...]) -> bool:
        """``q`` held ``key`` before the plan (or receives it); whether it has it whole:
        alive, not lacking it, and every copy in flight that brings it still fed."""
        if q == self.failed or q in seen:
            return False
        lacks = self.partial.get(q)
        if lacks is not None:
            return not contains(lacks, key)
        if q in self.suspected:
            return False
        incoming = [s for s, rs in self.feeds.get(q, ()) if contains(rs, key)]
        return all(self.holds(s, key, (*seen, q)) for s in incoming)


def _holders(ks: Keyspace, key: EKey) -> tuple[str, ...]:
    return ks.holders_of_segment(ks.segment_of(key))


def _atoms(
    old: Keyspace,
    new: Keyspace,
    copies: tuple[tuple[str, str, RangeSet], ...],
    in_flight: InFlight,
    partial: Mapping[str, RangeSet],
) -> list[tuple[EKey, EKey]]:
    """The keyspace cut at every bound that matters: each piece lies in one segment of
    each ring and inside or outside each copy and each lack."""
    bounds: set[Any] = {MIN_EKEY, MAX_EKEY}
    sets: list[RangeSet] = [*old.segments(), *new.segments(), *partial.values()]
    sets += [rs for _, _, rs in copies] + [rs for _, _, rs in in_flight]
    for rs in sets:
        for lo, hi in rs:
            bounds.add(lo)
            bounds.add(hi)
    ordered = sorted(bounds)
    return list(itertools.pairwise(ordered))
