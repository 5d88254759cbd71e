"""Holding the writers back while a view's maintainer falls behind its feed.

A storage process's change log keeps a bounded span of changes
(:mod:`rubberband.changelog`).  A view's maintainer that falls further behind than that
gets :class:`~rubberband.errors.Compacted` and starts the view over from a snapshot, and
under a load whose upkeep the machine cannot follow it falls behind again: an index over
a full table started six times in 100 s at the views benchmark's peak
(docs/benchmarks.md), a view never kept for as long as the load lasted.

So a storage process holds its intake back while the changes it logged after where a
maintainer's last feed read started fill the older half of what the log keeps
(:data:`HOLD_AT`), judged after every step: it takes deliveries no faster, in positions
of the total order a second, than :data:`PACE` times the rate at which that maintainer's
reads move on, until those after where its next read starts fill no more than a quarter
(:data:`RELEASE_AT`; :meth:`Holds.update` says why two places).  A maintainer's reads go
to one replica of each segment, in turns; the replica that answers tells the other
holders of what it answered (:class:`~rubberband.proto.FeedRead`), so every holder knows
every read of a feed and holds by the latest (a replica that was never asked, or a new
holder after a migration, held no one back and turned its log over under the maintainer
at its first read there).  The deliveries it does not take wait in its E-Cast client
unconfirmed (:mod:`rubberband.host`), unstable at the routers, and E-Cast's flow control
slows the writers down, the path by which an engine that falls behind slows them.  The
intake is slowed, never stopped: the maintainer's own feed reads and row writes come in
through it, in the total order.

Only a process named ``maintainer:`` (which it proved, docs/security.md) holds anyone
back.  A client's feed (``rb.watch``, a Spark stream) that falls behind is compacted
under as before: writers waiting for any reader would put every writer at the mercy of
the slowest consumer, while a view is the cluster's own and is worth nothing unless
kept.  A maintainer that stops reading a feed here (it failed, or starts over from a
snapshot) holds no one back for it after a few of its usual gaps between reads here
(:data:`LAPSE_GAPS`, between :data:`FIRST_TTL` and :data:`READER_TTL`).  Each feed a
maintainer follows holds apart: a maintainer keeps one feed for each group of views
over the same sources, each at its own place.  A maintainer late (past its usual gap
between reads) is taken as slowed by as much as it is late, until it reads again.

Sans I/O: :meth:`Holds.read` and :meth:`Holds.update` are called by the storage core
in its steps, with the step's time; :meth:`Holds.pause` by the host's intake on the
event loop.  The two share one value, :attr:`Holds.limit`, replaced whole.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Collection, Hashable
from dataclasses import dataclass

from ecast import NodeId
from rubberband.config import MAINTAINER

HOLD_AT = 0.5
"""Share of the change log's span logged after where a maintainer's last read started at
which its holder starts holding the writers back: the other half is the margin for the
maintainer's round under way and for the writes the routers hold already."""
RELEASE_AT = 0.25
"""Share at which the hold ends (half of where it starts, whatever that is set to): a gap
between the two, or the hold would go on and off with every step."""
PACE = 0.8
"""The intake's rate while held, relative to the maintainer's: the maintainer gains a
fifth of its own rate a second."""
READER_TTL = 30.0
"""Seconds after a maintainer's last read at this holder that its hold lapses at the
latest (its reads at one holder come every few rounds, since a read goes to one replica
of each segment, in turns; a round takes seconds when its pages are full)."""
LAPSE_GAPS = 4
"""A feed's hold lapses sooner: after this many of its usual gaps between reads here
(and :data:`FIRST_TTL` at the soonest).  A maintainer that failed, or started over,
held every writer for the whole :data:`READER_TTL` at its old pace (the simulator's
maintainers, crashed or halted, held the final reads past their deadline)."""
FIRST_TTL = 10.0
"""Seconds a feed read here only once is remembered (it holds nothing before its pace is
known), and the least any feed holds after its last read here."""
MAX_PAUSE = 0.5
"""Seconds the intake waits at most before it looks again (a hold that ends, or lapses,
is seen within this)."""


MAX_READERS = 4096
"""Feeds a storage process holds for at most: news of more (a storage peer may tell of
any maintainer's reads, :class:`~rubberband.proto.FeedRead`) is not kept."""
FEED_KEY = 16
"""Characters of a feed's key (:func:`feed_key`)."""


