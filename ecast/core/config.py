"""The pluggable ``Config`` automaton (3.5.3), a toolkit for writing one, and the two
configs E-Cast ships.

A ``Config`` is an immutable value.  ``apply(msg)`` returns the next config (``self`` when
``msg`` changes nothing, so ``MSeq`` stores a new config only where one changes),
``destset(msg)`` and ``suspects(msg)`` are the automaton's outputs, ``members()`` the
application processes it knows.  Routers pick the class by import path
(``package.module:Class``), so ``ecast`` never imports its users (Rubberband, 4.3).

Rules every config must follow, because E-Cast's guarantees rest on them:

* It is deterministic: equal configs give equal answers on every router.  Destination
  and suspect sets are frozensets; never iterate them unsorted to make a decision.
* Once a process is suspected, or has parted, it never appears in a later destination set
  and never rejoins under the same id (a new incarnation takes a fresh id).  Routers rely
  on this to stop waiting for a process whose own part is stable.
* Application membership is only what the history says (join, part, suspect messages).
* It never raises on a message, however malformed its header: headers come from
  application processes.  (Routers guard every call anyway and treat an exception as
  "no change, no destinations, no suspects", identically everywhere, but a config that
  raises has lost that message.)

:class:`Membership` is the base every shipped config (and Rubberband's) builds on: it
keeps the join/part/suspect bookkeeping, reads membership headers defensively, and asks
its subclass only how members are added and removed.
"""

from __future__ import annotations

import importlib
import zlib
from bisect import bisect_left
from typing import Any, ClassVar, Protocol, runtime_checkable

from ecast.core.effects import NodeId
from ecast.core.message import Message

EMPTY: frozenset[NodeId] = frozenset()

# ------------------------------------------------------------------ header conventions
KIND = "kind"
"""The reserved header key that makes a message a membership message (``header`` is a
dict).  Data messages must not use it."""
JOIN = "join"
PART = "part"
SUSPECT = "suspect"
WHO = "who"
"""A suspect message's list of suspected process ids."""
MEMBERSHIP_KINDS = frozenset({JOIN, PART, SUSPECT})
ROUTERS = "@routers"
"""The sender of messages the routers submit themselves (a lease that expired).  No
application process can send as it: names starting with ``@`` are refused at connect
time and at the routers."""


def kind_of(msg: Message) -> str | None:
    """``join``/``part``/``suspect`` if the header names one (the reserved key)."""
    h = msg.header
    if type(h) is dict:
        k = h.get(KIND)
        return k if type(k) is str else None
    return None


def suspected_in(msg: Message) -> frozenset[NodeId]:
    """The process ids a suspect message names; nothing if the list is malformed."""
    h = msg.header
    who = h.get(WHO) if type(h) is dict else None
    if type(who) not in (list, tuple) or len(who) > 4096:
        return EMPTY
    if not all(type(p) is str for p in who):
        return EMPTY
    return frozenset(who)


@runtime_checkable
class Config(Protocol):
    """What routers call.  A class also provides ``initial(**kwargs)`` (the first config,
    from the bootstrapping router's ``--config-arg`` values) and ``from_state(state)``
    (the inverse of ``to_state``); both are classmethods.  A class attribute
    ``data_inert = True`` promises that data messages change nothing and suspect nobody,
    so routers skip ``apply`` and ``suspects`` for them (:class:`Membership` declares it)."""

    def apply(self, msg: Message) -> Config: ...

    def destset(self, msg: Message) -> frozenset[NodeId]: ...

    def suspects(self, msg: Message) -> frozenset[NodeId]: ...

    def members(self) -> frozenset[NodeId]: ...

    def to_state(self) -> Any:
        """A plain value (msgpack-able) from which ``from_state`` rebuilds an equal config."""
        ...


def load_config(path: str, **kwargs: Any) -> Config:
    """Build the initial config named ``package.module:Class`` (its ``initial(**kwargs)``)."""
    return config_class(path).initial(**kwargs)  # type: ignore[attr-defined,no-any-return]


