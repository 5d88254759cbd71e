"""Application messages as E-Cast routes them (3.3.2, 3.5.3).

A message id is ``(session, seq)``: the submitting endpoint numbers messages within a
session, and sessions are separate from processes (a session may outlive the process that
opened it, which is what exactly-once ingestion from Spark builds on).  A session is named
``(namespace, epoch, stream)`` so that one ordered command can close all sessions of a
namespace up to an epoch and leave a single watermark behind.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ecast.core.effects import NodeId

Session = tuple[str, int, str]
"""(namespace, epoch, stream)."""
MsgId = tuple[Session, int]
"""(session, sequence number); sequence numbers start at 1."""


class Submission(NamedTuple):
    """What an endpoint sends to a router: no sender, the router's link supplies it.

    A NamedTuple rather than a frozen dataclass: just as immutable, but built several
    times per message on its path (decoding, routing), where a frozen dataclass's
    ``__init__`` costs several times more (docs/decisions.md).
    """

    id: MsgId
    header: Any
    payload: Any


class Message(NamedTuple):
    """A message in the m-seq.

    ``sender`` is the authenticated process the router received the submission from; it is
    never taken from the payload.  ``header`` is the small routing header a ``Config``
    reads; ``payload`` is opaque to E-Cast.
    """

    sender: NodeId
    id: MsgId
    header: Any
    payload: Any

    @property
    def kind(self) -> str | None:
        """The membership kind (``join``/``part``/``suspect``) if the header names one."""
        h = self.header
        return h.get("kind") if type(h) is dict else None


fast_new = tuple.__new__
"""``fast_new(Message, (sender, id, header, payload))`` builds a NamedTuple in C, without
its Python-level ``__new__``: hot paths build one per message at every hop.  All fields
must be given, in order."""
