"""Every exception a Rubberband call raises, in one hierarchy, and what is safe to retry
(``docs/rubberband.md``, "Errors"):

- :class:`RubberbandError`
  - :class:`Unavailable` (also an ``ecast.Unavailable``): no holder is left for some
    range, or nothing could be reached.  Nothing was applied: safe to retry, later.
  - :class:`Indeterminate` (also a ``TimeoutError``): the time ran out.  A read: safe to
    retry.  A write may yet take effect: retry only what may apply twice.
  - :class:`BadOperation` (also a ``ValueError``): the operation is malformed or
    invalid, refused at the call (:class:`BadKey`, a key that cannot be a key) or by
    every replica alike (:class:`Rejected`).  Deterministic: never retry as it is.
  - :class:`Refused` (also a ``ValueError``): a reconfiguration that must not run.
    - :class:`MustWait`: not yet (copies in flight); a request waits for them.
  - :class:`Compacted`: a change feed asked from a position whose changes are no longer
    kept; its ``position`` says where the feed can continue from.
"""

from __future__ import annotations

from ecast import Unavailable as _EcastUnavailable


class RubberbandError(Exception):
    """Base class of what a Rubberband call raises."""


class Unavailable(RubberbandError, _EcastUnavailable):
    """Some range of the request has no holder left (every replica suspected), or no
    storage process could be reached.  An ``ecast.Unavailable`` too, so one handler
    catches both layers' "nobody to talk to"."""


class Indeterminate(RubberbandError, TimeoutError):
    """A request whose outcome is unknown when its time ran out: a write not
    acknowledged (or not answered) in time may yet take effect; a read tried on every
    replica it could reach without a complete answer.  A ``TimeoutError`` too."""


class BadOperation(RubberbandError, ValueError):
    """An operation that is malformed or invalid: a deterministic rejection, the same
    at the call and at every replica (engines raise it, or return it as a result)."""


class BadKey(BadOperation):
    """A value that cannot be a Rubberband key (the caller's input, refused at the call)."""


class Rejected(BadOperation):
    """Every replica refused the operation as invalid (a ``BadOperation`` of the
    engine's, whose message this carries)."""


class Refused(RubberbandError, ValueError):
    """A reconfiguration request that must not run; the message says why."""


class MustWait(Refused):
    """A reconfiguration that must not run *yet*: while copies of an unfinished one are
    in flight, one failure would lose data under it.  A request waits and is planned
    again as the configuration moves, until its timeout; a dry run reports it."""


class Compacted(RubberbandError):
    """A change feed read from before what the holders still keep (retention, or a range
    that moved to its holder later): read again from ``position``, or from a snapshot."""

    def __init__(self, position: int) -> None:
        super().__init__(f"changes up to position {position} are no longer kept")
        self.position = position