def config_class(path: str) -> type:
    """The class named ``package.module:Class``; clear errors for what is wrong."""
    module_name, _, cls_name = path.partition(":")
    if not module_name or not cls_name:
        raise ValueError(f"config path must look like package.module:Class, got {path!r}")
    module = importlib.import_module(module_name)
    cls = getattr(module, cls_name, None)
    if cls is None:
        raise ValueError(f"module {module_name} has no class {cls_name}")
    for need in ("initial", "from_state", "apply", "destset", "suspects", "members"):
        if not hasattr(cls, need):
            raise ValueError(f"{path} is not a Config: it has no {need}")
    return cls  # type: ignore[no-any-return]


def config_path(config: Config) -> str:
    cls = type(config)
    return f"{cls.__module__}:{cls.__qualname__}"


def restore_config(path: str, state: Any, expected: type | None = None) -> Config:
    """Rebuild a config from ``(path, state)``.  With ``expected`` (what a router was
    started with) the path must name exactly that class and nothing is imported: a peer's
    snapshot cannot make a router import and run a module of its choosing."""
    if expected is not None:
        want = f"{expected.__module__}:{expected.__qualname__}"
        if path != want:
            raise ValueError(f"snapshot names config {path!r:.120}, this router runs {want}")
        return expected.from_state(state)  # type: ignore[attr-defined,no-any-return]
    return config_class(path).from_state(state)  # type: ignore[attr-defined,no-any-return]


class Membership:
    """Join/part/suspect bookkeeping for configs: who is a member, who left for good.

    A process joins by submitting a ``join``; from that message on it is a member.  It
    leaves with its own ``part``, or when a member (or the routers, if the subclass
    accepts it) submits a ``suspect`` naming it.  A process that left is *retired*: its id
    never comes back.  Messages from processes that are not members have no effect.

    Subclasses are immutable and say how to add and remove members
    (:meth:`_joined`, :meth:`_left`); they may refuse a join (:meth:`_may_join`) or a
    router-issued suspect (:meth:`accepts_router_suspect`, default: accept).
    """

    __slots__ = ("_members", "_retired")
    data_inert: ClassVar[bool] = True
    """Whether a data message (a header that is not a dict naming ``KIND``) leaves this
    config unchanged and suspects nobody, as this base's ``apply`` and ``suspects``
    guarantee: routers then call neither for it (two calls per message on every
    router).  A subclass whose ``apply`` or ``suspects`` reacts to data messages must
    set it False; a config that does not declare it is called for every message."""
    accepts_lease_suspects: ClassVar[bool] = True
    """Whether suspects the routers issue for expired leases count (E-Cast's lease-based
    failure detection); an application with its own failure detector may say no."""

    def __init__(self, members: frozenset[NodeId], retired: frozenset[NodeId]) -> None:
        self._members = members
        self._retired = retired

    # ------------------------------------------------------------------ to override
    def _joined(self, p: NodeId, header: dict[str, Any]) -> Membership:
        raise NotImplementedError

    def _left(self, gone: frozenset[NodeId]) -> Membership:
        """``gone`` left (members, or processes a suspect named before they joined):
        drop them everywhere, add them to the retired."""
        raise NotImplementedError

    def _may_join(self, p: NodeId, header: dict[str, Any]) -> bool:
        return True

    def accepts_router_suspect(self, p: NodeId) -> bool:
        return self.accepts_lease_suspects

    def _apply_other(self, msg: Message, kind: str | None) -> Membership:
        """Messages of a kind this base does not know (a subclass's own configuration
        messages, such as Rubberband's keyspace messages); data messages never get here."""
        return self

    # ------------------------------------------------------------------ the automaton
    def members(self) -> frozenset[NodeId]:
        return self._members

    def retired(self) -> frozenset[NodeId]:
        return self._retired

    def is_member(self, p: NodeId) -> bool:
        return p in self._members

    def joiner_state(self) -> Any:
        """What a process's own join carries to it: the members it joined, itself among
        them (override to hand a joiner more of the config to mirror)."""
        return {"members": sorted(self._members)}

    def apply(self, msg: Message) -> Membership:
        h = msg.header  # kind_of written out: every router calls this per message
        kind = h.get(KIND) if type(h) is dict else None
        if kind is None:
            return self  # data messages never change a config
        sender = msg.sender
        if kind == JOIN:
            if sender in self._members or sender in self._retired:
                return self
            if not self._may_join(sender, h):  # type: ignore[arg-type]
                return self
            return self._joined(sender, h)  # type: ignore[arg-type]
        if kind == PART:
            if sender not in self._members:
                return self
            return self._left(frozenset((sender,)))
        if kind == SUSPECT:
            # Everyone it names is retired, members or not: the routers expel them all
            # (``suspects``), and a process a lease suspect named before its join was
            # learned would otherwise join after it, a destination no router ever
            # suspects again, waited for by every later message.
            gone = self.suspects(msg) - self._retired
            return self._left(gone) if gone else self
        return self._apply_other(msg, kind if type(kind) is str else None)

    def suspects(self, msg: Message) -> frozenset[NodeId]:
        """Everyone a member's suspect names, members or not: a process that parted and
        crashed before it confirmed its own part is no member any more, yet routers wait
        for its confirmations until someone suspects it."""
        h = msg.header
        if type(h) is not dict or h.get(KIND) != SUSPECT:
            return EMPTY
        sender = msg.sender
        if sender == ROUTERS:
            return frozenset(p for p in suspected_in(msg) if self.accepts_router_suspect(p))
        if sender not in self._members:
            return EMPTY
        return suspected_in(msg)

    def join_destset(self, msg: Message) -> frozenset[NodeId] | None:
        """Where a membership message goes under broadcast rules, or None for a data
        message: a join to every member and the joiner, a part or suspect to every
        member, nothing from a non-member."""
        h = msg.header
        kind = h.get(KIND) if type(h) is dict else None
        if kind is None:
            return None
        sender = msg.sender
        if kind == JOIN:
            if sender in self._retired or sender in self._members:
                return EMPTY if sender in self._retired else self._members
            return self._members | {sender} if self._may_join(sender, h) else EMPTY  # type: ignore[arg-type]
        if sender == ROUTERS and kind == SUSPECT:
            return self._members if self.suspects(msg) else EMPTY
        return self._members if sender in self._members else EMPTY


