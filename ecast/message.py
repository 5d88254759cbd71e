"""Application messages as E-Cast routes them (3.3.2, 3.5.3).

A message id is ``(session, seq)``: the submitting endpoint numbers messages within a
session, and sessions are separate from processes (a session may outlive the process that
opened it, which is what exactly-once ingestion from Spark builds on).  A session is named
``(namespace, epoch, stream)`` so that one ordered command can close all sessions of a
namespace up to an epoch and leave a single watermark behind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ecast.effects import NodeId

Session = tuple[str, int, str]
"""(namespace, epoch, stream)."""
MsgId = tuple[Session, int]
"""(session, sequence number); sequence numbers start at 1."""


@dataclass(frozen=True, slots=True)
class Submission:
    """What an endpoint sends to a router: no sender, the router's link supplies it."""

    id: MsgId
    header: Any
    payload: Any


@dataclass(frozen=True, slots=True)
class Message:
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
