"""The engine protocol: what a storage engine implements to run under Rubberband.

Rubberband (dissertation chapter 4) orders every read, write and reconfiguration with
E-Cast and hands them to one engine per storage process *in delivery order*.  The engine
never sees E-Cast, the network or the other replicas; it sees a sequence of calls on one
worker thread, never two at once, and must behave as if it ran them one after another:

* ``apply(batch)``: data operations, each with the ranges this replica answers for
  (the operation's ranges intersected with this process's partition).  A write changes
  only keys inside them; a read reports only keys inside them.  One result per
  operation, in order.
* ``open_send(ranges)``: a consistent copy of ``ranges`` *as of this call* (partial live
  migration, 4.4.1 and 5.4).  Later ``apply`` calls must never leak into it, and it
  must not stop them: the cursor is drained in chunks by the receiver's pace while
  writes go on.
* ``receive(chunk)``: data streamed from another replica's cursor (chunks arrive in
  order; the storage process holds back writes to a range until its base is complete).
* ``delete(ranges)``: drop everything in ``ranges``.
* ``stats()``: size and load, reported to the supers.
* ``("version", ...)`` (key-value engines that hold views): merge version entries into
  version chains with :func:`merge` (:mod:`rubberband.versions`); and ``("reclaim",
  keys, upto)``: drop each key whose chain :func:`dead_by` says is dead by ``upto``.
  The storage process refuses, before the engine sees it, a version write delivered
  too far behind the positions it holds (:func:`rubberband.versions.too_old`).
* ``positions = True`` (optional): ``apply`` and ``apply_logged`` get ``(op, ranges,
  t)`` items, ``t`` the position in the total order of the delivery that carried the
  operation (-1 for a read answered outside the order, a basic read).  A durable engine
  stamps what it writes with it, so its data says up to where it holds the sequence.
* ``whole(t, writes)`` (optional, with ``positions``): before a batch, every write
  ``(op, ranges)`` of each message at ``t`` that reaches beyond this replica's ranges,
  for an engine that keeps them so a restart of the whole cluster can bring replicas
  that missed the message level (:mod:`rubberband.restart`).
* ``durable = True`` (optional): a batch is on disk when ``apply`` returns.  The
  storage process then confirms its deliveries to E-Cast only after their batch is
  applied (``EndpointParams.confirm_when_durable``), so a write is acknowledged only
  once it is on disk at every replica.
* ``apply_logged(batch)`` (optional): ``apply``, and for each operation what it changed,
  ``((key, "put", value) | (key, "delete", None), ...)``, for change feeds
  (:mod:`rubberband.changelog`).  An engine without it keeps no change log.

Two kinds of failure, never confused:

* :class:`BadOperation`: the operation is invalid (a type error, an unknown table).  It
  is deterministic, so every replica rejects it alike and the client gets the message.
* Anything else raised (out of memory, a backing server gone, an I/O error) is a failure
  of *this replica*: the storage process stops (fail-stop), is suspected and replaced.
  A replica never skips a write and carries on.

Keys and ranges are Rubberband's (:mod:`rubberband.keys`): ranges are in *placement*
space, which is the key itself under range partitioning and a 32-bit hash of it under
hash partitioning (dissertation 5.3).  :class:`Placement` maps a key to its place.

Clients use an engine's :class:`Operations` (no engine instance, no I/O) to compute what
an operation reads or writes (``part_fun``), so routers route without ever parsing a
payload (5.6.3 measured 10-20 % lost to parsing in the routers).

Engines import only this module (and third-party libraries): the protocol is
Rubberband's, so it lives in Rubberband's layer (``storage_adapters.base`` re-exports it
for engines written against that name).  It re-exports the key helpers an engine's
``part_fun`` needs to build range sets (``encode_key``, ``after``, ``normalize``,
``intersect``, ``union``, ``MIN_EKEY``/``MAX_EKEY``, ``NOTHING``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

from rubberband.errors import BadOperation
from rubberband.keys import (
    AFTER_TAIL,
    EVERYTHING,
    MAX_EKEY,
    MAX_INT,
    MIN_EKEY,
    MIN_INT,
    NOTHING,
    BadKey,
    EKey,
    Key,
    RangeSet,
    after,
    contains,
    encode_key,
    intersect,
    normalize,
    points,
    sort_bound,
    sort_key,
    sort_pairs,
    stable_hash32,
    union,
)
from rubberband.versions import (
    check_reclaim_op,
    check_version_op,
    dead_by,
    is_chain,
    merge,
    refuse_view_keys,
)

__all__ = [
    "AFTER_TAIL",
    "EVERYTHING",
    "INVALID",
    "MAX_EKEY",
    "MAX_INT",
    "MIN_EKEY",
    "MIN_INT",
    "NOTHING",
    "ROWS",
    "BadKey",
    "BadOperation",
    "Change",
    "EKey",
    "Engine",
    "Event",
    "Key",
    "Operations",
    "Part",
    "Placed",
    "Placement",
    "RangeSet",
    "ReportsChanges",
    "SendCursor",
    "after",
    "changed_key",
    "check_reclaim_op",
    "check_version_op",
    "contains",
    "dead_by",
    "encode_key",
    "intersect",
    "is_chain",
    "merge",
    "normalize",
    "points",
    "refuse_row_key",
    "refuse_view_keys",
    "rejection",
    "row_key",
    "sort_bound",
    "sort_key",
    "sort_pairs",
    "union",
]

Partitioning = Literal["range", "hash"]


INVALID = (BadOperation, BadKey, TypeError, IndexError, KeyError, ValueError)
"""What reading a malformed operation raises: a rejection of it, never a failure of the
replica (an engine catches these only around its own reading of the operation)."""


def rejection(op: Any, error: Exception) -> BadOperation:
    """``error``, raised while reading ``op``, as the rejection every replica returns.
    Without its traceback, nor the exception it was raised while handling: the
    rejection is an answer, kept in the batch's results, and a traceback holds the
    frames that hold those results (a context's too, through its frames' callers), a
    cycle of garbage for every rejected operation, which only the cyclic collector
    would free."""
    if isinstance(error, BadOperation):
        error.__traceback__ = error.__context__ = error.__cause__ = None
        return error
    return BadOperation(f"{op!r:.60}: {error}")


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a key lives on the ring: its own order, or a stable hash of it."""

    partitioning: Partitioning = "range"

    def __post_init__(self) -> None:
        if self.partitioning not in ("range", "hash"):
            raise ValueError(f"partitioning is 'range' or 'hash', not {self.partitioning!r}")

    def ekey(self, key: Key) -> EKey:
        if self.partitioning == "range":
            return encode_key(key)
        return (2, stable_hash32(key))

    @property
    def ordered(self) -> bool:
        """Whether key ranges map to placement ranges (only under range partitioning)."""
        return self.partitioning == "range"