def feed_key(ranges: object) -> str:
    """The key a feed is held by: a digest of the ranges it reads (up to thousands of
    ranges, too long to send to the other holders with every read's news)."""
    return hashlib.blake2b(repr(ranges).encode(), digest_size=FEED_KEY // 2).hexdigest()


@dataclass(slots=True)
class _Reader:
    since: int
    """Where its last read started: it may ask again from there (:meth:`Holds.read`)."""
    resume: int
    """Where its next read starts: the earliest end of that read's pages."""
    at: float
    rate: float | None = None
    """Positions a second its reads moved on (None: not measured yet)."""
    gap: float | None = None
    """Seconds between its reads here, smoothed (None: one read so far)."""
    holding: bool = False
    read_at: int | None = None
    """The position of that read in the total order (None: not said)."""

    def ttl(self) -> float:
        """Seconds after its last read here that its hold lapses."""
        if self.gap is None:
            return FIRST_TTL
        return min(READER_TTL, max(FIRST_TTL, LAPSE_GAPS * self.gap))


class Holds:
    """A storage process's holds on its intake, by the maintainers reading its feed."""

    def __init__(self, hold_at: float = HOLD_AT, also: Collection[NodeId] = ()) -> None:
        """``hold_at``: the share of the log at which to hold (a storage process's
        ``--view-hold-at``); the hold ends at half of it; 0: never hold.  ``also``:
        processes held for besides the maintainers (the simulator's recorder of the
        base's history, which its checkers need whole)."""
        self.hold_at, self.release_at = hold_at, hold_at * RELEASE_AT / HOLD_AT
        self.also = frozenset(also)
        self.readers: dict[tuple[NodeId, Hashable], _Reader] = {}
        """By reader and feed (:meth:`read`)."""
        self.limit: tuple[float, float] | None = None
        """``(positions a second, until when)`` the intake may take, while a hold lasts
        (None: none)."""
        self.held_seconds = 0.0
        """Seconds the intake waited for holds, in all (a counter for ``/metrics``)."""
        self._upto = -1
        self._due = 0.0

    def read(
        self,
        reader: NodeId,
        resume: int,
        now: float,
        feed: Hashable = None,
        read_at: int | None = None,
        since: int | None = None,
    ) -> bool:
        """A feed read of ``reader``'s from position ``since`` (``resume`` if not said) was
        answered at ``now`` with a page that ends at ``resume``, where its next read
        starts; whether it is one held for (a maintainer's, or one of ``also``).
        ``feed``: which of its feeds (the ranges it reads): a maintainer follows one
        feed for each group of views over the same sources, each at its own place, and
        one place for all of them, the last read's, took the one furthest on for the
        maintainer's (the simulator's maintainers, six views in four groups, compacted
        under so).  ``read_at``: the read's position in the total order; each holder of
        what it read hears of it (:class:`~rubberband.proto.FeedRead`), and counts it
        once, at the earliest end any holder's page had; news of an older read changes
        nothing."""
        if self.hold_at <= 0 or not (reader.startswith(MAINTAINER) or reader in self.also):
            return False
        if since is None:
            since = resume
        key = (reader, feed)
        r = self.readers.get(key)
        if r is None:
            if len(self.readers) >= MAX_READERS:
                return False
            self.readers[key] = _Reader(since, resume, now, read_at=read_at)
            return True
        if read_at is not None and r.read_at is not None and read_at <= r.read_at:
            if read_at == r.read_at:
                r.resume = min(r.resume, resume)  # another holder's page, cut sooner
            return True
        if resume < r.resume:  # it started over (or asks again, from further back)
            r.rate = None
        elif now > r.at:
            rate = (resume - r.resume) / (now - r.at)
            r.rate = rate if r.rate is None else (r.rate + rate) / 2
        gap = now - r.at
        r.gap = gap if r.gap is None else (r.gap + gap) / 2
        r.since, r.resume, r.at, r.read_at = since, resume, now, read_at
        return True

    def forget(self, reader: NodeId) -> None:
        """``reader`` was declared faulty (its lease ran out): it reads no more, and its
        holds end now rather than a few of its gaps between reads (10 s at the soonest)
        later."""
        for key in [k for k in self.readers if k[0] == reader]:
            del self.readers[key]

    def update(self, share_of: Callable[[int], float], now: float) -> None:
        """After each step (its writes logged, its reads answered): hold the intake, or
        let it go, by the share of the log's span that now lies after each maintainer's
        place (``share_of``: inf where it was compacted under).  After every step, not
        only at a maintainer's reads: a slow maintainer's round took seconds, and an
        intake that ran free until its next read turned the whole log over before it.

        A hold starts by where the last read started: an answer of another holder may be
        lost, and the reader then asks again from there (the simulator's feed follower,
        held for by its pages' end, was compacted under so).  It ends by where the next
        read starts: held until the next read moved the start on, the maintainer's reads,
        which come in through the held intake too, came too slowly to move it, and the
        hold never ended (the simulator's final reads stood still behind it)."""
        limit: tuple[float, float] | None = None
        for name, r in list(self.readers.items()):
            share = share_of(r.since)
            if now - r.at > r.ttl() or share == math.inf:
                del self.readers[name]  # gone, or starting over from a snapshot
                continue
            if share >= self.hold_at:
                r.holding = True
            elif share_of(r.resume) <= self.release_at:
                r.holding = False
            # Its pace unknown yet (its first read, or its first since a start over),
            # it holds nothing until its next read says it: a feed read once (a view's
            # start, a maintainer that failed) held the intake to a batch every
            # MAX_PAUSE for as long as it was remembered (the simulator's writers stood
            # still for 10 s so; held so for a second after it, one run got 14 writes
            # done).
            if r.holding and r.rate is not None:
                # Not back for longer than its usual gap, its pace as this holder last
                # measured it may be long gone (it slowed, or reads other replicas) and
                # the log turned over under it at its old pace (a slowed maintainer in
                # real-daemon runs): taken as slowed by as much as it is late.  (Held to a
                # batch every MAX_PAUSE once twice as late, a base write's p99 was 506 ms
                # at the views benchmark's peak, against 300-369 ms so.)
                usual = max(r.gap or 0.0, MAX_PAUSE)
                rate = PACE * r.rate * min(1.0, usual / max(now - r.at, 1e-9))
                if limit is None or rate < limit[0]:
                    limit = (rate, r.at + r.ttl())
        self.limit = limit

    def pause(self, upto: int, now: float) -> float:
        """Seconds the intake waits before it takes more, having taken deliveries up to
        position ``upto`` at ``now``."""
        last, self._upto = self._upto, max(self._upto, upto)
        limit = self.limit
        if limit is None or now > limit[1] or last < 0:
            self._due = now
            return 0.0
        if limit[0] <= 0:
            self._due = now + MAX_PAUSE
        else:
            self._due = max(self._due, now) + (self._upto - last) / limit[0]
        wait = min(MAX_PAUSE, self._due - now)
        self.held_seconds += wait
        return wait
