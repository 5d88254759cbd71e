"""Every exception a Rubberband call raises, in one hierarchy (``docs/rubberband.md``
says which are safe to retry)."""

from __future__ import annotations


class RubberbandError(Exception):
    """Base class of what a Rubberband call raises."""


class Unavailable(RubberbandError):
    """Some range of the request has no holder left (every replica suspected), or no
    storage process could be reached."""


class Indeterminate(RubberbandError, TimeoutError):
    """A request whose outcome is unknown when its time ran out: a write not
    acknowledged (or not answered) in time may yet take effect; a read tried on every
    replica it could reach without a complete answer.  A ``TimeoutError`` too."""


class Rejected(RubberbandError):
    """Every replica refused the operation as invalid (a ``BadOperation``)."""


class Refused(RubberbandError, ValueError):
    """A reconfiguration request that must not run; the message says why."""