class Part(NamedTuple):
    """What ``part_fun`` says of an operation: read or write, and where (placement space).
    A named tuple: a client makes one per operation, and a frozen dataclass's
    constructor cost a few per cent of a client at saturation."""

    kind: Literal["read", "write"]
    ranges: RangeSet


class Placed(tuple):  # type: ignore[type-arg]
    """A write that carries the ranges it touches (``ranges``, placement space under
    range partitioning), computed by its maker where that costs little: a view's
    maintainer knows each row key's encoded form when it writes the row, and
    ``part_fun`` finding them again from the keys was a quarter of its time (the key
    encoded, sorted, its value's size measured).  A client takes the ranges as they are
    under range partitioning and asks ``part_fun`` otherwise; on the wire it is the
    plain tuple.  Its maker answers for the ranges being ``part_fun``'s, or, for a
    write of many keys with ``places``, the one range around them
    (:func:`rubberband.messages.placed_ranges`), and for the operation being one
    ``part_fun`` would accept."""

    ranges: RangeSet
    places: tuple[EKey, ...] | None
    """Each of the operation's ``(key, ...)`` pairs' key, encoded, in the pairs' order,
    when the pairs need not be applied in one message (a view's rows, whose readers
    wait for a progress written after them): a client then sends the pairs of each
    piece of the ring apart, to its holders alone (``Messages.writes_of``)."""

    def __new__(
        cls, op: tuple[Any, ...], ranges: RangeSet, places: tuple[EKey, ...] | None = None
    ) -> Placed:
        self = super().__new__(cls, op)
        self.ranges = ranges
        self.places = places
        return self


class Operations(Protocol):
    """The client-side half of an engine: pure functions over operations."""

    def part_fun(self, op: Any, placement: Placement) -> Part:
        """The ranges ``op`` reads or writes; raises :class:`BadOperation` if invalid."""
        ...


