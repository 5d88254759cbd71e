"""Rubberband's wire: every message its processes exchange, typed, in one place.

Two kinds travel.  **Direct messages** go from one application process to another
outside the total order (E-Cast's ``Direct``): answers to reads and writes, basic reads,
migration streams, heartbeats, keyspace questions.  Each is a frozen dataclass here with
an append-only wire code, registered with E-Cast's codec, which decodes it strictly (a
field of the wrong type is refused with the packet, the connection closed and the refusal
counted, before any core sees it; ``ecast.wire.codec``).  What a field's type cannot say
(a range set is well formed, a request id is ours) the core that takes it checks.

**Headers** of E-Cast messages are what the routers' config reads to route (4.3): plain
maps, since routers parse every one and a map lookup is all they need.  Their keys are
named here, once (:class:`H`); builders for each kind of message follow.

Codes are part of the protocol: never renumber, only append.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ecast
from ecast import KIND, SUSPECT, WHO, NodeId
from rubberband.keys import AFTER_TAIL, is_key_quick

TransferId = tuple[int, int]
"""A migration's transfer: the keyspace message's position and the instruction's index."""


# ------------------------------------------------------------------ client <-> storage
@dataclass(frozen=True, slots=True)
class Answer:
    """storage -> client: one answer to a read (or a write that asked for one).

    ``covered`` is the part of the request this answer is for (the request intersected
    with what this process holds; None: all of it), ``error`` the message of a
    ``BadOperation`` (else None).  ``position`` and ``ok`` depend on the read: a
    sequential read (or a write) has its message's position in the total order and True;
    a snapshot read the router's frontier and whether this process could answer as of
    it; a basic read this process's keyspace version and whether the client's version
    matched."""

    request: Any
    covered: Any
    result: Any
    error: str | None
    position: int | None
    ok: bool


@dataclass(frozen=True, slots=True)
class Answers:
    """storage -> client: the answers to a bundle of reads, ``(index, covered, result,
    error)`` each, for one read and one piece of what this process holds of it
    (``covered`` None: all of the read).  A bundle of writes is answered only for the
    writes the engine rejected."""

    request: Any
    position: int | None
    ok: bool
    rows: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Whole:
    """storage -> client: the answers to a bundle of reads that this process answers
    every one of whole and without error (most bundles), ``results[i]`` for read ``i``."""

    request: Any
    position: int | None
    results: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class BasicRead:
    """client -> storage: a basic read, routed by the client's keyspace ``version``."""

    request: int
    op: Any
    ranges: tuple[Any, ...]
    version: int


@dataclass(frozen=True, slots=True)
class Peek:
    """client -> storage: a basic read of the change log, routed by the client's
    keyspace ``version`` as :class:`BasicRead` is: has a key of ``ranges`` (and of the
    encoded key range ``keys``, None: any) changed after position ``since``?  Answered
    by an :class:`Answer` whose result is a bool (``rubberband.changelog.Changed``)."""

    request: int
    since: int
    ranges: tuple[Any, ...]
    keys: Any
    version: int


@dataclass(frozen=True, slots=True)
class Stale:
    """storage -> client: a basic read routed by another keyspace version than ours:
    learn the keyspace again (from a super) and read again."""

    request: int
    version: int


# ------------------------------------------------------------------ storage <-> storage
@dataclass(frozen=True, slots=True)
class Pull:
    """receiver -> source: send chunk ``chunk`` of the transfer."""

    transfer: tuple[int, int]
    chunk: int


@dataclass(frozen=True, slots=True)
class Chunk:
    """source -> receiver: chunk ``chunk`` of the transfer (``last``: the end)."""

    transfer: tuple[int, int]
    chunk: int
    data: Any
    last: bool


@dataclass(frozen=True, slots=True)
class History:
    """source -> receiver, before the first chunk: a part of the source's change log of
    the copied ranges (``[t, [[key, kind, value], ...]]`` each), complete after
    ``after`` (``last``: the end), so a change feed continues at the receiver; then the
    revisions of the ranges' keys (``[key, position]`` each)."""

    transfer: tuple[int, int]
    after: int
    entries: tuple[Any, ...]
    last: bool
    revisions: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class Abort:
    """source -> receiver: the source's own copy is incomplete (its receive of those
    ranges was aborted), so the receiver's copy would be too."""

    transfer: tuple[int, int]


@dataclass(frozen=True, slots=True)
class Refuse:
    """receiver -> source: a chunk was malformed or held keys outside the copy's ranges;
    the receiver gave the transfer up (its ranges are broken, and a super repairs it from
    another replica), so the source stops sending."""

    transfer: tuple[int, int]


