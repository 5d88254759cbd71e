"""The pluggable ``Config`` automaton (3.5.3) and the two configs E-Cast ships.

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
"""

from __future__ import annotations

import importlib
import zlib
from bisect import bisect_left
from typing import Any, Protocol, runtime_checkable

from ecast.core.effects import NodeId
from ecast.core.message import Message

EMPTY: frozenset[NodeId] = frozenset()


@runtime_checkable
class Config(Protocol):
    def apply(self, msg: Message) -> Config: ...

    def destset(self, msg: Message) -> frozenset[NodeId]: ...

    def suspects(self, msg: Message) -> frozenset[NodeId]: ...

    def members(self) -> frozenset[NodeId]: ...

    def to_state(self) -> Any:
        """A plain value (msgpack-able) from which ``from_state`` rebuilds an equal config."""
        ...


def load_config(path: str, **kwargs: Any) -> Config:
    """Build the initial config named ``package.module:Class`` (its ``initial(**kwargs)``)."""
    module_name, _, cls_name = path.partition(":")
    if not module_name or not cls_name:
        raise ValueError(f"config path must look like package.module:Class, got {path!r}")
    cls = getattr(importlib.import_module(module_name), cls_name)
    return cls.initial(**kwargs)


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
    module_name, _, cls_name = path.partition(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    return cls.from_state(state)  # type: ignore[no-any-return]


def _suspected(msg: Message) -> frozenset[NodeId]:
    who = msg.header.get("who", ()) if type(msg.header) is dict else ()
    return frozenset(who)


class BroadcastConfig:
    """Atomic broadcast to every joined application process.

    ``join`` adds the sender, ``part`` removes it, ``suspect`` removes every process named
    in ``header["who"]``.  A joining process receives its own join and every later
    message; a parting process receives its own part and nothing after.  Messages from
    processes that are not members (never joined, parted, suspected) are ignored: empty
    destination set, no effect.  A process that left never comes back under the same id
    (its successor incarnation uses a fresh one), so left ids are remembered.
    """

    __slots__ = ("_members", "_retired")

    def __init__(
        self, members: frozenset[NodeId] = EMPTY, retired: frozenset[NodeId] = EMPTY
    ) -> None:
        self._members = members
        self._retired = retired

    @classmethod
    def initial(cls, **_: Any) -> BroadcastConfig:
        return cls()

    @classmethod
    def from_state(cls, state: Any) -> BroadcastConfig:
        members, retired = state
        return cls(frozenset(members), frozenset(retired))

    def to_state(self) -> Any:
        return [sorted(self._members), sorted(self._retired)]

    def members(self) -> frozenset[NodeId]:
        return self._members

    def apply(self, msg: Message) -> BroadcastConfig:
        h = msg.header  # Message.kind written out: every router calls this per message
        kind = h.get("kind") if type(h) is dict else None
        if kind is None:
            return self
        members = self._members
        if kind == "join":
            if msg.sender in members or msg.sender in self._retired:
                return self
            return BroadcastConfig(members | {msg.sender}, self._retired)
        if msg.sender not in members:
            return self
        if kind == "part":
            gone = frozenset((msg.sender,))
        elif kind == "suspect":
            gone = _suspected(msg) & members
        else:
            return self
        if not gone:
            return self
        return BroadcastConfig(members - gone, self._retired | gone)

    def destset(self, msg: Message) -> frozenset[NodeId]:
        members = self._members
        if msg.kind == "join":
            if msg.sender in self._retired:
                return EMPTY
            return members | {msg.sender}
        return members if msg.sender in members else EMPTY

    def suspects(self, msg: Message) -> frozenset[NodeId]:
        h = msg.header
        if type(h) is dict and h.get("kind") == "suspect" and msg.sender in self._members:
            return _suspected(msg)
        return EMPTY

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is BroadcastConfig
            and other._members == self._members
            and other._retired == self._retired
        )

    def __hash__(self) -> int:
        return hash((self._members, self._retired))

    def __repr__(self) -> str:
        return f"BroadcastConfig({sorted(self._members)})"


