"""Rubberband's ``Config``: Algorithm 12 (dissertation 4.3) as an E-Cast config automaton.

Routers load it with ``--config rubberband.config:RubberbandConfig --config-arg
replication=3 --config-arg partitioning=range``; only the bootstrapping router's arguments
count (joiners install the group's state).  Like every E-Cast config it is an immutable
value, deterministic, and never raises on a header: headers come from application
processes.

**Roles come from names.**  A process's role is the prefix of its name: ``super:``,
``storage:``, ``client:`` or ``maintainer:``.  Names are proven by E-Cast's credentials (a
client's credential covers ``client:*`` names only), so authorization by role is
authorization by proven identity: only supers submit keyspace messages and suspect votes,
only storage processes submit ``ready`` and ``incomplete``, only clients and maintainers
submit data.  Everything else, from anyone, gets an empty destination set and changes
nothing.  A maintainer is a client that may also write views' rows; the storage processes
refuse those writes from anyone else (:func:`rubberband.applying.refusal`).

**Headers** (the client computes ranges with the engine's ``part_fun``; routers never parse
payloads, which cost the dissertation 10-20 % of throughput, 5.6.3):

==========================================================  ===========================
header                                                      message
==========================================================  ===========================
``{"writes": ranges}``                                      write (ROWA: every holder)
``{"reads": ranges, "offset": o}``                          sequential read (a cover)
``{"reads": hulls, "offset": o, "count": n}``               a bundle of ``n`` reads
``{"kind": "join"}``                                        join; storage joins standby
``{"kind": "part"}``                                        part
``{"kind": "suspect", "who": [p]}``                         a super's vote, one name
``{"kind": "keyspace", "version": v, "op": op,``            keyspace message (4.4.1)
``"instructions": list}``
``{"kind": "ready", "version": v}``                         a storage process finished v
``{"kind": "incomplete", "version": v, "ranges": ranges}``  a receive that cannot finish
==========================================================  ===========================

The keys are :class:`rubberband.proto.H`'s, and the builders of every header are there.
``ranges`` is a normalized range set of encoded keys (:mod:`rubberband.keys`), ``op`` one
of ``["expand", name, id]``, ``["contract", name, ...]`` (one or more names, taken
off together), ``["replace", old, new]``, ``["rebalance", name, id]``,
``["restore", ring, partial, lost, epoch]`` (a recorded
ring into an empty one, the holders in ``partial`` incomplete, those in ``lost``
retired, the holders' positions numbered in ``epoch`` from then on: the restart of a
whole cluster),
``instructions`` the optimizer's instructions in wire form
(:mod:`rubberband.optimizer`).

**Routing.**  A write goes to every unsuspected holder overlapping its ranges.  A read
goes to a deterministic cover, one holder per primary segment rotated by the read's offset
(:class:`rubberband.placement.Routing`), avoiding *busy* holders (receivers of an
unfinished reconfiguration) when another replica is left, and never to an *incomplete*
one (it lacks data it will never get); a read that some range has no holder for at all
gets an empty destination set, which its client sees as an acknowledgement without
delivery (unavailable).  A keyspace message computed from another version than the
current one is ignored (4.4.1: empty destination set, its super retries).

**Suspicion** (4.2.3): each super votes with a suspect message; a process is suspected
by the vote that brings its voters to half of the current supers (at least one).  Router
lease suspects count for clients only: the supers decide about storage and supers.  A
vote names one process, so a vote is delivered beyond the supers only when it takes
effect: then it goes to every member, so storage processes in a migration with the
suspected process learn it at that point in the history and abort (4.4.1), and joined
clients learn that a responder is gone.  Keyspace messages go to the supers and every
storage process: each mirrors the keyspace to know its partition and the version.
"""

from __future__ import annotations

from typing import Any