# ------------------------------------------------------------------ super <-> the rest
@dataclass(frozen=True, slots=True)
class Ping:
    """super -> storage or super: a heartbeat (``sent_ms``: the super's clock, echoed)."""

    sent_ms: int


@dataclass(frozen=True, slots=True)
class Pong:
    """The answer to a :class:`Ping`, with the answerer's figures (a storage process's
    operations applied so far, items, bytes, items waiting; empty for a super)."""

    sent_ms: int
    figures: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Describe:
    """client -> super: what is the keyspace?"""

    request: int


@dataclass(frozen=True, slots=True)
class Described:
    """super -> client: the keyspace (``Keyspace.to_state()``) at ``version``."""

    request: int
    version: int
    keyspace: Any
    partitioning: str


@dataclass(frozen=True, slots=True)
class Leave:
    """storage -> super: take me off the ring (contract, or replace me with
    ``replace_with``); a storage process asks on SIGTERM."""

    request: int
    replace_with: str | None


@dataclass(frozen=True, slots=True)
class Left:
    """super -> storage: the leave completed at ``version``, or ``error`` says why not."""

    request: int
    error: str | None
    version: int | None


@dataclass(frozen=True, slots=True)
class ViewProgress:
    """maintainer (``maintainer:...``) -> super: how far each of its views is, for the
    console: ``(name, position, behind, staleness_s, rows)`` each (``behind``: positions
    between the view's progress and the newest page of the base it read; ``staleness_s``:
    seconds since the view was known to reflect every base write)."""

    views: tuple[Any, ...]


# ------------------------------------------------------------------ a whole-cluster restart
@dataclass(frozen=True, slots=True)
class LevelAsk:
    """super -> storage, before it restores the ring of a cluster that lost every
    process: your engine's epoch and position (``after`` None), or the records of its
    log after position ``after`` (:mod:`rubberband.restart`).  ``round`` names the
    coordinator's attempt; answers of another round are ignored."""

    round: int
    after: int | None


@dataclass(frozen=True, slots=True)
class LevelTail:
    """storage -> super: the engine's ``epoch`` and ``position``, the holders whose data
    it may keep (``holds``: the names that data was written under, which a process
    restarted under a new name still holds; none when it kept nothing), and slice
    ``index`` of its log's records ``(t, kind, body)`` after the asked position
    (``after`` echoed; none for a position ask); ``last``: the end."""

    round: int
    epoch: int
    position: int
    holds: tuple[str, ...]
    after: int | None
    index: int
    records: tuple[Any, ...]
    last: bool


@dataclass(frozen=True, slots=True)
class LevelApply:
    """super -> storage: slice ``index`` of what this holder missed, ``(op, ranges, t)``
    items in position order, of epoch ``epoch`` (a holder of an earlier one starts it
    first); the holder takes slices only in order, skips items at or before its
    position, so a slice sent twice is applied once, and after the ``last`` answers
    :class:`Levelled`."""

    round: int
    epoch: int
    index: int
    items: tuple[Any, ...]
    last: bool


@dataclass(frozen=True, slots=True)
class Levelled:
    """storage -> super: the slices of ``round`` are applied; the engine's position now."""

    round: int
    position: int


# ------------------------------------------------------------------ storage <-> storage
@dataclass(frozen=True, slots=True)
class FeedRead:
    """storage -> storage: a feed read of ``reader``'s from position ``since``
    (delivered at position ``read_at``, reading the ranges whose key is ``feed``:
    :func:`rubberband.holds.feed_key`) was answered here with a page that ends at
    ``resume``.  Sent to the other holders of what was answered: a read goes to one
    replica of each segment, and a replica that never answers a maintainer could not
    hold the writers back for it (``rubberband.holds``)."""

    reader: NodeId
    feed: str
    read_at: int
    since: int
    resume: int


MESSAGES: tuple[type, ...] = (
    Answer,
    Answers,
    Whole,
    BasicRead,
    Stale,
    Pull,
    Chunk,
    Abort,
    Refuse,
    Ping,
    Pong,
    Describe,
    Described,
    Leave,
    Left,
    History,
    ViewProgress,
    LevelAsk,
    LevelTail,
    LevelApply,
    Levelled,
    Peek,
    FeedRead,
)
"""Every direct message, in the order of their wire codes (64 on)."""
FIRST_CODE = 64

for _i, _cls in enumerate(MESSAGES):
    ecast.register_message(_cls, FIRST_CODE + _i)