def ring_position(name: str) -> int:
    """A stable position on a 32-bit ring (never Python's salted ``hash``)."""
    return zlib.crc32(name.encode())


class KeyRingConfig:
    """Key-ring multicast: a data message names ``header["key"]`` and goes to the ``f``
    successors of the key's position on a ring of receivers (successor replication, 4.2.2).

    Processes join with ``header={"kind": "join", "role": "receiver"}`` to take a place on
    the ring, or with any other role (submitters) to be allowed to send.  Membership
    messages are delivered to their sender only.  Used by the benchmark.
    """

    __slots__ = ("_all", "_others", "_positions", "_retired", "_ring", "_succ", "f")

    def __init__(
        self,
        f: int,
        ring: tuple[tuple[int, NodeId], ...] = (),
        others: frozenset[NodeId] = EMPTY,
        retired: frozenset[NodeId] = EMPTY,
    ) -> None:
        if f < 1:
            raise ValueError("replication factor must be at least 1")
        self.f = f
        self._ring = ring
        self._positions = tuple(p for p, _ in ring)
        self._others = others
        self._all = frozenset(n for _, n in ring) | others
        self._retired = retired
        names = [n for _, n in ring]
        k = min(f, len(names))
        # The f successors of each ring position, built once per config, not per message.
        self._succ = tuple(
            frozenset(names[(i + j) % len(names)] for j in range(k)) for i in range(len(names))
        )

    @classmethod
    def initial(cls, replication: int | str = 3, **_: Any) -> KeyRingConfig:
        return cls(int(replication))

    @classmethod
    def from_state(cls, state: Any) -> KeyRingConfig:
        f, ring, others, retired = state
        return cls(f, tuple((int(p), n) for p, n in ring), frozenset(others), frozenset(retired))

    def to_state(self) -> Any:
        return [self.f, [list(x) for x in self._ring], sorted(self._others), sorted(self._retired)]

    def members(self) -> frozenset[NodeId]:
        return self._all

    def receivers(self) -> tuple[NodeId, ...]:
        return tuple(n for _, n in self._ring)

    def apply(self, msg: Message) -> KeyRingConfig:
        h = msg.header  # Message.kind written out: every router calls this per message
        kind = h.get("kind") if type(h) is dict else None
        if kind is None:
            return self
        sender = msg.sender
        if kind == "join":
            if sender in self._all or sender in self._retired:
                return self
            if msg.header.get("role") == "receiver":
                ring = tuple(sorted((*self._ring, (ring_position(sender), sender))))
                return KeyRingConfig(self.f, ring, self._others, self._retired)
            return KeyRingConfig(self.f, self._ring, self._others | {sender}, self._retired)
        if sender not in self._all:
            return self
        if kind == "part":
            gone = frozenset((sender,))
        elif kind == "suspect":
            gone = _suspected(msg) & self._all
        else:
            return self
        if not gone:
            return self
        ring = tuple(x for x in self._ring if x[1] not in gone)
        return KeyRingConfig(self.f, ring, self._others - gone, self._retired | gone)

    def destset(self, msg: Message) -> frozenset[NodeId]:
        h = msg.header  # Message.kind written out: every router calls this per message
        kind = h.get("kind") if type(h) is dict else None
        sender = msg.sender
        if kind is not None:
            if kind == "join":
                return EMPTY if sender in self._retired else frozenset((sender,))
            return frozenset((sender,)) if sender in self._all else EMPTY
        if sender not in self._all or not self._ring:
            return EMPTY
        key = msg.header.get("key") if type(msg.header) is dict else None
        i = bisect_left(self._positions, ring_position(str(key)))
        return self._succ[i % len(self._succ)]

    def suspects(self, msg: Message) -> frozenset[NodeId]:
        h = msg.header
        if type(h) is dict and h.get("kind") == "suspect" and msg.sender in self._all:
            return _suspected(msg)
        return EMPTY

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
