"""Every exception a Rubberband call raises, in one hierarchy (``docs/rubberband.md``
says which are safe to retry)."""

from __future__ import annotations


class RubberbandError(Exception):
    """Base class of what a Rubberband call raises."""


class Unavailable(RubberbandError):
    """Some range of the request has no holder left (every replica suspected), or no
    storage process could be reached."""


class Indeterminate(RubberbandError):
    """A sequential read whose responders did not all answer: a responder failed after
    the read was ordered.  It is not re-sent behind the client's own later writes; the
    caller decides whether to read again."""


class Rejected(RubberbandError):
    """Every replica refused the operation as invalid (a ``BadOperation``)."""


class Refused(RubberbandError, ValueError):
    """A reconfiguration request that must not run; the message says why."""