# ------------------------------------------------------------------ E-Cast headers
class H:
    """The keys of Rubberband's headers.  Named in full: a name costs a few bytes of a
    message and nothing measurable in time (a router looks keys up in a small map)."""

    WRITES = "writes"
    """The ranges a write touches (routed to every holder of them)."""
    KEY = "key"
    """The one key a write of one key touches, instead of ``WRITES``: its range
    ``(key, after(key))`` named the key twice, packed and unpacked at every hop."""
    READS = "reads"
    """The ranges a read covers (routed to a cover of them, 4.3)."""
    OFFSET = "offset"
    """Which replica of each segment a read goes to: turns per read (4.3)."""
    REQUEST = "request"
    """The client's id for the answers (read, or write that asked for one)."""
    ANSWER = "answer"
    """A write whose client waits for a holder's answer (its validity depends on data)."""
    COUNT = "count"
    """A bundle: how many reads or writes its payload carries."""
    PACKED = "packed"
    """A write of many keys whose payload is its operation packed (msgpack bytes), so
    that the routers pass it on without decoding and encoding each of its keys."""
    VERSION = "version"
    """Keyspace version (keyspace, ready and incomplete messages)."""
    OP = "op"
    """A keyspace message's reconfiguration: ``(name, *args)``."""
    INSTRUCTIONS = "instructions"
    """A keyspace message's plan (``Plan.to_wire()``)."""
    RANGES = "ranges"
    """The ranges of a receive that cannot finish (incomplete)."""
    SINCE = "since"
    """A changes read (:mod:`rubberband.changelog`): the position its changes follow."""
    REVISIONS = "revisions"
    """A read answered with its keys' revisions: its payload is ``(op, keys)``
    (:class:`rubberband.changelog.Revisions`)."""


KEYSPACE = "keyspace"
READY = "ready"
INCOMPLETE = "incomplete"


REPORTED_CLIENTS = 64
"""Client names one heartbeat answer (a :class:`Pong`'s figures) carries at most; the
count beside them is always whole."""
MAX_RANGES = 4096
"""Ranges one header may name; the routers refuse more (an empty destination set).  A
client names fewer by widening (``rubberband.messages.Messages.routable``)."""


def write_header(ranges: Any) -> dict[str, Any]:
    """A write's header: ``KEY`` for a write of one key (most), ``WRITES`` otherwise."""
    if len(ranges) == 1:
        lo, hi = ranges[0]
        if is_key_quick(lo) and hi == lo + AFTER_TAIL:
            return {H.KEY: lo}
    return {H.WRITES: ranges}


def written(header: dict[str, Any]) -> Any:
    """The ranges a write's header (ours, or checked: :func:`rubberband.storage.held_part`)
    names, whichever way it names them; None for a header that names none."""
    ranges = header.get(H.WRITES)
    if ranges is None:
        key = header.get(H.KEY)
        if key is not None:
            return ((key, key + AFTER_TAIL),)
    return ranges


def read_header(ranges: Any, offset: int) -> dict[str, Any]:
    return {H.READS: ranges, H.OFFSET: offset}


def bundle_header(ranges: Any, offset: int, count: int) -> dict[str, Any]:
    return {H.READS: ranges, H.OFFSET: offset, H.COUNT: count}


def write_bundle_header(ranges: Any, count: int) -> dict[str, Any]:
    """A write bundle: ``count`` writes in one message, the payload as a read bundle's.
    Its ranges are one range inside one segment, from the writes' lowest bound to their
    highest (the client bundles only writes of one segment), so the routers route it as
    one write to that segment's holders, and each holder applies every write of it at
    the message's one position, in the order of the payload."""
    return {H.WRITES: ranges, H.COUNT: count}


def keyspace_header(version: int, op: tuple[Any, ...], instructions: Any) -> dict[str, Any]:
    """``op`` as in ``rubberband.config``'s docstring, ``instructions`` a plan's
    ``to_wire()``."""
    return {
        KIND: KEYSPACE,
        H.VERSION: version,
        H.OP: tuple(op),
        H.INSTRUCTIONS: tuple(instructions),
    }


def ready_header(version: int) -> dict[str, Any]:
    return {KIND: READY, H.VERSION: version}


def incomplete_header(version: int, ranges: Any) -> dict[str, Any]:
    return {KIND: INCOMPLETE, H.VERSION: version, H.RANGES: ranges}


def vote_header(who: NodeId) -> dict[str, Any]:
    return {KIND: SUSPECT, WHO: [who]}