class SendCursor(Protocol):
    def next_chunk(self, max_bytes: int) -> Any | None:
        """The next chunk (msgpack-able, about ``max_bytes`` at most), None at the end."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class Engine(Protocol):
    """What a storage process runs.  Its calls run on a thread of their own, so a long
    scan never holds up heartbeats; an engine whose every call is short and never waits
    for I/O may set ``blocking = False`` to run on the event loop instead, without a
    thread hop per batch (the null engine does).  One whose operations on a few single
    keys are short (no I/O, no long walk: the memory engine) sets ``inline_points =
    True``: a batch of nothing but such reads and writes then runs on the loop, and
    everything else (scans, copies, keyspace changes) on the thread; it may also say how
    many single keys an operation names (``point_keys(op)``, -1: not only single keys),
    for a write of many keys whose header names one range around them.  A durable
    engine keeps the thread (its batches end with a sync)."""

    placement: Placement

    def apply(self, batch: Sequence[tuple[Any, RangeSet]]) -> list[Any]:
        """Apply ``(op, ranges)`` in order; a result per op, or a :class:`BadOperation`
        instance (returned, not raised) for an op rejected as invalid."""
        ...

    def is_read(self, op: Any) -> bool:
        """Whether ``op`` is one of this engine's reads, which change nothing.  A read
        reaches one replica of each range (or none through the order: basic and
        snapshot reads), so the storage process runs an operation sent as a read only
        if this says so; a write there would change that replica alone and set it apart
        from the others for good.  False for anything it does not know."""
        ...

    def open_send(self, ranges: RangeSet) -> SendCursor: ...

    def receive(self, chunk: Any, ranges: RangeSet) -> None:
        """Store a chunk of a copy of ``ranges`` (placement space) that another engine's
        send cursor made.  Checked whole before anything is stored: a malformed chunk,
        or one with an item outside ``ranges``, raises :class:`BadOperation` and changes
        nothing (the storage process refuses the transfer, never stops for it); any other
        exception is the engine failing."""
        ...

    def delete(self, ranges: RangeSet) -> None: ...

    def stats(self) -> dict[str, int | float]:
        """At least ``items`` and ``bytes``."""
        ...

    def close(self) -> None: ...


Change = tuple[Any, str, Any]
"""What a write did to a key: ``(key, "put", new value)`` or ``(key, "delete", None)``."""


class Event(NamedTuple):
    """One write as a feed tells it: its position, and each key it changed in the feed's
    ranges, ``(key, "put", value)`` or ``(key, "delete", None)``, in key order."""

    position: int
    changes: tuple[tuple[Any, str, Any], ...]


ROWS = "~rows"
"""The first element of a table row's change key (keys starting with it are reserved)."""


def row_key(table: str, key: Key) -> tuple[str, str, Key]:
    """How an engine with tables names a row in the changes it reports: apart from
    key-value data of the same key and from other tables' rows, placed by ``key``
    (:func:`changed_key`).  Its value is ``{"row": after, "before": before}`` (a put;
    ``before`` None for a new row) or ``{"before": before}`` (a delete)."""
    return (ROWS, table, key)


def refuse_row_key(key: Key) -> None:
    """Key-value data may not use a table row's change key (its changes would be
    placed by the row key, not where the data lives): :class:`BadKey`."""
    if type(key) is tuple and len(key) == 3 and key[0] == ROWS:
        raise BadKey(f"keys ({ROWS!r}, table, key) are reserved for tables' rows: {key!r:.60}")


def changed_key(key: Key) -> Key:
    """The key a reported change is placed by: a table row's own key, else the key."""
    if type(key) is tuple and len(key) == 3 and key[0] == ROWS:
        return key[2]
    return key


class ReportsChanges:
    """``apply_logged`` for an engine whose writes append each change to ``_changes``
    while it is a list (``apply_logged`` runs each operation alone through ``apply``,
    so a subclass that wraps ``apply`` is obeyed; outside it, ``_changes`` is None and
    writes record nothing)."""

    _changes: list[Change] | None = None
    apply: Callable[[Sequence[tuple[Any, RangeSet]]], list[Any]]

    def apply_logged(
        self, batch: Sequence[tuple[Any, RangeSet]]
    ) -> tuple[list[Any], list[tuple[Change, ...]]]:
        """:meth:`apply`, and what each operation changed (change feeds): each key's new
        value, or its removal.  A delete of a key that holds nothing changes nothing."""
        results: list[Any] = []
        changed: list[tuple[Change, ...]] = []
        for one in batch:
            self._changes = log = []
            try:
                results.extend(self.apply((one,)))
            finally:
                self._changes = None
            changed.append(tuple(log))
        return results, changed