from ecast import EMPTY, JOIN, KIND, PART, ROUTERS, SUSPECT, Membership, Message, NodeId
from ecast.core import mutations
from rubberband.keys import (
    NOTHING,
    EKey,
    RangeSet,
    difference,
    is_ekey,
    is_key_quick,
    is_range_set,
    union,
)
from rubberband.optimizer import BadInstruction, Copy, instructions_from_wire
from rubberband.placement import BadKeyspace, Keyspace, Routing, Unavailable
from rubberband.proto import INCOMPLETE, KEYSPACE, MAX_RANGES, READY, H

SUPER = "super:"
STORAGE = "storage:"
CLIENT = "client:"
MAINTAINER = "maintainer:"
"""A client that keeps views: the one role whose writes of views' rows are applied."""
CLIENTS = (CLIENT, MAINTAINER)
"""The prefixes of the processes that submit data (``str.startswith`` takes the tuple)."""
ROLES = (SUPER, STORAGE, CLIENT, MAINTAINER)
READS_TO_BUSY = mutations.declare(
    "reads_to_busy", "config", "reads go to receivers still being filled, as if complete"
)
OPS = ("expand", "contract", "replace", "rebalance", "restore")
"""``restore`` puts back a ring a super recorded, into a new group whose ring is empty
(the restart of a whole cluster from its disks): its holders must all have joined."""

_NONE: frozenset[NodeId] = frozenset()


def role_of(name: str) -> str | None:
    """``super:``, ``storage:``, ``client:`` or ``maintainer:`` (the prefix of a name),
    else None."""
    for r in ROLES:
        if name.startswith(r) and len(name) > len(r):
            return r
    return None


class Pending:
    """One unfinished reconfiguration: who must still say ``ready``, which of them
    receive data (busy: reads avoid them), and its copies (source, receiver, ranges):
    those to a receiver not ready yet are in flight, and their source failing breaks
    the receiver (a plan must not count on it: ``rubberband.exposure``)."""

    __slots__ = ("copies", "receivers", "waiting")

    def __init__(
        self,
        waiting: frozenset[NodeId],
        receivers: frozenset[NodeId],
        copies: tuple[tuple[NodeId, NodeId, RangeSet], ...] = (),
    ) -> None:
        self.waiting = waiting
        self.receivers = receivers
        self.copies = copies

    def without(self, gone: frozenset[NodeId]) -> Pending | None:
        """Not waiting for ``gone`` any more; None when nobody is left to wait for."""
        waiting = self.waiting - gone
        if not waiting:
            return None
        return Pending(waiting, self.receivers - gone, self.copies)

    def in_flight(self) -> tuple[tuple[NodeId, NodeId, RangeSet], ...]:
        return tuple(c for c in self.copies if c[1] in self.receivers)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Pending)
            and other.waiting == self.waiting
            and other.receivers == self.receivers
            and other.copies == self.copies
        )

    def __hash__(self) -> int:
        return hash((self.waiting, self.receivers, self.copies))

    def __repr__(self) -> str:
        return f"Pending(waiting={sorted(self.waiting)}, receivers={sorted(self.receivers)})"


