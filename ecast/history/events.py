"""What an E-Cast history holds: events that processes observed, in their own order.

A history records, per application process, what E-Cast's guarantees (3.3) speak of:
what it submitted, what it delivered and in which ``t`` order, which acknowledgements it
got, whether it crashed and how it terminated.  When the recorder can see the routers
(the simulator can, a real run cannot), it adds what each router *learned*: the m-seq
itself, each message at its timestamp ``t``.  The checks (:mod:`ecast.history.checks`)
judge a history; the JSON-lines form (:mod:`ecast.history.jsonl`) stores one.

Only the order of one process's events carries meaning (a process's submissions come
after what it delivered before them, causal order); across processes, events relate
through ``t``, message ids and, where the recorder's clocks agree, their ``time``.

Events are NamedTuples, one class per kind: a recorder appends millions of them, and a
NamedTuple is built and dispatched on (``type(e) is Deliver``) as cheaply as a tuple.
Optional fields are ``None`` when the recorder does not know them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

from ecast.core.effects import NodeId
from ecast.core.message import Message, MsgId


class Submit(NamedTuple):
    """The process submitted message ``id`` (data, or its own join, part or suspect)."""

    id: MsgId
    time: float | None = None


class SubmitUnsafe(NamedTuple):
    """The process submitted an unsafe message (3.5.7): forwarded without agreement."""

    id: MsgId
    time: float | None = None


class Resubmit(NamedTuple):
    """A session's next owner submitted ``id`` again (a retried task resubmits the same
    session and sequence numbers): the routers keep one copy and acknowledge both."""

    id: MsgId
    time: float | None = None


class Deliver(NamedTuple):
    """The process delivered the message at timestamp ``t`` (safe delivery).  ``sender``
    and ``header``, when known, let a checker replay the config over the m-seq without
    the routers' records; ``payload`` is for people reading the history."""

    t: int
    id: MsgId
    time: float | None = None
    sender: NodeId | None = None
    header: Any = None
    payload: Any = None


class DeliverUnsafe(NamedTuple):
    """An unsafe message reached the process: ``tag`` is the ``t`` of the last message
    the forwarding router had sent it (-1: none since that router took over),
    ``frontier`` the router's forwarding position whose config routed it, ``accepted``
    whether the process took it (it fits the delivery stream)."""

    tag: int
    frontier: int
    id: MsgId
    accepted: bool
    time: float | None = None
    sender: NodeId | None = None
    header: Any = None
    payload: Any = None


class Ack(NamedTuple):
    """Message ``id`` of the process became stable at ``t`` (None: the routers no longer
    knew it); ``delivered``: some destination delivered it."""

    id: MsgId
    t: int | None
    delivered: bool
    time: float | None = None


class Crash(NamedTuple):
    """The process stopped without a word (killed, or cut off for good): liveness is no
    longer owed to it, and it owes nothing."""

    time: float | None = None


class Terminate(NamedTuple):
    """The endpoint terminated: ``closed`` (its own part was delivered), ``suspected``
    (declared faulty) or ``detached``."""

    reason: str
    time: float | None = None
    t: int | None = None
    """Suspected: where the routers said the suspect message lies (``Suspected.t``).
    Under a config whose suspects reach only the suspects themselves, no process may
    deliver that message: this is how the history's reference learns what it was."""


class Learned(NamedTuple):
    """A router learned ``message`` at ``t`` (the routers' m-seq; recorded only where the
    recorder sees the routers)."""

    t: int
    message: Message
    time: float | None = None


Event = Submit | SubmitUnsafe | Resubmit | Deliver | DeliverUnsafe | Ack | Crash | Terminate
"""An application process's event (``Learned`` belongs to routers)."""


class RouterLog:
    """What one router learned: the message at each ``t``, and when it first learned it."""

    __slots__ = ("first_seen", "learned")

    def __init__(self) -> None:
        self.learned: dict[int, Message] = {}
        self.first_seen: dict[int, float] = {}

    def learn(self, t: int, message: Message, time: float | None = None) -> None:
        self.learned[t] = message
        if time is not None and t not in self.first_seen:
            self.first_seen[t] = time


class History:
    """A history in memory: each process's events in order, and the routers' logs.

    A recorder that lives in the same process (the simulator, a demo) appends events to
    ``log(process)`` directly, without JSON; :func:`ecast.history.jsonl.read_history`
    builds the same object from a file.
    """

    __slots__ = ("processes", "routers")

    def __init__(self) -> None:
        self.processes: dict[NodeId, list[Any]] = {}
        self.routers: dict[NodeId, RouterLog] = {}

    def log(self, process: NodeId) -> list[Any]:
        """The event list of ``process`` (created empty), to append to."""
        events = self.processes.get(process)
        if events is None:
            events = self.processes[process] = []
        return events

    def router(self, rid: NodeId) -> RouterLog:
        """The log of router ``rid`` (created empty)."""
        log = self.routers.get(rid)
        if log is None:
            log = self.routers[rid] = RouterLog()
        return log

    def add(self, process: NodeId, event: Any) -> None:
        """Append one event (``Learned`` goes to the router's log)."""
        if type(event) is Learned:
            self.router(process).learn(event.t, event.message, event.time)
        else:
            self.log(process).append(event)

    def merge(self, other: History) -> None:
        """Add another recorder's history (its processes' events follow ours)."""
        for p, events in other.processes.items():
            self.log(p).extend(events)
        for r, log in other.routers.items():
            mine = self.router(r)
            for t, m in log.learned.items():
                mine.learn(t, m, log.first_seen.get(t))

    def events(self) -> Iterator[tuple[NodeId, Any]]:
        """Every ``(process, event)``: each process's events in order, then the routers'
        ``Learned`` events in ``t`` order."""
        for p, events in self.processes.items():
            for e in events:
                yield p, e
        for r, log in self.routers.items():
            first = log.first_seen
            for t in sorted(log.learned):
                yield r, Learned(t, log.learned[t], first.get(t))

    def __len__(self) -> int:
        return sum(len(v) for v in self.processes.values()) + sum(
            len(r.learned) for r in self.routers.values()
        )

    def of_kind(self, process: NodeId, kind: type) -> list[Any]:
        """The events of one kind ``process`` recorded, in order (for tests and tools)."""
        return [e for e in self.processes.get(process, ()) if type(e) is kind]
