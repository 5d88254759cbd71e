"""Messages between application processes and routers, and the commands routers replicate.

Algorithm 10 (application process) and Algorithm 11 (router) in 3.4, with the additions of
3.5: leader announcements (3.5.2), delayed acknowledgements (3.5.7), unsafe messages
(3.5.7) and congestion notices (3.5.6).  Everything is batched: one message carries every
item of its kind produced by one step of the sender.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ecast.core.effects import NodeId
from ecast.core.message import Message, MsgId, Submission

# ------------------------------------------------------------------ endpoint -> router


@dataclass(frozen=True, slots=True)
class Hello:
    """A process announces itself to a router, when it starts and whenever it turns to
    another router; it gets the succession order and a ``Welcome`` back.  ``lease`` is
    the lease it asks for, in seconds (0: the router's default)."""

    lease: float


@dataclass(frozen=True, slots=True)
class KeepAlive:
    """An idle process keeps its lease alive with it (when it sent nothing else for a
    third of its lease); the router answers with one, so an idle process learns when its
    router is gone."""


@dataclass(frozen=True, slots=True)
class Detach:
    """A process that never joined leaves: the router drops its lease and state at once."""


@dataclass(frozen=True, slots=True)
class Route:
    """Submissions to route, in session order (``route`` of Algorithm 10)."""

    subs: tuple[Submission, ...]


@dataclass(frozen=True, slots=True)
class RouteUnsafe:
    """Submissions to forward without agreement (3.5.7)."""

    subs: tuple[Submission, ...]


@dataclass(frozen=True, slots=True)
class Confirm:
    """Every ``Deliver`` this router sent me up to ``upto`` arrived (FIFO makes it exact)."""

    upto: int


@dataclass(frozen=True, slots=True)
class CloseSessions:
    """Close every session of ``namespace`` with an epoch up to ``epoch``, in total order."""

    namespace: str
    epoch: int


# ------------------------------------------------------------------ router -> endpoint


@dataclass(frozen=True, slots=True)
class Deliver:
    """Messages in strictly increasing ``t`` (``deliver`` of Algorithm 11)."""

    items: tuple[tuple[int, Message], ...]


@dataclass(frozen=True, slots=True)
class DeliverUnsafe:
    """Unsafe messages: ``(tag, frontier, message)``.

    ``tag`` is the ``t`` this router last sent to the receiver (None: nothing yet); the
    receiver accepts the message only if its ``t_max`` equals ``tag``.  ``frontier`` is
    the router's forwarding position: the config of the prefix before it routed the
    message.
    """

    items: tuple[tuple[int | None, int, Message], ...]


@dataclass(frozen=True, slots=True)
class UnsafeShed:
    """These unsafe messages of the receiver's did not reach every destination: the
    router that took them does not lead, or a destination lagged too far behind and its
    copy was dropped (3.5.7: unsafe messages are best effort).  Not all of them will be
    answered, so the sender need not wait for them; it may send them again."""

    ids: tuple[MsgId, ...]


@dataclass(frozen=True, slots=True)
class Stable:
    """Stable acknowledgements: ``(id, t, delivered)``.

    ``t`` is the message's timestamp (None if it was collected before this duplicate
    arrived); ``delivered`` says whether any destination confirmed it (False for an ignored
    message with an empty destination set, which Rubberband uses to detect stale
    reconfigurations, 4.4.1).
    """

    acks: tuple[tuple[MsgId, int | None, bool], ...]


@dataclass(frozen=True, slots=True)
class RejectedClosed:
    """These submissions belong to closed sessions; they were not and will not be routed."""

    ids: tuple[MsgId, ...]


@dataclass(frozen=True, slots=True)
class SessionsClosed:
    namespace: str
    epoch: int


@dataclass(frozen=True, slots=True)
class Forbidden:
    """These submissions name sessions whose namespace the sender's credential does not
    cover (or a reserved ``@`` namespace not its own); they were not and will not be
    routed.  Unlike ``RejectedClosed`` this says nothing about the session itself: its
    owner's messages go on."""

    ids: tuple[MsgId, ...]


@dataclass(frozen=True, slots=True)
class CloseForbidden:
    """A ``CloseSessions`` the sender may not make: ``namespace`` is reserved or not
    covered by its credential.  Nothing was closed."""

    namespace: str
    epoch: int


@dataclass(frozen=True, slots=True)
class Leader:
    """The succession order of router view ``view``; its first router leads (3.5.2)."""

    view: int
    succession: tuple[NodeId, ...]


@dataclass(frozen=True, slots=True)
class Welcome:
    """A router's answer to a process's first ``Hello`` (and to one that asks for another
    lease): the lease it holds the process to, in seconds (silent for longer, it is
    suspected), and the largest message, in bytes of payload and header, it accepts."""

    lease: float
    max_message: int


@dataclass(frozen=True, slots=True)
class Congestion:
    """Halve your congestion window (3.5.6)."""


@dataclass(frozen=True, slots=True)
class Suspected:
    """The history declared you faulty: stop (process-controlled crash, 3.3.4)."""

    t: int | None = None
    """Where: the position of the first suspect naming you, while the router remembers
    it (None: forgotten, or suspected before this router joined).  A suspected process
    learns from it which of its messages may have been delivered (those before ``t``)."""


@dataclass(frozen=True, slots=True)
class Directory:
    """Where nodes listen (node id -> HOST:PORT); runtimes gossip it, cores never see it."""

    entries: tuple[tuple[NodeId, str], ...]


@dataclass(frozen=True, slots=True)
class Direct:
    """An application message sent straight to another application process, outside the
    total order (Rubberband's basic reads, result streaming and data migration).

    ``payload`` is anything the codec packs; it is the application's to check.
    """

    payload: Any


ENDPOINT_TO_ROUTER = (Hello, Route, RouteUnsafe, Confirm, CloseSessions, Detach, KeepAlive)
ROUTER_TO_ENDPOINT = (
    KeepAlive,
    Deliver,
    DeliverUnsafe,
    Stable,
    RejectedClosed,
    SessionsClosed,
    Leader,
    Congestion,
    Suspected,
    Welcome,
    UnsafeShed,
    Forbidden,
    CloseForbidden,
)

# ------------------------------------------------------------------ replicated commands
# Payloads of ufabcast commands: a router proposes a tuple of these per step.


@dataclass(frozen=True, slots=True)
class RouteCmd:
    """Messages to append to the m-seq (senders set by the proposing router)."""

    msgs: tuple[Message, ...]


@dataclass(frozen=True, slots=True)
class StableCmd:
    """``(t, delivered)`` of messages every unsuspected destination confirmed."""

    entries: tuple[tuple[int, bool], ...]


@dataclass(frozen=True, slots=True)
class CloseSessionsCmd:
    requester: NodeId
    namespace: str
    epoch: int