class RubberbandConfig(Membership):
    """Members by role, the keyspace (ring of active storage processes), standby, busy and
    incomplete processes, the keyspace version and suspect votes."""

    __slots__ = (
        "_clients",
        "_read_routing",
        "_seniority",
        "_storage",
        "_supers",
        "_write_routing",
        "incomplete",
        "keyspace",
        "lacking",
        "partitioning",
        "pending",
        "version",
        "votes",
    )

    def __init__(
        self,
        keyspace: Keyspace,
        partitioning: str = "range",
        *,
        version: int = 0,
        supers: frozenset[NodeId] = _NONE,
        storage: frozenset[NodeId] = _NONE,
        clients: frozenset[NodeId] = _NONE,
        retired: frozenset[NodeId] = _NONE,
        pending: dict[int, Pending] | None = None,
        votes: dict[NodeId, frozenset[NodeId]] | None = None,
        incomplete: frozenset[NodeId] = _NONE,
        seniority: tuple[NodeId, ...] | None = None,
        lacking: dict[NodeId, RangeSet] | None = None,
    ) -> None:
        super().__init__(supers | storage | clients, retired)
        self.keyspace = keyspace
        self.partitioning = partitioning
        self.version = version
        self._supers = supers
        # Supers in the order their joins were delivered: the same on every replica, so
        # the oldest live super is the coordinator everywhere without any election.
        order = sorted(supers) if seniority is None else seniority
        self._seniority = tuple(p for p in order if p in supers)
        self._storage = storage
        self._clients = clients
        self.pending: dict[int, Pending] = pending or {}
        self.votes: dict[NodeId, frozenset[NodeId]] = votes or {}
        self.incomplete = incomplete
        self.lacking: dict[NodeId, RangeSet] = lacking or {}
        """The ranges each incomplete process lacks, where it said which (an incomplete
        process without an entry, a restored holder, lacks everything it holds): it may
        still send the rest of what it holds (:meth:`sources_in_part`)."""
        self._write_routing: Routing | None = None
        self._read_routing: Routing | None = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def initial(cls, replication: int | str = 3, partitioning: str = "range") -> RubberbandConfig:
        try:
            f = int(replication)
        except (TypeError, ValueError):
            raise ValueError(f"replication must be an integer, got {replication!r}") from None
        if not 1 <= f <= 16:
            raise ValueError(f"replication must be between 1 and 16, got {f}")
        if partitioning not in ("range", "hash"):
            raise ValueError(f"partitioning is 'range' or 'hash', not {partitioning!r}")
        return cls(Keyspace(f), partitioning)

    def to_state(self) -> Any:
        return [
            self.keyspace.f,
            self.partitioning,
            self.version,
            [list(x) for x in self.keyspace.ring()],
            list(self._seniority),
            sorted(self._storage),
            sorted(self._clients),
            sorted(self._retired),
            [
                [
                    v,
                    sorted(p.waiting),
                    sorted(p.receivers),
                    [[a, b, [list(r) for r in rs]] for a, b, rs in p.copies],
                ]
                for v, p in sorted(self.pending.items())
            ],
            [[p, sorted(v)] for p, v in sorted(self.votes.items())],
            sorted(self.incomplete),
            [[p, [list(r) for r in rs]] for p, rs in sorted(self.lacking.items())],
        ]

    @classmethod
    def from_state(cls, state: Any) -> RubberbandConfig:
        try:
            (
                f,
                partitioning,
                version,
                ring,
                supers,
                storage,
                clients,
                retired,
                pending,
                votes,
                incomplete,
                *more,
            ) = state
            if len(more) > 1:
                raise ValueError("too many fields")
            lacking = {}
            for p, rs in more[0] if more else ():
                ranges = tuple((_tuple(lo), _tuple(hi)) for lo, hi in rs)
                if p not in incomplete or not is_range_set(ranges):
                    raise ValueError(f"the ranges {p!r} lacks")
                lacking[str(p)] = ranges
            keyspace = Keyspace(f, ((_tuple(e), str(p)) for e, p in ring))
            return cls(
                keyspace,
                str(partitioning),
                version=int(version),
                supers=frozenset(supers),
                seniority=tuple(supers),
                storage=frozenset(storage),
                clients=frozenset(clients),
                retired=frozenset(retired),
                pending={int(v): _pending_from_state(*p) for v, *p in pending},
                votes={p: frozenset(v) for p, v in votes},
                incomplete=frozenset(incomplete),
                lacking=lacking,
            )
        except (TypeError, ValueError, BadKeyspace) as e:
            raise ValueError(f"not a RubberbandConfig state: {e}") from None

    def _with(self, **changes: Any) -> RubberbandConfig:
        fields = {
            "version": self.version,
            "supers": self._supers,
            "seniority": self._seniority,
            "storage": self._storage,
            "clients": self._clients,
            "retired": self._retired,
            "pending": self.pending,
            "votes": self.votes,
            "incomplete": self.incomplete,
            "lacking": self.lacking,
        }
        keyspace = changes.pop("keyspace", self.keyspace)
        fields.update(changes)
        return RubberbandConfig(keyspace, self.partitioning, **fields)

    # ------------------------------------------------------------------ reading
    def settings(self) -> dict[str, Any]:
        """What the bootstrapping router's ``--config-arg`` fixed for the group's life
        (the routers' /health shows it; changing it needs a new cluster)."""
        return {"replication": self.f, "partitioning": self.partitioning}

    @property
    def f(self) -> int:
        return self.keyspace.f

    def supers(self) -> frozenset[NodeId]:
        return self._supers

    def seniority(self) -> tuple[NodeId, ...]:
        """Supers oldest first (by the position of their joins in the history)."""
        return self._seniority

    def coordinator(self) -> NodeId | None:
        """The super that repairs broken holders: the oldest member super.  When it parts
        or is suspected, the next oldest takes over at the same point of the history on
        every replica (4.2.3)."""
        return self._seniority[0] if self._seniority else None

    def storage(self) -> frozenset[NodeId]:
        """Storage processes that are members (active or standby)."""
        return self._storage

    def clients(self) -> frozenset[NodeId]:
        """Clients that joined (light clients never appear here)."""
        return self._clients

    def active(self) -> tuple[NodeId, ...]:
        """The ring in id order, suspected processes still on it included (until a
        contract or replace removes them)."""
        return self.keyspace.processes

    def standby(self) -> frozenset[NodeId]:
        return self._storage - set(self.keyspace.processes)

    def busy(self) -> frozenset[NodeId]:
        """Receivers of unfinished reconfigurations: reads avoid them."""
        if mutations.on(READS_TO_BUSY):
            return _NONE
        return self.receiving()

    def receiving(self) -> frozenset[NodeId]:
        """Receivers of unfinished reconfigurations (a plan's sources only as a last
        resort: ``rubberband.optimizer``)."""
        out: frozenset[NodeId] = _NONE
        for p in self.pending.values():
            out |= p.receivers
        return out

    def copies_in_flight(self) -> tuple[tuple[NodeId, NodeId, RangeSet], ...]:
        """Copies of unfinished reconfigurations whose receiver is not ready yet and not
        incomplete: a copy to an incomplete receiver never finishes, and its lacks (or
        its suspicion) already say what it does not hold."""
        return tuple(
            c for p in self.pending.values() for c in p.in_flight() if c[1] not in self.incomplete
        )

    def excluded(self) -> frozenset[NodeId]:
        """Processes on the ring that are no longer members (suspected or parted)."""
        return frozenset(p for p in self.keyspace.processes if p not in self._storage)

    def sources_in_part(self) -> dict[NodeId, RangeSet]:
        """Incomplete members that said what they lack: a plan may copy the rest of what
        they hold from them.  Kept whole-process, one crash in a contraction that broke
        four receivers left a range no source a plan could use, though every holder had
        it whole but for other ranges (the simulator, seed 1054 with views)."""
        return {p: rs for p, rs in self.lacking.items() if p in self._storage}

    def joiner_state(self) -> Any:
        """A joining process mirrors the whole configuration (supers need all of it,
        storage processes the replication factor, partitioning and version)."""
        return {"members": sorted(self._members), "rubberband": self.to_state()}

    def write_routing(self) -> Routing:
        r = self._write_routing
        if r is None:
            r = self._write_routing = self.keyspace.routing(self.excluded())
        return r

    def read_routing(self) -> Routing:
        r = self._read_routing
        if r is None:
            r = self._read_routing = self.keyspace.routing(
                self.excluded() | self.incomplete, self.busy()
            )
        return r

    def read_cover(self, ranges: RangeSet, offset: int) -> dict[NodeId, RangeSet]:
        """Who answers a sequential read of ``ranges`` at ``offset`` and for which ranges
        (raises :class:`Unavailable`); clients and tests use it, routers use
        :meth:`destset`."""
        return self.read_routing().read_cover(ranges, offset)

    # ------------------------------------------------------------------ membership
    def _may_join(self, p: NodeId, header: dict[str, Any]) -> bool:
        return role_of(p) is not None

    def _joined(self, p: NodeId, header: dict[str, Any]) -> RubberbandConfig:
        role = role_of(p)
        if role == SUPER:
            return self._with(supers=self._supers | {p}, seniority=(*self._seniority, p))
        if role == STORAGE:
            return self._with(storage=self._storage | {p})
        return self._with(clients=self._clients | {p})

    def _left(self, gone: frozenset[NodeId]) -> RubberbandConfig:
        pending = self._pending_without(gone)
        votes = {p: v - gone for p, v in self.votes.items() if p not in gone and v - gone}
        return self._with(
            supers=self._supers - gone,
            seniority=tuple(p for p in self._seniority if p not in gone),
            storage=self._storage - gone,
            clients=self._clients - gone,
            retired=self._retired | gone,
            pending=pending,
            votes=votes,
            incomplete=self.incomplete - gone,
        )

    def accepts_router_suspect(self, p: NodeId) -> bool:
        """Lease suspects count for clients (maintainers too); the supers decide about
        everyone else."""
        return p.startswith(CLIENTS)

    def _threshold(self) -> int:
        """Votes needed: half of the current supers, at least one (4.2.3)."""
        return max(1, (len(self._supers) + 1) // 2)

    def suspects(self, msg: Message) -> frozenset[NodeId]:
        h = msg.header
        if type(h) is not dict or h.get(KIND) != SUSPECT:
            return EMPTY
        who = _names(h.get("who"))
        if who is None:
            return EMPTY
        sender = msg.sender
        if sender == ROUTERS:
            return frozenset(p for p in who if p.startswith(CLIENTS))
        if sender not in self._supers or len(who) != 1:
            return EMPTY  # a vote names one process: a delivered vote is one that counted
        need = self._threshold()
        supers = self._supers
        out = []
        for p in who:
            if p in self._retired or p == sender:
                continue
            voters = (self.votes.get(p, _NONE) & supers) | {sender}
            if len(voters) >= need:
                out.append(p)
        return frozenset(out)

    # ------------------------------------------------------------------ the automaton
    def apply(self, msg: Message) -> RubberbandConfig:
        h = msg.header
        kind = h.get(KIND) if type(h) is dict else None
        if kind is None:
            return self  # data messages never change the configuration
        if kind == SUSPECT:
            return self._apply_suspect(msg)
        if kind in (JOIN, PART):
            return super().apply(msg)  # type: ignore[return-value]
        sender = msg.sender
        if kind == KEYSPACE:
            return self._apply_keyspace(msg, h) if sender in self._supers else self
        if kind == READY:
            return self._apply_ready(sender, h) if sender in self._storage else self
        if kind == INCOMPLETE:
            return self._apply_incomplete(sender, h) if sender in self._storage else self
        return self

    def _apply_suspect(self, msg: Message) -> RubberbandConfig:
        gone = self.suspects(msg) & self._members
        sender = msg.sender
        if sender == ROUTERS or sender not in self._supers:
            return self._left(gone) if gone else self
        who = _names(msg.header.get("who")) or ()
        votes = dict(self.votes)
        for p in who:
            if p in gone or p == sender or p not in self._members:
                continue
            votes[p] = (votes.get(p, _NONE) & self._supers) | {sender}
        after = self._with(votes=votes) if votes != self.votes else self
        return after._left(gone) if gone else after

    def _apply_ready(self, sender: NodeId, h: dict[str, Any]) -> RubberbandConfig:
        v = h.get(H.VERSION)
        p = self.pending.get(v) if type(v) is int else None
        if p is None or sender not in p.waiting:
            return self
        pending = dict(self.pending)
        rest = p.without(frozenset((sender,)))
        if rest is not None:
            pending[v] = rest  # type: ignore[index]
        else:
            del pending[v]  # type: ignore[arg-type]
        return self._with(pending=pending)

    def _apply_incomplete(self, sender: NodeId, h: dict[str, Any]) -> RubberbandConfig:
        """A receiver whose source was suspected mid-transfer: it never gets ready and
        must not serve reads until a super repairs it (replace, or contract).  The
        ranges it names are what it lacks; the rest of what it holds it may still send
        (malformed ranges: it lacks everything)."""
        if sender not in self.keyspace:
            # It left the ring meanwhile and holds nothing: only stop waiting for it.
            return self._without_waiting(frozenset((sender,)))
        if sender in self.incomplete and sender not in self.lacking:
            return self  # it lacks everything already
        ranges = h.get(H.RANGES)
        lacking = dict(self.lacking)
        if is_range_set(ranges):
            lacking[sender] = union(lacking.get(sender, NOTHING), ranges)
        else:
            lacking.pop(sender, None)
        return self._with(incomplete=self.incomplete | {sender}, lacking=lacking)

    def _without_waiting(self, gone: frozenset[NodeId]) -> RubberbandConfig:
        pending = self._pending_without(gone)
        return self if pending == self.pending else self._with(pending=pending)

    def _pending_without(self, gone: frozenset[NodeId]) -> dict[int, Pending]:
        out = {}
        for v, p in self.pending.items():
            rest = p.without(gone)
            if rest is not None:
                out[v] = rest
        return out

    def _apply_keyspace(self, msg: Message, h: dict[str, Any]) -> RubberbandConfig:
        plan = _keyspace_plan(self, h)
        if plan is None:
            return self
        keyspace, involved, receivers, copies = plan
        # An incomplete process that leaves the ring will never finish what it could not
        # finish before: the reconfigurations waiting for it are done without it.
        pending = self._pending_without(frozenset(p for p in self.incomplete if p not in keyspace))
        v = self.version + 1
        # A process leaving the ring (contract, replace) is no longer incomplete.
        incomplete = frozenset(p for p in self.incomplete if p in keyspace)
        # One that stays never says ready (it is not whole), though it may have sent
        # what it still holds whole: nobody waits for it.
        waiting = (involved & self._storage) - incomplete
        if waiting:
            pending[v] = Pending(waiting, receivers & self._storage, copies)
        # What an incomplete process gains it gains without data (it receives no copies).
        lacking = {
            p: union(rs, difference(keyspace.partition(p), self.keyspace.partition(p)))
            for p, rs in self.lacking.items()
            if p in incomplete
        }
        incomplete, retired = _after_restore(h[H.OP], keyspace, incomplete, self._retired)
        return self._with(
            keyspace=keyspace,
            version=v,
            pending=pending,
            incomplete=incomplete,
            retired=retired,
            lacking=lacking,
        )

    def destset(self, msg: Message) -> frozenset[NodeId]:
        h = msg.header
        if type(h) is not dict:
            return EMPTY
        sender = msg.sender
        kind = h.get(KIND)
        if kind is None:
            if not sender.startswith(CLIENTS) or sender in self._retired:
                return EMPTY
            w = h.get(H.WRITES)
            if w is not None:
                if type(w) is not tuple or len(w) > MAX_RANGES or not is_range_set(w):
                    return EMPTY
                return self.write_routing().write_set(w)
            k = h.get(H.KEY)
            if k is not None:  # a write of one key: routed as its range is
                if H.READS in h or H.COUNT in h or not is_key_quick(k):
                    return EMPTY
                return self.write_routing().key_set(k)
            r = h.get(H.READS)
            o = h.get(H.OFFSET, 0)
            if type(r) is not tuple or len(r) > MAX_RANGES or type(o) is not int:
                return EMPTY
            if not is_range_set(r):
                return EMPTY
            try:
                return frozenset(self.read_routing().read_cover(r, o))
            except Unavailable:
                return EMPTY
        supers = self._supers
        if kind == JOIN:
            if sender in self._retired or sender in self._members or role_of(sender) is None:
                return EMPTY
            return supers | {sender}
        if kind == PART:
            if sender not in self._members:
                return EMPTY
            # A storage process that parts (a fail-stop: its engine failed) ends every
            # transfer it had: the others must hear it as they would its suspicion, or a
            # receiver waits for its chunks for ever and its reconfiguration never ends.
            return supers | self._storage if sender in self._storage else supers | {sender}
        if kind == SUSPECT:
            gone = self.suspects(msg)
            if gone:
                return self._members - gone
            return supers if sender in supers else EMPTY
        if kind == KEYSPACE:
            if sender not in supers:
                return EMPTY
            if _keyspace_plan(self, h) is None:
                return EMPTY
            # Every storage process mirrors the keyspace (its partition, the version its
            # basic reads are checked against); the involved ones find instructions.
            return supers | self._storage
        if kind in (READY, INCOMPLETE):
            return supers if sender in self._storage else EMPTY
        return EMPTY

    # ------------------------------------------------------------------ value semantics
    def __eq__(self, other: object) -> bool:
        return (
            type(other) is RubberbandConfig
            and other.version == self.version
            and other.keyspace == self.keyspace
            and other.partitioning == self.partitioning
            and other._seniority == self._seniority
            and other._storage == self._storage
            and other._clients == self._clients
            and other._retired == self._retired
            and other.pending == self.pending
            and other.votes == self.votes
            and other.incomplete == self.incomplete
            and other.lacking == self.lacking
        )

    def __hash__(self) -> int:
        return hash((self.version, self.keyspace, self._members))

    def __repr__(self) -> str:
        return (
            f"RubberbandConfig(v{self.version}, f={self.f}, ring={list(self.keyspace.processes)}, "
            f"standby={sorted(self.standby())}, supers={sorted(self._supers)})"
        )


def _keyspace_plan(
    c: RubberbandConfig, h: dict[str, Any]
) -> (
    tuple[
        Keyspace, frozenset[NodeId], frozenset[NodeId], tuple[tuple[NodeId, NodeId, RangeSet], ...]
    ]
    | None
):
    """The new keyspace, the storage processes involved, the receivers and the copies, or
    None for a stale, malformed or impossible keyspace message (ignored everywhere)."""
    if h.get(H.VERSION) != c.version or type(h.get(H.VERSION)) is not int:
        return None
    op = h.get(H.OP)
    if type(op) is not tuple or not op or op[0] not in OPS:
        return None
    try:
        instructions = instructions_from_wire(h.get(H.INSTRUCTIONS, ()))
    except BadInstruction:
        return None
    ks = c.keyspace
    storage = c._storage
    try:
        name = op[1]
        if op[0] == "expand" and len(op) == 3:
            if name not in storage or name in ks or not is_ekey(op[2]):
                return None
            new = ks.expand(_tuple(op[2]), name)
            moved = frozenset((name,))
        elif op[0] == "contract" and len(set(op[1:])) == len(op) - 1:
            new = ks.contract(*op[1:])  # several at once: none inherits from another
            moved = frozenset(op[1:])
        elif op[0] == "replace" and len(op) == 3:
            newcomer = op[2]
            if newcomer not in storage or newcomer in ks:
                return None
            new = ks.replace(name, newcomer)
            moved = frozenset((name, newcomer))
        elif op[0] == "rebalance" and len(op) == 3:
            if not is_ekey(op[2]):
                return None
            new = ks.rebalance(name, _tuple(op[2]))
            moved = frozenset((name,))
        elif op[0] == "restore" and len(op) in (2, 3, 4, 5) and not instructions:
            new, moved = _restored(c, op), _NONE
            if new is None:
                return None
        else:
            return None
    except (BadKeyspace, TypeError, IndexError):
        return None
    named: set[NodeId] = set(moved)
    receivers: set[NodeId] = set()
    copies = []
    for ins in instructions:
        # Every process an instruction names must still be a member: a plan made
        # before a vote and ordered after it would copy from, or to, a gone process.
        if isinstance(ins, Copy):
            if ins.src not in ks or ins.dst not in new:
                return None
            if ins.src not in storage or ins.dst not in storage:
                return None
            named.add(ins.src)
            named.add(ins.dst)
            receivers.add(ins.dst)
            copies.append((ins.src, ins.dst, ins.ranges))
        else:
            if ins.process not in ks or ins.process not in storage:
                return None
            named.add(ins.process)
    return new, frozenset(named), frozenset(receivers), tuple(copies)


def _pending_from_state(waiting: Any, receivers: Any, copies: Any = ()) -> Pending:
    """A pending reconfiguration from a state; one recorded before copies were kept
    has none (nothing counted in flight: the planner's check is then only as good as
    before)."""
    out = []
    for src, dst, rs in copies:
        ranges = tuple((_tuple(lo), _tuple(hi)) for lo, hi in rs)
        if not is_range_set(ranges):
            raise ValueError(f"the ranges {src!r} copies to {dst!r}")
        out.append((str(src), str(dst), ranges))
    return Pending(frozenset(waiting), frozenset(receivers), tuple(out))


def _after_restore(
    op: Any, keyspace: Keyspace, incomplete: frozenset[NodeId], retired: frozenset[NodeId]
) -> tuple[frozenset[NodeId], frozenset[NodeId]]:
    """After a restore: holders that were still receiving when the cluster died are
    incomplete (reads avoid them until a super repairs them); holders whose disk is gone
    are retired names (none may join and be trusted with ranges it does not hold) and
    stay off until a super replaces them."""
    if op[0] != "restore" or len(op) < 3:
        return incomplete, retired
    incomplete |= frozenset(p for p in op[2] if p in keyspace)
    return incomplete, retired | (frozenset(op[3]) if len(op) >= 4 else _NONE)


def _restored(c: RubberbandConfig, op: Any) -> Keyspace | None:
    """A restore's ring: only into an empty ring, and only with every holder back (each
    brings its ranges with it, so none is involved and nothing is pending)."""
    ks = c.keyspace
    if c.version != 0 or ks.processes or type(op[1]) is not tuple:
        return None
    lost = op[3] if len(op) >= 4 and type(op[3]) is tuple else ()
    new = Keyspace(ks.f, ((_tuple(e), str(p)) for e, p in op[1]))
    if not new.processes or any(p not in c.storage() and p not in lost for p in new.processes):
        return None
    if any(p in c.storage() for p in lost):
        return None  # a holder said lost is back: the record is not this cluster's
    return new


def _names(value: Any) -> tuple[NodeId, ...] | None:
    if type(value) not in (list, tuple) or len(value) > 4096:
        return None
    if not all(type(p) is str for p in value):
        return None
    return tuple(value)


def _tuple(value: Any) -> EKey:
    """An encoded key off a state or header (lists where a decoder made them)."""
    if type(value) is list:
        return tuple(_tuple(v) for v in value)
    if type(value) is tuple:
        return tuple(_tuple(v) if type(v) in (list, tuple) else v for v in value)
    return value  # type: ignore[no-any-return]


# ------------------------------------------------------------------ header builders
# Clients, storage processes and supers build headers only through ``rubberband.proto``,
# so the table in the module docstring is the whole protocol between them and the routers.