class BroadcastConfig(Membership):
    """Atomic broadcast to every joined application process.

    A joining process receives its own join and every later message; a parting process
    receives its own part and nothing after.  Membership messages go to every member.
    With ``senders="anyone"`` a process that never joined (a light client) may broadcast
    too; by default only members may.
    """

    __slots__ = ("open",)

    def __init__(
        self,
        members: frozenset[NodeId] = EMPTY,
        retired: frozenset[NodeId] = EMPTY,
        open: bool = False,
    ) -> None:
        super().__init__(members, retired)
        self.open = open

    @classmethod
    def initial(cls, senders: str = "members") -> BroadcastConfig:
        if senders not in ("members", "anyone"):
            raise ValueError(f"senders is 'members' or 'anyone', not {senders!r}")
        return cls(open=senders == "anyone")

    @classmethod
    def from_state(cls, state: Any) -> BroadcastConfig:
        members, retired, *rest = state
        return cls(frozenset(members), frozenset(retired), bool(rest and rest[0]))

    def to_state(self) -> Any:
        return [sorted(self._members), sorted(self._retired), self.open]

    def _joined(self, p: NodeId, header: dict[str, Any]) -> BroadcastConfig:
        return BroadcastConfig(self._members | {p}, self._retired, self.open)

    def _left(self, gone: frozenset[NodeId]) -> BroadcastConfig:
        return BroadcastConfig(self._members - gone, self._retired | gone, self.open)

    def destset(self, msg: Message) -> frozenset[NodeId]:
        members = self._members
        h = msg.header
        if type(h) is dict and KIND in h:
            dests = self.join_destset(msg)
            return dests if dests is not None else EMPTY
        sender = msg.sender
        if sender in members or (self.open and sender not in self._retired):
            return members
        return EMPTY

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is BroadcastConfig
            and other._members == self._members
            and other._retired == self._retired
            and other.open == self.open
        )

    def __hash__(self) -> int:
        return hash((self._members, self._retired, self.open))

    def __repr__(self) -> str:
        return f"BroadcastConfig({sorted(self._members)})"


def ring_position(name: str) -> int:
    """A stable position on a 32-bit ring (never Python's salted ``hash``)."""
    return zlib.crc32(name.encode())


class KeyRingConfig(Membership):
    """Key-ring multicast: a data message names ``header["key"]`` and goes to the ``f``
    successors of the key's position on a ring of receivers (successor replication, 4.2.2).

    Processes join with ``header={"kind": "join", "role": "receiver"}`` to take a place on
    the ring, or with any other role (submitters) to be allowed to send.  Membership
    messages are delivered to their sender only (and a lease suspect to its suspects).
    Used by the benchmark.
    """

    __slots__ = ("_others", "_positions", "_ring", "_succ", "f")

    def __init__(
        self,
        f: int,
        ring: tuple[tuple[int, NodeId], ...] = (),
        others: frozenset[NodeId] = EMPTY,
        retired: frozenset[NodeId] = EMPTY,
    ) -> None:
        if f < 1:
            raise ValueError("replication factor must be at least 1")
        super().__init__(frozenset(n for _, n in ring) | others, retired)
        self.f = f
        self._ring = ring
        self._positions = tuple(p for p, _ in ring)
        self._others = others
        names = [n for _, n in ring]
        k = min(f, len(names))
        # The f successors of each ring position, built once per config, not per message.
        self._succ = tuple(
            frozenset(names[(i + j) % len(names)] for j in range(k)) for i in range(len(names))
        )

    def settings(self) -> dict[str, Any]:
        """What the bootstrapping router's ``--config-arg`` fixed (shown by /health)."""
        return {"replication": self.f}

    @classmethod
    def initial(cls, replication: int | str = 3) -> KeyRingConfig:
        return cls(int(replication))

    @classmethod
    def from_state(cls, state: Any) -> KeyRingConfig:
        f, ring, others, retired = state
        return cls(f, tuple((int(p), n) for p, n in ring), frozenset(others), frozenset(retired))

    def to_state(self) -> Any:
        return [self.f, [list(x) for x in self._ring], sorted(self._others), sorted(self._retired)]

    def receivers(self) -> tuple[NodeId, ...]:
        return tuple(n for _, n in self._ring)

    def _joined(self, p: NodeId, header: dict[str, Any]) -> KeyRingConfig:
        if header.get("role") == "receiver":
            ring = tuple(sorted((*self._ring, (ring_position(p), p))))
            return KeyRingConfig(self.f, ring, self._others, self._retired)
        return KeyRingConfig(self.f, self._ring, self._others | {p}, self._retired)

    def _left(self, gone: frozenset[NodeId]) -> KeyRingConfig:
        ring = tuple(x for x in self._ring if x[1] not in gone)
        return KeyRingConfig(self.f, ring, self._others - gone, self._retired | gone)

    def destset(self, msg: Message) -> frozenset[NodeId]:
        h = msg.header  # kind_of written out: every router calls this per message
        kind = h.get(KIND) if type(h) is dict else None
        sender = msg.sender
        if kind is not None:
            if kind == JOIN:
                return EMPTY if sender in self._retired else frozenset((sender,))
            if sender == ROUTERS:
                return self.suspects(msg)
            return frozenset((sender,)) if sender in self._members else EMPTY
        if sender not in self._members or not self._ring:
            return EMPTY
        key = h.get("key") if type(h) is dict else None
        i = bisect_left(self._positions, ring_position(str(key)))
        return self._succ[i % len(self._succ)]

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is KeyRingConfig
            and other.f == self.f
            and other._ring == self._ring
            and other._others == self._others
            and other._retired == self._retired
        )

    def __hash__(self) -> int:
        return hash((self.f, self._ring, self._others, self._retired))

    def __repr__(self) -> str:
        return f"KeyRingConfig(f={self.f}, ring={[n for _, n in self._ring]})"
